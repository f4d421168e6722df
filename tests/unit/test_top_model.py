"""`sitsprobe top`'s model on two real scrapes of an agent 2 s apart
(engine under load, no GPU) and on the same page with GPU lines added.
Expected numbers are worked out by hand from the files."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from sitsprobe.top.model import (
    AlertRow,
    EngineRow,
    HttpRow,
    PrefixCacheRow,
    diff,
    parse,
    parse_alerts,
    quantile,
    sort_http,
)

FIX = Path(__file__).parent / "fixtures" / "top"


def page(name: str, at: float = 0.0):
    return parse((FIX / name).read_text(), at)


@pytest.fixture(scope="module")
def view():
    return diff(page("metrics1.txt"), page("metrics2.txt", 2.0), 2.0)


def test_parse_keeps_each_sample_by_its_labels():
    snap = page("metrics2.txt", 5.0)
    assert snap.at == 5.0
    assert snap.series("sitsprobe_events_received_total") == {(): 169.0}
    assert snap.series("sitsprobe_http_server_requests_total") == {
        (("http_response_status_code", "200"), ("pid", "21859"), ("process", "python")): 169.0}
    buckets = snap.series("http_server_request_duration_seconds_bucket")
    assert len(buckets) == 15 and buckets[(
        ("http_request_method", "POST"), ("http_response_status_code", "200"), ("http_route", "/v1/chat/completions"),
        ("le", "+Inf"), ("process", "python"))] == 168.0


def test_parse_rejects_a_page_that_is_not_prometheus_text():
    with pytest.raises(ValueError):
        parse("<html>{{{ 1</html>", 0.0)


def test_quantile_interpolates_inside_the_bucket_like_histogram_quantile():
    buckets = [(0.1, 10.0), (0.2, 30.0), (float("inf"), 40.0)]
    assert quantile(0.25, buckets) == pytest.approx(0.1)  # rank 10: the top of the first bucket
    assert quantile(0.5, buckets) == pytest.approx(0.15)  # rank 20: halfway through (0.1, 0.2]
    assert quantile(0.05, buckets) == pytest.approx(0.02)  # the first bucket starts at 0
    assert quantile(0.99, buckets) == 0.2  # in +Inf: the highest finite bound
    assert quantile(0.5, [(0.1, 0.0), (float("inf"), 0.0)]) is None
    assert quantile(0.5, []) is None


def test_http_rate_counts_kernel_responses_over_the_interval(view):
    (row,) = view.http
    assert (row.process, row.pids) == ("python", ("21859",))
    assert row.rate == (169 - 148) / 2  # the kernel's exact count
    assert row.error_ratio == 0.0


def test_http_latency_comes_from_the_buckets_of_the_interval_only(view):
    # bucket deltas: (0.025]: 7-7=0, (0.05]: 142-123=19, (0.075]: 167-147=20, +Inf: 168-148=20
    (row,) = view.http
    assert row.p50 == pytest.approx(0.025 + 0.025 * 10 / 19)  # rank 10 of 20, 19 in (0.025, 0.05]
    assert row.p99 == pytest.approx(0.05 + 0.025 * (19.8 - 19) / (20 - 19))


def test_engine_row_from_the_genai_histograms(view):
    (row,) = view.engine
    assert (row.process, row.model) == ("python", "sitsprobe-tiny-gpt")
    assert row.rate == (168 - 148) / 2  # requests: the duration histogram's count
    # ttft deltas: (0.005]: 1-1=0, (0.01]: 21-20=1, (0.02]: 153-133=20, total 20
    assert row.ttft_p50 == pytest.approx(0.01 + 0.01 * (10 - 1) / (20 - 1))
    assert row.ttft_p99 == pytest.approx(0.01 + 0.01 * (19.8 - 1) / (20 - 1))
    assert row.tpot_p50 == pytest.approx(0.01 * 10 / 20)  # all 20 in (0, 0.01]
    assert row.tpot_p99 == pytest.approx(0.01 * 19.8 / 20)
    # the fixture scrapes predate the token and slow-tail counters
    assert (row.output_tokens_rate, row.slow_segment, row.slow_share) == (None, None, None)


def test_prefix_cache_by_process(view):
    # 166-146=20 hits, 2-2=0 misses; since start from the agent's gauge
    assert view.prefix_caches == [PrefixCacheRow("python", 1.0, pytest.approx(166 / 168))]


GENAI_PAGE = """\
# TYPE gen_ai_server_request_duration_seconds histogram
gen_ai_server_request_duration_seconds_bucket{{le="1.0",gen_ai_request_model="[org]/7b",process="vllm"}} {fast}
gen_ai_server_request_duration_seconds_bucket{{le="+Inf",gen_ai_request_model="[org]/7b",process="vllm"}} {requests}
gen_ai_server_request_duration_seconds_count{{gen_ai_request_model="[org]/7b",process="vllm"}} {requests}
gen_ai_server_request_duration_seconds_sum{{gen_ai_request_model="[org]/7b",process="vllm"}} 1.0
# TYPE gen_ai_server_tokens counter
gen_ai_server_tokens_total{{gen_ai_request_model="[org]/7b",process="vllm",gen_ai_token_type="input"}} {input}
gen_ai_server_tokens_total{{gen_ai_request_model="[org]/7b",process="vllm",gen_ai_token_type="output"}} {output}
# TYPE sitsprobe_gen_ai_slow_tail_segment_seconds counter
sitsprobe_gen_ai_slow_tail_segment_seconds_total{{gen_ai_request_model="[org]/7b",process="vllm",segment="network"}} {network}
sitsprobe_gen_ai_slow_tail_segment_seconds_total{{gen_ai_request_model="[org]/7b",process="vllm",segment="scheduling"}} {sched}
sitsprobe_gen_ai_slow_tail_segment_seconds_total{{gen_ai_request_model="[org]/7b",process="vllm",segment="compute"}} {compute}
sitsprobe_gen_ai_slow_tail_segment_seconds_total{{gen_ai_request_model="[org]/7b",process="vllm",segment="io"}} 0
sitsprobe_gen_ai_slow_tail_segment_seconds_total{{gen_ai_request_model="tiny",process="python",segment="compute"}} 2.5
# TYPE gen_ai_server_time_to_first_token_seconds histogram
gen_ai_server_time_to_first_token_seconds_bucket{{le="0.1",gen_ai_request_model="tiny",process="python"}} {ttft_fast}
gen_ai_server_time_to_first_token_seconds_bucket{{le="+Inf",gen_ai_request_model="tiny",process="python"}} {ttft}
gen_ai_server_time_to_first_token_seconds_count{{gen_ai_request_model="tiny",process="python"}} {ttft}
gen_ai_server_time_to_first_token_seconds_sum{{gen_ai_request_model="tiny",process="python"}} 1.0
# TYPE sitsprobe_engine_cache_lookups counter
sitsprobe_engine_cache_lookups_total{{cache="prefix",process="python",result="hit"}} {hits}
sitsprobe_engine_cache_lookups_total{{cache="prefix",process="python",result="miss"}} {misses}
sitsprobe_engine_cache_lookups_total{{cache="completion",process="vllm",result="hit"}} {hits}
# TYPE sitsprobe_engine_cache_hit_ratio gauge
sitsprobe_engine_cache_hit_ratio{{cache="prefix",process="python"}} 0.9
sitsprobe_engine_cache_hit_ratio{{cache="completion",process="vllm"}} 1.0
"""
GENAI_BEFORE = {"fast": 90, "requests": 100, "input": 20000, "output": 5000, "network": 1.0, "sched": 2.0,
                "compute": 4.0, "ttft_fast": 40, "ttft": 40, "hits": 10, "misses": 0}
GENAI_AFTER = {"fast": 150, "requests": 160, "input": 40000, "output": 9000, "network": 1.5, "sched": 5.0,
               "compute": 4.5, "ttft_fast": 50, "ttft": 50, "hits": 16, "misses": 2}


def genai_view(before=GENAI_BEFORE, after=GENAI_AFTER):
    return diff(parse(GENAI_PAGE.format(**before), 0.0), parse(GENAI_PAGE.format(**after), 4.0), 4.0)


def test_engine_rows_are_every_model_any_genai_series_names():
    tiny, vllm = genai_view().engine  # by process, then model
    assert vllm == EngineRow("vllm", "[org]/7b", rate=60 / 4,
                             output_tokens_rate=4000 / 4,  # type="input" is not counted
                             ttft_p50=None, ttft_p99=None, tpot_p50=None, tpot_p99=None,  # no token timings
                             # slow tail +0.5 network, +3.0 scheduling, +0.5 compute, +0 io
                             slow_segment="scheduling", slow_share=3.0 / 4.0)
    assert (tiny.process, tiny.model, tiny.rate, tiny.output_tokens_rate) == ("python", "tiny", None, None)
    assert tiny.ttft_p50 == pytest.approx(0.1 * 5 / 10)  # 10 in the interval, all in (0, 0.1]
    assert (tiny.slow_segment, tiny.slow_share) == (None, None)  # its slow tail did not grow: "-"


def test_prefix_cache_lines_are_for_prefix_lookups_only():
    # python: +6 hits, +2 misses; vllm's completion cache is no prefix cache
    assert genai_view().prefix_caches == [PrefixCacheRow("python", 6 / 8, 0.9)]
    quiet = genai_view(after={**GENAI_AFTER, "hits": 10, "misses": 0})
    assert quiet.prefix_caches == [PrefixCacheRow("python", None, 0.9)]  # no look-ups in the interval


def test_a_slow_tail_counter_that_went_down_counts_from_zero():
    after = {**GENAI_AFTER, "network": 0.2, "sched": 0.1, "compute": 0.7, "requests": 5, "fast": 5,
             "output": 100}
    vllm = next(r for r in genai_view(after=after).engine if r.process == "vllm")  # the agent restarted
    assert (vllm.slow_segment, vllm.slow_share) == ("compute", pytest.approx(0.7 / 1.0))
    assert (vllm.rate, vllm.output_tokens_rate) == (5 / 4, 100 / 4)


def test_batch_mean_and_step_rate(view):
    assert view.batch_mean == pytest.approx((1750 - 1530) / (1399 - 1211))
    assert view.batch_rate == (1399 - 1211) / 2


def test_header_numbers(view):
    assert (view.processes, view.events_rate) == (1, (169 - 148) / 2)
    assert (view.lost_total, view.lost_by_reason) == (0, {})
    assert (view.gpus, view.alerts) == ([], [])


def test_cache_lookups_and_misses_over_the_interval(view):
    (row,) = view.caches
    assert (row.cache, row.rate, row.miss_ratio) == ("prefix", (167 - 146) / 2, 0.0)
    assert row.top_miss_prefix is None  # no misses in the interval


CACHE_PAGE = """\
# TYPE sitsprobe_cache_lookups_total counter
sitsprobe_cache_lookups_total{{cache="redis",prefix="user:",result="hit"}} {0}
sitsprobe_cache_lookups_total{{cache="redis",prefix="user:",result="miss"}} {1}
sitsprobe_cache_lookups_total{{cache="redis",prefix="session:",result="miss"}} {2}
# TYPE sitsprobe_http_server_requests_total counter
sitsprobe_http_server_requests_total{{pid="7",process="[worker]",http_response_status_code="200"}} {3}
sitsprobe_http_server_requests_total{{pid="7",process="[worker]",http_response_status_code="503"}} {4}
# TYPE sitsprobe_events_lost_total counter
sitsprobe_events_lost_total{{reason="ring_buffer_full"}} {5}
sitsprobe_events_lost_total{{reason="connection_table_full"}} 0
"""


def test_misses_by_prefix_errors_and_lost_events():
    prev = parse(CACHE_PAGE.format(100, 10, 40, 50, 0, 0), 0.0)
    cur = parse(CACHE_PAGE.format(160, 30, 70, 80, 10, 12), 4.0)
    v = diff(prev, cur, 4.0)
    (cache,) = v.caches
    assert cache.rate == (60 + 20 + 30) / 4
    assert cache.miss_ratio == pytest.approx(50 / 110)
    assert (cache.top_miss_prefix, cache.top_miss_rate) == ("session:", 30 / 4)
    (http,) = v.http
    assert (http.process, http.rate, http.error_ratio) == ("[worker]", 40 / 4, 10 / 40)
    assert (http.p50, http.p99) == (None, None)  # no histogram: "-" in the view
    assert (v.lost_total, v.lost_by_reason) == (12, {"ring_buffer_full": 12})


def test_a_counter_that_went_down_was_reset():
    prev = parse(CACHE_PAGE.format(100, 10, 40, 50, 0, 0), 0.0)
    cur = parse(CACHE_PAGE.format(6, 0, 0, 4, 0, 0), 2.0)
    v = diff(prev, cur, 2.0)
    assert v.caches[0].rate == 3.0 and v.http[0].rate == 2.0


def test_gpus_and_the_collapse_gauge():
    v = diff(page("metrics1.txt"), page("metrics_gpu.txt", 2.0), 2.0)
    g0, g1 = v.gpus
    assert (g0.gpu, g0.busy, g0.signal, g0.collapsed) == ("0", 0.031, "gpm_sm_util", True)
    assert (g0.memory_used, g0.memory_total, g0.power) == (65712914432.0, 85520809984.0, 118.4)
    assert g0.top_process == ("python", "21859", 0.03)
    assert (g1.gpu, g1.busy, g1.collapsed, g1.top_process) == ("1", 0.874, False, ("python", "21874", 0.86))
    assert v.alerts == [AlertRow("0", "cpu_bound")]  # no /alerts.json: the gauge, cause only


def test_alerts_json_gives_the_process_and_evidence():
    (a,) = parse_alerts((FIX / "alerts.json").read_text())
    assert a == AlertRow("0", "cpu_bound", 21859, "python", 3.1, 74.0, 3.0, 1764470000.0)
    v = diff(page("metrics1.txt"), page("metrics_gpu.txt", 2.0), 2.0, [a])
    assert v.alerts == [a]


@pytest.mark.parametrize("body", ["{}", "[1]", '[{"cause": "x"}]', '[{"gpu": 0, "cause": "x", "pid": "?"}]',
                                  "<html>"])
def test_a_malformed_alert_list_is_a_value_error(body):
    with pytest.raises(ValueError):
        parse_alerts(body)


def test_parse_alerts_accepts_an_empty_list():
    assert parse_alerts(json.dumps([])) == []


def test_sort_http():
    rows = [HttpRow("b", ("1",), 5.0, 0.5, 0.1, 0.9), HttpRow("a", ("2",), 9.0, None, None, None),
            HttpRow("c", ("3",), 1.0, 0.0, 0.2, 2.0)]
    assert [r.process for r in sort_http(rows, "req/s")] == ["a", "b", "c"]
    assert [r.process for r in sort_http(rows, "err%")] == ["b", "c", "a"]  # no responses last
    assert [r.process for r in sort_http(rows, "p99")] == ["c", "b", "a"]
    assert [r.process for r in sort_http(rows, "process")] == ["a", "b", "c"]


def test_a_process_that_exits_is_no_spike_and_no_pid():
    """Its series go and its counts join its name's totals (pid ""): the
    rate is what was answered in the interval, and the row names live pids only."""
    name = "sitsprobe_http_server_requests_total"
    before = parse(f'{name}{{pid="7",process="py",http_response_status_code="200"}} 100\n'
                   f'{name}{{pid="8",process="py",http_response_status_code="200"}} 50\n', 0)
    after = parse(f'{name}{{pid="",process="py",http_response_status_code="200"}} 104\n'
                  f'{name}{{pid="8",process="py",http_response_status_code="200"}} 56\n', 2)
    (row,) = diff(before, after, 2.0).http
    assert (row.process, row.pids, row.rate) == ("py", ("8",), 5.0)
