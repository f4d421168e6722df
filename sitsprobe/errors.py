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


class MapCreateError(SitsprobeError):
    """The kernel did not make one of a module's maps, where bcc says only
    that the module did not compile: which map, the kernel's reason, and the
    settings its size comes from."""

    def __init__(self, module: str, table: str, reason: str, sized_by: tuple[str, ...] = ()):
        self.module, self.table, self.reason, self.sized_by = module, table, reason, sized_by
        msg = f"{module}: the kernel did not make its map {table}: {reason}"
        if sized_by:
            msg += (f"; its size comes from {', '.join(sized_by)}: lower them, or raise the agent's memory "
                    f"limit (BPF maps are kernel memory charged to its cgroup)")
        super().__init__(msg)


class HeadersNotFound(SitsprobeError):
    pass
