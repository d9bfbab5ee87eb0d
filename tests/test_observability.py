"""Traces, metrics and health endpoints around a real stop (real API server, Jupyter, Prometheus)."""

from __future__ import annotations

import asyncio
import gzip
import os
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiohttp import web
from need import missing
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from support.passes import Passes
from support.target import KubeTarget

from kf_culler.config import Settings, load_mapping
from kf_culler.local import objects as obj
from kf_culler.local.jupyter import JupyterServer
from kf_culler.local.procs import free_port
from kf_culler.local.prometheus import (
    Exposition,
    FakeGpu,
    Prometheus,
    Unavailable,
    dcgm_exposition,
    static_job,
)
from kf_culler.local.router import Router
from kf_culler.metrics import HealthServer, Metrics
from kf_culler.model import TRACE_ANNOTATION
from kf_culler.runner import build_runner
from kf_culler.service import instrument, readiness

pytestmark = pytest.mark.cluster


@pytest.fixture()
def fleet(api: Any, namespace: str) -> Iterator[tuple[Router, Prometheus]]:
    """cpu-nb and gpu-nb, both idle: real Jupyter servers, a real Prometheus with the GPU idle."""
    started = datetime.now(UTC) - timedelta(hours=1)
    servers = []
    with Router() as router, Exposition(dcgm_exposition([FakeGpu(
            0, "GPU-0", util=0, used_mib=0, namespace=namespace, pod="gpu-nb-0", container="gpu-nb")])) as exp:
        try:
            prom = Prometheus([static_job("dcgm", [exp.stub.address], honor_labels=True)]).start()
        except Unavailable as why:
            missing("Prometheus", why)
        try:
            for name, gpus in (("cpu-nb", 0), ("gpu-nb", 1)):
                s = JupyterServer(namespace, name)
                s.start()
                servers.append(s)
                s.start_kernel()
                router.add("notebook", namespace, name, f"http://127.0.0.1:{s.port}", strip=False)
                obj.create_notebook(api, namespace, obj.notebook(name, gpus=gpus))
                obj.running_pod(api, namespace, name, started, gpus=gpus)
            prom.wait_for("count_over_time(DCGM_FI_DEV_FB_USED[1m]) >= 2", count=1, timeout=60)
            yield router, prom
        finally:
            for s in servers:
                s.stop()
            prom.stop()


def settings(router: Router, prom: Prometheus, namespace: str) -> Settings:
    return load_mapping({"idleMinutes": 0.05, "warnMinutes": 0, "startupGraceMinutes": 1,
                         "namespaces": {"include": [namespace]}, "urls": {"jupyter": router.template()},
                         "prometheus": {"url": prom.url, "lookbackMinutes": 10, "stepSeconds": 1}}, "test")


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def test_stop_is_traced_counted_and_served(api: Any, namespace: str,
                                           fleet: tuple[Router, Prometheus]) -> None:
    router, prom = fleet
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    runner = Passes(build_runner(settings(router, prom, namespace), api, tracer=provider.get_tracer("test")))
    metrics = Metrics()
    runner.runner = instrument(runner.runner, metrics)
    server = HealthServer(f"127.0.0.1:{free_port()}", metrics,
                          lambda: readiness(runner.runner, memory=runner.memory))
    server.start()
    base = f"http://127.0.0.1:{server.port}"
    try:
        assert get(f"{base}/healthz")[0] == 200
        assert get(f"{base}/readyz")[0] == 503  # caches not synced yet
        time.sleep(3.5)
        runner.start_cache(30)
        assert get(f"{base}/readyz")[0] == 200
        first = {r.name: r for r in runner.once().results}
        assert first["gpu-nb"].verdict.action == "stop", first["gpu-nb"].verdict.reason
        assert first["cpu-nb"].verdict.action == "stop", first["cpu-nb"].verdict.reason
        time.sleep(1.5)
        runner.once()  # the GPU stays reclaimed: reclaimed time accrues
        status, text = get(f"{base}/metrics")
    finally:
        server.stop()
        assert runner.cache is not None
        runner.cache.close()
    assert status == 200
    assert 'kf_culler_stops_total{reason_rule="10-idle"} 2.0' in text
    gpu_hours = [float(line.split()[-1]) for line in text.splitlines()
                 if line.startswith("kf_culler_gpu_hours_reclaimed_total ")]
    assert gpu_hours and gpu_hours[0] > 0
    assert 'kf_culler_api_writes_total{kind="event"} 2.0' in text
    assert 'kf_culler_notebooks{state="stopped"} 2.0' in text

    spans = exporter.get_finished_spans()
    by_id = {s.context.span_id: s for s in spans}

    def parent(s: ReadableSpan) -> ReadableSpan | None:
        return by_id.get(s.parent.span_id) if s.parent else None

    nb_span = next(s for s in spans if s.name == "kf_culler.session"
                   and s.attributes and s.attributes.get("kf_culler.session") == "gpu-nb"
                   and s.attributes.get("kf_culler.action") == "stop")
    cycle = parent(nb_span)
    assert cycle is not None and cycle.name == "kf_culler.cycle"
    children = [s for s in spans if s.parent and s.parent.span_id == nb_span.context.span_id]
    names = sorted({c.name for c in children})
    assert names == ["kf_culler.apply", "kf_culler.probe"]
    probe = next(c for c in children if c.name == "kf_culler.probe")
    assert probe.attributes is not None and probe.attributes["http.response.status_code"] == 200
    assert probe.attributes["kf_culler.source"] == "jupyter"
    attrs = nb_span.attributes or {}
    assert attrs["k8s.namespace.name"] == namespace and attrs["kf_culler.server_type"] == "jupyter"
    assert attrs["kf_culler.state"] == "idle" and float(attrs["kf_culler.idle_seconds"]) >= 3
    assert "GPU" in str(attrs["kf_culler.reason"])
    # The trace id is on the Notebook and in the Event, so a complaint leads to the trace.
    trace_id = format(nb_span.context.trace_id, "032x")
    assert obj.get_notebook(api, namespace, "gpu-nb")["metadata"]["annotations"][TRACE_ANNOTATION] == trace_id
    assert any(trace_id in e.message for e in obj.events_for(api, namespace, "gpu-nb"))


def test_session_and_probe_spans_are_made_only_when_spans_leave_the_process(api: Any, namespace: str,
                                                                           fleet: tuple[Router, Prometheus]) -> None:
    """`run` without an exporter makes no span per session or probe request (nobody would ever see one: a
    10,000-notebook pass made 10,000 and 25,000 of them, docs/performance.md); the pass's span is made all the same,
    and its trace id is each session's, as it was its session span's (a child of the pass's), in its result (then
    its Event and annotations)."""
    router, prom = fleet
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    runner = Passes(build_runner(settings(router, prom, namespace), api, dry_run=True,
                                 tracer=provider.get_tracer("test"), spans_exported=False))
    try:
        runner.start_cache(30)
        results = runner.once().results
    finally:
        assert runner.cache is not None
        runner.cache.close()
    assert results and all(r.calls for r in results if r.name in ("gpu-nb", "cpu-nb")), "the notebooks were probed"
    spans = exporter.get_finished_spans()
    assert [s.name for s in spans if s.name in ("kf_culler.probe", "kf_culler.session", "kf_culler.apply")] == []
    (cycle,) = [s for s in spans if s.name == "kf_culler.cycle"]
    assert cycle.context is not None
    assert {r.trace_id for r in results} == {format(cycle.context.trace_id, "032x")}
    assert len(results) > 1 and len({id(r.trace_id) for r in results}) == 1  # one string held by them all


class ThreadRecordingExporter(InMemorySpanExporter):
    """Wraps the real OTLP exporter: records on which thread each export ran."""

    def __init__(self, inner: Any) -> None:
        super().__init__()
        self.inner = inner
        self.threads: list[str] = []

    def export(self, spans: Any) -> SpanExportResult:
        self.threads.append(threading.current_thread().name)
        result: SpanExportResult = self.inner.export(spans)
        return result


def test_collector_down_never_holds_up_the_cycle(api: Any, namespace: str,
                                                 fleet: tuple[Router, Prometheus]) -> None:
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    router, prom = fleet
    closed = free_port()
    recorder = ThreadRecordingExporter(OTLPSpanExporter(endpoint=f"http://127.0.0.1:{closed}/v1/traces",
                                                        timeout=2))
    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(recorder, schedule_delay_millis=50))
    plain = Passes(build_runner(settings(router, prom, namespace), api, dry_run=True))
    traced = Passes(build_runner(plain.settings, api, dry_run=True, tracer=provider.get_tracer("test")))
    try:
        plain.start_cache(30)
        traced.start_cache(30)
        cycle_thread = threading.current_thread().name
        a = [(r.name, r.verdict.action, r.verdict.state) for r in plain.once().results]
        b = [(r.name, r.verdict.action, r.verdict.state) for r in traced.once().results]
        deadline = time.monotonic() + 30
        while not recorder.threads and time.monotonic() < deadline:
            time.sleep(0.1)  # the batch processor exports on its own thread, after the cycle
        threads = list(recorder.threads)
    finally:
        for r in (plain, traced):
            if r.cache is not None:
                r.cache.close()
        provider.shutdown()
    assert a == b
    assert threads, "the exporter was never called"
    assert cycle_thread not in threads  # exports ran in the background only


def test_otlp_spans_arrive_at_a_receiver(kube: KubeTarget, api: Any, namespace: str, tmp_path: Path,
                                         fleet: tuple[Router, Prometheus]) -> None:
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    router, _ = fleet
    received: list[bytes] = []
    loop = asyncio.new_event_loop()
    port = free_port()

    async def handler(request: web.Request) -> web.Response:
        body = await request.read()
        if request.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        received.append(body)
        return web.Response(status=200, body=b"", content_type="application/x-protobuf")

    holder: dict[str, web.AppRunner] = {}

    async def up() -> None:
        app = web.Application()
        app.router.add_post("/v1/traces", handler)
        holder["r"] = web.AppRunner(app)
        await holder["r"].setup()
        await web.TCPSite(holder["r"], "127.0.0.1", port).start()

    t = threading.Thread(target=loop.run_forever, daemon=True)
    t.start()
    asyncio.run_coroutine_threadsafe(up(), loop).result(10)
    cfg = tmp_path / "config.yaml"
    cfg.write_text(yaml.safe_dump({"idleMinutes": 600, "namespaces": {"include": [namespace]},
                                   "urls": {"jupyter": router.template()}, "dryRun": True}))
    env = {**os.environ, "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{port}"}
    try:
        done = subprocess.run([sys.executable, "-m", "kf_culler", "run", "--once", "--kubeconfig",
                               str(kube.kubeconfig), "--config", str(cfg)], env=env, capture_output=True,
                              text=True, timeout=120)
    finally:
        asyncio.run_coroutine_threadsafe(holder["r"].cleanup(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
    assert done.returncode == 0, done.stderr[-2000:]
    assert received, "no export request reached the receiver"
    services: set[str] = set()
    spans: list[tuple[str, dict[str, Any], bytes, bytes, bytes]] = []  # name, attributes, trace, id, parent
    for body in received:
        request = ExportTraceServiceRequest()
        request.ParseFromString(body)  # raises on anything that is not OTLP protobuf
        for resource_spans in request.resource_spans:
            services |= {a.value.string_value for a in resource_spans.resource.attributes
                         if a.key == "service.name"}
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    attrs = {a.key: getattr(a.value, a.value.WhichOneof("value") or "string_value")
                             for a in span.attributes}
                    spans.append((span.name, attrs, span.trace_id, span.span_id, span.parent_span_id))
    assert services == {"kf-culler"}
    names = [name for name, *_ in spans]
    assert names.count("kf_culler.cycle") == 1 and names.count("kf_culler.gather") == 1
    (cycle,) = [s for s in spans if s[0] == "kf_culler.cycle"]
    assert cycle[1]["kf_culler.notebooks"] == 2 and cycle[1]["kf_culler.interrupted"] is False
    notebooks = {s[1]["kf_culler.session"]: s for s in spans if s[0] == "kf_culler.session"}
    assert set(notebooks) == {"cpu-nb", "gpu-nb"}
    for name, (_, attrs, trace_id, span_id, parent) in notebooks.items():
        assert (trace_id, parent) == (cycle[2], cycle[3]), name  # a child of the pass's span
        assert attrs["k8s.namespace.name"] == namespace and attrs["kf_culler.server_type"] == "jupyter"
        probes = [s[1] for s in spans if s[0] == "kf_culler.probe" and s[4] == span_id]
        # Jupyter's three endpoints of this notebook, each read at the first attempt
        paths = sorted(urllib.parse.urlsplit(p["url.full"]).path for p in probes)
        assert [x.rsplit("/", 2)[-2:] for x in paths] == [["api", "kernels"], ["api", "status"],
                                                          ["api", "terminals"]], paths
        assert all(f"/{namespace}/{name}/" in x for x in paths), paths
        assert all(p["kf_culler.source"] == "jupyter" and p["http.response.status_code"] == 200
                   and p["kf_culler.attempts"] == 1 and p["kf_culler.probe_error"] == "" for p in probes)
    # No Prometheus in this configuration: the CPU notebook is idle under its 600-minute limit; the GPU
    # notebook's IDE is idle inside that window too, but without GPU metrics it rests on half the
    # evidence (rule 6). A dry run: no apply span.
    cpu, gpu = notebooks["cpu-nb"][1], notebooks["gpu-nb"][1]
    assert (cpu["kf_culler.action"], cpu["kf_culler.state"], cpu["kf_culler.rule"]) == ("keep", "idle", "10-idle")
    assert (gpu["kf_culler.action"], gpu["kf_culler.state"], gpu["kf_culler.rule"]) == \
        ("keep", "idle", "6-half-evidence")
    assert cpu["kf_culler.gpus"] == 0 and gpu["kf_culler.gpus"] == 1
    assert "kf_culler.apply" not in names
