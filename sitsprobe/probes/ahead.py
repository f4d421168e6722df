"""net.c's compile, begun before the agent is built.

The compile is LLVM's work for about a second (two halves, the second in a
process of its own: probes/apart.py), and bcc's call into it drops the
GIL. `sitsprobe run` begins it as soon as the configuration is read, so it
runs while the rest of the agent imports and sets up;
an Agent built without one begins its own at start. It compiles for the
plan load_net guesses first (the last probe of this boot, else every hook
working); load_net takes it, or compiles again where the probe plans otherwise.
Either takes the programs an earlier start kept where it can (probes/kept.py).
"""
from __future__ import annotations

import logging
import threading

from .. import kheaders
from ..config import Config
from .compiler import free_module
from .kept import KeptPrograms
from .net import compile_net
from .net_plan import guessed

log = logging.getLogger("sitsprobe")


class NetAhead:
    def __init__(self, config: Config):
        """Kernel headers found for bcc (logged; raises HeadersNotFound where
        there are none), then the compile begun on a thread."""
        choice = kheaders.resolve(configured=config.kernel_headers)
        note = kheaders.install(choice)
        log.log(logging.WARNING if choice.mismatch else logging.INFO, "kernel headers: %s (%s)%s",
                choice.build, choice.kind, f"; {choice.note}" if choice.note else "")
        if note:
            log.info("%s", note)
        self.flags = guessed(config).flags
        self.kept = KeptPrograms(config.compiled_dir) if config.compiled_dir else None
        self._made: dict[str, object] = {}  # "net": the NetModule, or "error": why it did not compile
        self._thread = threading.Thread(target=self._compile, name="net-compile", daemon=True)
        self._thread.start()

    def _compile(self) -> None:
        try:
            self._made["net"] = compile_net(self.flags, self.kept)
        except Exception as e:  # noqa: BLE001 (bcc raises Exception) take() raises it
            self._made["error"] = e

    def take(self, flags: list[str]):
        """The NetModule compiled for ``flags``, once (its compile's error, raised);
        None where it was taken already or begun on other flags."""
        self._thread.join()
        if flags != self.flags:
            return None
        if "error" in self._made:
            raise self._made.pop("error")
        return self._made.pop("net", None)

    def close(self) -> None:
        """A compile not taken ends and is freed."""
        self._thread.join()
        self._made.pop("error", None)
        if (net := self._made.pop("net", None)) is not None:
            free_module(net.bpf)
