"""Fault matrix, endpoints: probes against servers that misbehave, Prometheus down, the OTLP collector down.

Every fault must give `{"error": ...}` within the probe's budget (timeoutSeconds, at most 1 + retries
attempts), with bounded memory, and a full pass over notebooks pointing at the broken endpoints
must stop none of them: a broken endpoint is no signal, never idleness (rule 6). One notebook in each
pass answers a valid idle answer and *is* stopped, so the setup is shown to be able to stop.
"""

from __future__ import annotations

import asyncio
import threading
import time
import tracemalloc
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from aiohttp import web
from support.faulty import HUGE_BYTES, FaultyServer
from support.passes import Passes

from kf_culler.config import ProbeSettings, PrometheusSettings, Settings, load_mapping
from kf_culler.cycle import Cycle
from kf_culler.local import objects as obj
from kf_culler.local.procs import free_port
from kf_culler.model import STOP_ANNOTATION
from kf_culler.plan import EVENT_STOP
from kf_culler.runner import build_runner
from kf_culler.sources import codeserver, jupyter
from kf_culler.sources.gpu import PrometheusGpu
from kf_culler.sources.http import Call, Fetcher

TIMEOUT = 2.0
RETRIES = 1
PROBE = ProbeSettings.model_validate({"timeoutSeconds": TIMEOUT, "connectTimeoutSeconds": 1.0, "retries": RETRIES})
# A behavioural bound, not a speed target: the budget covers every attempt; one second of slack.
PROBE_BOUND = TIMEOUT * (1 + RETRIES) + 1.0
FAULTS = ["hang", "reset", "e401", "e403", "rbac", "e404", "e500", "e502", "e503", "e504", "badjson", "huge",
          "hugechunked", "slow"]
TRANSIENT = {"reset", "e502", "e503", "e504"}  # retried: at most 1 + retries attempts; every other fault: one


@pytest.fixture(scope="module")
def faulty() -> Iterator[FaultyServer]:
    with FaultyServer(slow_delay=0.25) as server:
        yield server


def run_probe(kind: str, url: str, settings: ProbeSettings = PROBE) -> tuple[dict[str, Any], list[Call], float]:
    async def go() -> tuple[dict[str, Any], list[Call]]:
        fetcher = Fetcher.open(settings, 8)
        try:
            if kind == "jupyter":
                return await jupyter.probe(fetcher, url)
            return await codeserver.probe(fetcher, url)
        finally:
            await fetcher.close()

    t0 = time.monotonic()
    answer, calls = asyncio.run(go())
    return answer, calls, time.monotonic() - t0


# -- each fault, each probe ---------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["jupyter", "codeServer"])
@pytest.mark.parametrize("fault", FAULTS)
def test_fault_gives_an_error_within_the_budget(faulty: FaultyServer, kind: str, fault: str) -> None:
    segment = f"{'jup' if kind == 'jupyter' else 'cs'}{len(faulty.seen)}-{fault}"
    answer, calls, seconds = run_probe(kind, faulty.url(segment))
    assert set(answer) == {"error"}, answer
    assert seconds <= PROBE_BOUND, f"{fault}: {seconds:.1f}s"
    assert any(c.error for c in calls)  # (a slow "[]" from api/kernels may still arrive in time)
    for call in calls:
        assert 1 <= call.attempts <= (1 + RETRIES if fault in TRANSIENT else 1), (fault, call)
        assert call.seconds <= TIMEOUT + 0.5, (fault, call)
    # The server saw no more requests than the attempts the calls report, for this notebook's segment
    # (aiohttp itself sends an idempotent request once more when the connection drops before the
    # answer: a reset costs at most two requests per attempt).
    seen = [s for s in faulty.seen if s.path.startswith(f"/{segment}/")]
    per_attempt = 2 if fault == "reset" else 1
    assert 0 < len(seen) <= per_attempt * sum(c.attempts for c in calls)


def test_a_valid_answer_from_the_same_server_is_read(faulty: FaultyServer) -> None:
    """The control: the server's `ok` answers parse, so the errors above come from the faults."""
    from kf_culler.readings import parse_code_server, parse_jupyter

    answer, _, _ = run_probe("jupyter", faulty.url("jup-ok"))
    assert parse_jupyter(answer).summary["kernels"] == 0
    answer, _, _ = run_probe("codeServer", faulty.url("cs-ok"))
    assert not parse_code_server(answer).connected


@pytest.mark.parametrize(("status", "attempts"), [(502, 3), (503, 3), (504, 3), (500, 1), (404, 1)])
def test_only_502_503_504_are_tried_again(faulty: FaultyServer, status: int, attempts: int) -> None:
    """A gateway error (502, 504) or 503 is tried 1 + retries times, each try a request the server
    counts; any other status is asked once. The budget leaves every retry room on a loaded machine."""
    settings = ProbeSettings.model_validate({"timeoutSeconds": 30, "connectTimeoutSeconds": 5, "retries": 2})
    segment = f"retry{len(faulty.seen)}-e{status}"

    async def go() -> tuple[Any, Call]:
        fetcher = Fetcher.open(settings, 1)
        try:
            return await fetcher.get_json(faulty.url(segment) + "api/status")
        finally:
            await fetcher.close()

    answer, call = asyncio.run(go())
    assert answer == {"error": f"HTTP {status}"}
    assert (call.status, call.attempts) == (status, attempts), call
    with faulty.lock:
        seen = [s.path for s in faulty.seen if s.path.startswith(f"/{segment}/")]
    assert seen == [f"/{segment}/api/status"] * attempts


@pytest.mark.parametrize("fault", ["huge", "hugechunked"])
def test_a_50_mb_body_is_not_read_whole(faulty: FaultyServer, fault: str) -> None:
    """The size cap stops the read early: peak Python memory stays far below the body, and the server
    could push only a small part of its 50 MB before the probe hung up. (The body is `0,0,...`: with the
    default probe.maxJsonValues its values would end the read sooner still; the highest lets the cap do it.)"""
    cap = 1 << 20
    before = faulty.body_bytes[fault]
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        settings = ProbeSettings.model_validate({"timeoutSeconds": TIMEOUT, "retries": RETRIES,
                                                 "maxResponseBytes": cap, "maxJsonValues": 10_000_000})
        answer, _calls, _ = run_probe("codeServer", faulty.url(f"cs-{fault}"), settings)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert set(answer) == {"error"} and "cap" in answer["error"], answer
    assert peak < 8 * (1 << 20), f"peak {peak / 2**20:.1f} MiB while refusing a {HUGE_BYTES // 10**6} MB body"
    time.sleep(0.5)  # let the server notice the closed connection
    pushed = faulty.body_bytes[fault] - before
    # The cap plus what the socket buffers hold in flight; nowhere near the whole body.
    assert pushed < 8 * (1 << 20), f"the server pushed {pushed / 2**20:.1f} MiB"


# -- a full pass over notebooks on the real API server --------------------------------------------------------

def fleet_settings(faulty: FaultyServer, namespace: str, **extra: Any) -> Settings:
    return load_mapping({
        "namespaces": {"include": [namespace]},
        "idleMinutes": 1, "warnMinutes": 0, "startupGraceMinutes": 0,
        "urls": {"jupyter": faulty.base + "/{name}/", "codeServer": faulty.base + "/{name}/"},
        "probe": {"timeoutSeconds": TIMEOUT, "connectTimeoutSeconds": 1.0, "retries": RETRIES},
        "concurrency": 32, **extra}, "test")


def make_fleet(api: Any, namespace: str, names: Sequence[tuple[str, str, int]]) -> None:
    started = datetime.now(UTC) - timedelta(hours=1)
    for name, server_type, gpus in names:
        obj.create_notebook(api, namespace, obj.notebook(name, server_type=server_type, gpus=gpus))
        obj.running_pod(api, namespace, name, started, gpus=gpus)


def run_once(settings: Settings, api: Any) -> Any:
    runner = Passes(build_runner(settings, api))
    runner.start_cache(30)
    try:
        return runner.once()
    finally:
        assert runner.cache is not None
        runner.cache.close()


def stopped(api: Any, namespace: str, name: str) -> bool:
    return STOP_ANNOTATION in (obj.get_notebook(api, namespace, name)["metadata"].get("annotations") or {})


@pytest.mark.cluster
def test_a_pass_over_every_broken_endpoint_stops_none(api: Any, namespace: str, faulty: FaultyServer) -> None:
    fleet = [(f"jup-{f}", "jupyter", 0) for f in FAULTS] + [(f"cs-{f}", "group-one", 0) for f in FAULTS]
    make_fleet(api, namespace, [*fleet, ("jup-ok", "jupyter", 0), ("cs-ok", "group-one", 0)])
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        result = run_once(fleet_settings(faulty, namespace), api)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    by_name = {r.name: r for r in result.results}
    assert set(by_name) == {n for n, _, _ in fleet} | {"jup-ok", "cs-ok"}
    for name, _, _ in fleet:
        r = by_name[name]
        source = "jupyter" if name.startswith("jup-") else "codeServer"
        assert set(r.observations[source]) == {"error"}, (name, r.observations)
        assert (r.verdict.action, r.verdict.state) == ("keep", "no-signal"), (name, r.verdict)
        assert not stopped(api, namespace, name), name
        assert EVENT_STOP not in [e.reason for e in obj.events_for(api, namespace, name)]
    for name in ("jup-ok", "cs-ok"):  # the control: readable and idle for an hour -> stopped
        assert by_name[name].verdict.action == "stop", by_name[name].verdict
        assert stopped(api, namespace, name)
    # Probes run concurrently: the whole pass fits in one probe budget plus the API calls.
    assert result.seconds <= PROBE_BOUND + 30
    assert peak < 40 * (1 << 20), f"peak {peak / 2**20:.1f} MiB with two 50 MB answers in the pass"


# -- Prometheus down, answering 503, or hanging ---------------------------------------------------------------

@pytest.fixture(scope="module")
def prometheus_stub() -> Iterator[str]:
    """A Prometheus that answers every query 503 (or, under /hang, nothing within the timeout)."""
    async def handler(request: web.Request) -> web.StreamResponse:
        if request.match_info["mode"] == "hang":
            await asyncio.sleep(8)  # longer than the client's timeout
        return web.json_response({"status": "error", "errorType": "unavailable",
                                  "error": "the TSDB is not ready"}, status=503)

    port = free_port()
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    holder: dict[str, web.AppRunner] = {}

    async def start() -> None:
        app = web.Application()
        app.router.add_route("*", "/{mode}/api/v1/{api}", handler)
        runner = web.AppRunner(app)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        holder["r"] = runner

    asyncio.run_coroutine_threadsafe(start(), loop).result(10)
    yield f"http://127.0.0.1:{port}"
    asyncio.run_coroutine_threadsafe(holder["r"].shutdown(), loop).result(30)
    asyncio.run_coroutine_threadsafe(holder["r"].cleanup(), loop).result(30)
    loop.call_soon_threadsafe(loop.stop)


def prometheus_urls(stub: str) -> dict[str, str]:
    return {"down": f"http://127.0.0.1:{free_port()}", "503": f"{stub}/fail", "hang": f"{stub}/hang"}


@pytest.mark.parametrize("mode", ["down", "503", "hang"])
def test_prometheus_fault_gives_every_pod_an_error(prometheus_stub: str, mode: str) -> None:
    settings = PrometheusSettings.model_validate({"url": prometheus_urls(prometheus_stub)[mode], "timeoutSeconds": 2})
    pods = [("team-a", f"nb-{i}-0") for i in range(50)]
    t0 = time.monotonic()
    answers, queries = PrometheusGpu(settings).samples(pods, datetime.now(UTC))
    seconds = time.monotonic() - t0
    assert set(answers) == set(pods)
    assert all(set(a) == {"error"} and a["error"].startswith("prometheus:") for a in answers.values())
    assert queries == 1  # the first failed query ends the pass's GPU reading; no retry storm
    assert seconds <= settings.timeout_seconds + 5.0
    if mode == "503":
        assert "503" in answers[pods[0]]["error"]


@pytest.mark.cluster
@pytest.mark.parametrize("mode", ["down", "503"])
def test_prometheus_fault_stops_no_gpu_notebook(api: Any, namespace: str, faulty: FaultyServer,
                                                prometheus_stub: str, mode: str) -> None:
    """GPU notebooks whose IDE is readable and idle for an hour: without GPU metrics, no stop (rule 6)."""
    make_fleet(api, namespace, [("jup-ok-gpu", "jupyter", 1), ("cs-ok-gpu", "group-one", 1),
                                ("jup-ok", "jupyter", 0)])
    settings = fleet_settings(faulty, namespace, prometheus={
        "url": prometheus_urls(prometheus_stub)[mode], "timeoutSeconds": 2})
    result = run_once(settings, api)
    by_name = {r.name: r for r in result.results}
    for name in ("jup-ok-gpu", "cs-ok-gpu"):
        r = by_name[name]
        assert set(r.observations["gpu"]) == {"error"}, r.observations
        assert (r.verdict.action, r.verdict.state) == ("keep", "no-signal"), r.verdict
        assert not stopped(api, namespace, name)
    assert by_name["jup-ok"].verdict.action == "stop"  # the CPU control is stopped by the same pass
    assert result.bulk_queries <= 3


# -- the OTLP collector down ------------------------------------------------------------------------------------

def _items(n: int) -> list[tuple[dict[str, Any], dict[str, Any] | None]]:
    """Notebooks in memory (no API server needed): Jupyter, idle for an hour on the faulty server's `ok`."""
    started = (datetime.now(UTC) - timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
    out: list[tuple[dict[str, Any], dict[str, Any] | None]] = []
    for i in range(n):
        name = f"jup-ok-{i}" if i % 2 == 0 else f"jup-e500-{i}"
        nb = obj.notebook(name)
        nb["metadata"]["namespace"] = "team-a"
        pod = {"metadata": {"name": f"{name}-0", "namespace": "team-a"},
               "status": {"phase": "Running", "startTime": started}}
        out.append((nb, pod))
    return out


def _verdicts(result: Any) -> dict[str, tuple[str, str]]:
    return {r.name: (r.verdict.action, r.verdict.state) for r in result.results}


def test_otlp_collector_down_changes_nothing_and_blocks_nothing(faulty: FaultyServer, monkeypatch: Any) -> None:
    """OTEL_EXPORTER_OTLP_ENDPOINT points at a closed port, and every export is held until the pass is
    over: the pass gives the same verdicts as without tracing, and it finishes while exports wait."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace.export import SpanExportResult

    from kf_culler.telemetry import setup_tracing

    items = _items(20)
    settings = fleet_settings(faulty, "team-a")
    baseline = _verdicts(Cycle(settings).run(items))
    assert set(baseline.values()) == {("stop", "idle"), ("keep", "no-signal")}

    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{free_port()}")
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "10")  # export as soon as spans exist
    gate = threading.Event()
    entered = threading.Event()  # set once the exporter holds spans, waiting on the collector
    handed: list[str] = []  # the names of every span handed to the exporter
    calls: list[tuple[str, SpanExportResult]] = []
    real_export = OTLPSpanExporter.export

    def held_export(self: OTLPSpanExporter, spans: Sequence[Any]) -> SpanExportResult:
        handed.extend(span.name for span in spans)
        entered.set()
        gate.wait(120)  # a collector that does not answer until the test lets it
        outcome = real_export(self, spans)
        calls.append((threading.current_thread().name, outcome))
        return outcome

    monkeypatch.setattr(OTLPSpanExporter, "export", held_export)
    provider = setup_tracing()
    tracer = provider.get_tracer("test")  # the global provider can be set once per process: pass it in
    done: dict[str, Any] = {}

    def run_pass(key: str) -> None:
        worker = threading.Thread(target=lambda: done.setdefault(key, Cycle(settings, tracer=tracer).run(items)),
                                  daemon=True)
        worker.start()
        worker.join(PROBE_BOUND + 60)
        assert not worker.is_alive(), f"the {key} pass waited on span export"

    try:
        run_pass("first")
        # The first pass's spans reach the exporter, which is now held: the second pass runs, start to
        # end, while an export is certainly waiting on the collector.
        assert entered.wait(30), "no span reached the exporter"
        run_pass("second")
        assert not gate.is_set()
    finally:
        gate.set()
        t0 = time.monotonic()
        provider.shutdown()  # drains what it can into the closed port, then gives up
        shutdown_seconds = time.monotonic() - t0
    assert _verdicts(done["first"]) == baseline
    assert _verdicts(done["second"]) == baseline
    # Every span of both passes was handed over (none lost to the held export): per pass one cycle,
    # one gather and one span per notebook.
    names = [n for n in handed if n in ("kf_culler.cycle", "kf_culler.gather", "kf_culler.session")]
    assert sorted(names) == sorted(["kf_culler.cycle", "kf_culler.gather"] * 2 + ["kf_culler.session"] * 40)
    assert calls, "no export ever returned"
    assert all(outcome == SpanExportResult.FAILURE for _, outcome in calls)
    assert all(name != threading.main_thread().name for name, _ in calls)
    assert shutdown_seconds <= 60, f"shutting tracing down took {shutdown_seconds:.0f}s"
