"""resp_get_results: GET/MGET hits and misses from request and reply bytes."""
import random

import pytest

from sitsprobe.stitch.protocols.resp import resp_get_results


def cmd(*args: bytes) -> bytes:
    return b"*%d\r\n" % len(args) + b"".join(b"$%d\r\n%s\r\n" % (len(a), a) for a in args)


def bulk(v: bytes | None) -> bytes:
    return b"$-1\r\n" if v is None else b"$%d\r\n%s\r\n" % (len(v), v)


def test_single_get_hit_and_miss():
    assert resp_get_results(cmd(b"GET", b"user:1"), bulk(b"alice")) == [(b"user:1", True)]
    assert resp_get_results(cmd(b"GET", b"user:2"), b"$-1\r\n") == [(b"user:2", False)]
    assert resp_get_results(cmd(b"get", b"k"), bulk(b"")) == [(b"k", True)]  # empty value: a hit


def test_resp3_null_and_attribute_and_push():
    assert resp_get_results(cmd(b"GET", b"a"), b"_\r\n") == [(b"a", False)]
    pushed = b">3\r\n$7\r\nmessage\r\n$2\r\nch\r\n$2\r\nhi\r\n"
    attr = b"|1\r\n+ttl\r\n:5\r\n"
    reply = pushed + attr + bulk(b"v") + pushed + b"_\r\n"
    assert resp_get_results(cmd(b"GET", b"a") + cmd(b"GET", b"b"), reply) == [(b"a", True), (b"b", False)]


def test_pipeline_with_other_commands_between():
    req = (cmd(b"SET", b"x:1", b"v") + cmd(b"GET", b"x:1") + cmd(b"INCR", b"n")
           + cmd(b"GET", b"x:2") + cmd(b"HGETALL", b"h") + cmd(b"GET", b"x:3"))
    rep = (b"+OK\r\n" + bulk(b"v") + b":1\r\n" + bulk(None)
           + b"*2\r\n$1\r\nf\r\n$1\r\nv\r\n" + bulk(b"w"))
    assert resp_get_results(req, rep) == [(b"x:1", True), (b"x:2", False), (b"x:3", True)]


def test_mget_and_resp3_map_reply():
    req = cmd(b"HELLO", b"3") + cmd(b"MGET", b"a", b"b", b"c")
    rep = b"%1\r\n+server\r\n+redis\r\n" + b"*3\r\n" + bulk(b"1") + b"_\r\n" + bulk(b"3")
    assert resp_get_results(req, rep) == [(b"a", True), (b"b", False), (b"c", True)]


def test_errors_are_not_counted():
    req = cmd(b"GET", b"list") + cmd(b"GET", b"k")
    rep = b"-WRONGTYPE Operation against a key holding the wrong kind of value\r\n" + bulk(b"v")
    assert resp_get_results(req, rep) == [(b"k", True)]


def test_inline_commands():
    assert resp_get_results(b"GET user:9\r\nGET user:8\n", bulk(b"x") + bulk(None)) == [
        (b"user:9", True), (b"user:8", False)]


def test_multi_exec_pairs_queued_commands():
    req = (cmd(b"MULTI") + cmd(b"GET", b"a") + cmd(b"SET", b"b", b"1") + cmd(b"MGET", b"b", b"c")
           + cmd(b"EXEC"))
    rep = (b"+OK\r\n+QUEUED\r\n+QUEUED\r\n+QUEUED\r\n"
           b"*3\r\n" + bulk(None) + b"+OK\r\n" + b"*2\r\n" + bulk(b"1") + bulk(None))
    assert resp_get_results(req, rep) == [(b"a", False), (b"b", True), (b"c", False)]
    aborted = cmd(b"MULTI") + cmd(b"GET", b"a") + cmd(b"EXEC") + cmd(b"GET", b"z")
    assert resp_get_results(aborted, b"+OK\r\n+QUEUED\r\n*-1\r\n" + bulk(b"q")) == [(b"z", True)]
    discarded = cmd(b"MULTI") + cmd(b"GET", b"a") + cmd(b"DISCARD") + cmd(b"GET", b"y")
    assert resp_get_results(discarded, b"+OK\r\n+QUEUED\r\n+OK\r\n" + bulk(None)) == [(b"y", False)]


def test_client_reply_off_and_skip():
    req = (cmd(b"CLIENT", b"REPLY", b"SKIP") + cmd(b"GET", b"unanswered") + cmd(b"GET", b"a")
           + cmd(b"CLIENT", b"REPLY", b"OFF") + cmd(b"GET", b"b") + cmd(b"CLIENT", b"REPLY", b"ON")
           + cmd(b"GET", b"c"))
    rep = bulk(b"1") + b"+OK\r\n" + bulk(None)
    assert resp_get_results(req, rep) == [(b"a", True), (b"c", False)]


def test_subscribe_stops_pairing():
    req = cmd(b"GET", b"a") + cmd(b"SUBSCRIBE", b"ch") + cmd(b"GET", b"b")
    rep = bulk(b"1") + b"*3\r\n$9\r\nsubscribe\r\n$2\r\nch\r\n:1\r\n" + bulk(b"2")
    assert resp_get_results(req, rep) == [(b"a", True)]


def test_cut_reply_goes_as_far_as_the_bytes_allow():
    req = cmd(b"GET", b"a") + cmd(b"GET", b"b") + cmd(b"GET", b"c")
    rep = bulk(b"1") + b"$1000\r\nxxxxxxxx"  # b's value cut short: its length says it exists
    assert resp_get_results(req, rep) == [(b"a", True), (b"b", True)]
    assert resp_get_results(req, bulk(b"1") + b"$10") == [(b"a", True)]  # header cut: unknown
    mget = cmd(b"MGET", b"a", b"b", b"c", b"d")
    assert resp_get_results(mget, b"*4\r\n$1\r\n1\r\n$-1\r\n$50\r\nabc") == [
        (b"a", True), (b"b", False), (b"c", True)]


def test_cut_request_keeps_the_head_of_the_key():
    req = cmd(b"GET", b"a") + b"*2\r\n$3\r\nGET\r\n$200\r\nsession:12345"
    assert resp_get_results(req, bulk(b"1") + bulk(None)) == [(b"a", True), (b"session:12345", False)]
    assert resp_get_results(cmd(b"GET", b"a") + b"*2\r\n$3\r\nGE", bulk(b"1") + bulk(b"2")) == [(b"a", True)]
    cut_mget = b"*3\r\n$4\r\nMGET\r\n$1\r\na\r\n$1"
    assert resp_get_results(cut_mget, b"*2\r\n$1\r\n1\r\n$-1\r\n") == [(b"a", True)]


def test_more_replies_than_requests_or_none():
    assert resp_get_results(cmd(b"GET", b"a"), bulk(b"1") + bulk(b"2")) == [(b"a", True)]
    assert resp_get_results(cmd(b"GET", b"a"), b"") == []
    assert resp_get_results(b"", bulk(b"1")) == []
    assert resp_get_results(None, None) == []


@pytest.mark.parametrize("req, rep", [
    (cmd(b"GET", b"a"), b"*99999999999999999999\r\n"),
    (cmd(b"MGET", b"a"), b"*4294967296\r\n$1\r\n1\r\n"),
    (b"*9999999\r\n$3\r\nGET\r\n", bulk(b"1")),
    (cmd(b"GET", b"a"), b"*1\r\n" * 100000),
    (cmd(b"GET", b"a"), b"$-7\r\n"),
    (cmd(b"GET", b"a"), b"$abc\r\nxyz\r\n"),
    (cmd(b"GET", b"a"), b"$3\r\nabcdef\r\n"),
    (cmd(b"GET", b"a"), b"?what\r\n"),
    (cmd(b"GET", b"a"), b"_garbage\r\n"),
    (cmd(b"GET", b"a"), b"~-1\r\n"),
    (b"*2\r\n$-1\r\n$1\r\na\r\n", bulk(b"1")),
    (b"*2\r\nGET\r\n", bulk(b"1")),
    (b"\x00\xff" * 1000, b"\r\n" * 1000),
    (bytearray(cmd(b"GET", b"a")), memoryview(bulk(b"1"))),
])
def test_hostile_bytes_never_raise(req, rep):
    out = resp_get_results(req, rep)
    assert isinstance(out, list)
    assert all(isinstance(k, bytes) and isinstance(h, bool) for k, h in out)


def test_fuzzed_bytes_never_raise():
    rng = random.Random(1234)
    good_req = cmd(b"GET", b"a") + cmd(b"MGET", b"b", b"c") + cmd(b"MULTI") + cmd(b"GET", b"d") + cmd(b"EXEC")
    good_rep = bulk(b"1") + b"*2\r\n$-1\r\n_\r\n" + b"+OK\r\n+QUEUED\r\n*1\r\n" + bulk(b"x")
    assert resp_get_results(good_req, good_rep) == [(b"a", True), (b"b", False), (b"c", False), (b"d", True)]
    for _ in range(3000):
        req, rep = bytearray(good_req), bytearray(good_rep)
        for buf in (req, rep):
            for _ in range(rng.randrange(1, 6)):
                op, i = rng.randrange(3), rng.randrange(len(buf) + 1)
                if op == 0 and buf:
                    buf[min(i, len(buf) - 1)] = rng.randrange(256)
                elif op == 1:
                    alphabet = b"*$:-+_\r\n0123456789%>|~"
                    buf[i:i] = bytes(rng.choice(alphabet) for _ in range(rng.randrange(1, 4)))
                else:
                    del buf[i:i + rng.randrange(1, 8)]
        out = resp_get_results(bytes(req), bytes(rep))
        assert isinstance(out, list) and len(out) <= 4
