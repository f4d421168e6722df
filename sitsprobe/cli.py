"""sitsprobe's command line: run, doctor, config, top, heatmap, report."""
from __future__ import annotations

import argparse
import difflib
import logging
import signal
import sys
import threading
from pathlib import Path

from . import __version__, config as cfg
from .errors import SitsprobeError

RUN_EPILOG = """\
examples:
  sitsprobe run --port 8000 --traces-file traces.jsonl
  sitsprobe run --comm python3 --duration 60 --otlp-endpoint http://tempo:4317
  sitsprobe run -c /etc/sitsprobe.yaml

Traces go to --traces-file (OTLP/JSON, one ExportTraceServiceRequest per line)
and/or an OTLP collector (--otlp-endpoint, else $OTEL_EXPORTER_OTLP_ENDPOINT;
metrics and GPU alerts go there too, each signal by the same OTEL_EXPORTER_OTLP_*
rules, per-signal variables first).
Prometheus metrics and /healthz are served on --metrics-port (default 9102).
SIGINT/SIGTERM stop it cleanly: open exchanges are reported, exporters
flushed, and every probe detached.
"""

TOP_EPILOG = """\
Shows, per interval: HTTP req/s, 5xx share and p50/p99 latency per process;
the engine's time to first token, time per output token, batch size and
prefix-cache hits; per cache, look-ups/s, miss share and the most-missed key
prefix; per GPU, busy share, memory and power, with raised collapse alerts.
The numbers are differences between consecutive scrapes of the agent's
/metrics page (quantiles from histogram buckets, as histogram_quantile does);
alerts come from its /alerts.json. Keys: q quit, p pause, s sort HTTP rows, ? help.
When the agent stops answering, the last view stays, marked STALE.
"""

REPORT_EPILOG = """\
examples:
  sitsprobe report traces.jsonl
  sitsprobe report traces.jsonl --last 15m --png attribution.png
  sitsprobe report --agent http://127.0.0.1:9102 --json

Three tables, over the requests (SERVER spans) that ended in the window:
- Latency attribution: the slow tail is the slowest 1 % by duration; per
  segment (network, scheduling, compute, io, cache: the sitsprobe.latency.*_s
  attributes), its P99 and its share of the tail's time, next to its mean,
  variance and share over all requests; then whether the segments add up to
  each duration (report.tolerance).
- SLIs: per window of report.windows, the share of requests within it and
  the P99 of what it measures; then EIPR, valid GenAI responses per second,
  and semantic uptime, valid / all GenAI responses, against
  report.uptime_target (report.valid says what is valid).
- Sampling bias: the P99 of duration from every request, the P99 that
  head sampling at --sample-ratio would show (decided by trace id, exactly as
  OpenTelemetry's TraceIdRatioBased sampler), and the spread of 100 random
  samples at that ratio. The "exact" P99 is exact only if the input holds
  every request: a traces file written with traces.cpu_budget and
  traces.max_per_second 0, or --agent.
Quantiles are nearest-rank: the smallest value with at least that share of
the requests at or below it.
"""


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="sitsprobe",
        description="eBPF agent that stitches what an inference server does on the "
                    "network into one trace per request.")
    p.add_argument("--version", action="version", version=f"sitsprobe {__version__}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    run = sub.add_parser("run", help="trace selected processes and export traces and metrics",
                         epilog=RUN_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    run.add_argument("-c", "--config", metavar="FILE", help="YAML config (see `sitsprobe config --show`)")
    sel = run.add_argument_group("what to trace (any match; processes started later are picked up)")
    sel.add_argument("--pid", type=int, action="append", metavar="PID", help="a process id (repeatable)")
    sel.add_argument("--comm", action="append", metavar="NAME", help="a command name, as in /proc/PID/comm")
    sel.add_argument("--cmdline", action="append", metavar="REGEX", help="a regex searched in the command line")
    sel.add_argument("--port", type=int, action="append", metavar="PORT",
                     help="processes listening on this TCP port")
    out = run.add_argument_group("output")
    out.add_argument("--traces-file", metavar="PATH", help="write OTLP/JSON trace lines here")
    out.add_argument("--otlp-endpoint", metavar="URL", help="OTLP collector, e.g. http://localhost:4317")
    out.add_argument("--otlp-protocol", choices=("grpc", "http/protobuf"),
                     help="default $OTEL_EXPORTER_OTLP_PROTOCOL, else grpc")
    out.add_argument("--metrics-port", type=int, metavar="N", help="Prometheus port, 0 = off (default 9102)")
    run.add_argument("--cache-probe", action="append", metavar="NAME",
                     help="probe a cache's look-ups: redis (the lookupKey preset); repeatable")
    run.add_argument("--duration", type=float, metavar="SECONDS", help="stop after this long, flushing everything")
    run.add_argument("--log-level", choices=("debug", "info", "warning", "error"))
    run.add_argument("--ebpf", action="store_true",
                     help="print the programs the agent would load on this kernel, where each goes, "
                          "and the -D flags bpf/net.c is compiled with; then exit (probes the kernel)")

    doc = sub.add_parser("doctor", help="what this kernel offers and which hook each probe will use")
    doc.add_argument("--json", action="store_true", help="machine-readable report")
    doc.add_argument("-c", "--config", metavar="FILE", help="YAML config (for kernel_headers)")
    doc.add_argument("--pid", type=int, action="append", metavar="PID", default=[],
                     help="also say whether this process's TLS can be read, and why not (repeatable)")

    heat = sub.add_parser("heatmap", help="cache-miss heatmaps from a running agent")
    heat.add_argument("--url", default="http://127.0.0.1:9102", help="the agent's metrics address")
    heat.add_argument("--out", metavar="FILE.png", help="write the PNG here (else print text)")

    top = sub.add_parser("top", help="live view of one node, from a running agent's metrics",
                         epilog=TOP_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    top.add_argument("--url", default="http://127.0.0.1:9102", help="the agent's metrics address")
    top.add_argument("--interval", type=float, default=1.0, metavar="SECONDS",
                     help="seconds between scrapes (default 1.0)")
    top.add_argument("--once", action="store_true",
                     help="print one plain-text frame (two scrapes --interval apart) and exit")

    rep = sub.add_parser("report", help="latency attribution, SLIs and a sampling-bias check "
                                        "from a traces file or a running agent",
                         epilog=REPORT_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    rep.add_argument("traces", nargs="?", metavar="TRACES_FILE",
                     help="OTLP/JSON lines, as `sitsprobe run --traces-file` writes them (- = stdin)")
    rep.add_argument("--agent", metavar="URL",
                     help="instead, a running agent's recent requests, e.g. http://127.0.0.1:9102")
    when = rep.add_argument_group("time window (by each request's end; default: every request)")
    when.add_argument("--last", metavar="DURATION",
                      help="the last DURATION (90s, 5m, 1.5h, 2d) up to the newest request")
    when.add_argument("--since", metavar="TIME", help="from TIME: ISO 8601 (no offset = UTC) or Unix seconds")
    when.add_argument("--until", metavar="TIME", help="up to TIME, as --since")
    rep.add_argument("--json", action="store_true", help="print the tables as one JSON document")
    rep.add_argument("--png", metavar="FILE", help="also draw the attribution as a PNG here")
    rep.add_argument("-c", "--config", metavar="FILE",
                     help="YAML config whose report: section sets windows, validity and tolerance")
    rep.add_argument("--sample-ratio", type=float, default=0.01, metavar="RATIO",
                     help="head-sampling ratio the bias check compares against, 0 < RATIO <= 1 "
                          "(default 0.01)")

    conf = sub.add_parser("config", help="show or check the effective configuration")
    conf.add_argument("-c", "--config", metavar="FILE")
    conf.add_argument("--show", action="store_true", help="print the effective config as YAML")
    p.set_defaults(commands=sub.choices)
    return p


def _unrecognized(command: argparse.ArgumentParser, extra: list[str]) -> None:
    """A command's usage and, for a mistyped option, the one meant (exits 2)."""
    known = [o for action in command._actions for o in action.option_strings if o.startswith("--")]
    typed = next((x.split("=", 1)[0] for x in extra if x.startswith("--")), None)
    close = difflib.get_close_matches(typed, known, n=1) if typed else []
    command.error(f"unrecognized arguments: {' '.join(extra)}" + (f"; did you mean {close[0]}?" if close else ""))


def _overrides(a: argparse.Namespace) -> dict:
    pairs = {
        "select.pids": a.pid, "select.comms": a.comm, "select.cmdline": a.cmdline,
        "select.ports": a.port, "traces.file": a.traces_file,
        "traces.otlp_endpoint": a.otlp_endpoint, "traces.otlp_protocol": a.otlp_protocol,
        "metrics.port": a.metrics_port, "duration_s": a.duration, "log_level": a.log_level,
        "cache.probes": a.cache_probe,
    }
    return {k: v for k, v in pairs.items() if v is not None}


def _run(a: argparse.Namespace) -> int:
    conf = cfg.load(a.config, _overrides(a))
    logging.basicConfig(level=conf.log_level.upper(), format="%(asctime)s %(levelname)s %(message)s")
    if a.ebpf:
        print(_ebpf(conf), end="")
        return 0
    from .probes.ahead import NetAhead

    ahead = NetAhead(conf)  # compiles on a thread while the rest of the agent imports
    try:
        from .agent import Agent

        agent = Agent(conf, net_ahead=ahead)
    except BaseException:
        ahead.close()
        raise
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    try:
        agent.start()
        agent.run(stop, conf.duration_s)
    finally:
        agent.close()
    logging.getLogger("sitsprobe").info("stopped: %d requests stitched", agent.requests_seen)
    return 0


def _ebpf(conf: cfg.Config) -> str:
    """`run --ebpf`: what `run` with this config would load here."""
    from . import cpus
    from .probes.compiler import kallsyms_seen, lib
    from .probes.kept import key
    from .probes.net import bpf_dir, conn_by_state, tail_calls
    from .probes.net_plan import plan_net
    net = plan_net(conf)
    how = ("  whole (one CPU to run on)" if cpus.usable() < 2 else
           "  in two halves side by side: -DNET_PART=1 here, -DNET_PART=2 (the tail calls) in a second process")
    if conf.compiled_dir:
        lib()  # bcc's build is part of the key
        kept = Path(conf.compiled_dir) / key(bpf_dir(), net.flags)
        how = (f"  only its maps (-DNET_PART=3): its programs kept by an earlier start, {kept}" if kept.exists()
               else f"{how}; its programs then kept for the next start, {kept}")
    lines = [f"{bpf_dir() / 'net.c'}, compiled with:", *(f"  {f}" for f in net.flags), how,
             f"  /proc/kallsyms as bcc's frontend reads it: {kallsyms_seen()}", "attached:"]
    lines += [f"  {point:<18} {hook or '(nothing on this kernel)'}" for point, hook in net.hooks.items()]
    tails = [t.decode() for t in tail_calls(net.flags).values()]
    tails += ["end_conn_tp (inet_sock_set_state's)"] if conn_by_state(net.flags) else []
    lines.append("tail calls: " + ", ".join(tails))
    lines += [f"cache probe {p.name}: uprobe {p.binary or 'the processes ' + str(p.process)}:{p.symbol}"
              for p in conf.cache.probes]
    lines.append("loaded when needed: the libssl uprobes above (net.c again, with -DTLS_MODULE=1, on a "
                 "thread, kept in compiled_dir as net.c's programs are), once a traced process maps libssl; "
                 "bpf/markers.c once one loads sitsprobe.markers; bpf/cuda.c once one maps libcudart "
                 "(with NVML)")
    return "\n".join(lines) + "\n"


def _heatmap(a: argparse.Namespace) -> int:
    import urllib.error
    import urllib.request
    page = "/heatmap.png" if a.out else "/heatmap.txt"
    try:
        with urllib.request.urlopen(a.url.rstrip("/") + page, timeout=30) as r:
            body = r.read()
    except urllib.error.HTTPError as e:
        raise SitsprobeError(f"{a.url}{page}: HTTP {e.code}; is a cache probe on "
                             "(--cache-probe redis, or cache.resp_mode)?") from None
    except OSError as e:
        raise SitsprobeError(f"cannot reach the agent at {a.url} ({getattr(e, 'reason', e)}): start one "
                             "with a cache probe, e.g. `sitsprobe run --cache-probe redis`, or give "
                             "--url") from None
    if a.out:
        with open(a.out, "wb") as f:
            f.write(body)
        print(f"wrote {a.out}")
    else:
        print(body.decode(), end="")
    return 0


def _top(a: argparse.Namespace) -> int:
    from .top import Source, TopApp, once
    if a.interval <= 0:
        raise SitsprobeError(f"--interval: expected a positive number of seconds, got {a.interval}")
    if a.once:
        print(once(Source(a.url), a.interval))
    else:
        TopApp(Source(a.url), a.interval).run()
    return 0


def _report(a: argparse.Namespace) -> int:
    from .report import build, render
    from .report import load as source
    from .report.tables import kept_attributes

    if (a.traces is None) == (a.agent is None):
        raise SitsprobeError("report: give a TRACES_FILE or --agent URL (one of them)")
    if not 0 < a.sample_ratio <= 1:
        raise SitsprobeError(f"--sample-ratio: expected a number 0 < RATIO <= 1, got {a.sample_ratio:g}")
    if a.last is not None and (a.since is not None or a.until is not None):
        raise SitsprobeError("--last: use it alone, or --since/--until, not both")
    settings = cfg.load(a.config).report
    last = source.parse_duration(a.last) if a.last is not None else None
    since = source.parse_time(a.since, "--since") if a.since is not None else None
    until = source.parse_time(a.until, "--until") if a.until is not None else None
    if since is not None and until is not None and since >= until:
        raise SitsprobeError(f"--since {a.since} is not before --until {a.until}")
    if a.agent is not None:
        loaded = source.fetch_agent(a.agent, window_s=last)
    else:
        loaded = source.read_traces(a.traces, kept_attributes(settings.windows))
    records, window = source.select(loaded.records, since, until, last)
    window = source.covered(window, loaded)
    tables = build(records, settings, window, a.sample_ratio)
    print(render.json_text(tables, loaded) if a.json else render.text(tables, loaded), end="")
    if a.png:
        try:
            render.png(tables, a.png, title=loaded.source)
        except ImportError:
            raise SitsprobeError("--png needs matplotlib: pip install 'sitsprobe[heatmap]'") from None
        except OSError as e:
            raise SitsprobeError(f"--png {a.png}: cannot write ({e.strerror or e})") from None
        if not a.json:
            print(f"wrote {a.png}")
    return 0


def main(argv: list[str] | None = None) -> int:
    a, extra = _parser().parse_known_args(argv)
    if extra:
        _unrecognized(a.commands[a.command], extra)
    try:
        if a.command == "run":
            return _run(a)
        if a.command == "heatmap":
            return _heatmap(a)
        if a.command == "top":
            return _top(a)
        if a.command == "report":
            return _report(a)
        if a.command == "doctor":
            from . import doctor
            headers = cfg.load(a.config).kernel_headers if a.config else None
            return doctor.run(a.json, configured_headers=headers, pids=a.pid)
        conf = cfg.load(a.config)
        print(cfg.dump(conf) if a.show else f"{a.config or '<defaults>'}: ok", end="\n" if not a.show else "")
        return 0
    except SitsprobeError as e:
        print(f"sitsprobe: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
