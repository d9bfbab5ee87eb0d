"""The RStudio source: container CPU and Istio requests through a real Prometheus (Debian 2.42).

RStudio Server cannot be installed here, and the source never talks to it: it reads what the cluster
records about the pod. The stand-in endpoints Prometheus scrapes replay those records:

- cAdvisor, as the kubelet serves it at /metrics/cadvisor: `container_cpu_usage_seconds_total`
  ("Cumulative cpu time consumed in seconds", a counter) labelled container, cpu, id, image, name,
  namespace, pod, with explicit millisecond time stamps; per pod also the pod cgroup (container="")
  and the pause container (container="POD"). Shape from google/cadvisor docs/storage/prometheus.md
  (v0.49) and the kubelet's cadvisor endpoint (Kubernetes 1.30).
- Istio's sidecar, as merged into the pod's /stats/prometheus: `istio_requests_total` with the
  standard labels reporter, source_workload, destination_workload, destination_workload_namespace,
  response_code, ... (istio.io/latest/docs/reference/config/metrics, "Istio Standard Metrics").
- what an RStudio browser tab does to those counters: it long-polls `/events/get_events`, each poll
  returning within 50 s (`maxRequestSec = seconds(50)` in ClientEventService::run,
  src/cpp/session/SessionClientEventService.cpp of rstudio/rstudio, the copy at commit 07e1e7e0),
  so a connected tab adds a request at least every 50 s while using no CPU; R running code adds CPU.
  The stand-in compresses that cadence to one request every second so the test stays short.
"""

from __future__ import annotations

import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from need import missing
from prometheus_client.parser import text_string_to_metric_families

from kf_culler.config import PrometheusSettings, RStudioSettings, load_mapping
from kf_culler.local import procs
from kf_culler.local.prometheus import (
    Prometheus,
    Seen,
    StubServer,
    Unavailable,
    find_prometheus,
    static_job,
    text_reply,
)
from kf_culler.readings import parse_rstudio
from kf_culler.sources.rstudio import PrometheusRStudio, source_for, workload_of

NS = "team-r"
BUSY = (NS, "rs-busy-0")
IDLE = (NS, "rs-idle-0")
WAS_BUSY = (NS, "rs-was-busy-0")
RENAMED = (NS, "rs-renamed-0")
NO_CPU = (NS, "rs-absent-0")


@dataclass
class Container:
    pod: tuple[str, str]
    name: str
    cores: float  # CPU cores used now


class Cluster:
    """Counters that grow with real time at the rates the test sets."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.cpu: dict[tuple[str, str, str], float] = {}
        self.rates: dict[tuple[str, str, str], float] = {}
        self.requests: dict[tuple[str, str, str], float] = {}  # (ns, workload, source) -> per second
        self.req_totals: dict[tuple[str, str, str], float] = {}
        self.last = time.time()

    def _advance(self) -> None:
        now = time.time()
        dt, self.last = now - self.last, now
        for key, rate in self.rates.items():
            self.cpu[key] = self.cpu.get(key, 0.0) + rate * dt
        for key, rate in self.requests.items():
            self.req_totals[key] = self.req_totals.get(key, 0.0) + rate * dt

    def set_cpu(self, pod: tuple[str, str], container: str, cores: float) -> None:
        with self.lock:
            self._advance()
            self.rates[(pod[0], pod[1], container)] = cores

    def set_requests(self, ns: str, workload: str, source: str, per_second: float) -> None:
        with self.lock:
            self._advance()
            self.requests[(ns, workload, source)] = per_second

    def cadvisor(self, pods: set[tuple[str, str]]) -> str:
        with self.lock:
            self._advance()
            ms = int(self.last * 1000)
            lines = ["# HELP container_cpu_usage_seconds_total Cumulative cpu time consumed in seconds.",
                     "# TYPE container_cpu_usage_seconds_total counter"]
            totals: dict[tuple[str, str], float] = {}
            for (ns, pod, container), value in sorted(self.cpu.items()):
                if (ns, pod) not in pods:
                    continue
                totals[(ns, pod)] = totals.get((ns, pod), 0.0) + value
                uid = f"{abs(hash((ns, pod))):032x}"
                lines.append(
                    f'container_cpu_usage_seconds_total{{container="{container}",cpu="total",'
                    f'id="/kubepods/burstable/pod{uid}/{container}",'
                    f'image="kubeflownotebookswg/rstudio-tidyverse:v1.10.0",name="{container}",'
                    f'namespace="{ns}",pod="{pod}"}} {value:.6f} {ms}')
            for (ns, pod), value in totals.items():  # the pod cgroup and the pause container
                uid = f"{abs(hash((ns, pod))):032x}"
                lines.append(f'container_cpu_usage_seconds_total{{container="",cpu="total",'
                             f'id="/kubepods/burstable/pod{uid}",image="",name="",namespace="{ns}",'
                             f'pod="{pod}"}} {value:.6f} {ms}')
                lines.append(f'container_cpu_usage_seconds_total{{container="POD",cpu="total",'
                             f'id="/kubepods/burstable/pod{uid}/pause",image="registry.k8s.io/pause:3.9",'
                             f'name="pause",namespace="{ns}",pod="{pod}"}} 0.04 {ms}')
            return "\n".join(lines) + "\n"

    def istio(self) -> str:
        with self.lock:
            self._advance()
            lines = ["# TYPE istio_requests_total counter"]
            for (ns, workload, source), total in sorted(self.req_totals.items()):
                source_ns = "istio-system" if source == "istio-ingressgateway" else "kubeflow"
                lines.append(
                    f'istio_requests_total{{reporter="destination",source_workload="{source}",'
                    f'source_workload_namespace="{source_ns}",source_app="{source}",source_version="unknown",'
                    f'source_cluster="Kubernetes",destination_workload="{workload}",'
                    f'destination_workload_namespace="{ns}",destination_app="unknown",'
                    f'destination_version="unknown",destination_service="{workload}.{ns}.svc.cluster.local",'
                    f'destination_service_name="{workload}",destination_service_namespace="{ns}",'
                    f'destination_cluster="Kubernetes",request_protocol="http",response_code="200",'
                    f'grpc_response_status="",response_flags="-",connection_security_policy="mutual_tls"}} '
                    f'{int(total)}')
            return "\n".join(lines) + "\n"


@pytest.fixture(scope="module")
def world() -> Iterator[tuple[Prometheus, Cluster]]:
    try:
        binary = find_prometheus()
    except Unavailable as why:
        missing("Prometheus", why)
    c = Cluster()
    c.set_cpu(BUSY, "rs-busy", 1.2)               # R computing
    c.set_cpu(BUSY, "istio-proxy", 0.01)
    c.set_cpu(IDLE, "rs-idle", 0.003)             # rserver + idle rsession
    c.set_cpu(IDLE, "istio-proxy", 0.6)           # a busy sidecar is not R working
    c.set_cpu(WAS_BUSY, "rs-was-busy", 0.9)
    c.set_cpu(RENAMED, "rs-renamed", 0.5)
    c.set_requests(NS, "rs-busy", "istio-ingressgateway", 1.0)           # a browser tab polling
    c.set_requests(NS, "rs-idle", "notebook-controller-deployment", 1.0)  # Kubeflow's own culler probing

    def kubelet(pods: set[tuple[str, str]]) -> Any:
        def handle(seen: Seen) -> tuple[int, str, bytes]:
            return text_reply(c.cadvisor(pods))
        return handle

    with StubServer(kubelet({BUSY, IDLE, WAS_BUSY})) as node1, StubServer(kubelet({RENAMED})) as node2, \
            StubServer(lambda _: text_reply(c.istio())) as mesh:
        jobs = [static_job("kubelet-cadvisor", [node1.address], honor_labels=True),
                # not honouring labels: the target's namespace/pod win, the pod's become exported_*
                static_job("kubelet-cadvisor-renamed", [node2.address], honor_labels=False,
                           labels={"namespace": "kube-system", "pod": "kubelet"}),
                static_job("envoy-stats", [mesh.address], honor_labels=True)]
        with Prometheus(jobs, binary=binary) as prom:
            prom.wait_for('rate(container_cpu_usage_seconds_total{container="rs-busy"}[10s]) > 1', timeout=60)
            prom.wait_for('increase(istio_requests_total[30s]) > 0', count=2, timeout=60)
            yield prom, c


def settings(**kw: Any) -> RStudioSettings:
    return RStudioSettings.model_validate({"lookbackMinutes": 2, "stepSeconds": 1, "rateWindowSeconds": 10,
                                           "connectedWindowSeconds": 30, **kw})


def source(prom: Prometheus, **kw: Any) -> PrometheusRStudio:
    return PrometheusRStudio(PrometheusSettings(url=prom.url, timeoutSeconds=5), settings(**kw))


def now() -> datetime:
    return datetime.now(UTC)


def when(text: str) -> datetime:
    return datetime.fromisoformat(text)


def instant_queries(prom: Prometheus) -> float:
    with urllib.request.urlopen(f"{prom.url}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples
               if s.name == "prometheus_http_requests_total" and s.labels.get("handler") == "/api/v1/query")


def test_busy_idle_and_connected(world: tuple[Prometheus, Cluster]) -> None:
    prom, _ = world
    src = source(prom)
    t = now()
    before = instant_queries(prom)
    answers, queries = src.samples([BUSY, IDLE, RENAMED, NO_CPU], t)
    assert queries == 4 and instant_queries(prom) - before == 4

    busy = answers[BUSY]
    assert busy["busy"] is True and busy["connected"] is True, busy
    assert busy["activityInWindow"] is True
    assert 1.0 < busy["cpuCores"] < 1.4  # the sidecar's CPU, the pod cgroup and the pause container excluded
    assert t - when(busy["lastActivity"]) < timedelta(seconds=15)
    assert t - when(busy["lastConnected"]) < timedelta(seconds=15)

    idle = answers[IDLE]
    assert idle["busy"] is False, idle  # a busy sidecar is not R working
    assert idle["connected"] is False and idle["lastConnected"] is None  # the controller's probes excluded
    assert idle["activityInWindow"] is False
    assert when(idle["lastActivity"]) == t - timedelta(minutes=2)  # nothing known before the window

    assert answers[RENAMED]["busy"] is True  # exported_namespace/exported_pod
    assert answers[NO_CPU] == {"error": "no container CPU series (container_cpu_usage_seconds_total) for pod"}

    for key in (BUSY, IDLE, RENAMED):
        reading = parse_rstudio(answers[key])  # what decide reads
        assert reading.busy == answers[key]["busy"]
        assert reading.connected == answers[key]["connected"]


def test_last_activity_after_the_work_ends(world: tuple[Prometheus, Cluster]) -> None:
    prom, c = world
    src = source(prom)
    procs.wait_until(lambda: src.samples([WAS_BUSY], now())[0][WAS_BUSY].get("busy") is True, 30,
                     interval=0.5, what="the session to be busy")
    stopped = now()
    c.set_cpu(WAS_BUSY, "rs-was-busy", 0.0)
    procs.wait_until(lambda: src.samples([WAS_BUSY], now())[0][WAS_BUSY].get("busy") is False, 60,
                     interval=0.5, what="the session to go quiet")
    answer = src.samples([WAS_BUSY], now())[0][WAS_BUSY]
    last = when(answer["lastActivity"])
    assert answer["activityInWindow"] is True
    # the last step whose 10-second CPU rate was over the threshold: after the work ended, within the window
    assert stopped - timedelta(seconds=2) <= last <= stopped + timedelta(seconds=12), (stopped, last)


def test_without_istio_two_queries_and_never_connected(world: tuple[Prometheus, Cluster]) -> None:
    prom, _ = world
    answers, queries = source(prom, istio=False).samples([BUSY, IDLE], now())
    assert queries == 2
    assert answers[BUSY]["connected"] is False and "requests" not in answers[BUSY]
    assert answers[BUSY]["via"] == "prometheus: container CPU"


def test_queries_do_not_grow_with_pods(world: tuple[Prometheus, Cluster]) -> None:
    prom, _ = world
    many = [BUSY, IDLE, RENAMED] + [(NS, f"rs-other{i}-0") for i in range(200)]
    answers, queries = source(prom).samples(many, now())
    assert queries == 4 and len(answers) == 203


def test_prometheus_down_is_an_error_for_every_pod() -> None:
    port = procs.free_port()
    src = PrometheusRStudio(PrometheusSettings(url=f"http://127.0.0.1:{port}", timeoutSeconds=2), settings())
    answers, queries = src.samples([BUSY, IDLE], now())
    assert queries == 1
    assert all("cannot reach Prometheus" in a["error"] for a in answers.values()), answers


def test_503_is_an_error_for_every_pod() -> None:
    with StubServer(lambda _: (503, "text/plain", b"upstream overloaded")) as stub:
        src = PrometheusRStudio(PrometheusSettings(url=stub.url, timeoutSeconds=2), settings())
        answers, _ = src.samples([BUSY], now())
    assert "HTTP 503" in answers[BUSY]["error"]


def test_workload_of_and_source_for() -> None:
    assert workload_of("rs-busy-0") == "rs-busy"
    assert workload_of("my-nb-12") == "my-nb"
    assert workload_of("plain") == "plain"
    assert source_for(load_mapping({}, "t")) is None  # no Prometheus URL
    assert source_for(load_mapping({"prometheus": {"url": "http://p:9090"}, "rstudio": {"enabled": False}},
                                   "t")) is None
    found = source_for(load_mapping({"prometheus": {"url": "http://p:9090"}}, "t"))
    assert isinstance(found, PrometheusRStudio)
    assert 'container!="istio-proxy"' in found.cpu_expr()
    assert 'source_workload!="notebook-controller-deployment"' in found.requests_expr()


def rstudio_notebook(now: datetime) -> tuple[dict[str, Any], dict[str, Any]]:
    started = (now - timedelta(hours=6)).strftime("%Y-%m-%dT%H:%M:%SZ")
    container = {"name": "rs", "image": "kubeflownotebookswg/rstudio-tidyverse:v1.10.0"}
    notebook = {"apiVersion": "kubeflow.org/v1", "kind": "Notebook",
                "metadata": {"name": "rs", "namespace": NS,
                             "annotations": {"notebooks.kubeflow.org/server-type": "group-two"}},
                "spec": {"template": {"spec": {"containers": [container]}}}}
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "rs-0", "namespace": NS},
           "spec": {"containers": [container]}, "status": {"phase": "Running", "startTime": started}}
    return notebook, pod


@pytest.mark.parametrize("lookback, action", [(240, "stop"), (30, "keep")])
def test_a_quiet_window_never_claims_more_than_it_looked_at(lookback: int, action: str) -> None:
    """No CPU activity in the window: idle since the window's start, never since the pod's start."""
    from kf_culler.config import Policy
    from kf_culler.decide import decide

    t = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
    quiet = {"connected": False, "busy": False, "lastConnected": None, "via": "prometheus: container CPU",
             "lastActivity": (t - timedelta(minutes=lookback)).strftime("%Y-%m-%dT%H:%M:%SZ")}
    notebook, pod = rstudio_notebook(t)
    verdict = decide(notebook, pod, {"rstudio": quiet}, Policy.model_validate({"idleMinutes": 60}), t)
    assert verdict.action == action, verdict
    assert verdict.idle_since == t - timedelta(minutes=lookback)


def test_a_browser_seen_recently_counts_in_the_idle_clock() -> None:
    """lastConnected works like code-server's lastHeartbeat: the idle clock starts there, not earlier."""
    from kf_culler.config import Policy
    from kf_culler.decide import decide

    t = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
    closed = {"connected": False, "busy": False, "via": "prometheus: container CPU and Istio requests",
              "lastActivity": "2026-11-29T08:00:00Z", "lastConnected": "2026-11-29T11:40:00Z"}
    notebook, pod = rstudio_notebook(t)
    verdict = decide(notebook, pod, {"rstudio": closed}, Policy.model_validate({"idleMinutes": 60}), t)
    assert verdict.action == "keep" and verdict.state == "idle", verdict
    assert verdict.idle_since == datetime(2026, 11, 29, 11, 40, tzinfo=UTC)
    connected = {**closed, "connected": True, "lastConnected": "2026-11-29T11:59:00Z"}
    assert decide(notebook, pod, {"rstudio": connected}, Policy(), t).state == "connected"
