"""stitch.join: requests the kernel linked become one trace, in whatever order they finish."""
from __future__ import annotations

import itertools

from sitsprobe.request import Link, Request, TraceParent
from sitsprobe.stitch.join import Joiner

MS = 1_000_000
GATEWAY, ENGINE = 10, 20  # pids


def req(pid, fd, start, end, direction="server", link=None, calls=0, traceparent=None) -> Request:
    return Request(pid, "p", fd, start * MS, end * MS, start * MS, 10, 10, direction=direction,
                   link=link, calls=calls, traceparent=traceparent)


# the gateway serves S1 on fd 5 and calls the engine on fd 7 (C1); the engine answers it on fd 9 (S2)
S1 = req(GATEWAY, 5, 0, 100, calls=1)
C1 = req(GATEWAY, 7, 10, 90, "client", Link(GATEWAY, 5, 0), calls=1)
S2 = req(ENGINE, 9, 11, 89, link=Link(GATEWAY, 7, 0))


def shape(traces) -> dict:
    """{request: (its trace, its parent request or None, how)} over all traces."""
    spans = [s for t in traces for s in t.spans]
    by_id = {s.span_id: s.req for s in spans}
    return {s.req: (s.trace_id, by_id.get(s.parent_id), s.via) for s in spans}


def test_a_request_nothing_links_goes_out_alone_at_once():
    j = Joiner(wait_ns=1000 * MS)
    lone = req(1, 3, 0, 5)
    [t] = j.add(lone, 0)
    assert [s.req for s in t.spans] == [lone] and not t.late and t.spans[0].parent_id is None
    assert j.waiting() == 0


def test_gateway_call_engine_is_one_trace_whatever_order_they_finish_in():
    for order in itertools.permutations([S1, C1, S2]):
        j = Joiner(wait_ns=1000 * MS)
        traces = []
        for r in order:
            for t in j.add(r, 0):
                t.exported = True  # as the agent's exporter marks it
                traces.append(t)
        got = shape(traces)
        assert set(got) == {S1, C1, S2}, order
        assert len({tid for tid, _, _ in got.values()}) == 1, order
        assert got[S1][1] is None and got[C1][1:] == (S1, "thread") and got[S2][1:] == (C1, "connection"), order
        assert j.waiting() == 0 and j.timed_out == 0


def test_a_late_child_of_a_trace_still_held_by_the_sampler_goes_with_it():
    j = Joiner(wait_ns=1000 * MS)
    [t] = j.add(S1, 0)  # not exported: the sampler holds it
    assert j.add(C1, 0) == []
    assert [s.req for s in t.spans] == [S1, C1] and t.spans[1].parent_id == t.spans[0].span_id


def test_a_late_child_of_a_trace_that_went_out_is_a_late_part_of_it():
    j = Joiner(wait_ns=1000 * MS)
    [t] = j.add(S1, 0)
    t.exported = True
    [late] = j.add(C1, 0)
    assert late.late and late.spans[0].trace_id == t.spans[0].trace_id
    assert late.spans[0].parent_id == t.spans[0].span_id


def test_a_call_begun_after_the_response_ended_is_not_its_child():
    j = Joiner(wait_ns=1000 * MS)
    after = C1._replace(start_ns=150 * MS, end_ns=160 * MS)
    assert j.add(after, 0) == []
    traces = j.add(S1, 0)
    assert len(traces) == 2 and all(len(t.spans) == 1 for t in traces)


def run(order, j: Joiner, until_ns: int = 0) -> list:
    traces = []
    for r in order:
        traces += j.add(r, 0)
        for t in traces:
            t.exported = True  # as the agent's exporter marks it
    return traces + j.expire(until_ns)


def test_a_call_carrying_the_traceparent_its_gateway_was_sent_is_that_requests():
    """An event-loop gateway (nginx, HAProxy) serves A and B at once and
    forwards each one's traceparent on its call; the kernel's guess (the
    request the thread last read) gave both calls to B. The header wins:
    each call is the child of the request that carried it, each callee of
    its call, each trace the header's, in whatever order they finish."""
    ta, tb = TraceParent(0xA, 0xA1, 1), TraceParent(0xB, 0xB1, 1)
    a = req(GATEWAY, 5, 0, 100, traceparent=ta)
    b = req(GATEWAY, 6, 5, 100, calls=2, traceparent=tb)
    ka = req(GATEWAY, 7, 10, 80, "client", Link(GATEWAY, 6, 5), calls=1, traceparent=ta)
    kb = req(GATEWAY, 8, 20, 90, "client", Link(GATEWAY, 6, 5), calls=1, traceparent=tb)
    sa = req(ENGINE, 9, 11, 79, link=Link(GATEWAY, 7, 0), traceparent=ta)
    sb = req(ENGINE, 10, 21, 89, link=Link(GATEWAY, 8, 0), traceparent=tb)
    for order in itertools.permutations([a, b, ka, kb, sa, sb]):
        j = Joiner(wait_ns=1000 * MS)
        got = shape(run(order, j))
        assert got == {a: (0xA, None, None), ka: (0xA, a, "traceparent"), sa: (0xA, ka, "connection"),
                       b: (0xB, None, None), kb: (0xB, b, "traceparent"), sb: (0xB, kb, "connection")}, order
        assert j.waiting() == 0 and j.timed_out == 0, order
        j.expire(1101 * MS)  # requests sent a header are remembered wait_ns after they end, no longer
        assert not j._headers and not j._open_headers, order


def test_a_call_whose_traceparent_no_request_of_its_process_carried_is_that_spans_child():
    """An instrumented caller sends its own span's traceparent: no request it
    served carried it, so the call waits for one, then goes out under the
    header's span, with its callee under it (not counted as alone)."""
    own = TraceParent(trace_id=0xABC, span_id=0xDEF, flags=1)
    call, callee = C1._replace(traceparent=own), S2._replace(traceparent=own)
    for order in itertools.permutations([S1, call, callee]):
        j = Joiner(wait_ns=100 * MS)
        got = shape(run(order, j, until_ns=100 * MS))
        assert got[call] == (0xABC, None, None) and got[callee] == (0xABC, call, "connection"), order
        assert got[S1][1] is None and got[S1][0] != 0xABC, order
        assert j.waiting() == 0 and j.timed_out == 0, order


def test_a_call_outside_the_request_that_carried_its_header_waits_for_the_next_that_did():
    """A client that sends the same traceparent on two requests in a row (a
    retry): each call is the child of the one it was made during."""
    tp = TraceParent(0xA, 0xA1, 1)
    first, second = req(GATEWAY, 5, 0, 50, traceparent=tp), req(GATEWAY, 5, 60, 120, traceparent=tp)
    k1 = req(GATEWAY, 7, 10, 40, "client", Link(GATEWAY, 5, 0), traceparent=tp)
    k2 = req(GATEWAY, 7, 70, 110, "client", Link(GATEWAY, 5, 60), traceparent=tp)
    for order in itertools.permutations([first, second, k1, k2]):
        j = Joiner(wait_ns=1000 * MS)
        got = shape(run(order, j))
        assert got[k1][1:] == (first, "traceparent") and got[k2][1:] == (second, "traceparent"), order
        assert j.waiting() == 0, order


def test_what_waits_too_long_goes_out_alone_and_is_counted():
    j = Joiner(wait_ns=100 * MS)
    assert j.add(C1, 0) == [] and j.add(S2, 0) == []  # S2 waits with C1, which waits for S1
    assert j.expire(50 * MS) == []
    [t] = j.expire(100 * MS)
    assert [s.req for s in t.spans] == [C1, S2] and j.timed_out == 1 and j.waiting() == 0


def test_a_callee_on_another_connection_of_the_caller_is_not_joined():
    j = Joiner(wait_ns=100 * MS)
    other = S2._replace(link=Link(GATEWAY, 8, 0))
    j.add(C1, 0)
    assert j.add(other, 0) == []
    [t] = j.add(S1, 0)
    assert other not in {s.req for s in t.spans}
    [alone] = j.expire(100 * MS)
    assert [s.req for s in alone.spans] == [other]


def test_calls_multiplexed_on_one_connection_are_told_apart_by_stream():
    from sitsprobe.request import H2

    j = Joiner(wait_ns=1000 * MS)
    # two gRPC calls at once on the gateway's fd 7: streams 1 and 3; the engine serves both on fd 9
    calls = [req(GATEWAY, 7, 10, 90, "client", Link(GATEWAY, 5, 0), calls=1)._replace(h2=H2(sid))
             for sid in (1, 3)]
    served = [req(ENGINE, 9, 12 + sid, 80, link=Link(GATEWAY, 7, 0, stream=sid))._replace(h2=H2(sid))
              for sid in (3, 1)]
    traces = []
    for r in (*served, *calls, S1):
        for t in j.add(r, 0):
            t.exported = True
            traces.append(t)
    got = shape(traces)
    for s in served:
        parent = got[s][1]
        assert parent.h2.stream_id == s.h2.stream_id and got[s][2] == "connection"


def test_an_answer_read_before_its_calls_send_returned_is_that_calls_child():
    """The socket tier times a call from the end of its send, and on loopback
    the server reads the request before that: 3 µs here. Two calls in turn on
    one keep-alive connection each get their own answer, in any order the
    answers arrive in (the calls come in order, as the kernel reports them)."""
    us = 1000
    calls = [Request(GATEWAY, "p", 7, start, start + 5 * MS, start, 10, 10, direction="client",
                     link=Link(GATEWAY, 5, 0), calls=1) for start in (10 * MS, 16 * MS)]
    served = [Request(ENGINE, "p", 9, c.start_ns - 3 * us, c.end_ns - us, c.start_ns, 10, 10,
                      link=Link(GATEWAY, 7, 0)) for c in calls]
    for answers in itertools.permutations(served):
        for cut in range(3):  # where the calls come among the answers
            j = Joiner(wait_ns=1000 * MS)
            traces = []
            for r in (*answers[:cut], *calls, *answers[cut:], S1):
                for t in j.add(r, 0):
                    t.exported = True
                    traces.append(t)
            got = shape(traces)
            assert [got[s][1:] for s in served] == [(c, "connection") for c in calls], (answers, cut)
            assert j.waiting() == 0 and j.timed_out == 0


def test_an_answer_read_long_before_its_calls_send_returned_is_still_that_calls_child():
    """A caller that waited for a CPU between its bytes moving and its send
    returning (a stalled vCPU: 30 ms here) is timed from long after the
    server read the request: the call before it on the connection ended
    earlier still, and that bounds the answer; not a fixed lag."""
    first = req(GATEWAY, 7, 10, 15, "client", Link(GATEWAY, 5, 0), calls=1)
    late = req(GATEWAY, 7, 50, 55, "client", Link(GATEWAY, 5, 0), calls=1)
    answers = [req(ENGINE, 9, 10, 14, link=Link(GATEWAY, 7, 0)), req(ENGINE, 9, 20, 54, link=Link(GATEWAY, 7, 0))]
    for order in ((first, *answers, late), (first, late, *answers), (*answers, first, late)):
        j = Joiner(wait_ns=1000 * MS)
        traces = []
        for r in (*order, S1):
            for t in j.add(r, 0):
                t.exported = True
                traces.append(t)
        got = shape(traces)
        assert [got[a][1:] for a in answers] == [(first, "connection"), (late, "connection")], order
        assert j.waiting() == 0 and j.timed_out == 0


def test_an_answer_begun_long_before_a_connections_first_call_is_not_its_child():
    j = Joiner(wait_ns=100 * MS)
    stale = req(ENGINE, 9, 20, 54, link=Link(GATEWAY, 7, 0))
    call = req(GATEWAY, 7, 50, 55, "client", Link(GATEWAY, 5, 0), calls=1)
    assert j.add(stale, 0) == [] and j.add(call, 0) == []
    [t] = j.add(S1, 0)
    assert [s.req for s in t.spans] == [S1, call] and j.waiting() == 1


def test_an_answer_the_kernel_counted_for_no_call_still_finds_its_call():
    """The caller's hook and the server's read race (each on its own CPU):
    the kernel may count no callee for a call whose answer then comes. The
    call, placed already, still takes it, whichever comes first."""
    call = req(GATEWAY, 7, 10, 15, "client", Link(GATEWAY, 5, 0), calls=0)
    answer = req(ENGINE, 9, 11, 14, link=Link(GATEWAY, 7, 0))
    for order in itertools.permutations([S1, call, answer]):
        j = Joiner(wait_ns=1000 * MS)
        traces = []
        for r in order:
            for t in j.add(r, 0):
                t.exported = True
                traces.append(t)
        got = shape(traces)
        assert got[answer][1:] == (call, "connection") and got[call][1:] == (S1, "thread"), order
        assert len({tid for tid, _, _ in got.values()}) == 1 and j.waiting() == 0, order
