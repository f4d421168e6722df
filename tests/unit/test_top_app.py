"""`sitsprobe top` driven headless through Textual's Pilot, `--once`, and
the scraping Source, all on fixture pages served by a fake fetcher.

SITSPROBE_UPDATE_DOCS=1 makes test_docs_pictures_are_current rewrite
docs/top.txt and docs/top.svg from the GPU fixture."""
from __future__ import annotations

import asyncio
import re
import itertools
import os
import urllib.error
from pathlib import Path

import pytest
from textual.widgets import Static

from sitsprobe import cli
from sitsprobe.top import ScrapeError, Source, TopApp, once, render
from sitsprobe.top.model import diff, parse
from sitsprobe.top.render import WAITING

FIX = Path(__file__).parent / "fixtures" / "top"
DOCS = Path(__file__).parents[2] / "docs"
URL = "http://agent:9102"
T0 = 1764470010.0  # 12 s after the fixture alert's since_unix


class Agent:
    """A fake fetcher: /metrics serves `pages` in turn (the last one stays),
    /alerts.json `alerts`; `down` makes every fetch fail like a closed port."""

    def __init__(self, *pages: str, alerts: str | None = None):
        self.pages = [(FIX / p).read_text() for p in pages]
        self.alerts, self.down, self.scrapes = alerts, False, 0

    def __call__(self, url: str) -> str:
        if self.down:
            raise urllib.error.URLError(ConnectionRefusedError(111, "Connection refused"))
        if url == URL + "/alerts.json":
            if self.alerts is None:
                raise urllib.error.HTTPError(url, 404, "Not Found", None, None)
            return (FIX / self.alerts).read_text()
        assert url == URL + "/metrics"
        self.scrapes += 1
        return self.pages.pop(0) if len(self.pages) > 1 else self.pages[0]


def genai_counters(tokens_in: int, tokens_out: int, slow_tail: dict[str, float]) -> str:
    """The page lines of the token and slow-tail counters of the fixtures' one model."""
    labels = 'gen_ai_request_model="sitsprobe-tiny-gpt",process="python"'
    return "\n".join([
        "# TYPE gen_ai_server_tokens counter",
        f'gen_ai_server_tokens_total{{{labels},gen_ai_token_type="input"}} {tokens_in}',
        f'gen_ai_server_tokens_total{{{labels},gen_ai_token_type="output"}} {tokens_out}',
        "# TYPE sitsprobe_gen_ai_slow_tail_segment_seconds counter",
        *(f'sitsprobe_gen_ai_slow_tail_segment_seconds_total{{{labels},segment="{segment}"}} {seconds}'
          for segment, seconds in slow_tail.items()), ""])


def with_genai_counters(agent: Agent) -> Agent:
    """The fixture scrapes predate the agent's token and slow-tail counters; add
    them as the demo would have: 148 then 168 requests of 29 tokens in and 12 out
    (the interval's mean ttft 16 ms + 11 tokens of 2.1 ms ~ its mean duration,
    40 ms), and in the interval one slow request of 74.5 ms (the model's p99)."""
    before = {"network": 0.0061, "scheduling": 0.0172, "compute": 0.1105, "io": 0.0040, "cache": 0.0009}
    slow = {"network": 0.0034, "scheduling": 0.0095, "compute": 0.0589, "io": 0.0022, "cache": 0.0005}
    after = {segment: before[segment] + slow[segment] for segment in before}
    first, *rest = agent.pages
    agent.pages = [first + genai_counters(148 * 29, 148 * 12, before),
                   *(page + genai_counters(168 * 29, 168 * 12, after) for page in rest)]
    return agent


def clock():
    ticks = itertools.count()
    return lambda: T0 + 2.0 * next(ticks)  # scrapes 2 s apart, as the fixture pages were


def source(agent: Agent) -> Source:
    return Source(URL, agent, clock())


def shown(app: TopApp, widget: str) -> str:
    return app.query_one(f"#{widget}", Static).content.plain


async def until(pilot, condition) -> None:
    for _ in range(500):
        if condition():
            return
        await pilot.pause(0.01)
    raise AssertionError("timed out")


def drive(agent: Agent, steps, interval: float = 3600.0, size=(80, 30)):
    """Run the app headless: the first scrape happens on mount; `steps(app, pilot)`
    does the rest (a long interval keeps the timer from scraping on its own)."""
    app = TopApp(source(agent), interval)

    async def main():
        async with app.run_test(size=size) as pilot:
            await until(pilot, lambda: agent.scrapes >= 1)  # app.scrape() waits for this one
            await steps(app, pilot)

    asyncio.run(main())
    return app


def screen(agent: Agent) -> tuple[str, str]:
    """(status, body) as the app shows them after its second scrape."""
    seen = {}

    async def steps(app, pilot):
        await app.scrape()
        seen.update(status=shown(app, "status"), body=shown(app, "body"))

    drive(agent, steps)
    return seen["status"], seen["body"]


def test_app_shows_the_rows_of_the_interval():
    status, body = screen(with_genai_counters(Agent("metrics1.txt", "metrics2.txt")))
    assert "python[21859]                    10.5    0.0%    38.2ms    70.0ms" in body
    assert "\npython  prefix cache 100.0% hits, 98.8% since start\n" \
           "  sitsprobe-tiny-gpt   10.0  120.0 14.7ms 19.9ms   5.0ms  9.9ms  compute 79%\n" in body
    assert "batches: 1.17 requests per step, 94.0 steps/s" in body
    assert body.endswith("\nprefix                           10.5    0.0%  -")
    assert "GPU" not in body  # none on the page
    assert "http://agent:9102  02:33:32 UTC  over 2.0s" in status
    assert "processes 1  events 10.5/s  lost 0" in status


def test_gpus_and_alerts_with_and_without_alerts_json():
    _, body = screen(Agent("metrics1.txt", "metrics_gpu.txt", alerts="alerts.json"))
    assert "0      3%  gpm_sm_util         61.2/79.6 GiB   118 W  python[21859]      3%" in body
    assert "ALERT GPU 0 cpu_bound  python[21859]  busy 3% vs working 74%  demand 3  for 12s" in body
    _, gauge_only = screen(Agent("metrics1.txt", "metrics_gpu.txt"))
    assert gauge_only.splitlines()[-1] == "ALERT GPU 0 cpu_bound"


def test_p_pauses_and_resumes():
    async def steps(app, pilot):
        await app.scrape()
        await pilot.press("p")
        assert "[PAUSED]" in shown(app, "status")  # escaped: not eaten as markup
        frozen = shown(app, "body")
        await app.scrape()  # metrics2 again: nothing moved, so 0 req/s if it were shown
        assert shown(app, "body") == frozen
        await pilot.press("p")
        assert "PAUSED" not in shown(app, "status")
        await app.scrape()
        assert "python[21859]                     0.0       -         -         -" in shown(app, "body")
        assert "  sitsprobe-tiny-gpt    0.0      -      -      -       -      -  -" in shown(app, "body")

    drive(Agent("metrics1.txt", "metrics2.txt"), steps)


def test_s_cycles_the_http_sort():
    async def steps(app, pilot):
        await app.scrape()
        assert "sort: req/s" in shown(app, "body")
        for expected in ("err%", "p99", "process", "req/s"):
            await pilot.press("s")
            assert f"sort: {expected}" in shown(app, "body")

    drive(Agent("metrics1.txt", "metrics2.txt"), steps)


def test_an_unreachable_agent_shows_one_line_and_is_retried():
    agent = Agent("metrics1.txt", "metrics2.txt")

    async def steps(app, pilot):
        agent.down = True
        await app.scrape()
        assert shown(app, "status").splitlines()[-1] == \
            "cannot reach http://agent:9102/metrics: [Errno 111] Connection refused"
        assert shown(app, "body") == WAITING
        agent.down = False
        await app.scrape()
        assert "cannot reach" not in shown(app, "status")
        assert "python[21859]" in shown(app, "body")

    drive(agent, steps)


def test_a_view_kept_after_the_agent_stopped_answering_is_marked_stale():
    agent = Agent("metrics1.txt", "metrics2.txt")

    async def steps(app, pilot):
        await app.scrape()
        assert "STALE" not in shown(app, "status")
        agent.down = True
        await app.scrape()
        assert "STALE" in shown(app, "status").splitlines()[0]
        assert "python[21859]" in shown(app, "body")  # the last good view, still shown
        agent.down = False
        await app.scrape()
        assert "STALE" not in shown(app, "status")

    drive(agent, steps)


def test_question_mark_shows_the_help_and_any_key_returns():
    async def steps(app, pilot):
        await app.scrape()
        await pilot.press("question_mark")
        assert shown(app, "body").startswith("keys  q quit")
        await pilot.press("x")
        assert "python[21859]" in shown(app, "body")

    drive(Agent("metrics1.txt", "metrics2.txt"), steps)


def test_a_process_whose_pod_is_known_is_shown_by_its_pod():
    agent = Agent("metrics1.txt", "metrics2.txt")
    info = ('sitsprobe_tracked_process_info{container="vllm",container_id="4b82",namespace="inference",'
            'owner="vllm",owner_kind="Deployment",pid="21859",pod="vllm-7d9f8c6b5-x2k4q",pod_uid="1f2e",'
            'process="python"} 1.0')
    agent.pages = [re.sub(r'^sitsprobe_tracked_process_info\{.*$', info, p, flags=re.M) for p in agent.pages]
    _, body = screen(agent)
    assert "python inference/vllm-7d9f8c" in body and "python[21859]" not in body


def test_gpu_sampling_off_is_said():
    agent = Agent("metrics1.txt", "metrics2.txt")
    agent.pages = [p + "# TYPE sitsprobe_gpu_sampling gauge\nsitsprobe_gpu_sampling 0.0\n" for p in agent.pages]
    _, body = screen(agent)
    assert body.splitlines()[-1].startswith("GPU sampling off")
    _, silent = screen(Agent("metrics1.txt", "metrics2.txt"))  # an agent that does not say: nothing
    assert "GPU sampling" not in silent


def test_the_timer_scrapes_on_its_own_and_q_quits():
    agent = Agent("metrics1.txt", "metrics2.txt")

    async def steps(app, pilot):
        await until(pilot, lambda: "python[21859]" in shown(app, "body"))
        await pilot.press("q")
        await until(pilot, lambda: not app.is_running)

    app = drive(agent, steps, interval=0.01)
    assert app.return_code == 0


def test_labels_are_escaped():
    agent = with_genai_counters(Agent("metrics1.txt", "metrics2.txt"))
    agent.pages = [p.replace('process="python"', 'process="[bold]py"')
                   .replace('gen_ai_request_model="sitsprobe-tiny-gpt"', 'gen_ai_request_model="[i]x"') for p in agent.pages]
    body = screen(agent)[1]  # escaped: not eaten as markup
    assert "[bold]py[21859]" in body
    assert "\n[bold]py  prefix cache 100.0% hits" in body and "\n  [i]x    " in body


def test_no_genai_requests_yet():
    body = render.plain(render.body(diff(parse("", 0.0), parse("", 2.0), 2.0), "req/s"))
    assert "GenAI by model" in body and "\nno GenAI requests seen yet" in body


def test_source_falls_back_on_bad_alerts_and_reports_bad_pages():
    agent = Agent("metrics1.txt", "metrics_gpu.txt", alerts="metrics1.txt")  # not JSON
    src = source(agent)
    assert src.view() is None
    assert [a.pid for a in src.view().alerts] == [0]  # from the gauge
    agent.pages = ["<html>{{{ 1</html>"]
    with pytest.raises(ScrapeError, match=r"^cannot parse http://agent:9102/metrics: "):
        src.view()


def test_source_names_an_http_error_and_takes_the_url_as_people_paste_it():
    def fetch(url):
        raise urllib.error.HTTPError(url, 503, "Service Unavailable", None, None)

    src = Source("agent:9102/metrics/", fetch)
    assert src.url == URL
    with pytest.raises(ScrapeError, match=r"^cannot read http://agent:9102/metrics: HTTP 503 Service Unavail"):
        src.view()


def test_a_clock_that_steps_back_restarts_the_diff():
    times = iter([T0, T0 - 60, T0 - 58])
    src = Source(URL, Agent("metrics1.txt", "metrics2.txt"), lambda: next(times))
    assert src.view() is None and src.view() is None
    assert src.view().seconds == 2.0


def once_text() -> str:
    sleeps = []
    agent = with_genai_counters(Agent("metrics1.txt", "metrics_gpu.txt", alerts="alerts.json"))
    text = once(source(agent), 2.0, sleeps.append)
    assert sleeps == [2.0]
    return text


def test_once_prints_one_plain_frame_of_80_columns():
    text = once_text()
    assert text.startswith("sitsprobe top  http://agent:9102  02:33:32 UTC  over 2.0s\n")
    assert "python[21859]" in text and "ALERT GPU 0 cpu_bound" in text
    assert "[b]" not in text and max(len(line) for line in text.splitlines()) <= 80


def test_docs_pictures_are_current():
    text = once_text() + "\n"
    if os.environ.get("SITSPROBE_UPDATE_DOCS"):
        (DOCS / "top.txt").write_text(text)

        async def shoot(app, pilot):
            await app.scrape()
            await pilot.pause()
            app.save_screenshot("top.svg", str(DOCS))

        drive(with_genai_counters(Agent("metrics1.txt", "metrics_gpu.txt", alerts="alerts.json")), shoot,
              size=(80, 24))
    assert (DOCS / "top.txt").read_text() == text
    assert "ALERT GPU 0 cpu_bound" in (DOCS / "top.svg").read_text().replace("&#160;", " ")


def test_cli_once_on_a_closed_port_says_so_in_one_line(capsys):
    assert cli.main(["top", "--once", "--url", "http://127.0.0.1:1", "--interval", "0.01"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("sitsprobe: cannot reach http://127.0.0.1:1/metrics: ") and err.count("\n") == 1


def test_lost_events_server_errors_and_cache_misses_are_shown():
    from .test_top_model import CACHE_PAGE
    v = diff(parse(CACHE_PAGE.format(100, 10, 40, 50, 0, 0), 0.0),
             parse(CACHE_PAGE.format(160, 30, 70, 80, 10, 12), 4.0), 4.0)
    status = render.header(URL, v)
    assert status[1] == "processes 0  events 0.0/s  [b red]lost 12 (ring_buffer_full 12)[/b red]"
    body = render.body(v, "req/s")
    assert "[red]  25.0%[/red]" in body[1]
    assert render.plain(body).splitlines()[1] == \
        "[worker][7]                      10.0   25.0%         -         -"
    assert render.plain(body).endswith(
        "\nredis                            27.5   45.5%  session:             7.5/s")


def test_engine_rows_under_their_process_in_80_columns():
    from .test_top_model import GENAI_AFTER, GENAI_BEFORE, GENAI_PAGE, genai_view
    assert render.plain(render._engine(genai_view())).splitlines()[1:] == [
        "python  prefix cache 75.0% hits, 90.0% since start",
        "  tiny                    -      - 50.0ms 99.0ms       -      -  -",
        "vllm",  # no prefix look-ups
        "  [org]/7b             15.0   1000      -      -       -      -  scheduling 75%"]
    busiest = {**GENAI_AFTER, "requests": 400100, "output": 5000 + 3999996, "sched": 11.0, "network": 1.0,
               "compute": 4.0}
    page = GENAI_PAGE.replace("[org]/7b", "meta-llama/Llama-3.1-70B-Instruct")
    v = diff(parse(page.format(**GENAI_BEFORE), 0.0), parse(page.format(**busiest), 4.0), 4.0)
    lines = render.plain(render._engine(v)).splitlines()
    assert lines[-1] == "  meta-llama/Llama-3 100000 999999      -      -       -      -  scheduling 100%"
    assert max(len(line) for line in lines) == 80
