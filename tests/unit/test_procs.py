import os
import shutil
import socket
from pathlib import Path

import pytest

from sitsprobe import procs
from sitsprobe.procs import ProcInfo, Selector, TcpRow
from sitsprobe.request import Endpoint

# Copied from a real /proc/<pid>/net/tcp{,6} (trailing columns trimmed):
# listeners on 0.0.0.0:2024, 127.0.0.1:48601 and [::]:48697, [::1]:36193,
# loopback connections over each, one v4 client into the [::] listener
# (the v4-mapped row), and inode-0 rows for not-yet-accepted sockets.
TCP = """\
  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000:07E8 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1594 1 00000000fc46e12e 100 0 0 10 0
   1: 0100007F:BDD9 00000000:0000 0A 00000000:00000001 00:00000000 00000000     0        0 6019 2 00000000917c544b 100 0 0 10 0
   2: 0100007F:A7DE 0100007F:BE39 01 00000000:00000000 00:00000000 00000000     0        0 6017 2 00000000d9bbcc74 20 0 0 10 -1
   3: 0100007F:BDD9 0100007F:C3B4 01 00000000:00000000 00:00000000 00000000     0        0 0 1 000000007f7bb5ce 20 0 0 10 -1
   4: 0100007F:C3B4 0100007F:BDD9 01 00000000:00000000 00:00000000 00000000     0        0 6020 2 000000004b378504 20 0 0 10 -1
"""
TCP6 = """\
  sl  local_address                         remote_address                        st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000000000000000000000000000:BE39 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 6016 1 000000004f6faeb8 100 0 0 10 0
   1: 00000000000000000000000001000000:8D61 00000000000000000000000000000000:0000 0A 00000000:00000001 00:00000000 00000000     0        0 6021 2 0000000015c4ab45 100 0 0 10 0
   2: 00000000000000000000000001000000:C4E4 00000000000000000000000001000000:8D61 01 00000000:00000000 00:00000000 00000000     0        0 6022 2 00000000165d42df 20 0 0 10 -1
   3: 00000000000000000000000001000000:8D61 00000000000000000000000001000000:C4E4 01 00000000:00000000 00:00000000 00000000     0        0 0 1 00000000e7c59751 20 0 0 10 -1
   4: 0000000000000000FFFF00000100007F:BE39 0000000000000000FFFF00000100007F:A7DE 01 00000000:00000000 00:00000000 00000000     0        0 6018 1 0000000061cfd347 20 0 0 10 -1
"""
# fd -> socket inode for a "server" holding the [::]:48697 listener and its
# accepted v4-mapped connection, plus non-socket fds.
SERVER_FDS = {0: "/dev/null", 3: "socket:[6016]", 4: "pipe:[777]", 5: "socket:[6018]"}


def make_proc(root, pid, comm="app", cmdline=b"app\0", fds=None, tcp=TCP, tcp6=TCP6):
    """A /proc/<pid> fixture; pass None to leave a file out (a process mid-exit)."""
    d = root / str(pid)
    (d / "net").mkdir(parents=True)
    for name, content in [("comm", comm and comm + "\n"), ("cmdline", cmdline),
                          ("net/tcp", tcp), ("net/tcp6", tcp6)]:
        if content is not None:
            (d / name).write_bytes(content if isinstance(content, bytes) else content.encode())
    if fds is not None:
        (d / "fd").mkdir()
        for fd, target in fds.items():
            os.symlink(target, d / "fd" / str(fd))
    return d


@pytest.fixture
def proc(tmp_path):
    make_proc(tmp_path, 100, "nginx", b"nginx: master process\0")
    make_proc(tmp_path, 200, "python3", b"python3\0-m\0gunicorn\0app:wsgi\0", fds=SERVER_FDS)
    make_proc(tmp_path, 300, "curl", b"curl\0http://localhost:48697/\0", fds={3: "socket:[6017]"})
    make_proc(tmp_path, 2, "kthreadd", b"")  # kernel thread: empty cmdline
    make_proc(tmp_path, 400, "dying", cmdline=None)  # exited between comm and cmdline
    make_proc(tmp_path, 500, comm=None)  # exited before we read anything
    (tmp_path / "self").mkdir()
    (tmp_path / "meminfo").write_text("")
    return str(tmp_path)


def test_read_info_joins_args(proc):
    assert procs.read_info(200, proc) == ProcInfo(200, "python3", "python3 -m gunicorn app:wsgi")
    assert procs.read_info(400, proc) is None
    assert procs.read_info(999, proc) is None


def test_processes_skips_kernel_threads_and_vanished(proc):
    assert sorted(p.pid for p in procs.processes(proc)) == [100, 200, 300]
    assert list(procs.processes(proc + "/missing")) == []


def test_selector_criteria():
    nginx = ProcInfo(1, "nginx", "nginx: worker process")
    assert Selector().empty() and not Selector().matches(nginx, frozenset({80}))
    assert Selector(pids=(1,)).matches(nginx)
    assert Selector(comms=("nginx",)).matches(nginx)
    assert not Selector(comms=("ngin",)).matches(nginx)
    assert Selector(cmdline=(r"worker\b",)).matches(nginx)
    assert not Selector(cmdline=(r"^worker",)).matches(nginx)
    assert Selector(ports=(80,)).matches(nginx, frozenset({443, 80}))
    assert not Selector(ports=(80,)).matches(nginx, frozenset({8080}))
    assert not Selector(ports=(80,)).empty()


def test_selector_truncates_comm_like_the_kernel_and_takes_lists():
    sel = Selector(comms=["gunicorn-worker-main"], pids=[7])
    assert sel.pids == (7,)
    assert hash(sel) == hash(Selector(comms=("gunicorn-worker-main",), pids=(7,)))
    assert sel.matches(ProcInfo(1, "gunicorn-worker", "x"))


def test_select_by_comm_reads_no_cmdline_fds_or_tables_for_non_matches(proc, monkeypatch):
    read = []
    real_cmdline = procs._cmdline
    monkeypatch.setattr(procs, "_cmdline", lambda pid, p: read.append(pid) or real_cmdline(pid, p))
    monkeypatch.setattr(procs, "socket_inodes", pytest.fail)
    monkeypatch.setattr(procs, "tcp_table", pytest.fail)
    assert procs.select(Selector(comms=("nginx", "kthreadd"), pids=(300,)), proc) == {
        100: ProcInfo(100, "nginx", "nginx: master process"),
        300: ProcInfo(300, "curl", "curl http://localhost:48697/"),
    }
    assert sorted(read) == [2, 100, 300]  # only the matches; kthreadd dropped afterwards


def test_select_by_cmdline(proc):
    assert list(procs.select(Selector(cmdline=(r"\bgunicorn\b",)), proc)) == [200]
    assert sorted(procs.select(Selector(cmdline=("",)), proc)) == [100, 200, 300]  # no 2, 400, 500


def test_select_by_port_only_matches_the_listener(proc):
    assert list(procs.select(Selector(ports=(48697,)), proc)) == [200]
    assert procs.select(Selector(ports=(48697,)), proc, need_ports=False) == {}
    assert procs.select(Selector(ports=(2024,)), proc) == {}  # nobody here owns inode 1594


def test_select_takes_known_pids_without_reading_their_sockets(proc, monkeypatch):
    """A traced server stays selected while it lives: the agent's rescan
    must not pay for its fds and net tables every second."""
    real = procs.socket_inodes

    def socket_inodes(pid, p):
        assert pid != 200, "a known pid's sockets were read"
        return real(pid, p)

    monkeypatch.setattr(procs, "socket_inodes", socket_inodes)
    found = procs.select(Selector(ports=(48697,)), proc, known={200, 400})
    assert found == {200: ProcInfo(200, "python3", "python3 -m gunicorn app:wsgi")}  # 400 is gone


def test_select_reads_each_network_namespace_once(proc, monkeypatch):
    for pid in (200, 300):  # one namespace, two processes with sockets
        os.makedirs(f"{proc}/{pid}/ns")
        os.symlink("net:[4026531840]", f"{proc}/{pid}/ns/net")
    reads = []
    real_read = procs._read
    monkeypatch.setattr(procs, "_read", lambda path: reads.append(path) or real_read(path))
    assert list(procs.select(Selector(ports=(48697,)), proc)) == [200]
    tables = [p.rsplit("/", 1)[1] for p in reads if "/net/" in p]
    assert sorted(tables) == ["tcp", "tcp6"]  # for 200 and 300 together


def test_listen_memo_reads_tables_again_only_when_sockets_change_or_age(proc, monkeypatch):
    now = [100.0]
    memo = procs.ListenMemo(max_age_s=10, clock=lambda: now[0])
    reads = []
    real = procs.tcp_table
    monkeypatch.setattr(procs, "tcp_table", lambda *a: reads.append(a[0]) or real(*a))
    select = lambda: procs.select(Selector(ports=(48697,)), proc, memo=memo)  # noqa: E731
    assert list(select()) == [200]
    assert sorted(reads) == [200, 300]  # each process holding sockets, once
    assert list(select()) == [200] and len(reads) == 2  # nothing changed: nothing read
    os.symlink("socket:[6022]", f"{proc}/300/fd/4")  # 300 opened another socket
    assert list(select()) == [200] and reads[2:] == [300]
    now[0] += 10  # a socket may have begun listening since: read all again
    assert list(select()) == [200] and sorted(reads[3:]) == [200, 300]
    shutil.rmtree(f"{proc}/300")  # exited: forgotten
    select()
    assert list(memo._memo) == [200]


def test_select_excludes_the_agent_unless_listed_by_pid(tmp_path):
    make_proc(tmp_path, os.getpid(), "sitsprobe", b"sitsprobe\0")
    assert procs.select(Selector(comms=("sitsprobe",)), str(tmp_path)) == {}
    assert list(procs.select(Selector(pids=(os.getpid(),)), str(tmp_path))) == [os.getpid()]


def test_tcp_table_parses_v4_v6_and_v4_mapped(proc):
    rows = procs.tcp_table(200, proc)
    assert len(rows) == 10
    assert rows[0] == TcpRow(Endpoint("0.0.0.0", 2024), Endpoint("0.0.0.0", 0), 0x0A, 1594)
    assert rows[2] == TcpRow(Endpoint("127.0.0.1", 42974), Endpoint("127.0.0.1", 48697), 0x01, 6017)
    assert rows[5] == TcpRow(Endpoint("::", 48697), Endpoint("::", 0), 0x0A, 6016)
    assert rows[7] == TcpRow(Endpoint("::1", 50404), Endpoint("::1", 36193), 0x01, 6022)
    assert rows[9] == TcpRow(Endpoint("127.0.0.1", 48697), Endpoint("127.0.0.1", 42974), 0x01, 6018)


def test_tcp_table_of_one_state_decodes_only_its_rows(proc, monkeypatch):
    every = procs.tcp_table(200, proc)
    decoded = []
    real = procs._endpoint
    monkeypatch.setattr(procs, "_endpoint", lambda hex_: decoded.append(hex_) or real(hex_))
    for state in (0x0A, 0x01, 0x06):
        rows = procs.tcp_table(200, proc, state=state)
        assert rows == [r for r in every if r.state == state]
        assert len(decoded) == 2 * len(rows)  # a TIME_WAIT-heavy host's rows cost a split each, no more
        decoded.clear()


def test_tcp_table_without_ipv6_or_net(tmp_path):
    make_proc(tmp_path, 1, tcp6=None)
    make_proc(tmp_path, 2, tcp=None, tcp6=None)
    assert len(procs.tcp_table(1, str(tmp_path))) == 5
    assert procs.tcp_table(2, str(tmp_path)) == []


def test_sockets_map_to_fds(proc):
    assert procs.socket_inodes(200, proc) == {6016: 3, 6018: 5}
    assert procs.listening_ports(200, proc) == frozenset({48697})
    assert procs.established(200, proc) == [
        (5, Endpoint("127.0.0.1", 48697), Endpoint("127.0.0.1", 42974))
    ]
    assert procs.established(300, proc) == [
        (3, Endpoint("127.0.0.1", 42974), Endpoint("127.0.0.1", 48697))
    ]
    assert procs.listening_ports(300, proc) == frozenset()


def test_ports_listened_on_are_the_namespaces_whoever_holds_them(proc):
    """curl (300) holds no listener, but 48697 is listened on where it lives:
    its connection from 42974 is one it opened, the server's to 48697 one accepted."""
    assert procs.ports_listened_on(300, proc) == frozenset({2024, 48601, 48697, 36193})
    assert procs.ports_listened_on(200, proc) == procs.ports_listened_on(300, proc)


def test_socket_inodes_keeps_lowest_dup(tmp_path):
    make_proc(tmp_path, 1, fds={9: "socket:[6016]", 4: "socket:[6016]"})
    assert procs.socket_inodes(1, str(tmp_path)) == {6016: 4}


@pytest.mark.parametrize("error", [FileNotFoundError, ProcessLookupError, PermissionError])
def test_fd_races_are_skipped(proc, monkeypatch, error):
    real_readlink = os.readlink

    def readlink(path):
        if path.endswith("/3"):
            raise error(path)
        return real_readlink(path)

    monkeypatch.setattr(procs.os, "readlink", readlink)
    assert procs.socket_inodes(200, proc) == {6018: 5}
    assert procs.socket_inodes(100, proc) == {}  # no fd dir: gone, or not ours


def test_real_proc_finds_own_sockets():
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        with socket.create_connection(("127.0.0.1", port)) as client, server.accept()[0] as conn:
            me = os.getpid()
            assert port in procs.listening_ports(me)
            found = procs.established(me)
            for s in (client, conn):
                assert (s.fileno(), Endpoint(*s.getsockname()), Endpoint(*s.getpeername())) in found
            assert me in procs.select(Selector(pids=(me,), ports=(port,)))
            assert me not in procs.select(Selector(ports=(port,)))


def test_names_keep_the_traced_and_the_last_few_that_exited():
    from sitsprobe.procs import Names

    names = Names(keep=2)
    for pid in (1, 2, 3, 4):
        names[pid] = f"p{pid}"
    for pid in (1, 2, 3):
        names.retire(pid)
    assert names == {2: "p2", 3: "p3", 4: "p4"}  # 1, the oldest gone, is forgotten; 4 still traced
    names[2] = "again"  # a pid reused by a process traced again
    names.retire(3)
    names.retire(4)
    names.retire(99)  # never traced: nothing to keep
    assert names == {2: "again", 3: "p3", 4: "p4"}
    names.retire(2)
    assert names == {4: "p4", 2: "again"}


def test_rescan_reads_the_traced_and_the_young_and_everything_now_and_then(proc, monkeypatch):
    """What an idle node pays for the agent: a rescan reads the traced
    processes (a rename changes their name) and those it first found
    unselected less than settle_s ago (a program renames itself as it
    starts); the rest only at the next full scan, or when the agent asks
    (a notice the kernel lost), or once one execs."""
    now = [0.0]
    reads = []
    real = procs._comm
    monkeypatch.setattr(procs, "_comm", lambda pid, p: reads.append(pid) or real(pid, p))
    scan = procs.Rescan(Selector(comms=("nginx",)), proc, settle_s=10, full_every_s=30, clock=lambda: now[0])

    def read(known=(), dt=1.0):
        reads.clear()
        now[0] += dt
        found = scan(known)
        return sorted(found), sorted(set(reads))

    assert read(dt=0) == ([100], [2, 100, 200, 300, 400, 500])  # the first scan is a full one
    assert read({100}) == ([100], [100])  # what it found is old: only the traced one
    make_proc(Path(proc), 600, "python3", b"python3\0server.py\0")  # started ...
    assert read({100}) == ([100], [100, 600])
    with open(f"{proc}/600/comm", "w") as f:
        f.write("nginx\n")  # ... and renamed itself as it started
    with open(f"{proc}/200/comm", "w") as f:
        f.write("nginx\n")  # an old one renamed itself too
    assert read({100}) == ([100, 600], [100, 600])  # 200 not yet
    scan.fresh(300)  # 300 exec'd: young again
    assert read({100, 600}) == ([100, 600], [100, 300, 600])
    shutil.rmtree(f"{proc}/300")  # exited: forgotten
    assert read({100, 600}) == ([100, 600], [100, 600])
    assert 300 not in scan.unselected
    make_proc(Path(proc), 700, "sleep", b"sleep\0999\0")
    assert read({100, 600}) == ([100, 600], [100, 600, 700])
    assert read({100, 600}, dt=9) == ([100, 600], [100, 600, 700])  # young for 10 s
    assert read({100, 600}) == ([100, 600], [100, 600])  # then passed over
    assert read({100, 600}, dt=30) == ([100, 200, 600], [2, 100, 200, 400, 500, 600, 700])  # the full scan
    assert read({100, 200, 600}) == ([100, 200, 600], [100, 200, 600])  # no one young: the full scan kept their age
    scan.read_all()  # asked for: everything again, at once
    assert read({100, 200, 600}, dt=0)[1] == [2, 100, 200, 400, 500, 600, 700]
