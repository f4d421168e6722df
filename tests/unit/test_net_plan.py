"""How the socket tier follows connections: by their first call and their TCP
state where the kernel's BTF locates struct sock's family and type and
struct unix_sock's address, else through the accept, connect and close
syscall tracepoints."""
from __future__ import annotations

import struct

from sitsprobe.probes import hooks, net_plan
from sitsprobe.probes.btf import BTF_MAGIC
from sitsprobe.probes.net import cflags, conn_by_state, pid_bitmap_words, tail_calls

KERNEL = {"sock": [("__sk_common", 0), ("sk_type", 534)], "sock_common": [("skc_family", 16)],
          "unix_sock": [("sk", 0), ("addr", 784)]}


def btf_blob(structs: dict[str, list[tuple[str, int]]]) -> bytes:
    """A BTF type section of an int and the structs given (member, byte offset)."""
    names = ["int", *structs, *(m for members in structs.values() for m, _ in members)]
    strings = b"\0" + b"".join(n.encode() + b"\0" for n in dict.fromkeys(names))
    at = lambda n: strings.index(b"\0" + n.encode() + b"\0") + 1  # noqa: E731
    types = struct.pack("<III", at("int"), 1 << 24, 4) + struct.pack("<I", 32)
    for name, members in structs.items():
        types += struct.pack("<III", at(name), 4 << 24 | len(members), 4096)
        types += b"".join(struct.pack("<III", at(m), 1, off * 8) for m, off in members)
    header = struct.pack("<HBBIIIII", BTF_MAGIC, 1, 0, 24, 0, len(types), len(types), len(strings))
    return header + types + strings


def test_the_offsets_come_from_the_kernels_btf(tmp_path):
    path = tmp_path / "vmlinux"
    path.write_bytes(btf_blob(KERNEL))
    assert net_plan.connection_offsets(str(path)) == (16, 534, 784)
    # a kernel whose Unix sockets are a module's (their BTF is not vmlinux's)
    path.write_bytes(btf_blob({k: v for k, v in KERNEL.items() if k != "unix_sock"}))
    assert net_plan.connection_offsets(str(path)) is None
    assert net_plan.connection_offsets(str(tmp_path / "none")) is None


def _plan() -> dict:
    return {"socket_io": hooks.SOCKET_TIER, "tcp_state": hooks.CONNECTIONS_BY_STATE,
            **{p: hooks.NET_POINTS[p][0] for p in hooks.CONNECTION_SYSCALLS}}


def test_with_the_offsets_the_socket_tier_takes_no_syscall_tracepoint(monkeypatch):
    monkeypatch.setattr(net_plan, "connection_offsets", lambda _path: (16, 534, 784))
    plan = _plan()
    assert net_plan.follow_connections(plan, say=True) == (16, 534, 784)
    assert plan["connections"] == hooks.CONNECTIONS_BY_STATE
    assert not any(h.kind == hooks.TRACEPOINT and h.target.startswith("syscalls:") for h in plan.values())
    # the syscall tier keeps its hooks: the offsets are not even looked for
    plan = {**_plan(), "socket_io": hooks.SYSCALL_TIER}
    assert net_plan.follow_connections(plan, say=True) is None
    assert plan == {**_plan(), "socket_io": hooks.SYSCALL_TIER}


def test_without_them_the_syscall_tracepoints_stay_and_the_log_says_why(monkeypatch, caplog):
    monkeypatch.setattr(net_plan, "connection_offsets", lambda _path: None)
    plan = _plan()
    caplog.set_level("INFO", logger="sitsprobe")
    assert net_plan.follow_connections(plan, say=True) is None
    assert plan == _plan()
    assert "using the accept, connect and close syscall tracepoints" in caplog.text


def test_the_offsets_reach_net_c_on_the_socket_tier_only():
    base = dict(request_bytes=256, response_bytes=64, max_connections=64, ring_buffer_mib=1,
                sock_offsets=(16, 534, 784))
    sock = cflags(socket_io=hooks.SOCKET_TIER, **base)
    assert {"-DSOCK_FAMILY_OFF=16", "-DSOCK_TYPE_OFF=534", "-DUNIX_ADDR_OFF=784"} <= set(sock)
    syscall = cflags(socket_io=hooks.SYSCALL_TIER, tcp_sendmsg=hooks.NET_POINTS["tcp_sendmsg"][2], **base)
    assert not any(f.startswith(("-DSOCK_", "-DUNIX_")) for f in syscall)


def test_connections_followed_by_their_state_end_in_a_tail_call():
    """end_conn (scan_prog's 6) where net.c is compiled CONN_BY_STATE: the
    socket tier with struct sock's offsets; else none (the syscall tier's
    close tracepoint ends them). The integration tests load what this names."""
    base = dict(request_bytes=256, response_bytes=64, max_connections=64, ring_buffer_mib=1)
    by_state = cflags(socket_io=hooks.SOCKET_TIER, sock_offsets=(16, 534, 784), bins=["-DBINS=1"], **base)
    assert conn_by_state(by_state)
    assert tail_calls(by_state) == {0: b"scan_head", 1: b"send_beat", 2: b"send_chunk", 3: b"keep_payload",
                                    4: b"split_body", 5: b"find_shape", 6: b"end_conn", 8: b"send_more"}
    for flags in (cflags(socket_io=hooks.SOCKET_TIER, **base),
                  cflags(socket_io=hooks.SYSCALL_TIER, tcp_sendmsg=hooks.NET_POINTS["tcp_sendmsg"][2],
                         sock_offsets=(16, 534, 784), **base)):
        assert not conn_by_state(flags) and 6 not in tail_calls(flags) and 5 not in tail_calls(flags)


def test_the_tracked_process_bitmaps_cover_pid_max(tmp_path):
    """net.c's bitmaps of tracked processes are as long as pid_max, in words
    of 64 pids: Debian's default 32768, systemd's 4194304 (the 64-bit limit),
    an odd one rounded up; where pid_max cannot be read, the limit."""
    pid_max = tmp_path / "pid_max"
    for text, words in (("32768\n", 512), ("4194304\n", 65536), ("100\n", 2), ("64\n", 1)):
        pid_max.write_text(text)
        assert pid_bitmap_words(str(pid_max)) == words, text
    pid_max.write_text("not a number\n")
    assert pid_bitmap_words(str(pid_max)) == 65536
    assert pid_bitmap_words(str(tmp_path / "missing")) == 65536
    flags = cflags(socket_io=hooks.SOCKET_TIER, request_bytes=256, response_bytes=64, max_connections=64,
                   ring_buffer_mib=1, pid_words=3)
    assert "-DPID_WORDS=3" in flags
