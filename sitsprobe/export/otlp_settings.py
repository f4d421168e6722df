"""Where each OTLP signal goes, and how: one set of rules for traces, metrics and logs.

For a signal ("traces", "metrics" or "logs") :func:`resolve` gives the
settings its exporter is built with, by the OpenTelemetry specification's
rules for the ``OTEL_EXPORTER_OTLP_*`` variables (opentelemetry-specification,
protocol/exporter.md), with sitsprobe's own configuration above them::

    setting      from, first found wins
    endpoint     traces.otlp_endpoint / --otlp-endpoint (a base URL, as below)
                 OTEL_EXPORTER_OTLP_<SIGNAL>_ENDPOINT   (used as is)
                 OTEL_EXPORTER_OTLP_ENDPOINT            (http/protobuf: + "/v1/<signal>")
                 http://localhost:4317 (grpc), http://localhost:4318/v1/<signal>
    protocol     traces.otlp_protocol / --otlp-protocol
                 OTEL_EXPORTER_OTLP_<SIGNAL>_PROTOCOL, OTEL_EXPORTER_OTLP_PROTOCOL, grpc
    headers      the caller's, over OTEL_EXPORTER_OTLP_<SIGNAL>_HEADERS (else the generic one)
    the rest     OTEL_EXPORTER_OTLP_<SIGNAL>_<X>, OTEL_EXPORTER_OTLP_<X>, the default

An empty variable counts as unset. Whether a signal is exported at all is
sitsprobe's rule, not the SDK's: only when an endpoint is configured for it
(:func:`configured`). The factories (:func:`span_exporter`,
:func:`metric_exporter`, :func:`log_exporter`) hand the SDK every setting
explicitly, so the SDK's own reading of the environment (which, for one,
takes timeouts in seconds where the specification says milliseconds) never
decides anything. A bad value raises :class:`~sitsprobe.errors.ConfigError`
naming the variable and what it expects.
"""
from __future__ import annotations

import importlib
import logging
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from urllib.parse import unquote, urlsplit

from ..errors import ConfigError

log = logging.getLogger(__name__)

__all__ = [
    "SIGNALS", "PROTOCOLS", "SETTINGS", "OtlpSettings", "resolve", "configured", "settings", "variable",
    "span_exporter", "metric_exporter", "log_exporter",
]

SIGNALS = ("traces", "metrics", "logs")
PROTOCOLS = ("grpc", "http/protobuf")
DEFAULT_ENDPOINTS = {"grpc": "http://localhost:4317", "http/protobuf": "http://localhost:4318"}
DEFAULT_TIMEOUT_MS = 10_000
COMPRESSIONS = ("gzip", "none")

ENVIRONMENT = "environment"  # the ConfigError source of a variable's bad value
CONFIG_ENDPOINT = "traces.otlp_endpoint"  # the configuration keys above the environment
CONFIG_PROTOCOL = "traces.otlp_protocol"

# -- the variables: each generic one, then its per-signal forms, which win over it --

OTEL_EXPORTER_OTLP_ENDPOINT = "OTEL_EXPORTER_OTLP_ENDPOINT"
"""Base URL for every signal: gRPC uses it as is; OTLP/HTTP appends ``/v1/<signal>``."""
OTEL_EXPORTER_OTLP_TRACES_ENDPOINT = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
"""The traces endpoint, used as is (for OTLP/HTTP, the full URL)."""
OTEL_EXPORTER_OTLP_METRICS_ENDPOINT = "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT"
"""The metrics endpoint, used as is (for OTLP/HTTP, the full URL)."""
OTEL_EXPORTER_OTLP_LOGS_ENDPOINT = "OTEL_EXPORTER_OTLP_LOGS_ENDPOINT"
"""The logs endpoint, used as is (for OTLP/HTTP, the full URL)."""

OTEL_EXPORTER_OTLP_PROTOCOL = "OTEL_EXPORTER_OTLP_PROTOCOL"
"""``grpc`` (the default) or ``http/protobuf``; ``http/json`` is not supported."""
OTEL_EXPORTER_OTLP_TRACES_PROTOCOL = "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"
"""The traces protocol: ``grpc`` or ``http/protobuf``."""
OTEL_EXPORTER_OTLP_METRICS_PROTOCOL = "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL"
"""The metrics protocol: ``grpc`` or ``http/protobuf``."""
OTEL_EXPORTER_OTLP_LOGS_PROTOCOL = "OTEL_EXPORTER_OTLP_LOGS_PROTOCOL"
"""The logs protocol: ``grpc`` or ``http/protobuf``."""

OTEL_EXPORTER_OTLP_HEADERS = "OTEL_EXPORTER_OTLP_HEADERS"
"""Request headers (gRPC metadata) as ``key=value,key2=value2``; values are
percent-decoded, keys lowercased. A per-signal variable replaces it whole."""
OTEL_EXPORTER_OTLP_TRACES_HEADERS = "OTEL_EXPORTER_OTLP_TRACES_HEADERS"
"""Headers for traces only, as OTEL_EXPORTER_OTLP_HEADERS."""
OTEL_EXPORTER_OTLP_METRICS_HEADERS = "OTEL_EXPORTER_OTLP_METRICS_HEADERS"
"""Headers for metrics only, as OTEL_EXPORTER_OTLP_HEADERS."""
OTEL_EXPORTER_OTLP_LOGS_HEADERS = "OTEL_EXPORTER_OTLP_LOGS_HEADERS"
"""Headers for logs only, as OTEL_EXPORTER_OTLP_HEADERS."""

OTEL_EXPORTER_OTLP_TIMEOUT = "OTEL_EXPORTER_OTLP_TIMEOUT"
"""Longest wait for one export, in milliseconds (a positive integer; default 10000)."""
OTEL_EXPORTER_OTLP_TRACES_TIMEOUT = "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT"
"""The traces export timeout, in milliseconds."""
OTEL_EXPORTER_OTLP_METRICS_TIMEOUT = "OTEL_EXPORTER_OTLP_METRICS_TIMEOUT"
"""The metrics export timeout, in milliseconds."""
OTEL_EXPORTER_OTLP_LOGS_TIMEOUT = "OTEL_EXPORTER_OTLP_LOGS_TIMEOUT"
"""The logs export timeout, in milliseconds."""

OTEL_EXPORTER_OTLP_COMPRESSION = "OTEL_EXPORTER_OTLP_COMPRESSION"
"""``gzip`` or ``none`` (the default)."""
OTEL_EXPORTER_OTLP_TRACES_COMPRESSION = "OTEL_EXPORTER_OTLP_TRACES_COMPRESSION"
"""The traces compression: ``gzip`` or ``none``."""
OTEL_EXPORTER_OTLP_METRICS_COMPRESSION = "OTEL_EXPORTER_OTLP_METRICS_COMPRESSION"
"""The metrics compression: ``gzip`` or ``none``."""
OTEL_EXPORTER_OTLP_LOGS_COMPRESSION = "OTEL_EXPORTER_OTLP_LOGS_COMPRESSION"
"""The logs compression: ``gzip`` or ``none``."""

OTEL_EXPORTER_OTLP_INSECURE = "OTEL_EXPORTER_OTLP_INSECURE"
"""``true``: gRPC without TLS to an endpoint given without a scheme (an ``http://``
endpoint is always plaintext, an ``https://`` one always TLS). Default false."""
OTEL_EXPORTER_OTLP_TRACES_INSECURE = "OTEL_EXPORTER_OTLP_TRACES_INSECURE"
"""As OTEL_EXPORTER_OTLP_INSECURE, for traces."""
OTEL_EXPORTER_OTLP_METRICS_INSECURE = "OTEL_EXPORTER_OTLP_METRICS_INSECURE"
"""As OTEL_EXPORTER_OTLP_INSECURE, for metrics."""
OTEL_EXPORTER_OTLP_LOGS_INSECURE = "OTEL_EXPORTER_OTLP_LOGS_INSECURE"
"""As OTEL_EXPORTER_OTLP_INSECURE, for logs."""

OTEL_EXPORTER_OTLP_CERTIFICATE = "OTEL_EXPORTER_OTLP_CERTIFICATE"
"""PEM file of the CA certificate(s) that verify the collector's (default: the system's)."""
OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE = "OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE"
"""As OTEL_EXPORTER_OTLP_CERTIFICATE, for traces."""
OTEL_EXPORTER_OTLP_METRICS_CERTIFICATE = "OTEL_EXPORTER_OTLP_METRICS_CERTIFICATE"
"""As OTEL_EXPORTER_OTLP_CERTIFICATE, for metrics."""
OTEL_EXPORTER_OTLP_LOGS_CERTIFICATE = "OTEL_EXPORTER_OTLP_LOGS_CERTIFICATE"
"""As OTEL_EXPORTER_OTLP_CERTIFICATE, for logs."""

OTEL_EXPORTER_OTLP_CLIENT_KEY = "OTEL_EXPORTER_OTLP_CLIENT_KEY"
"""PEM file of the client's private key, for mutual TLS (with a client certificate)."""
OTEL_EXPORTER_OTLP_TRACES_CLIENT_KEY = "OTEL_EXPORTER_OTLP_TRACES_CLIENT_KEY"
"""As OTEL_EXPORTER_OTLP_CLIENT_KEY, for traces."""
OTEL_EXPORTER_OTLP_METRICS_CLIENT_KEY = "OTEL_EXPORTER_OTLP_METRICS_CLIENT_KEY"
"""As OTEL_EXPORTER_OTLP_CLIENT_KEY, for metrics."""
OTEL_EXPORTER_OTLP_LOGS_CLIENT_KEY = "OTEL_EXPORTER_OTLP_LOGS_CLIENT_KEY"
"""As OTEL_EXPORTER_OTLP_CLIENT_KEY, for logs."""

OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE = "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE"
"""PEM file of the client's certificate chain, for mutual TLS (with a client key)."""
OTEL_EXPORTER_OTLP_TRACES_CLIENT_CERTIFICATE = "OTEL_EXPORTER_OTLP_TRACES_CLIENT_CERTIFICATE"
"""As OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE, for traces."""
OTEL_EXPORTER_OTLP_METRICS_CLIENT_CERTIFICATE = "OTEL_EXPORTER_OTLP_METRICS_CLIENT_CERTIFICATE"
"""As OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE, for metrics."""
OTEL_EXPORTER_OTLP_LOGS_CLIENT_CERTIFICATE = "OTEL_EXPORTER_OTLP_LOGS_CLIENT_CERTIFICATE"
"""As OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE, for logs."""

SETTINGS = ("endpoint", "protocol", "headers", "timeout", "compression", "insecure",
            "certificate", "client_key", "client_certificate")


def variable(setting: str, signal: str | None = None) -> str:
    """The variable for ``setting`` (one of SETTINGS): ``signal``'s own, or the generic one."""
    return globals()["OTEL_EXPORTER_OTLP_" + (f"{signal}_" if signal else "").upper() + setting.upper()]


_HEADERS_FORMAT = "comma-separated key=value pairs (k=v,k2=v2)"
_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")  # an HTTP header name (RFC 9110 token)
_SIGNAL_PATH = re.compile(r"/v1/(?:traces|metrics|logs)/?$")


@dataclass(frozen=True)
class OtlpSettings:
    """What one signal's OTLP exporter is built with.

    ``endpoint`` is the exporter's URL: for http/protobuf the full one, with its
    ``/v1/<signal>`` path; for grpc as given (a scheme-less ``host:port`` too).
    ``insecure`` is whether gRPC goes without TLS. ``sources`` says, per
    setting, the variable or configuration key it came from ("default" if none).
    """

    signal: str
    endpoint: str
    protocol: str
    headers: Mapping[str, str]
    timeout_s: float
    compression: str
    insecure: bool
    certificate: str | None = None
    client_key: str | None = None
    client_certificate: str | None = None
    sources: Mapping[str, str] = field(default_factory=dict, compare=False)

    def __str__(self) -> str:
        return (f"OTLP {self.signal} over {self.protocol} to {self.endpoint} "
                f"(endpoint from {self.sources.get('endpoint', 'default')}, "
                f"protocol from {self.sources.get('protocol', 'default')})")


def configured(signal: str, *, endpoint: str | None = None, env: Mapping[str, str] = os.environ) -> bool:
    """Whether ``signal`` is exported over OTLP at all: only if an endpoint is
    given, by the configuration (``endpoint``) or by its per-signal or the generic
    ``..._ENDPOINT`` variable."""
    return bool(endpoint) or any(value for _, value in _lookup(env, "endpoint", signal))


def settings(signal: str, *, endpoint: str | None = None, protocol: str | None = None,
             headers: Mapping[str, str] | None = None,
             env: Mapping[str, str] = os.environ) -> OtlpSettings | None:
    """:func:`resolve`'s settings, or None when the signal is not :func:`configured`."""
    if not configured(signal, endpoint=endpoint, env=env):
        return None
    return resolve(signal, endpoint=endpoint, protocol=protocol, headers=headers, env=env)


def resolve(signal: str, *, endpoint: str | None = None, protocol: str | None = None,
            headers: Mapping[str, str] | None = None,
            env: Mapping[str, str] = os.environ) -> OtlpSettings:
    """The settings for ``signal``: ``endpoint`` and ``protocol`` (traces.otlp_endpoint,
    traces.otlp_protocol) above the environment ``env``, ``headers`` merged over the
    environment's. ``endpoint`` is a base URL, as OTEL_EXPORTER_OTLP_ENDPOINT (a
    ``/v1/<signal>`` path at its end is replaced by this signal's)."""
    if signal not in SIGNALS:
        raise ValueError(f"unknown OTLP signal {signal!r}: expected one of {', '.join(SIGNALS)}")
    sources: dict[str, str] = {}

    def pick(setting: str) -> tuple[str, str] | None:
        found = next(((var, v) for var, v in _lookup(env, setting, signal) if v), None)
        if found is not None:
            sources[setting] = found[0]
        return found

    if protocol:
        proto = _protocol(protocol, "configuration", CONFIG_PROTOCOL)
        sources["protocol"] = CONFIG_PROTOCOL
    elif found := pick("protocol"):
        proto = _protocol(found[1], ENVIRONMENT, found[0])
    else:
        proto = "grpc"

    if endpoint:
        url = _with_signal_path(_SIGNAL_PATH.sub("", endpoint), signal, proto)
        sources["endpoint"], where = CONFIG_ENDPOINT, ("configuration", CONFIG_ENDPOINT)
    elif found := pick("endpoint"):
        var, url = found
        if var == OTEL_EXPORTER_OTLP_ENDPOINT:
            url = _with_signal_path(url, signal, proto)
        where = (ENVIRONMENT, var)
    else:
        url, where = _with_signal_path(DEFAULT_ENDPOINTS[proto], signal, proto), ("default", "endpoint")
    scheme = urlsplit(url).scheme if "://" in url else ""
    if proto == "http/protobuf" and scheme not in ("http", "https"):
        raise ConfigError(*where, "an http:// or https:// URL for http/protobuf", url)

    merged = {}
    if found := pick("headers"):
        merged = _headers(found[1], found[0])
    merged.update({k.lower(): v for k, v in (headers or {}).items()})

    timeout_ms = DEFAULT_TIMEOUT_MS
    if found := pick("timeout"):
        timeout_ms = _timeout_ms(found[1], found[0])

    compression = "none"
    if found := pick("compression"):
        compression = _choice(found[1].lower(), COMPRESSIONS, found[0])

    if scheme in ("http", "https"):
        insecure = scheme == "http"
    else:
        insecure = (found := pick("insecure")) is not None and _boolean(found[1], found[0])

    files = {}
    for setting in ("certificate", "client_key", "client_certificate"):
        if found := pick(setting):
            files[setting] = _existing_file(found[1], found[0])
    if ("client_key" in files) != ("client_certificate" in files):
        have, lacking = ("client_key", "client_certificate") if "client_key" in files else \
            ("client_certificate", "client_key")
        raise ConfigError(ENVIRONMENT, variable(lacking),
                          f"a file to go with {sources[have]} (mutual TLS needs both)")
    return OtlpSettings(signal=signal, endpoint=url, protocol=proto, headers=merged,
                        timeout_s=timeout_ms / 1000, compression=compression, insecure=insecure,
                        sources=sources, **files)


# -- the factories ------------------------------------------------------------------

# (signal, protocol) -> the SDK's exporter class, imported only when used
_EXPORTERS = {
    ("traces", "grpc"): ("opentelemetry.exporter.otlp.proto.grpc.trace_exporter", "OTLPSpanExporter"),
    ("traces", "http/protobuf"): ("opentelemetry.exporter.otlp.proto.http.trace_exporter", "OTLPSpanExporter"),
    ("metrics", "grpc"): ("opentelemetry.exporter.otlp.proto.grpc.metric_exporter", "OTLPMetricExporter"),
    ("metrics", "http/protobuf"): ("opentelemetry.exporter.otlp.proto.http.metric_exporter", "OTLPMetricExporter"),
    ("logs", "grpc"): ("opentelemetry.exporter.otlp.proto.grpc._log_exporter", "OTLPLogExporter"),
    ("logs", "http/protobuf"): ("opentelemetry.exporter.otlp.proto.http._log_exporter", "OTLPLogExporter"),
}


def span_exporter(s: OtlpSettings):
    """The SDK's OTLP span exporter for ``s`` (a "traces" signal's settings)."""
    return _exporter(s, "traces")


def metric_exporter(s: OtlpSettings):
    """The SDK's OTLP metric exporter for ``s`` (a "metrics" signal's settings)."""
    return _exporter(s, "metrics")


def log_exporter(s: OtlpSettings):
    """The SDK's OTLP log exporter for ``s`` (a "logs" signal's settings)."""
    return _exporter(s, "logs")


def _exporter(s: OtlpSettings, signal: str):
    if s.signal != signal:
        raise ValueError(f"settings for {s.signal} given to the {signal} exporter")
    module, name = _EXPORTERS[(signal, s.protocol)]
    cls = getattr(importlib.import_module(module), name)
    common = {"endpoint": s.endpoint, "headers": dict(s.headers), "timeout": s.timeout_s}
    log.info("%s", s)
    if s.protocol == "grpc":
        import grpc

        compression = grpc.Compression.Gzip if s.compression == "gzip" else grpc.Compression.NoCompression
        credentials = None if s.insecure else grpc.ssl_channel_credentials(
            root_certificates=_read(s, "certificate"), private_key=_read(s, "client_key"),
            certificate_chain=_read(s, "client_certificate"))
        return cls(insecure=s.insecure, credentials=credentials, compression=compression, **common)

    from opentelemetry.exporter.otlp.proto.http import Compression

    compression = Compression.Gzip if s.compression == "gzip" else Compression.NoCompression
    return cls(certificate_file=s.certificate, client_key_file=s.client_key,
               client_certificate_file=s.client_certificate, compression=compression,
               session=_session_verifying_with(s.certificate) if s.certificate else None, **common)


def _session_verifying_with(certificate: str):
    """A requests Session that verifies with ``certificate`` whatever the environment
    says: a plain one lets REQUESTS_CA_BUNDLE or CURL_CA_BUNDLE replace the CA file
    it was given (psf/requests#3829), so OTEL_EXPORTER_OTLP_CERTIFICATE would be
    ignored wherever those are set."""
    import requests

    class Pinned(requests.Session):
        def merge_environment_settings(self, url, proxies, stream, verify, cert):
            merged = super().merge_environment_settings(url, proxies, stream, verify, cert)
            merged["verify"] = certificate
            return merged

    return Pinned()


# -- reading one value --------------------------------------------------------------

def _lookup(env: Mapping[str, str], setting: str, signal: str) -> list[tuple[str, str]]:
    """(variable, value) for ``setting``: the per-signal variable first, then the generic one."""
    return [(var, env.get(var, "").strip()) for var in (variable(setting, signal), variable(setting))]


def _with_signal_path(base: str, signal: str, protocol: str) -> str:
    return base if protocol == "grpc" else f"{base.rstrip('/')}/v1/{signal}"


def _protocol(value: str, source: str, key: str) -> str:
    return _choice(value.strip(), PROTOCOLS, key, source)


def _choice(value: str, options: tuple[str, ...], key: str, source: str = ENVIRONMENT) -> str:
    if value not in options:
        raise ConfigError(source, key, " or ".join(options), value)
    return value


def _boolean(value: str, var: str) -> bool:
    return _choice(value.strip().lower(), ("true", "false"), var) == "true"


def _timeout_ms(value: str, var: str) -> int:
    if not value.isdigit() or int(value) == 0:
        raise ConfigError(ENVIRONMENT, var, "a positive whole number of milliseconds", value)
    return int(value)


def _headers(value: str, var: str) -> dict[str, str]:
    """``key=value,key2=value2`` as a dict; a value is never shown in an error (it may be a secret)."""
    out: dict[str, str] = {}
    items = value.split(",")
    for i, item in enumerate(items, 1):
        key, eq, val = item.partition("=")
        key = key.strip()
        if not item.strip() and i == len(items) > 1:
            continue  # a trailing comma
        if not eq or not _TOKEN.fullmatch(key):
            what = "has no '='" if not eq else "has no valid header name before '='"
            raise ConfigError(ENVIRONMENT, var, f"{_HEADERS_FORMAT}; item {i} of {len(items)} {what}")
        out[key.lower()] = unquote(val.strip())
    return out


def _existing_file(path: str, var: str) -> str:
    if not os.path.isfile(path):
        why = "a directory" if os.path.isdir(path) else "no such file"
        raise ConfigError(ENVIRONMENT, var, f"an existing PEM file, got {path!r} ({why})")
    return path


def _read(s: OtlpSettings, setting: str) -> bytes | None:
    path = getattr(s, setting)
    if path is None:
        return None
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        raise ConfigError(ENVIRONMENT, s.sources[setting],
                          f"a readable PEM file, got {path!r} ({e.strerror})") from None
