"""GPU samples through a real Prometheus (the Debian package, 2.42) scraping stand-in dcgm-exporters.

No GPU exists here, so the exporters are stand-ins on loopback that serve dcgm-exporter's text format
as documented in NVIDIA/dcgm-exporter: the README's quick start for 4.x (`# HELP`/`# TYPE` lines, then
one line per GPU labelled gpu, UUID, pci_bus_id, device, modelName, Hostname, DCGM_FI_DRIVER_VERSION,
plus container/namespace/pod when the exporter maps a GPU to a pod) and etc/default-counters.csv
(DCGM_FI_DEV_GPU_UTIL "GPU utilization (in %)", DCGM_FI_DEV_FB_USED "Framebuffer memory used (in MiB)");
DCGM_FI_PROF_GR_ENGINE_ACTIVE is from etc/dcp-metrics-included.csv. Prometheus scrapes them every
second: one job with `honor_labels: true` (labels kept as namespace/pod) and one whose static target
labels namespace/pod collide with the exporter's, so Prometheus renames those to exported_namespace/
exported_pod (`honor_labels: false`, the default).

The fake Prometheus endpoints (503, bearer token, empty and invalid answers) answer in the shape of
the HTTP API documented at prometheus.io/docs/prometheus/latest/querying/api/ (range queries).
"""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from need import missing
from prometheus_client.parser import text_string_to_metric_families

from kf_culler.config import PrometheusSettings
from kf_culler.local import procs
from kf_culler.local.prometheus import (
    Exposition,
    FakeGpu,
    Prometheus,
    Seen,
    StubServer,
    Unavailable,
    dcgm_exposition,
    find_prometheus,
    json_reply,
    static_job,
)
from kf_culler.sources.gpu import PrometheusGpu, Split

HONOR = "dcgm-honor"
EXPORTED = "dcgm-exported"
BULK = [("bulk", f"nb{i:02d}-0") for i in range(50)]
SINGLE = ("team-a", "single-0")
MULTI = ("team-a", "multi-0")
ENGINE = ("team-a", "engine-0")
RENAMED = ("team-b", "rstudio-0")
HALF = ("team-d", "half-0")


@pytest.fixture(scope="module")
def prometheus_binary() -> str:
    try:
        return find_prometheus()
    except Unavailable as why:
        missing("Prometheus", why)


def gpu(i: int, util: float, mem: float, key: tuple[str, str] | None, node: str = "gpu-node-1",
        engine: float | None = None) -> FakeGpu:
    ns, pod = key or ("", "")
    return FakeGpu(i, f"GPU-{node}-{i:02d}", util=util, used_mib=mem, namespace=ns, pod=pod,
                   container=pod[:-2] if pod else "", hostname=node, engine_active=engine)


def honor_text() -> str:
    gpus = [gpu(0, 80, 4000, SINGLE),
            gpu(1, 0, 300, MULTI), gpu(2, 85, 9000, MULTI),
            gpu(3, 0, 4096, ENGINE, engine=0.6),
            gpu(4, 0, 0, None)]  # a GPU no pod holds
    # A pod whose GPU reports utilisation but no memory series at all.
    half = ('DCGM_FI_DEV_GPU_UTIL{gpu="5",UUID="GPU-half",device="nvidia5",Hostname="gpu-node-1",'
            'container="half",namespace="team-d",pod="half-0"} 77\n')
    return dcgm_exposition(gpus) + half


def bulk_text() -> str:
    return dcgm_exposition(gpu(i % 8, i, 100 * i, key, node=f"bulk-{i // 8}") for i, key in enumerate(BULK))


@pytest.fixture(scope="module")
def cluster(prometheus_binary: str) -> Iterator[Prometheus]:
    """Prometheus scraping three stand-in exporters every second."""
    with Exposition(honor_text()) as honor, \
            Exposition(dcgm_exposition([gpu(0, 42, 2048, RENAMED, node="gpu-node-2")])) as renamed, \
            Exposition(bulk_text()) as bulk:
        jobs = [static_job(HONOR, [honor.stub.address, bulk.stub.address], honor_labels=True),
                static_job(EXPORTED, [renamed.stub.address], honor_labels=False,
                           labels={"namespace": "gpu-operator", "pod": "nvidia-dcgm-exporter-x7k2p"})]
        with Prometheus(jobs, binary=prometheus_binary) as prom:
            # six scrapes of every target, so that every pod has a few samples
            prom.wait_for('count_over_time(DCGM_FI_DEV_FB_USED[1m]) >= 6', count=5 + 50, timeout=90)
            yield prom


def source(url: str, **kw: Any) -> PrometheusGpu:
    return PrometheusGpu(PrometheusSettings.model_validate(
        {"url": url, "lookbackMinutes": 1, "stepSeconds": 1, "timeoutSeconds": 5, **kw}))


def now() -> datetime:
    return datetime.now(UTC)


def latest(answer: dict[str, Any]) -> tuple[float, float]:
    assert "samples" in answer, answer
    s = answer["samples"][-1]
    return s["utilPercent"], s["memoryUsedMiB"]


def test_samples_per_pod_in_both_label_styles(cluster: Prometheus) -> None:
    src = source(cluster.url)
    asked = [SINGLE, RENAMED, ("team-z", "absent-0"), ("gpu-operator", "nvidia-dcgm-exporter-x7k2p")]
    answers, queries = src.samples(asked, now())
    assert queries == 1
    assert latest(answers[SINGLE]) == (80.0, 4000.0)
    assert latest(answers[RENAMED]) == (42.0, 2048.0)  # read from exported_namespace/exported_pod
    assert answers[("team-z", "absent-0")] == {"error": "no GPU series for pod"}
    # the exporter's own pod holds no GPU series of its own
    assert answers[("gpu-operator", "nvidia-dcgm-exporter-x7k2p")] == {"error": "no GPU series for pod"}
    # The stand-in exporter's values never change: its points (one a step) come as the two ends of one
    # run of equal values (kf_culler.sources.gpu.runs), on the 1-second step grid, the newest recent.
    samples = answers[SINGLE]["samples"]
    assert answers[SINGLE]["points"] >= 3 and len(samples) == 2
    times = [datetime.fromisoformat(s["time"]) for s in samples]
    assert times[0] < times[1] and all(t.microsecond == 0 for t in times)
    assert (times[1] - times[0]).total_seconds() == answers[SINGLE]["points"] - 1
    assert (now() - times[-1]).total_seconds() < 30


def test_multi_gpu_pod_and_engine_activity(cluster: Prometheus) -> None:
    answers, _ = source(cluster.url).samples([MULTI, ENGINE, HALF], now())
    assert answers[MULTI]["gpus"] == 2
    assert latest(answers[MULTI]) == (85.0, 9000.0)  # highest utilisation, highest memory
    assert latest(answers[ENGINE]) == (60.0, 4096.0)  # 100 x DCGM_FI_PROF_GR_ENGINE_ACTIVE
    assert "both GPU utilisation and memory" in answers[HALF]["error"]
    answers, queries = source(cluster.url, gpuEngineActive=False).samples([ENGINE], now())
    assert queries == 1
    assert latest(answers[ENGINE]) == (0.0, 4096.0)


def query_range_requests(prom: Prometheus) -> float:
    """Range queries Prometheus has served, from its own /metrics."""
    with urllib.request.urlopen(f"{prom.url}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    return sum(s.value for family in text_string_to_metric_families(text) for s in family.samples
               if s.name == "prometheus_http_requests_total"
               and s.labels.get("handler") == "/api/v1/query_range")


def test_one_query_for_fifty_pods(cluster: Prometheus) -> None:
    src = source(cluster.url)
    before = query_range_requests(cluster)
    answers, queries = src.samples(BULK, now())
    assert queries == 1  # every metric of every pod in one range query
    assert query_range_requests(cluster) - before == 1  # counted by Prometheus itself
    assert len(answers) == 50
    for i, key in enumerate(BULK):
        assert latest(answers[key]) == (float(i), 100.0 * i), key
    _, few = src.samples(BULK[:5], now())
    assert few == queries  # the same number of queries for 5 pods as for 50


def test_every_pod_gets_an_error_when_prometheus_is_stopped(prometheus_binary: str) -> None:
    with Exposition(dcgm_exposition([gpu(0, 80, 4000, SINGLE)])) as exp:
        prom = Prometheus([static_job(HONOR, [exp.stub.address], honor_labels=True)],
                          binary=prometheus_binary).start()
        try:
            prom.wait_for("DCGM_FI_DEV_GPU_UTIL", timeout=60)
            src = source(prom.url)
            procs.wait_until(lambda: "samples" in src.samples([SINGLE], now())[0][SINGLE], 30,
                             interval=0.5, what="GPU samples")
        finally:
            prom.stop()
        answers, queries = src.samples([SINGLE, MULTI], now())
    assert queries == 1  # the first refused connection ends the call
    for key in (SINGLE, MULTI):
        assert "cannot reach Prometheus" in answers[key]["error"], answers[key]


def matrix(result: list[dict[str, Any]]) -> dict[str, Any]:
    return {"status": "success", "data": {"resultType": "matrix", "result": result}}


def test_503_is_an_error_for_every_pod() -> None:
    def handle(seen: Seen) -> tuple[int, str, bytes]:
        return json_reply({"status": "error", "errorType": "unavailable", "error": "TSDB not ready"}, 503)

    with StubServer(handle) as stub:
        answers, queries = source(stub.url).samples([SINGLE, MULTI], now())
    assert queries == 1
    assert all("HTTP 503" in a["error"] and "TSDB not ready" in a["error"] for a in answers.values()), answers


@pytest.mark.parametrize("reply, words", [
    ((200, "application/json", json.dumps(matrix([])).encode()), "no DCGM_FI_DEV_GPU_UTIL series"),
    ((200, "application/json", b"<html>proxy error</html>"), "not a JSON object"),
    ((200, "application/json", json.dumps({"status": "success", "data": {"resultType": "vector",
                                                                          "result": []}}).encode()),
     "expected a matrix"),
    ((400, "application/json", json.dumps({"status": "error", "errorType": "bad_data",
                                           "error": "parse error"}).encode()),
     "HTTP 400: bad_data parse error"),
])
def test_empty_and_invalid_answers_are_errors(reply: tuple[int, str, bytes], words: str) -> None:
    with StubServer(lambda _: reply) as stub:
        answers, _ = source(stub.url).samples([SINGLE], now())
    assert words in answers[SINGLE]["error"], answers


def test_bearer_token_is_read_on_every_call(tmp_path: Path) -> None:
    t = int(now().timestamp())
    labels = {"namespace": SINGLE[0], "pod": SINGLE[1], "gpu": "0", "UUID": "GPU-1"}
    series = [{"metric": {"__name__": name, **labels}, "values": [[t - 1, "12"], [t, "12"]]}
              for name in ("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED")]

    def handle(seen: Seen) -> tuple[int, str, bytes]:
        if seen.headers.get("authorization") not in ("Bearer first-token", "Bearer rotated-token"):
            return json_reply({"status": "error", "error": "unauthorized"}, 401)
        return json_reply(matrix(series))

    token = tmp_path / "token"
    token.write_text("first-token\n")
    with StubServer(handle) as stub:
        src = source(stub.url, bearerTokenFile=str(token), gpuEngineActive=False)
        first, _ = src.samples([SINGLE], now())
        token.write_text("rotated-token")
        second, _ = src.samples([SINGLE], now())
        token.write_text("stale-token")
        third, _ = src.samples([SINGLE], now())
        seen = [r.headers.get("authorization") for r in stub.requests()]
    assert latest(first[SINGLE]) == (12.0, 12.0) and latest(second[SINGLE]) == (12.0, 12.0)
    assert "HTTP 401" in third[SINGLE]["error"]
    assert seen == ["Bearer first-token", "Bearer rotated-token", "Bearer stale-token"]  # one query a call
    token.unlink()
    missing, queries = src.samples([SINGLE], now())
    assert queries == 0 and "cannot read bearerTokenFile" in missing[SINGLE]["error"]


def test_tls_with_a_ca_file_and_insecure_skip_verify(prometheus_binary: str, tmp_path: Path) -> None:
    from kf_culler.local.pki import Authority

    ca = Authority(tmp_path)
    serving = ca.issue("prometheus", "localhost", server=True)
    web = {"tls_server_config": {"cert_file": str(serving.cert), "key_file": str(serving.key)}}
    with Exposition(dcgm_exposition([gpu(0, 80, 4000, SINGLE)])) as exp, \
            Prometheus([static_job(HONOR, [exp.stub.address], honor_labels=True)], web_config=web,
                       binary=prometheus_binary) as prom:
        assert prom.url.startswith("https://127.0.0.1:")
        prom.wait_for("DCGM_FI_DEV_GPU_UTIL", timeout=60)
        trusted = source(prom.url, caFile=str(ca.pair.cert))
        procs.wait_until(lambda: "samples" in trusted.samples([SINGLE], now())[0][SINGLE], 30,
                         interval=0.5, what="GPU samples over TLS")
        untrusted, _ = source(prom.url).samples([SINGLE], now())
        assert "TLS error" in untrusted[SINGLE]["error"], untrusted
        skipped, _ = source(prom.url, insecureSkipVerify=True).samples([SINGLE], now())
        assert latest(skipped[SINGLE]) == (80.0, 4000.0)


def test_not_configured() -> None:
    answers, queries = PrometheusGpu(PrometheusSettings()).samples([SINGLE], now())
    assert queries == 0 and "no Prometheus URL" in answers[SINGLE]["error"]


class Recording(PrometheusGpu):
    """PrometheusGpu that notes the time range of each range query it makes."""

    def __init__(self, settings: PrometheusSettings) -> None:
        super().__init__(settings)
        self.ranges: list[tuple[float, float]] = []
        real = self.client.query_range

        def query_range(expr: str, start: datetime, end: datetime, step: float, *rest: Any) -> Any:
            self.ranges.append((start.timestamp(), end.timestamp()))
            return real(expr, start, end, step, *rest)

        self.client.query_range = query_range  # type: ignore[method-assign]


def test_later_calls_read_only_what_is_new_and_answer_as_a_fresh_source(cluster: Prometheus) -> None:
    """The source keeps the look-back between calls: a later call asks Prometheus only for the overlap
    window (5 min) back from what it read last, and answers exactly what a new source reading the whole
    look-back answers at the same moment."""
    settings = PrometheusSettings.model_validate(
        {"url": cluster.url, "lookbackMinutes": 40, "stepSeconds": 1, "timeoutSeconds": 5})
    kept = Recording(settings)
    asked = [SINGLE, MULTI, ENGINE, HALF, RENAMED, ("team-z", "absent-0"), *BULK[:5]]
    first, queries = kept.samples(asked, now())
    assert queries == 3  # 40 min in slices of at most 15 min
    assert [round(b - a) for a, b in kept.ranges] == [900, 900, 598]
    first_end = kept.ranges[-1][1]
    time.sleep(2.5)
    at = now()
    later, queries = kept.samples(asked, at)
    assert queries == 1
    start, end = kept.ranges[-1]
    assert end == float(int(at.timestamp())) and start == first_end - 300  # what is new, and the overlap again
    fresh, _ = Recording(settings).samples(asked, at)
    assert later == fresh
    assert later[SINGLE]["points"] > first[SINGLE]["points"]  # the new points were added
    assert later[("team-z", "absent-0")] == {"error": "no GPU series for pod"}
    assert "no time stamp with both" in later[HALF]["error"]


def test_points_past_the_look_back_are_dropped() -> None:
    """Points older than the look-back leave the history; a pod whose points all left it is unknown."""
    src = PrometheusGpu(PrometheusSettings.model_validate({"url": "http://127.0.0.1:9", "lookbackMinutes": 2,
                                                           "stepSeconds": 60}))
    calls: list[float] = []
    t0 = 1_800_000_000.0

    def fetch(a: float, b: float, wanted: set[str]) -> tuple[Split, set[str], None]:
        calls.append(a)
        series = {"DCGM_FI_DEV_GPU_UTIL": {t: 0.0 for t in range(int(a), int(b) + 1, 60)},
                  "DCGM_FI_DEV_FB_USED": {t: 0.0 for t in range(int(a), int(b) + 1, 60)}}
        got = Split()
        got.pods = {SINGLE: {("n", "GPU-0", ""): series}} if a < t0 + 120 else {}
        return got, {"DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED"}, None

    src._fetch = fetch  # type: ignore[method-assign]
    at = datetime.fromtimestamp(t0 + 60, tz=UTC)
    answers, _ = src.samples([SINGLE], at)
    assert answers[SINGLE]["points"] == 3  # t0 - 60, t0, t0 + 60
    answers, _ = src.samples([SINGLE], datetime.fromtimestamp(t0 + 1200, tz=UTC))
    assert answers[SINGLE] == {"error": "no GPU series for pod"}
