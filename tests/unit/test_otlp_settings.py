"""sitsprobe.export.otlp_settings: where each OTLP signal goes, by the
specification's rules for OTEL_EXPORTER_OTLP_*, with the configuration above
them; and exporters built from that alone, proved against real receivers.

The environment is a plain dict handed to resolve(); os.environ is touched
only where the point is that the SDK's own reading of it decides nothing.
"""
from __future__ import annotations

import shutil
import subprocess

import pytest
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import SimpleLogRecordProcessor
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from sitsprobe.errors import ConfigError
from sitsprobe.export import otlp_settings as o
from sitsprobe.export.otlp_settings import configured, resolve, settings
from tests.otlp_receiver import GrpcOtlpReceiver, HttpOtlpReceiver, Tls, attributes

SIGNALS = ("traces", "metrics", "logs")
HTTP = "http/protobuf"


def env_for(signal: str, setting: str, value: str) -> dict[str, str]:
    return {f"OTEL_EXPORTER_OTLP_{signal.upper()}_{setting}": value}


# -- endpoint and protocol -----------------------------------------------------------

@pytest.mark.parametrize("signal", SIGNALS)
def test_defaults_are_the_specifications(signal):
    s = resolve(signal, env={})
    assert (s.protocol, s.endpoint, s.timeout_s, s.compression, s.headers) == \
        ("grpc", "http://localhost:4317", 10.0, "none", {})
    assert s.insecure  # an http:// endpoint is plaintext
    assert resolve(signal, env={"OTEL_EXPORTER_OTLP_PROTOCOL": HTTP}).endpoint == \
        f"http://localhost:4318/v1/{signal}"
    assert s.sources == {}


@pytest.mark.parametrize("signal", SIGNALS)
def test_the_helm_charts_environment_sends_every_signal_over_http(signal):
    """Issue 10: with these two variables, metrics and logs went over gRPC to the HTTP port."""
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318",
           "OTEL_EXPORTER_OTLP_PROTOCOL": HTTP}
    s = settings(signal, env=env)
    assert (s.protocol, s.endpoint) == (HTTP, f"http://collector:4318/v1/{signal}")
    assert s.sources == {"endpoint": "OTEL_EXPORTER_OTLP_ENDPOINT", "protocol": "OTEL_EXPORTER_OTLP_PROTOCOL"}
    assert str(s) == (f"OTLP {signal} over http/protobuf to http://collector:4318/v1/{signal} "
                      "(endpoint from OTEL_EXPORTER_OTLP_ENDPOINT, protocol from OTEL_EXPORTER_OTLP_PROTOCOL)")


@pytest.mark.parametrize("signal", SIGNALS)
def test_a_per_signal_endpoint_wins_and_is_used_as_is(signal):
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://generic:4318",
           **env_for(signal, "ENDPOINT", "http://special:9999/custom/path")}
    for protocol in ("grpc", HTTP):
        s = resolve(signal, protocol=protocol, env=env)
        assert s.endpoint == "http://special:9999/custom/path"
        assert s.sources["endpoint"] == f"OTEL_EXPORTER_OTLP_{signal.upper()}_ENDPOINT"
    other = next(x for x in SIGNALS if x != signal)  # the others keep the generic one
    assert resolve(other, protocol=HTTP, env=env).endpoint == f"http://generic:4318/v1/{other}"


@pytest.mark.parametrize("base, expected", [
    ("http://c:4318", "http://c:4318/v1/logs"),
    ("http://c:4318/", "http://c:4318/v1/logs"),
    ("https://c/otlp/", "https://c/otlp/v1/logs"),
    ("https://c/otlp", "https://c/otlp/v1/logs"),
])
def test_the_generic_endpoint_is_a_base_url_for_http(base, expected):
    assert resolve("logs", env={"OTEL_EXPORTER_OTLP_ENDPOINT": base,
                                "OTEL_EXPORTER_OTLP_PROTOCOL": HTTP}).endpoint == expected
    assert resolve("logs", env={"OTEL_EXPORTER_OTLP_ENDPOINT": base}).endpoint == base  # gRPC: as is


@pytest.mark.parametrize("signal", SIGNALS)
def test_the_configuration_sits_above_the_environment_for_every_signal(signal):
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://env:4317", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
           **env_for(signal, "ENDPOINT", "http://env-signal:4317"), **env_for(signal, "PROTOCOL", "grpc")}
    s = resolve(signal, endpoint="http://config:4318", protocol=HTTP, env=env)
    assert (s.protocol, s.endpoint) == (HTTP, f"http://config:4318/v1/{signal}")
    assert s.sources == {"endpoint": "traces.otlp_endpoint", "protocol": "traces.otlp_protocol"}
    # an endpoint configured in full for traces is taken as the base of them all
    assert resolve(signal, endpoint="http://config:4318/v1/traces", protocol=HTTP, env={}).endpoint == \
        f"http://config:4318/v1/{signal}"


def test_a_per_signal_protocol_wins_over_the_generic_one():
    env = {"OTEL_EXPORTER_OTLP_PROTOCOL": HTTP, "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL": "grpc"}
    assert [resolve(s, env=env).protocol for s in SIGNALS] == [HTTP, "grpc", HTTP]


def test_an_empty_variable_counts_as_unset():
    env = {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://g:4317",
           "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": " ", "OTEL_EXPORTER_OTLP_TIMEOUT": ""}
    s = resolve("traces", env=env)
    assert (s.endpoint, s.protocol, s.timeout_s) == ("http://g:4317", "grpc", 10.0)
    assert not configured("metrics", env={"OTEL_EXPORTER_OTLP_ENDPOINT": ""})


def test_a_signal_is_exported_only_with_an_endpoint_for_it():
    assert not configured("traces", env={})
    assert settings("traces", env={"OTEL_EXPORTER_OTLP_PROTOCOL": HTTP}) is None
    assert all(configured(s, endpoint="http://config:4317", env={}) for s in SIGNALS)
    assert all(configured(s, env={"OTEL_EXPORTER_OTLP_ENDPOINT": "http://g:4317"}) for s in SIGNALS)
    env = {"OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": "http://m:4317"}
    assert [configured(s, env=env) for s in SIGNALS] == [False, True, False]
    assert settings("traces", env={"OTEL_EXPORTER_OTLP_HEADERS": "not a header"}) is None  # not read


# -- headers, timeout, compression, TLS ------------------------------------------------

def test_headers_are_percent_decoded_with_lowercase_names():
    env = {"OTEL_EXPORTER_OTLP_HEADERS": " Api-Key = s%3Dcr%2Cet , X-Scope-OrgID=tenant-1,"}
    assert resolve("logs", env=env).headers == {"api-key": "s=cr,et", "x-scope-orgid": "tenant-1"}
    assert resolve("logs", env={"OTEL_EXPORTER_OTLP_HEADERS": "k="}).headers == {"k": ""}


def test_per_signal_headers_replace_the_generic_ones_and_the_callers_go_over_them():
    env = {"OTEL_EXPORTER_OTLP_HEADERS": "a=1,b=2", "OTEL_EXPORTER_OTLP_TRACES_HEADERS": "b=3"}
    assert resolve("traces", env=env).headers == {"b": "3"}
    assert resolve("metrics", env=env).headers == {"a": "1", "b": "2"}
    assert resolve("metrics", headers={"B": "caller", "c": "4"}, env=env).headers == \
        {"a": "1", "b": "caller", "c": "4"}


def test_timeout_is_milliseconds_as_the_specification_says():
    env = {"OTEL_EXPORTER_OTLP_TIMEOUT": "2500", "OTEL_EXPORTER_OTLP_LOGS_TIMEOUT": "250"}
    assert [resolve(s, env=env).timeout_s for s in SIGNALS] == [2.5, 2.5, 0.25]


def test_compression():
    env = {"OTEL_EXPORTER_OTLP_COMPRESSION": "gzip", "OTEL_EXPORTER_OTLP_TRACES_COMPRESSION": "none"}
    assert [resolve(s, env=env).compression for s in SIGNALS] == ["none", "gzip", "gzip"]
    assert resolve("logs", env={"OTEL_EXPORTER_OTLP_COMPRESSION": "GZIP"}).compression == "gzip"


@pytest.mark.parametrize("endpoint, insecure_var, insecure", [
    ("http://c:4317", "false", True),  # the scheme decides
    ("https://c:4317", "true", False),
    ("c:4317", None, False),  # no scheme: TLS unless told otherwise
    ("c:4317", "true", True),
    ("c:4317", "False", False),
])
def test_grpc_plaintext_or_tls(endpoint, insecure_var, insecure):
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint}
    if insecure_var is not None:
        env["OTEL_EXPORTER_OTLP_METRICS_INSECURE"] = insecure_var
    assert resolve("metrics", env=env).insecure is insecure


def test_certificate_files(tmp_path):
    ca, key, cert = (tmp_path / n for n in ("ca.pem", "client.key", "client.pem"))
    for f in (ca, key, cert):
        f.write_text("-----BEGIN X-----\n")
    env = {"OTEL_EXPORTER_OTLP_CERTIFICATE": str(ca), "OTEL_EXPORTER_OTLP_LOGS_CLIENT_KEY": str(key),
           "OTEL_EXPORTER_OTLP_LOGS_CLIENT_CERTIFICATE": str(cert)}
    s = resolve("logs", env=env)
    assert (s.certificate, s.client_key, s.client_certificate) == (str(ca), str(key), str(cert))
    t = resolve("traces", env={"OTEL_EXPORTER_OTLP_CERTIFICATE": str(ca)})
    assert (t.certificate, t.client_key, t.client_certificate) == (str(ca), None, None)


# -- bad values: ConfigError naming the variable and what it expects -------------------

@pytest.mark.parametrize("env, message", [
    ({"OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"},
     "environment: OTEL_EXPORTER_OTLP_PROTOCOL: expected grpc or http/protobuf, got 'http/json'"),
    ({"OTEL_EXPORTER_OTLP_METRICS_PROTOCOL": "zipkin"},
     "environment: OTEL_EXPORTER_OTLP_METRICS_PROTOCOL: expected grpc or http/protobuf, got 'zipkin'"),
    ({"OTEL_EXPORTER_OTLP_TIMEOUT": "10s"},
     "environment: OTEL_EXPORTER_OTLP_TIMEOUT: expected a positive whole number of milliseconds, got '10s'"),
    ({"OTEL_EXPORTER_OTLP_METRICS_TIMEOUT": "0"},
     "environment: OTEL_EXPORTER_OTLP_METRICS_TIMEOUT: expected a positive whole number of milliseconds, "
     "got '0'"),
    ({"OTEL_EXPORTER_OTLP_HEADERS": "api-key=1,Bearer sekrit"},
     "environment: OTEL_EXPORTER_OTLP_HEADERS: expected comma-separated key=value pairs (k=v,k2=v2); "
     "item 2 of 2 has no '='"),
    ({"OTEL_EXPORTER_OTLP_HEADERS": "=sekrit"},
     "environment: OTEL_EXPORTER_OTLP_HEADERS: expected comma-separated key=value pairs (k=v,k2=v2); "
     "item 1 of 1 has no valid header name before '='"),
    ({"OTEL_EXPORTER_OTLP_COMPRESSION": "zstd"},
     "environment: OTEL_EXPORTER_OTLP_COMPRESSION: expected gzip or none, got 'zstd'"),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "collector:4317", "OTEL_EXPORTER_OTLP_INSECURE": "yes"},
     "environment: OTEL_EXPORTER_OTLP_INSECURE: expected true or false, got 'yes'"),
    ({"OTEL_EXPORTER_OTLP_CERTIFICATE": "/nonexistent/ca.pem"},
     "environment: OTEL_EXPORTER_OTLP_CERTIFICATE: expected an existing PEM file, "
     "got '/nonexistent/ca.pem' (no such file)"),
    ({"OTEL_EXPORTER_OTLP_METRICS_CLIENT_KEY": "/"},
     "environment: OTEL_EXPORTER_OTLP_METRICS_CLIENT_KEY: expected an existing PEM file, got '/' (a directory)"),
    ({"OTEL_EXPORTER_OTLP_PROTOCOL": HTTP, "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": "collector:4318"},
     "environment: OTEL_EXPORTER_OTLP_METRICS_ENDPOINT: expected an http:// or https:// URL for "
     "http/protobuf, got 'collector:4318'"),
])
def test_a_bad_value_names_its_variable_and_what_it_expects(env, message):
    with pytest.raises(ConfigError) as e:
        resolve("metrics", env=env)
    assert str(e.value) == message
    assert "sekrit" not in str(e.value)  # header values are secrets: never shown


def test_a_client_key_needs_its_certificate(tmp_path):
    key = tmp_path / "client.key"
    key.write_text("k")
    with pytest.raises(ConfigError) as e:
        resolve("traces", env={"OTEL_EXPORTER_OTLP_TRACES_CLIENT_KEY": str(key)})
    assert str(e.value) == ("environment: OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE: expected a file to go with "
                            "OTEL_EXPORTER_OTLP_TRACES_CLIENT_KEY (mutual TLS needs both)")


def test_a_bad_configured_protocol_names_its_key():
    with pytest.raises(ConfigError, match=r"^configuration: traces.otlp_protocol: expected grpc or "
                                          r"http/protobuf, got 'http/json'$"):
        resolve("logs", protocol="http/json", env={})
    with pytest.raises(ValueError, match="unknown OTLP signal 'spans'"):
        resolve("spans", env={})


def test_every_variable_is_a_documented_constant():
    names = [n for n in vars(o) if n.startswith("OTEL_")]
    assert sorted(names) == sorted(o.variable(setting, signal) for setting in o.SETTINGS
                                   for signal in (None, *SIGNALS))  # each generic and per signal
    assert o.variable("client_key", "metrics") == "OTEL_EXPORTER_OTLP_METRICS_CLIENT_KEY"
    assert all(getattr(o, n) == n for n in names)
    source = open(o.__file__).read()
    for n in names:
        assert f'{n} = "{n}"\n"""' in source, f"{n} has no docstring"


# -- the exporters, built from the settings alone, against real receivers --------------

def send(signal: str, s: o.OtlpSettings) -> None:
    """One span, one metric or one log record through the factory's exporter."""
    if signal == "traces":
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(o.span_exporter(s)))
        provider.get_tracer("t").start_span("one").end()
    elif signal == "metrics":
        reader = InMemoryMetricReader()
        provider = MeterProvider(metric_readers=[reader])
        provider.get_meter("m").create_counter("sitsprobe_test_total").add(3)
        exporter = o.metric_exporter(s)
        exporter.export(reader.get_metrics_data())
        exporter.shutdown()
    else:
        provider = LoggerProvider()
        provider.add_log_record_processor(SimpleLogRecordProcessor(o.log_exporter(s)))
        provider.get_logger("l").emit(body="one alert", attributes={"gpu": 0})
    provider.shutdown()


def received(signal: str, rx) -> list:
    if signal == "traces":
        return [span.name for _, span in rx.spans()]
    if signal == "metrics":
        return sorted(rx.metrics.names())
    return [(r.body.string_value, attributes(r.attributes)) for _, r in rx.logs.records()]


EXPECTED = {"traces": ["one"], "metrics": ["sitsprobe_test_total"], "logs": [("one alert", {"gpu": 0})]}


@pytest.mark.parametrize("signal", SIGNALS)
@pytest.mark.parametrize("protocol, receiver", [("grpc", GrpcOtlpReceiver), (HTTP, HttpOtlpReceiver)])
def test_each_factory_reaches_a_real_receiver_with_the_headers(signal, protocol, receiver):
    with receiver() as rx:
        env = {"OTEL_EXPORTER_OTLP_ENDPOINT": rx.endpoint, "OTEL_EXPORTER_OTLP_PROTOCOL": protocol,
               "OTEL_EXPORTER_OTLP_HEADERS": "x-tenant=t1", "OTEL_EXPORTER_OTLP_COMPRESSION": "gzip"}
        send(signal, resolve(signal, env=env))
        assert received(signal, rx) == EXPECTED[signal]
        service = rx if signal == "traces" else getattr(rx, signal)
        assert service.headers[0]["x-tenant"] == "t1"
        if protocol == HTTP:
            assert service.headers[0]["content-encoding"] == "gzip"


@pytest.mark.parametrize("signal", SIGNALS)
def test_the_sdks_own_reading_of_the_environment_decides_nothing(signal, monkeypatch):
    """os.environ says grpc to a dead port, with a 1 ms timeout (1 s to the SDK);
    the settings say http/protobuf to the receiver: the settings win."""
    for var, value in {"ENDPOINT": "http://127.0.0.1:9", "PROTOCOL": "grpc", "TIMEOUT": "1",
                       "COMPRESSION": "deflate"}.items():
        monkeypatch.setenv(f"OTEL_EXPORTER_OTLP_{var}", value)
        monkeypatch.setenv(f"OTEL_EXPORTER_OTLP_{signal.upper()}_{var}", value)
    with HttpOtlpReceiver() as rx:
        send(signal, resolve(signal, endpoint=rx.endpoint, protocol=HTTP, env={}))
        assert received(signal, rx) == EXPECTED[signal]
        service = rx if signal == "traces" else getattr(rx, signal)
        assert "content-encoding" not in service.headers[0]


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    """A CA, a server certificate for 127.0.0.1 and a client certificate, all from it (openssl)."""
    if not shutil.which("openssl"):
        pytest.skip("no openssl on PATH")
    d = tmp_path_factory.mktemp("pki")

    def run(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=d, check=True, capture_output=True, timeout=60)

    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    run("req", "-x509", *ec, "-subj", "/CN=sitsprobe test CA", "-days", "1", "-keyout", "ca.key", "-out", "ca.pem")
    for name, ext in (("server", "subjectAltName=IP:127.0.0.1"), ("client", "extendedKeyUsage=clientAuth")):
        (d / f"{name}.ext").write_text(ext + "\n")
        run("req", *ec, "-subj", f"/CN={name}", "-keyout", f"{name}.key", "-out", f"{name}.csr")
        run("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
            "-days", "1", "-extfile", f"{name}.ext", "-out", f"{name}.pem")
    return d


@pytest.mark.parametrize("protocol, receiver", [("grpc", GrpcOtlpReceiver), (HTTP, HttpOtlpReceiver)])
def test_mutual_tls_from_the_certificate_variables(pki, protocol, receiver, monkeypatch):
    """The collector's certificate checked against OTEL_EXPORTER_OTLP_CERTIFICATE, and the
    agent's own (CLIENT_KEY, CLIENT_CERTIFICATE) shown to a collector that demands one.
    requests' own CA variables (set on many machines) must not replace the CA file."""
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", "/etc/ssl/certs/ca-certificates.crt")
    monkeypatch.setenv("CURL_CA_BUNDLE", "/etc/ssl/certs/ca-certificates.crt")
    tls = Tls(str(pki / "server.pem"), str(pki / "server.key"), client_ca=str(pki / "ca.pem"))
    with receiver(tls) as rx:
        assert rx.endpoint.startswith("https://")
        env = {"OTEL_EXPORTER_OTLP_ENDPOINT": rx.endpoint, "OTEL_EXPORTER_OTLP_PROTOCOL": protocol,
               "OTEL_EXPORTER_OTLP_CERTIFICATE": str(pki / "ca.pem"),
               "OTEL_EXPORTER_OTLP_TRACES_CLIENT_KEY": str(pki / "client.key"),
               "OTEL_EXPORTER_OTLP_TRACES_CLIENT_CERTIFICATE": str(pki / "client.pem")}
        s = resolve("traces", env=env)
        assert not s.insecure
        send("traces", s)
        assert received("traces", rx) == EXPECTED["traces"]


def test_a_factory_takes_only_its_own_signals_settings():
    with pytest.raises(ValueError, match="settings for logs given to the traces exporter"):
        o.span_exporter(resolve("logs", env={}))


def test_a_certificate_gone_before_the_exporter_is_built_names_its_variable(tmp_path):
    ca = tmp_path / "ca.pem"
    ca.write_text("x")
    s = resolve("metrics", env={"OTEL_EXPORTER_OTLP_ENDPOINT": "https://c:4317",
                                "OTEL_EXPORTER_OTLP_METRICS_CERTIFICATE": str(ca)})
    ca.unlink()
    with pytest.raises(ConfigError, match=r"^environment: OTEL_EXPORTER_OTLP_METRICS_CERTIFICATE: expected "
                                          r"a readable PEM file, got '.*ca.pem' \(No such file"):
        o.metric_exporter(s)
