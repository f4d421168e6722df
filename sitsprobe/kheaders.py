"""Find kernel headers bcc can compile against, and show bcc where they are.

bcc looks in ``/lib/modules/$(uname -r)/{build,source}``, or unpacks
``/sys/kernel/kheaders.tar.xz`` (CONFIG_IKHEADERS). A pod or a cloud VM often
has neither, so ``resolve`` walks a fixed order and says which it took:

1. ``host``: ``/lib/modules/R/build`` exists (the host's, maybe mounted in);
2. ``kheaders``: the kernel carries its own headers;
3. ``configured``: the ``kernel_headers`` setting names a build tree;
4. ``nearest``: the ``/usr/src/linux-headers-*`` tree closest in version.

``install`` then links a configured or nearest tree where bcc looks. Every
path is taken under ``root`` so tests run on fixture trees.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass

from sitsprobe import files
from sitsprobe.errors import HeadersNotFound, SitsprobeError

HOST, KHEADERS, CONFIGURED, NEAREST = "host", "kheaders", "configured", "nearest"

MISMATCH = (
    "headers are for {have}, the kernel is {want}: programs that read kernel "
    "structs field by field are unsafe; tracepoint arguments and user memory are fine"
)

_VERSION = re.compile(r"(\d+)\.(\d+)(?:\.(\d+))?")
_INCLUDE = re.compile(r"^include\s+(\S+)/Makefile\s*$", re.M)


@dataclass(frozen=True, slots=True)
class HeaderChoice:
    kind: str  # HOST, KHEADERS, CONFIGURED or NEAREST
    build: str | None  # the build tree (has include/generated), a real path
    source: str | None  # its source tree (Debian's "-common"), or None
    note: str = ""
    release: str = ""  # the kernel release they were resolved for
    mismatch: bool = False  # built for another release: see MISMATCH


def _under(root: str, path: str) -> str:
    return os.path.join(root, path.lstrip("/"))


def _version(text: str) -> tuple[int, int, int] | None:
    m = _VERSION.search(text)
    return (int(m[1]), int(m[2]), int(m[3] or 0)) if m else None


def _source_of(build: str, root: str) -> str | None:
    """The source tree a Debian/Ubuntu build tree includes, or None if whole."""
    try:
        with open(os.path.join(build, "Makefile")) as f:
            m = _INCLUDE.search(f.read())
    except OSError:
        m = None
    if m:
        src = _under(root, m[1])
        if os.path.isdir(src):
            return src
    # Debian names its common tree after the flavour's ABI: 6.1.0-50-common
    base = os.path.basename(build.rstrip("/"))
    m2 = re.match(r"(linux-headers-\d+\.\d+[.\d]*-[^-]+)-", base)
    if m2:
        common = os.path.join(os.path.dirname(build.rstrip("/")), m2[1] + "-common")
        if os.path.isdir(common) and common != build:
            return common
    return None


def _tree_release(tree: str, by_name: bool = True) -> str | None:
    """The release a build tree was made for: its utsrelease.h, else its name."""
    m = re.search(r'UTS_RELEASE\s+"([^"]+)"',
                  files.text(os.path.join(tree, "include/generated/utsrelease.h")))
    if m or not by_name:
        return m[1] if m else None
    return os.path.basename(tree.rstrip("/")).removeprefix("linux-headers-")


def _tree_version(tree: str) -> tuple[int, int, int] | None:
    """Upstream version (Debian's 6.1.0-50 tree says 6.1.176 in kernel.release)."""
    text = files.text(os.path.join(tree, "include/config/kernel.release"))
    return _version(text) or _version(_tree_release(tree))


def _nearest(release: str, root: str) -> str | None:
    want = _version(release) or (0, 0, 0)
    usr_src = _under(root, "/usr/src")
    try:
        names = os.listdir(usr_src)
    except OSError:
        return None
    ranked = []
    for name in names:
        path = os.path.join(usr_src, name)
        if not name.startswith("linux-headers-") or name.endswith("-common"):
            continue
        have = _tree_version(path) if os.path.isdir(path) else None
        if have is None:
            continue
        built = os.path.isdir(os.path.join(path, "include", "generated"))
        distance = tuple(abs(h - w) for h, w in zip(have, want))
        ranked.append((_tree_release(path) != release, not built, distance, name))
    return os.path.join(usr_src, min(ranked)[-1]) if ranked else None


def resolve(release: str | None = None, *, root: str = "/",
            configured: str | None = None) -> HeaderChoice:
    """Where bcc will find headers for ``release`` (default: the running kernel)."""
    release = release or os.uname().release
    modules = _under(root, f"/lib/modules/{release}")
    build = os.path.join(modules, "build")
    if os.path.isdir(build):
        source = os.path.join(modules, "source")
        have = _tree_release(build, by_name=False)  # a link we made earlier says so
        mismatch = have not in (None, release)
        note = MISMATCH.format(have=have, want=release) if mismatch else f"using {build}"
        return HeaderChoice(HOST, build, source if os.path.isdir(source) else None, note,
                            release, mismatch)
    kheaders = _under(root, "/sys/kernel/kheaders.tar.xz")
    if os.path.isfile(kheaders):
        return HeaderChoice(KHEADERS, None, None,
                            f"bcc unpacks the kernel's own headers ({kheaders})", release)
    if configured:
        tree = _under(root, configured)
        if not os.path.isdir(tree):
            raise HeadersNotFound(
                f"kernel_headers: {configured} is not a directory; point it at a "
                f"kernel build tree (one with include/generated), or unset it")
        return _choice(CONFIGURED, tree, release, root)
    tree = _nearest(release, root)
    if tree:
        return _choice(NEAREST, tree, release, root)
    raise HeadersNotFound(
        f"no kernel headers for {release}: searched {build}, {kheaders}, "
        f"{_under(root, '/usr/src')}/linux-headers-*"
        + (f" and kernel_headers={configured}" if configured else "")
        + "; mount the host's /lib/modules and /usr/src into the pod, "
        f"or install linux-headers-{release}, or set kernel_headers in the config")


def _choice(kind: str, tree: str, release: str, root: str) -> HeaderChoice:
    have = _tree_release(tree)
    note = f"using {tree}" if have == release else MISMATCH.format(have=have, want=release)
    return HeaderChoice(kind, tree, _source_of(tree, root), note, release, have != release)


def install(choice: HeaderChoice, *, root: str = "/") -> str | None:
    """Link a configured/nearest tree into /lib/modules/R; never replace a build."""
    if choice.kind not in (CONFIGURED, NEAREST):
        return None
    modules = _under(root, f"/lib/modules/{choice.release or os.uname().release}")
    done = []
    for link, target in (("build", choice.build), ("source", choice.source or choice.build)):
        path = os.path.join(modules, link)
        if os.path.lexists(path):
            if link == "build" and not os.path.exists(path):
                raise HeadersNotFound(
                    f"{path} points to {os.path.realpath(path)}, which is missing; mount "
                    f"that tree, or remove the link so sitsprobe can link {target}")
            if link == "build" and os.path.realpath(path) != os.path.realpath(target):
                return f"left {path} as it is; bcc will use it, not {target}"
            continue
        try:
            os.makedirs(modules, exist_ok=True)
            os.symlink(target, path)
        except OSError as e:
            raise SitsprobeError(
                f"cannot link {path} -> {target}: {e.strerror}; make "
                f"{modules} writable, or mount the host's /lib/modules") from e
        done.append(f"{path} -> {target}")
    return "linked " + ", ".join(done) if done else None
