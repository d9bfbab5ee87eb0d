"""Tracing (OpenTelemetry, configured by the standard OTEL_* variables) and JSON logs."""

from __future__ import annotations

import json
import logging
import os
import sys
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter

from kf_culler import __version__

LOG_FIELDS = ("namespace", "notebook", "server_type", "source", "http_status", "action", "state", "rule",
              "reason", "idle_seconds", "trace_id", "write", "event", "shards", "shard_count", "identity",
              "brakes", "trips")


def otlp_configured() -> bool:
    return bool(os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or os.environ.get(
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")) and os.environ.get("OTEL_TRACES_EXPORTER", "otlp") != "none"


def setup_tracing(exporter: SpanExporter | None = None) -> TracerProvider:
    """A tracer provider; spans go to `exporter`, else to OTLP/HTTP when OTEL_* says so, else nowhere.

    Spans are always recorded (so trace ids exist for Events) and exported in the background by a
    bounded batch processor: a collector that is down costs dropped spans, never a slower cycle.
    """
    provider = TracerProvider(resource=Resource.create({"service.name": os.environ.get(
        "OTEL_SERVICE_NAME", "kf-culler"), "service.version": __version__}))
    if exporter is None and otlp_configured():
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        exporter = OTLPSpanExporter(timeout=5)
    if exporter is not None:
        provider.add_span_processor(BatchSpanProcessor(exporter, max_queue_size=4096,
                                                       export_timeout_millis=5000))
    trace.set_tracer_provider(provider)
    return provider


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {"time": self.formatTime(record, "%Y-%m-%dT%H:%M:%S"), "level": record.levelname,
                               "logger": record.name, "msg": record.getMessage()}
        for key in LOG_FIELDS:
            value = record.__dict__.get(key)
            if value is not None:
                out[key] = value
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


def setup_logging(json_logs: bool, level: int = logging.INFO) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if json_logs else logging.Formatter(
        "%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    for noisy in ("kubernetes", "urllib3", "aiohttp"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
