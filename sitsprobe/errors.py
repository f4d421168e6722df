"""Errors that say what went wrong, where, and what the user can do."""
from __future__ import annotations


class SitsprobeError(Exception):
    """Base class: the CLI prints these as one line, without a traceback."""


class ConfigError(SitsprobeError):
    def __init__(self, source: str, key: str, expected: str, got: object = None):
        self.source, self.key, self.expected, self.got = source, key, expected, got
        msg = f"{source}: {key}: expected {expected}"
        if got is not None:
            msg += f", got {got!r}"
        super().__init__(msg)


class KernelFeatureMissing(SitsprobeError):
    def __init__(self, feature: str, kernel: str, fallback: str | None = None):
        self.feature, self.kernel, self.fallback = feature, kernel, fallback
        msg = f"{feature} unavailable (kernel {kernel})"
        msg += f"; using {fallback}" if fallback else "; no fallback"
        super().__init__(msg)


class ProbeAttachError(SitsprobeError):
    def __init__(self, probe: str, target: str, reason: str):
        self.probe, self.target, self.reason = probe, target, reason
        super().__init__(f"cannot attach {probe} to {target}: {reason}")


class ProbeLoadError(SitsprobeError):
    """The kernel did not take a program (or a module's compile loading its
    own). The message ends with the kernel's reason, as bcc's does."""

    def __init__(self, program: str, reason: str):
        self.program, self.reason = program, reason
        super().__init__(f"Failed to load BPF program {program}: {reason}")


class HeadersNotFound(SitsprobeError):
    pass
