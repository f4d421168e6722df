"""net.c's programs, kept from one start for the next.

Compiling net.c is most of a start (LLVM's passes: 1-2 s of CPU here), and
what it makes is a function of the source, the flags, bcc with its LLVM and
the kernel's headers. A start that compiles keeps the programs, once they
loaded (their instructions, and the names of the maps their instructions
name by fd), in a root-only folder, under a key of all of those; a later
start with the same key makes only the maps (net.c with NET_PART 3: no
program, 0.4 s here) and loads the kept programs onto them, as it does a
second process's (probes/apart.py). The kernel's verifier checks them as it
checks a fresh compile's; what it refuses is compiled afresh (net.forget).

The TLS module (net.c with -DTLS_MODULE, compiled once a traced process
maps a libssl) is kept so too, under its own key (its flags; not the folder
its compile opened the first module's maps from, a fresh one each time).

The default folder is on tmpfs (/run): a reboot, which a new kernel needs,
empties it.
"""
from __future__ import annotations

import contextlib
import hashlib
import logging
import marshal
import os
import stat
from collections.abc import Iterable
from pathlib import Path

from .apart import Programs
from .compiler import Tables

log = logging.getLogger("sitsprobe")

SCHEMA = b"sitsprobe kept programs 1"  # what a kept file holds; changed with its shape
AT_MOST = 8  # files kept (about 100 KB each): those used last
_LIBRARIES = (b"libbcc", b"libLLVM", b"libclang")  # whose builds decide the instructions


def libraries(maps: str = "/proc/self/maps") -> list[str]:
    """The compiler's shared libraries this process has loaded: each one's
    path, size and modification time (a new build of bcc or LLVM is a new key)."""
    seen: list[str] = []
    try:
        with open(maps, "rb") as f:
            paths = {line.split()[-1] for line in f if any(lib in line for lib in _LIBRARIES)}
    except OSError:
        return seen
    for path in sorted(paths):
        try:
            st = os.stat(path)
        except OSError:
            continue
        seen.append(f"{path.decode(errors='replace')} {st.st_size} {st.st_mtime_ns}")
    return seen


def key(sources: Path, flags: Iterable[str], maps: str = "/proc/self/maps") -> str:
    """What a compile of ``sources``' net.c with ``flags`` makes depends on:
    every file of the folder (net.c and the headers it includes), the flags,
    the compiler's libraries, the kernel and its headers (bcc's build folder)."""
    h = hashlib.sha256(SCHEMA)
    for path in sorted(p for p in sources.iterdir() if p.is_file()):
        h.update(b"\0file\0" + path.name.encode() + b"\0" + path.read_bytes())
    uname = os.uname()
    build = os.path.realpath(f"/lib/modules/{uname.release}/build")
    for part in (*flags, *libraries(maps), uname.release, uname.version, uname.machine, build):
        h.update(b"\0" + part.encode())
    return h.hexdigest()


class KeptPrograms:
    """A folder of compiles' programs, one file per key."""

    def __init__(self, folder: str):
        self.folder = Path(folder)

    def get(self, k: str) -> tuple[Tables, Programs] | None:
        """The maps and programs kept under ``k``; None where none are, or
        where the file is not one this process's user alone could have written
        (said why)."""
        path = self.folder / k
        try:
            with open(path, "rb") as f:
                st = os.fstat(f.fileno())
                if st.st_uid != os.geteuid() or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
                    log.warning("kept programs %s not loaded: owned by uid %d, mode %o (want uid %d, "
                                "writable by it alone); compiling instead", path, st.st_uid,
                                stat.S_IMODE(st.st_mode), os.geteuid())
                    return None
                made = marshal.load(f)
                os.utime(f.fileno())  # used: the last to go (put)
        except FileNotFoundError:
            return None
        except (OSError, ValueError, EOFError, TypeError) as e:
            log.warning("kept programs %s unreadable (%s); compiling instead", path, e)
            return None
        if not _shaped(made):
            log.warning("kept programs %s are not a compile's maps and programs; compiling instead", path)
            return None
        return made

    def put(self, k: str, tables: Tables, programs: Programs) -> None:
        """Keep a compile's maps and programs under ``k`` (written whole or not
        at all; where the folder cannot be written, the next start compiles),
        and of the others the AT_MOST - 1 used last."""
        path = self.folder / k
        part = path.with_name(f".{k}.{os.getpid()}")
        try:
            self.folder.mkdir(mode=0o700, parents=True, exist_ok=True)
            with open(part, "wb") as f:
                os.fchmod(f.fileno(), 0o600)
                marshal.dump((tables, programs), f)
            os.replace(part, path)
        except OSError as e:
            log.info("net.c's programs not kept for the next start (%s): it compiles them again", e)
            with contextlib.suppress(OSError):
                part.unlink()
            return
        self._prune()

    def _prune(self) -> None:
        files = []
        for p in self.folder.iterdir():
            with contextlib.suppress(OSError):
                if not p.name.startswith("."):
                    files.append((p.stat().st_mtime_ns, p))
        for _, p in sorted(files, reverse=True)[AT_MOST:]:
            with contextlib.suppress(OSError):
                p.unlink()


def _shaped(made: object) -> bool:
    """(maps by fd, programs by name), as compiled() returns them."""
    if not (isinstance(made, tuple) and len(made) == 2 and all(isinstance(x, dict) for x in made)):
        return False
    tables, programs = made
    return (all(isinstance(fd, int) and isinstance(name, str) for fd, name in tables.items())
            and all(isinstance(n, bytes) and isinstance(c, bytes) and len(c) % 8 == 0 for n, c in programs.items()))
