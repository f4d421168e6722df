"""sitsprobe.config: defaults, file and command-line layers, one-line errors."""
from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import textwrap
import threading
import time
from importlib import resources
from pathlib import Path

import pytest
import yaml

from sitsprobe import config
from sitsprobe.config import Config, dump, load
from sitsprobe.errors import ConfigError


def write(tmp_path, text: str, name: str = "sitsprobe.yaml"):
    p = tmp_path / name
    p.write_text(textwrap.dedent(text))
    return p


def error(tmp_path=None, text: str | None = None, overrides=None) -> ConfigError:
    path = write(tmp_path, text) if text is not None else None
    with pytest.raises(ConfigError) as info:
        load(path, overrides)
    msg = str(info.value)
    assert "\n" not in msg
    return info.value


# --- defaults -----------------------------------------------------------------

def test_defaults_load():
    c = load()
    assert isinstance(c, Config)
    assert c.select.pids == () and c.select.comms == () and c.select.cmdline == () and c.select.ports == ()
    assert c.select.rescan_interval_s == 1.0 and isinstance(c.select.rescan_interval_s, float)
    assert c.capture.request_bytes == 256 and c.capture.response_bytes == 256
    assert c.capture.redact_headers == ("authorization", "cookie", "set-cookie",
                                        "proxy-authorization", "x-api-key")
    assert c.capture.keep_query_params == ()  # every query value is redacted
    assert c.ring_buffer_mib == 8
    assert (c.stitch.flush_interval_ms, c.stitch.max_connections) == (250, 16384)
    assert c.routes.templates == () and c.routes.collapse_ids is True and c.routes.max_routes == 500
    assert c.traces.file is None and c.traces.otlp_endpoint is None and c.traces.otlp_protocol is None
    assert (c.traces.cpu_budget, c.traces.max_per_second, c.traces.keep_slowest) == (0.05, 0, 20)
    assert (c.metrics.address, c.metrics.port) == ("0.0.0.0", 9102)
    assert c.duration_s is None and c.kernel_headers is None and c.log_level == "info"


def test_defaults_file_ships_in_package_and_covers_every_key():
    text = resources.files("sitsprobe").joinpath("defaults.yaml").read_text()
    data = yaml.safe_load(text)
    flat = {f"{s}.{k}" if isinstance(v, dict) else s: None
            for s, v in data.items() for k in (v if isinstance(v, dict) else [None])}
    assert set(flat) == set(config._RULES)
    # documented: every key line carries a comment
    for line in text.splitlines():
        if line.strip() and not line.lstrip().startswith(("#", "-")) and not line.rstrip().endswith(":"):
            assert "#" in line, line


def test_config_is_frozen():
    c = load()
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.log_level = "debug"  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.select.pids = (1,)  # type: ignore[misc]


@pytest.mark.parametrize("text", ["", "# only comments\n", "---\n"])
def test_empty_file_is_defaults(tmp_path, text):
    assert load(write(tmp_path, text)) == load()


def test_empty_section_is_defaults(tmp_path):
    assert load(write(tmp_path, "select:\ntraces:\n")) == load()


# --- layering -----------------------------------------------------------------

def test_file_overrides_defaults(tmp_path):
    c = load(write(tmp_path, """
        select:
          ports: [8000, 30000]
          cmdline: ['vllm serve']
        capture:
          redact_headers: [Authorization, X-Secret]
        ring_buffer_mib: 128
        traces:
          otlp_endpoint: http://collector:4317
          otlp_protocol: grpc
        duration_s: 5
        log_level: debug
    """))
    assert c.select.ports == (8000, 30000) and c.select.cmdline == ("vllm serve",)
    assert c.capture.redact_headers == ("authorization", "x-secret")  # lower-cased
    assert c.capture.request_bytes == 256  # untouched keys keep defaults
    assert c.ring_buffer_mib == 128
    assert c.traces.otlp_endpoint == "http://collector:4317" and c.traces.otlp_protocol == "grpc"
    assert c.duration_s == 5.0 and isinstance(c.duration_s, float)
    assert c.log_level == "debug" and c.metrics.port == 9102


def test_path_can_be_pathlike_or_str(tmp_path):
    p = write(tmp_path, "log_level: error\n")
    assert load(p) == load(str(p))


def test_dotted_overrides_beat_file(tmp_path):
    p = write(tmp_path, "select:\n  pids: [7]\nmetrics:\n  port: 9999\n")
    c = load(p, {"select.pids": [1, 2], "traces.file": "x", "metrics.port": 0, "duration_s": 5})
    assert c.select.pids == (1, 2)
    assert c.traces.file == "x"
    assert c.metrics.port == 0
    assert c.duration_s == 5.0
    assert c.metrics.address == "0.0.0.0"


def test_override_whole_section_and_null():
    c = load(None, {"stitch": {"flush_interval_ms": 20}, "traces.file": None})
    assert c.stitch.flush_interval_ms == 20 and c.stitch.max_connections == 16384
    assert c.traces.file is None


# --- errors -------------------------------------------------------------------

def test_unknown_key_with_suggestion(tmp_path):
    e = error(tmp_path, "stitch:\n  flush_interval: 10\n")
    assert str(e) == (f"{tmp_path / 'sitsprobe.yaml'}: stitch.flush_interval: unknown key "
                      "(expected one of: flush_interval_ms, max_connections, run_queue, read_waits, outgoing, kernel_bins, join_wait_ms); did you mean flush_interval_ms?")
    assert e.key == "stitch.flush_interval"


def test_unknown_top_level_key_with_suggestion(tmp_path):
    msg = str(error(tmp_path, "loglevel: debug\n"))
    assert ": loglevel: unknown key (expected one of: " in msg
    assert msg.endswith("did you mean log_level?")


def test_unknown_key_without_close_match(tmp_path):
    msg = str(error(tmp_path, "zzzz: 1\n"))
    assert "unknown key" in msg and "did you mean" not in msg


def test_dotted_key_in_file_is_unknown(tmp_path):
    assert "stitch.flush_interval_ms: unknown key" in str(error(tmp_path, "stitch.flush_interval_ms: 10\n"))


def test_unknown_override_key():
    e = error(overrides={"stitch.flush_interval": 10})
    assert str(e).startswith("<command line>: stitch.flush_interval: unknown key (expected one of: "
                             "flush_interval_ms, max_connections, run_queue, read_waits, outgoing, kernel_bins, join_wait_ms)")
    assert "did you mean flush_interval_ms?" in str(e)
    assert "unknown key" in str(error(overrides={"nosuch.thing": 1}))


def test_wrong_type(tmp_path):
    e = error(tmp_path, "capture:\n  request_bytes: lots\n")
    assert str(e) == (f"{tmp_path / 'sitsprobe.yaml'}: capture.request_bytes: "
                      "expected an integer 16..4096, got 'lots'")


def test_out_of_range(tmp_path):
    path = tmp_path / "sitsprobe.yaml"
    e = error(tmp_path, "capture:\n  request_bytes: 99999\n")
    assert str(e) == f"{path}: capture.request_bytes: expected an integer 16..4096, got 99999"
    assert (e.source, e.key, e.got) == (str(path), "capture.request_bytes", 99999)


def test_cpu_budget_is_a_share_of_one_core(tmp_path):
    path = tmp_path / "sitsprobe.yaml"
    e = error(tmp_path, "traces:\n  cpu_budget: 5\n")  # 5 %, meant as a percentage
    assert str(e) == f"{path}: traces.cpu_budget: expected a number 0..1, got 5"
    assert e.key == "traces.cpu_budget"
    assert load(write(tmp_path, "traces:\n  cpu_budget: 0\n")).traces.cpu_budget == 0.0  # max_per_second alone
    assert load(None, {"traces.cpu_budget": 1}).traces.cpu_budget == 1.0


@pytest.mark.parametrize("key,value,expected", [
    ("ring_buffer_mib", 48, "a power-of-two integer 1..1024"),
    ("select.rescan_interval_s", 0.01, "a number 0.05..60"),
    ("select.rescan_interval_s", float("nan"), "a number 0.05..60"),
    ("duration_s", 0, "null or a number > 0"),
    ("duration_s", float("inf"), "null or a number > 0"),
    ("traces.otlp_protocol", "http/json", "null or one of: grpc, http/protobuf"),
    ("traces.otlp_endpoint", "collector:4317", "null or an http:// or https:// URL"),
    ("traces.max_per_second", -1, "an integer >= 0"),
    ("traces.cpu_budget", 1.5, "a number 0..1"),  # a share of one core
    ("traces.cpu_budget", -0.05, "a number 0..1"),
    ("traces.cpu_budget", "5%", "a number 0..1"),
    ("log_level", "verbose", "one of: debug, info, warning, error"),
    ("routes.collapse_ids", "yes please", "true or false"),
    ("metrics.port", 70000, "an integer 0..65535"),
    ("select.pids", 5, "a list of items, each an integer >= 1"),
])
def test_rule_messages(key, value, expected):
    msg = str(error(overrides={key: value}))
    assert msg.startswith(f"<command line>: {key}: expected {expected}, got "), msg


def test_bad_regex(tmp_path):
    msg = str(error(tmp_path, "select:\n  cmdline: ['ok', 'vllm[']\n"))
    assert ": select.cmdline[1]: expected a valid regular expression (" in msg
    assert msg.endswith("got 'vllm['")


def test_bad_list_item_index(tmp_path):
    e = error(tmp_path, "select:\n  ports: [80, 443, 0]\n")
    assert str(e).endswith("select.ports[2]: expected an integer 1..65535, got 0")
    assert e.key == "select.ports[2]"


@pytest.mark.parametrize("text,key", [
    ("select:\n  comms: [python3, a_very_long_comm_name]\n", "select.comms[1]"),
    ("routes:\n  templates: [v1/models]\n", "routes.templates[0]"),
    ("capture:\n  redact_headers: [cookie, 7]\n", "capture.redact_headers[1]"),
    ("capture:\n  keep_query_params: [stream, '']\n", "capture.keep_query_params[1]"),
    ("kubernetes:\n  metric_labels: [namespace, pods]\n", "kubernetes.metric_labels[1]"),
    ("kubernetes:\n  metric_labels: [pod, namespace, pod]\n", "kubernetes.metric_labels[2]"),
])
def test_other_list_items(tmp_path, text, key):
    assert f": {key}: expected " in str(error(tmp_path, text))


def test_keep_query_params(tmp_path):
    c = load(write(tmp_path, "capture:\n  keep_query_params: [stream, Model, page size]\n"))
    assert c.capture.keep_query_params == ("stream", "Model", "page size")  # case kept
    assert load(None, {"capture.keep_query_params": None}).capture.keep_query_params == ()
    path = tmp_path / "sitsprobe.yaml"
    assert str(error(tmp_path, "capture:\n  keep_query_params: stream\n")) == (
        f"{path}: capture.keep_query_params: expected a list of items, "
        "each a non-empty parameter name, got 'stream'")
    assert str(error(tmp_path, "capture:\n  keep_query_params: [stream, 7]\n")) == (
        f"{path}: capture.keep_query_params[1]: expected a non-empty parameter name, got 7")


def test_bool_is_not_int(tmp_path):
    msg = str(error(tmp_path, "metrics:\n  port: true\n"))
    assert msg.endswith("metrics.port: expected an integer 0..65535, got true")
    assert str(error(overrides={"select.pids": [True]})).endswith(
        "select.pids[0]: expected an integer >= 1, got true")
    assert "got false" in str(error(overrides={"duration_s": False}))


def test_null_where_not_allowed(tmp_path):
    assert str(error(tmp_path, "log_level: null\n")).endswith(
        "log_level: expected one of: debug, info, warning, error, got null")


def test_bad_yaml_names_file_and_line(tmp_path):
    e = error(tmp_path, "select:\n  pids: [1, 2\nlog_level: info\n")
    msg = str(e)
    assert msg.startswith(f"{tmp_path / 'sitsprobe.yaml'}: line ")
    assert "expected valid YAML, got " in msg
    e2 = error(tmp_path, "select:\n  pids: [1]\n bad: indent\n")
    assert ": line 3, column " in str(e2)


def test_top_level_not_a_mapping(tmp_path):
    msg = str(error(tmp_path, "- select\n- capture\n"))
    assert msg == (f"{tmp_path / 'sitsprobe.yaml'}: top level: "
                   "expected a mapping of settings (key: value), got a list")
    assert "got a str" in str(error(tmp_path, "just words\n"))


def test_section_not_a_mapping(tmp_path):
    assert str(error(tmp_path, "select: [1, 2]\n")).endswith(
        "select: expected a mapping of settings, got [1, 2]")


def test_missing_file(tmp_path):
    missing = tmp_path / "nope.yaml"
    with pytest.raises(ConfigError) as info:
        load(missing)
    assert str(info.value).startswith(f"{missing}: ")
    assert "no such file" in str(info.value)


def refused(path) -> str:
    """load(path)'s error, which must come at once: in a thread joined with a
    timeout, so a load that blocks fails the test instead of hanging it."""
    out = []

    def attempt():
        try:
            load(path)
        except ConfigError as e:
            out.append(str(e))
    t = threading.Thread(target=attempt, daemon=True)
    t.start()
    t.join(timeout=2)
    assert not t.is_alive(), f"load({path}) blocked"
    assert len(out) == 1 and "\n" not in out[0], out
    return out[0]


def test_a_directory_is_refused(tmp_path):
    assert refused(tmp_path) == f"{tmp_path}: file: expected a regular file, got a directory"


def test_a_fifo_is_refused_never_opened(tmp_path):
    fifo = tmp_path / "sitsprobe.yaml"
    os.mkfifo(fifo)  # opening it to read would wait for a writer, forever
    started = time.monotonic()
    assert refused(fifo) == f"{fifo}: file: expected a regular file, got a FIFO"
    assert time.monotonic() - started < 0.5


def test_a_device_is_refused():
    assert refused("/dev/null") == "/dev/null: file: expected a regular file, got a character device"


def test_a_link_to_a_regular_file_is_read(tmp_path):
    link = tmp_path / "link.yaml"
    link.symlink_to(write(tmp_path, "log_level: debug\n"))
    assert load(link).log_level == "debug"


# --- dump ---------------------------------------------------------------------

def test_dump_round_trips_defaults(tmp_path):
    c = load()
    assert load(write(tmp_path, dump(c))) == c


def test_dump_round_trips_changed_config(tmp_path):
    c = load(None, {"select.pids": [1, 2], "select.cmdline": [r"python\d? -m vllm"],
                    "select.comms": ["vllm"], "routes.templates": ["/v1/{x}"],
                    "routes.collapse_ids": False, "traces.file": "/tmp/t.jsonl",
                    "metrics.address": "::", "metrics.port": 0, "duration_s": 2.5,
                    "kernel_headers": "/usr/src/linux-headers", "log_level": "warning"})
    text = dump(c)
    assert load(write(tmp_path, text)) == c
    assert list(yaml.safe_load(text)) == [f.name for f in dataclasses.fields(Config)]


def test_loading_the_config_imports_no_layer_it_names():
    """`sitsprobe run` begins its compile once the config is read: reading it
    (cache.probes is parsed by sitsprobe.cache.spec) imports neither the
    heatmap's and top-K modules nor prometheus_client, nor bcc."""
    r = subprocess.run([sys.executable, "-c", "import sys, sitsprobe.config as c; c.load(None); "
                        "print([m for m in ('prometheus_client', 'sitsprobe.cache.render', "
                        "'sitsprobe.cache.stats', 'bcc') if m in sys.modules])"],
                       cwd=Path(__file__).resolve().parents[2], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"
