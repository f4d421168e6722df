"""Builds and loads libsitsprobe_markers.so from the C source in this package.

The library is compiled once per source into a cache folder, named by a hash
of the source and the compiler flags, so a changed source builds a new library,
and processes never see a half-written one (written under a temporary name,
then renamed).
When it cannot be built (no compiler, no sys/sdt.h, nowhere to write), `load`
returns None with the reason, and the markers fall back to Python no-ops.
"""
from __future__ import annotations

import ctypes as ct
import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

SOURCE = Path(__file__).with_name("markers.c")
PREFIX = "libsitsprobe_markers"
# Where to build: this folder when set; else _build/ beside the source when
# writable; else $XDG_CACHE_HOME/sitsprobe (~/.cache/sitsprobe).
ENV_DIR = "SITSPROBE_MARKERS_DIR"
# The C compiler: $CC (a name on PATH or a path), else "cc".
ENV_CC = "CC"
CFLAGS = ["-O2", "-shared", "-fPIC"]

# The exported functions (markers.c). They are called without ctypes argtypes:
# converting three arguments through argtypes cost about 0.5 us per call here,
# more than the call itself. The caller passes exactly what ctypes passes
# unconverted: bytes (a char *), Python ints that fit in a C int (libffi widens
# them to the full register, sign-extended), and c_uint64 for wider ones.
FUNCTIONS = (
    "sitsprobe_request_begin",  # (uint64_t id, int32_t fd, const char *model)
    "sitsprobe_request_end",    # (uint64_t id)
    "sitsprobe_range_begin",    # (uint64_t id, uint64_t batch_id, const char *name)
    "sitsprobe_range_end",      # (uint64_t id, uint64_t batch_id, const char *name)
    "sitsprobe_batch",          # (uint64_t batch_id, const uint64_t *ids, uint32_t n)
    "sitsprobe_cache_get",      # (uint64_t id, const char *cache, const char *key,
                                #  uint32_t key_len, int32_t hit)
    "sitsprobe_usage",          # (uint64_t id, uint64_t in, uint64_t out, uint64_t kv_bytes)
)


class BuildError(Exception):
    """Why the library is not there; the message says what to install or set."""


def cache_dirs(env=os.environ) -> list[Path]:
    """Candidate build folders, best first."""
    if env.get(ENV_DIR):
        return [Path(env[ENV_DIR])]
    home = env.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return [SOURCE.parent / "_build", Path(home) / "sitsprobe"]


def compiler(env=os.environ) -> str:
    cc = env.get(ENV_CC) or "cc"
    found = shutil.which(cc)
    if not found:
        raise BuildError(f"no C compiler ({ENV_CC}={cc!r} not found; install gcc or set {ENV_CC})")
    return found


def library_name(source: bytes) -> str:
    """Named by the source and flags: a changed source gets a new library."""
    digest = hashlib.sha256(source + " ".join(CFLAGS).encode()).hexdigest()
    return f"{PREFIX}-{digest[:16]}.so"


def _writable(d: Path) -> bool:
    try:
        d.mkdir(parents=True, exist_ok=True)
    except OSError:
        return False
    return os.access(d, os.W_OK | os.X_OK)


def _compile(cc: str, source: Path, out: Path) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent)
    os.close(fd)
    try:
        r = subprocess.run([cc, *CFLAGS, "-o", tmp, str(source)],
                           capture_output=True, text=True, timeout=120)
        if r.returncode != 0:
            err = r.stderr.strip()
            if "sdt.h" in err:
                raise BuildError("sys/sdt.h not found (install systemtap-sdt-dev)")
            raise BuildError(f"{cc} failed on {source}: {err[-500:]}")
        os.chmod(tmp, 0o755)
        os.replace(tmp, out)  # atomic: other processes see all of it or none
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def build(env=os.environ, source: Path = SOURCE) -> Path:
    """The library's path, compiling it first when this source has no build yet."""
    name = library_name(source.read_bytes())
    dirs = cache_dirs(env)
    for d in dirs:
        if (d / name).is_file():
            return d / name
    cc = compiler(env)
    for d in dirs:
        if _writable(d):
            _compile(cc, source, d / name)
            return d / name
    raise BuildError(f"nowhere to build (tried {', '.join(map(str, dirs))}; set {ENV_DIR})")


def load(env=os.environ, source: Path = SOURCE) -> tuple[ct.PyDLL | None, Path | None, str | None]:
    """(library, its path, None) or (None, None, why it is missing).

    A PyDLL: its calls keep the GIL, which a nop has no reason to drop (a CDLL
    call releases and retakes it, letting another thread in each time)."""
    try:
        path = build(env, source)
        lib = ct.PyDLL(str(path))
        for name in FUNCTIONS:
            getattr(lib, name).restype = None
    except (BuildError, OSError, AttributeError, subprocess.SubprocessError) as e:
        return None, None, str(e)
    return lib, path, None
