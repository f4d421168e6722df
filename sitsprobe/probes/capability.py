"""What this kernel lets us hook, proved by loading tiny programs and firing them.

``probe_all`` compiles one program for the tracepoint, kprobe and uprobe
checks and one each for fentry, USDT, the ring buffer and batched map reads
(a failure there must not sink the rest), attaches, triggers from this
process, counts, and cleans up. ``plan`` (in ``probes.plan``) turns the result into a hook per
probe point; both are exported here.
"""
from __future__ import annotations

import atexit
import contextlib
import ctypes
import dataclasses
import errno
import functools
import gzip
import os
import re
import socket
import subprocess
import sys
import tempfile

from sitsprobe import tracefs

from .compiler import short_kallsyms
from .retry import soon

SYSCALL_TP, NET_TP, KFUNC = "syscalls:sys_enter_getppid", "sock:inet_sock_set_state", "tcp_sendmsg"
# kind -> (how bcc attaches it, its arguments, what that is in words)
_MAIN = {
    "syscall_tracepoint": ("attach_tracepoint", {"tp": SYSCALL_TP}, SYSCALL_TP),
    "tracepoint": ("attach_tracepoint", {"tp": NET_TP}, NET_TP),
    "raw_tracepoint": ("attach_raw_tracepoint", {"tp": "sys_enter"}, "sys_enter"),
    # the socket tier (bpf/net.c NET_TIER_SOCK): a raw tracepoint on sock_send_length
    # that reads the syscall's number from its registers, as the tier does
    "sock_tracepoint": ("attach_raw_tracepoint", {"tp": "sock_send_length"},
                        "sock:sock_send_length (with the syscall's registers)"),
    "kprobe": ("attach_kprobe", {"event": KFUNC}, KFUNC),
    "uprobe": ("attach_uprobe", {"name": "c", "sym": "getppid"}, "libc:getppid"),
}
_HITS = """BPF_ARRAY(hits, u64, 8);
static inline int bump(int i) {
    if ((bpf_get_current_pid_tgid() >> 32) != PID) return 0;
    u64 *v = hits.lookup(&i);
    if (v) __sync_fetch_and_add(v, 1);
    return 0;
}
"""
# counts only a send whose registers say sendto (the trigger's): proves they are read right.
# The syscall number's place in struct pt_regs and sendto's number, by machine, as
# constants: the kernel headers that define them would cost this compile a second.
_SYSCALL_NR = {"x86_64": (120, 44), "aarch64": (280, 206)}  # (offsetof orig_ax / syscallno, __NR_sendto)
_SOCK_CHECK = """int on_sock_tracepoint(void *ctx) {
    u64 nr = 0;
    bpf_probe_read_kernel(&nr, sizeof(nr), (void *)bpf_task_pt_regs(bpf_get_current_task_btf()) + NR_OFF);
    return nr == NR_SENDTO ? bump(%d) : 0;
}
"""
_RINGBUF = """BPF_RINGBUF_OUTPUT(events, 1);
int on_getppid(void *ctx) {
    if ((bpf_get_current_pid_tgid() >> 32) != PID) return 0;
    u32 *v = events.ringbuf_reserve(sizeof(u32));
    if (v) { *v = 42; events.ringbuf_submit(v, 0); }
    return 0;
}"""
_STRERRORS = {os.strerror(n): name for n, name in errno.errorcode.items()}


@dataclasses.dataclass(frozen=True, slots=True)
class Capability:
    kind: str
    ok: bool
    detail: str
    reason: str = ""  # short cause when not ok, for fallback notes: "EPERM"


@contextlib.contextmanager
def _quiet():
    """Capture fd 2 (clang and libbpf chatter); the list fills on exit."""
    lines: list[str] = []
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as tmp:
        os.dup2(tmp.fileno(), 2)
        try:
            yield lines
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            lines += [ln for ln in tmp.read().decode(errors="replace").splitlines() if ln.strip()]


def _failed(kind: str, what: str, err: Exception, noise: list[str]) -> Capability:
    """A short, named reason: the compiler's first error, else the errno bcc
    or libbpf saw (bcc words EPERM as "Need super-user"), else its message."""
    texts = [*noise, str(err)]
    error = next((t[t.index("error:"):] for t in texts if "error:" in t), "")
    code = next((name for t in texts for msg, name in _STRERRORS.items() if msg in t),
                "EPERM" if "super-user" in str(err) else "")
    reason = " ".join((error or code or texts[-1] or type(err).__name__).split())[:100]
    return Capability(kind, False, f"{kind} unavailable: {what} failed ({reason})", reason)


def _fired(kind: str, count: int, target: str) -> Capability:
    if count:
        return Capability(kind, True, f"fired {count}x on {target}")
    return Capability(kind, False, f"{kind}: attached to {target} but never fired", "never fired")


def kernel_config(root: str = "/") -> dict[str, str] | None:
    """CONFIG_* -> value from /proc/config.gz or /boot/config-R; None if neither."""
    for path, opener in ((os.path.join(root, "proc/config.gz"), gzip.open),
                         (os.path.join(root, f"boot/config-{os.uname().release}"), open)):
        try:
            with opener(path, "rt") as f:
                return dict(re.findall(r"^(CONFIG_\w+)=(.*)$", f.read(), re.M))
        except OSError:
            continue
    return None


def _kprobe_missing(root: str) -> Capability | None:
    """Why kprobes cannot work, from what the kernel exposes; None if they might."""
    events = os.path.join(tracefs.tracefs_path(root), "kprobe_events")
    pmu = os.path.join(root, "sys/bus/event_source/devices/kprobe")
    if os.path.exists(events) or os.path.exists(pmu):
        return None
    config = kernel_config(root)
    unset = config is not None and "CONFIG_KPROBES" not in config
    reason = "CONFIG_KPROBES unset" if unset else "no kprobe support"
    return Capability("kprobe", False,
                      f"kprobes unavailable: {events} missing and no kprobe PMU ({reason})", reason)


def _trigger() -> None:
    ctypes.CDLL(None).getppid()  # syscall tracepoint, raw sys_enter, uprobe
    with socket.socket() as srv:  # sock:inet_sock_set_state, tcp_sendmsg
        srv.bind(("127.0.0.1", 0))
        srv.listen(1)
        with socket.create_connection(srv.getsockname()) as cli:
            cli.sendall(b"x")
            srv.accept()[0].close()


def _load(BPF, **kw):
    """``BPF(**kw)``, freeing what bcc made when it fails half way (bcc keeps
    even a half-built object alive for atexit, with its maps open), and tried
    again while the kernel refuses it for the moment: the answer is kept for
    the boot, so a refusal for the moment must not stand as a missing hook."""
    def once():
        b = BPF.__new__(BPF)
        try:
            short_kallsyms(lambda: b.__init__(**kw))
        except Exception:
            _close(b)
            raise
        return b
    return soon(once, "a test program of the kernel probe")


def _close(b) -> None:
    with contextlib.suppress(Exception):
        b.cleanup()
    with contextlib.suppress(Exception):
        atexit.unregister(b.cleanup)


def _probe_main(BPF, root: str) -> dict[str, Capability]:
    text = _HITS + "".join(_SOCK_CHECK % i if k == "sock_tracepoint" else
                           f"int on_{k}(void *ctx) {{ return bump({i}); }}\n"
                           for i, k in enumerate(_MAIN))
    nr_off, sendto = _SYSCALL_NR.get(os.uname().machine, (0, -1))  # elsewhere: never counts
    try:
        with _quiet() as noise:
            b = _load(BPF, text=text, cflags=[f"-DPID={os.getpid()}", f"-DNR_OFF={nr_off}",
                                              f"-DNR_SENDTO={sendto}"])
    except Exception as e:
        return {k: _failed(k, "compiling the test program", e, noise) for k in _MAIN}
    caps: dict[str, Capability] = {}
    try:
        for kind, (method, args, target) in _MAIN.items():
            with _quiet() as noise:
                try:
                    pid = {"pid": os.getpid()} if kind == "uprobe" else {}
                    soon(functools.partial(getattr(b, method), fn_name=f"on_{kind}", **args, **pid),
                         f"the kernel probe's test program on {target}")
                    continue
                except Exception as e:
                    err = e
            caps[kind] = (_kprobe_missing(root) if kind == "kprobe" else None) \
                or _failed(kind, f"attaching to {target}", err, noise)
        _trigger()
        hits = [v.value for v in b["hits"].values()]
    finally:
        _close(b)
    for i, (kind, (_, _, target)) in enumerate(_MAIN.items()):
        caps.setdefault(kind, _fired(kind, hits[i], target))
    return caps


def _probe_fentry(BPF) -> Capability:
    try:
        with _quiet() as noise:
            b = _load(BPF, text=_HITS + f"KFUNC_PROBE({KFUNC}) {{ return bump(0); }}",
                      cflags=[f"-DPID={os.getpid()}"])
    except Exception as e:
        return _failed("fentry", f"loading a program on {KFUNC}", e, noise)
    try:
        _trigger()
        return _fired("fentry", b["hits"][0].value, KFUNC)
    finally:
        _close(b)


def _probe_ringbuf(BPF) -> Capability:
    got: list[int] = []
    try:
        with _quiet() as noise:
            b = _load(BPF, text=_RINGBUF, cflags=[f"-DPID={os.getpid()}"])
    except Exception as e:
        return _failed("ringbuf", "creating a BPF_RINGBUF_OUTPUT map", e, noise)
    try:
        soon(lambda: b.attach_tracepoint(tp=SYSCALL_TP, fn_name="on_getppid"),
             f"the kernel probe's ring buffer program on {SYSCALL_TP}")
        b["events"].open_ring_buffer(lambda _ctx, _data, size: got.append(size))
        os.getppid()
        b.ring_buffer_poll(100)
    finally:
        _close(b)
    if got:
        return Capability("ringbuf", True, f"{len(got)} event(s) through a ring buffer")
    return Capability("ringbuf", False, "ringbuf: map made but no event arrived", "no event")


def _probe_map_batch(BPF) -> Capability:
    try:
        with _quiet() as noise:
            b = _load(BPF, text="BPF_HASH(m, u64, u64, 8);")
    except Exception as e:
        return _failed("map_batch", "creating a hash map", e, noise)
    from sitsprobe.probes.maps import MapCopy

    try:
        t = b["m"]
        t[t.Key(7)] = t.Leaf(42)
        copy = MapCopy(t, "doctor's test map")
        n, _, values = copy.read()
    finally:
        _close(b)
    if copy.batched and n == 1 and bytes(values) == bytes(ctypes.c_uint64(42)):
        return Capability("map_batch", True, "BPF_MAP_LOOKUP_BATCH copied a hash map")
    return Capability("map_batch", False, f"BPF_MAP_LOOKUP_BATCH unavailable "
                      f"({copy.unbatched_why or 'wrong copy'}): connections are read one by one "
                      "each flush tick (Linux 5.6+ has it)", copy.unbatched_why or "wrong copy")


def usdt_candidates() -> list[str]:
    """Python interpreters that carry stapsdt notes (Debian's do)."""
    paths = [sys.executable, "/usr/bin/python3", *(f"/usr/bin/python3.{m}" for m in range(8, 15))]
    found = []
    for path in dict.fromkeys(os.path.realpath(p) for p in paths if os.path.exists(p)):
        with open(path, "rb") as f:
            if b".note.stapsdt" in f.read():
                found.append(path)
    return found


def _probe_usdt(BPF, USDT, binary: str | None, probe: str | None) -> Capability:
    """Default: a Python with stapsdt notes runs as a child and is made to hit
    gc__start. Given ``binary``: attach to its ``probe`` by path, unfired."""
    child = None
    if binary is None:
        found = usdt_candidates()
        if not found:
            return Capability("usdt", False, "usdt: no USDT-carrying binary to test against",
                              "untested")
        binary, probe = found[0], "gc__start"
        argv = [binary, "-c", "import sys, gc; sys.stdin.readline(); gc.collect()"]
        child = subprocess.Popen(argv, stdin=subprocess.PIPE, stderr=subprocess.DEVNULL)
    b, noise = None, []
    try:
        with _quiet() as noise:
            u = USDT(pid=child.pid) if child else USDT(path=binary)
            probe = probe or u.enumerate_probes()[0].name.decode()
            u.enable_probe(probe=probe, fn_name="on_usdt")
            b = _load(BPF, text=_HITS + "int on_usdt(void *ctx) { return bump(0); }",
                      cflags=[f"-DPID={child.pid if child else 0}"], usdt_contexts=[u])
        if child is None:
            return Capability("usdt", True, f"attached to {binary}:{probe} (not fired)")
        child.communicate(b"\n", timeout=10)
        return _fired("usdt", b["hits"][0].value, f"{binary}:{probe}")
    except Exception as e:
        return _failed("usdt", f"attaching to {binary}:{probe}", e, noise)
    finally:
        if child is not None and child.poll() is None:
            child.kill()
            child.wait()
        if b is not None:
            _close(b)


GROUPS = ("main", "fentry", "usdt", "ringbuf", "map_batch")  # each its own compile
KINDS = {"main": tuple(_MAIN), "fentry": ("fentry",)}  # the hook kinds a group says, of those a plan reads


def probe_all(*, root: str = "/", usdt_binary: str | None = None,
              usdt_probe: str | None = None, only: tuple[str, ...] = GROUPS) -> dict[str, Capability]:
    """Every hook kind: does it load, attach and fire on this kernel? With
    ``only``, just those groups (the agent asks for what its plan needs:
    each group costs a compile); "main" is the tracepoint, raw tracepoint,
    kprobe and uprobe kinds."""
    caps = {"btf": btf_capability(root)}
    try:
        from bcc import BPF, USDT
    except ImportError as e:
        why = f"bcc not importable ({e}); install python3-bpfcc"
        return caps | {k: Capability(k, False, why, "no bcc")
                       for k in (*_MAIN, "fentry", "usdt", "ringbuf", "map_batch")}
    if "main" in only:
        caps |= _probe_main(BPF, root)
    if "fentry" in only:
        caps["fentry"] = _probe_fentry(BPF)
    if "usdt" in only:
        caps["usdt"] = _probe_usdt(BPF, USDT, usdt_binary, usdt_probe)
    if "ringbuf" in only:
        caps["ringbuf"] = _probe_ringbuf(BPF)
    if "map_batch" in only:
        caps["map_batch"] = _probe_map_batch(BPF)
    return caps


def btf_capability(root: str = "/") -> Capability:
    btf = os.path.join(root, "sys/kernel/btf/vmlinux")
    if os.path.exists(btf):
        return Capability("btf", True, f"{btf} present")
    return Capability("btf", False, f"btf: {btf} missing (CONFIG_DEBUG_INFO_BTF unset)", "no BTF")


from sitsprobe.probes.plan import fallback_notes, plan  # noqa: E402  (re-export)
