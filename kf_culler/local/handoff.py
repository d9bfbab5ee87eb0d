"""The GPU handoff, end to end, on a local cluster: used by the tests, the benchmark and the demo.

One fake node with `nvidia.com/gpu: 1` (kwok); Notebook A (1 GPU) runs on it with a real, idle Jupyter
server behind its URL; Notebook B (1 GPU, a real Jupyter server with a kernel running code) waits
Pending; the culler stops A through the stop annotation; Kubeflow's notebook-controller scales A's
StatefulSet to 0; the StatefulSet controller deletes A's pod; the scheduler places B on the freed GPU.
Every link but the culler is upstream code.

    with LocalCluster(mode="full") as cluster:
        cluster.start_notebook_controller()
        with GpuHandoff(cluster, "team-a") as scenario:
            scenario.setup()                 # A Running on the GPU, B Pending for it
            stop = scenario.cull_a()         # the culler's verdict for A, and when it was taken
            times = scenario.wait_handoff(stop)

The fake node has no GPU, so its GPU is described by a dcgm-exporter-shaped /metrics endpoint
(`GpuNode`: the metric names and labels of dcgm-exporter's default counters, see
kf_culler.local.prometheus.FakeGpu) that a real Prometheus scrapes; the culler reads it the way it
reads a cluster's Prometheus (`prometheus.url`). The GPU is assigned to A's pod and idle (0 %, 0 MiB)
until B's pod is bound to it, then to B's pod and working.
The Jupyter servers run on loopback; a loopback router (kf_culler.local.router) stands in for the
Service DNS, so the culler's usual URL template `.../notebook/{namespace}/{name}/` reaches them.
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kf_culler.config import Settings, load_mapping
from kf_culler.cycle import CycleResult, NotebookResult
from kf_culler.kube import GROUP, PLURAL, VERSION
from kf_culler.local import procs
from kf_culler.local.cluster import (
    CLUSTER_BINARIES,
    GPU_NODE,
    GPU_RESOURCE,
    LocalCluster,
    bin_dir,
)
from kf_culler.local.jupyter import JupyterServer
from kf_culler.local.prometheus import (
    Exposition,
    FakeGpu,
    Prometheus,
    dcgm_exposition,
    find_prometheus,
    static_job,
)
from kf_culler.local.prometheus import Unavailable as PrometheusUnavailable
from kf_culler.local.router import Router
from kf_culler.model import STOP_ANNOTATION
from kf_culler.runner import Runner, build_runner

log = logging.getLogger(__name__)
IMAGE = "kubeflownotebookswg/jupyter-scipy:v1.10.0"  # never pulled: kwok plays the kubelet
INSUFFICIENT_GPU = f"Insufficient {GPU_RESOURCE}"
Key = tuple[str, str]


class ScenarioError(AssertionError):
    """A step of the scenario did not happen in time; the message says which and what was seen."""


class Unavailable(RuntimeError):
    """The full local cluster cannot be had here (no Go toolchain and no built binaries)."""


@contextmanager
def open_full_cluster(quiet: bool = True) -> Iterator[LocalCluster]:
    """A LocalCluster(mode="full") with its fake GPU node, stopped (and its files removed) on exit."""
    if os.environ.get("KF_CULLER_TEST_CLUSTER", "local") != "local":
        raise Unavailable("the GPU handoff runs on the local control plane only (KF_CULLER_TEST_CLUSTER="
                          f"{os.environ['KF_CULLER_TEST_CLUSTER']})")
    if shutil.which("go") is None and not all((bin_dir() / n).is_file() for n in CLUSTER_BINARIES):
        raise Unavailable("no Go toolchain to build kube-controller-manager, kube-scheduler and kwok, "
                          "and no cached binaries")
    cluster = LocalCluster(mode="full", quiet=quiet)
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


def start_controller(cluster: LocalCluster, binary: Path | None = None) -> None:
    """Kubeflow's notebook-controller on the cluster; NotebookControllerUnavailable says why not."""
    cluster.start_notebook_controller(binary)



def notebook_body(namespace: str, name: str, gpus: int = 1) -> dict[str, Any]:
    """A Notebook as the Jupyter web app creates it (one container; GPUs as a limit and a request)."""
    resources: dict[str, dict[str, str]] = {"requests": {"cpu": "500m", "memory": "1Gi"},
                                            "limits": {"cpu": "1", "memory": "2Gi"}}
    if gpus:
        resources["requests"][GPU_RESOURCE] = str(gpus)
        resources["limits"][GPU_RESOURCE] = str(gpus)
    return {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "Notebook",
        "metadata": {"name": name, "namespace": namespace, "labels": {"app": name},
                     "annotations": {"notebooks.kubeflow.org/server-type": "jupyter"}},
        "spec": {"template": {"spec": {"containers": [
            {"name": name, "image": IMAGE, "resources": resources}]}}},
    }


def statefulset_body(namespace: str, name: str, gpus: int = 1) -> dict[str, Any]:
    """A StatefulSet of the shape the notebook-controller makes for a Notebook (labels `statefulset`
    and `notebook-name`, one replica, port 8888, fsGroup 100): for checks of what happens below it."""
    container = notebook_body(namespace, name, gpus)["spec"]["template"]["spec"]["containers"][0]
    container.update({"workingDir": "/home/jovyan",
                      "ports": [{"containerPort": 8888, "name": "notebook-port", "protocol": "TCP"}]})
    labels = {"statefulset": name, "notebook-name": name}
    return {
        "apiVersion": "apps/v1", "kind": "StatefulSet",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"statefulset": name}},
                 "template": {"metadata": {"labels": labels},
                              "spec": {"containers": [container], "securityContext": {"fsGroup": 100}}}},
    }


class GpuNode:
    """The GPU node's one GPU as dcgm-exporter would report it, scraped by a real Prometheus."""

    def __init__(self, namespace: str) -> None:
        self.namespace = namespace
        self.gpu = FakeGpu(0, "GPU-handoff-0", hostname=GPU_NODE)
        self.exposition = Exposition(dcgm_exposition([self.gpu]))
        self.prometheus: Prometheus | None = None
        self.serving = False

    def start(self) -> GpuNode:
        try:
            binary = find_prometheus()
        except PrometheusUnavailable as why:
            raise Unavailable(f"no Prometheus for the GPU metrics: {why}") from None
        self.exposition.__enter__()
        self.serving = True
        self.prometheus = Prometheus([static_job("dcgm", [self.exposition.stub.address], honor_labels=True)],
                                     binary=binary).start()
        return self

    @property
    def url(self) -> str:
        assert self.prometheus is not None
        return self.prometheus.url

    def assign(self, pod: str, util: float, used_mib: float) -> None:
        """The GPU now belongs to `pod` of the scenario's namespace and shows this load."""
        self.gpu = FakeGpu(0, self.gpu.uuid, util=util, used_mib=used_mib, namespace=self.namespace, pod=pod,
                           container=pod.rsplit("-", 1)[0], hostname=GPU_NODE)
        self.exposition.set(dcgm_exposition([self.gpu]))

    def wait_scraped(self, pod: str, samples: int = 2, timeout: float = 60.0) -> None:
        """Until Prometheus holds `samples` scrapes of the GPU as `pod`'s."""
        assert self.prometheus is not None
        self.prometheus.wait_for(f'count_over_time(DCGM_FI_DEV_FB_USED{{pod="{pod}"}}[5m]) >= {samples}',
                                 timeout=timeout)

    def stop(self) -> None:
        if self.prometheus is not None:
            self.prometheus.stop()
            self.prometheus = None
        if self.serving:
            self.serving = False
            self.exposition.__exit__()


@dataclass
class Seen:
    """One watch event, stamped with the local clock when it arrived."""

    at: float
    kind: str  # "pod" | "statefulset"
    type: str  # ADDED | MODIFIED | DELETED
    name: str
    obj: dict[str, Any]

    @property
    def revision(self) -> int:
        """The object's resourceVersion: on this cluster's one etcd, the revision of the write, which
        orders events of different watches (arrival times in two threads do not)."""
        rv = str((self.obj.get("metadata") or {}).get("resourceVersion") or "0")
        return int(rv) if rv.isdigit() else 0


class Timeline:
    """Watches pods and StatefulSets of one namespace and keeps every event with its arrival time."""

    def __init__(self, api: Any, namespace: str) -> None:
        self.api = api
        self.namespace = namespace
        self.events: list[Seen] = []
        self.lock = threading.Lock()
        self.stop_event = threading.Event()
        self.threads: list[threading.Thread] = []
        self.errors: list[str] = []

    def start(self) -> Timeline:
        from kubernetes import client

        core: Any = client.CoreV1Api(self.api)
        apps: Any = client.AppsV1Api(self.api)
        listers = (("pod", core.list_namespaced_pod), ("statefulset", apps.list_namespaced_stateful_set))
        for kind, lister in listers:
            t = threading.Thread(target=self._run, args=(kind, lister), name=f"timeline-{kind}", daemon=True)
            t.start()
            self.threads.append(t)
        return self

    def _run(self, kind: str, lister: Callable[..., Any]) -> None:
        from kubernetes import watch as kwatch

        watch: Any = kwatch
        rv = ""
        while not self.stop_event.is_set():
            try:
                if not rv:
                    listed = self.api.sanitize_for_serialization(lister(self.namespace))
                    now = time.time()
                    with self.lock:
                        for obj in listed.get("items") or []:
                            self.events.append(Seen(now, kind, "ADDED", obj["metadata"]["name"], obj))
                    rv = str(listed["metadata"].get("resourceVersion", ""))
                w: Any = watch.Watch()
                for ev in w.stream(lister, self.namespace, resource_version=rv, timeout_seconds=5,
                                   allow_watch_bookmarks=False):
                    at = time.time()
                    obj = self.api.sanitize_for_serialization(ev["object"])
                    rv = str(obj.get("metadata", {}).get("resourceVersion", rv))
                    with self.lock:
                        self.events.append(Seen(at, kind, str(ev["type"]), obj["metadata"]["name"], obj))
                    if self.stop_event.is_set():
                        w.stop()
                        break
            except Exception as err:  # a broken watch: list again
                self.errors.append(f"{type(err).__name__}: {err}"[:300])
                rv = ""
                self.stop_event.wait(0.2)

    def close(self) -> None:
        self.stop_event.set()
        for t in self.threads:
            t.join(timeout=10)

    def first(self, kind: str, name: str, after: float, pred: Callable[[Seen], bool]) -> Seen | None:
        with self.lock:
            for ev in self.events:
                if ev.kind == kind and ev.name == name and ev.at >= after and pred(ev):
                    return ev
        return None


def pod_running_on(node: str) -> Callable[[Seen], bool]:
    return lambda ev: ev.type != "DELETED" and (ev.obj.get("spec") or {}).get("nodeName") == node and \
        (ev.obj.get("status") or {}).get("phase") == "Running"


def pod_bound(ev: Seen) -> bool:
    return ev.type != "DELETED" and bool((ev.obj.get("spec") or {}).get("nodeName"))


def pod_gone(ev: Seen) -> bool:
    return ev.type == "DELETED"


def replicas_zero(ev: Seen) -> bool:
    return ev.type != "DELETED" and (ev.obj.get("spec") or {}).get("replicas") == 0


@dataclass
class StopDecision:
    """The culler's verdict for A in the cycle that stopped it."""

    result: NotebookResult
    cycle: CycleResult
    decided_at: float  # epoch seconds of the cycle's decision time (its `now`)
    cycles: int  # cycles run until then


@dataclass
class HandoffTimes:
    """Seconds from the culler's decision to stop A to each upstream step."""

    statefulset_scaled: float  # the notebook-controller set A's replicas to 0
    pod_a_gone: float  # the StatefulSet controller deleted A's pod (and kwok finished it)
    pod_b_bound: float  # the scheduler bound B's pod to the GPU node
    pod_b_running: float  # kwok reported B's pod Running
    revisions: tuple[int, int, int, int] = (0, 0, 0, 0)  # etcd revision of each step, in the same order

    def lines(self) -> list[str]:
        steps = [("StatefulSet a scaled to 0 (notebook-controller)", self.statefulset_scaled),
                 ("pod a-0 deleted (StatefulSet controller, kwok)", self.pod_a_gone),
                 (f"pod b-0 bound to {GPU_NODE} (kube-scheduler)", self.pod_b_bound),
                 ("pod b-0 Running (kwok)", self.pod_b_running)]
        return [f"  {what.ljust(50)} +{seconds:6.2f} s" for what, seconds in steps]


@dataclass
class PodView:
    name: str
    exists: bool
    phase: str = ""
    node: str = ""
    unschedulable: str = ""  # the scheduler's message when it could not place the pod
    uid: str = ""
    gpus: int = 0


class GpuHandoff:
    """One run of the scenario in its own namespace. Notebooks are named `a` and `b`."""

    def __init__(self, cluster: LocalCluster, namespace: str | None = None, idle_minutes: float = 0.1,
                 timeout: float = 90.0) -> None:
        self.cluster = cluster
        self.namespace = namespace or f"gpu-{uuid.uuid4().hex[:8]}"
        self.idle_minutes = idle_minutes
        self.timeout = timeout
        self.api = cluster.api_client()
        self.jupyter: dict[str, JupyterServer] = {}
        self.router: Router | None = None
        self.timeline: Timeline | None = None
        self.gpu = GpuNode(self.namespace)
        self.runner: Runner | None = None
        self.results: list[CycleResult] = []
        self._created_namespace = False

    # -- lifecycle -------------------------------------------------------------------------------
    def __enter__(self) -> GpuHandoff:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self, timeout: float = 60.0) -> None:
        """Stop the culler, the watches and Jupyter; delete the namespace and wait until its pods are
        gone, so the GPU is free for whatever runs next on the cluster."""
        if self.runner is not None:
            self.runner.cache.close()
        if self.timeline is not None:
            self.timeline.close()
        for server in self.jupyter.values():
            server.stop()
        self.jupyter.clear()
        if self.router is not None:
            self.router.stop()
            self.router = None
        self.gpu.stop()
        if self._created_namespace:
            self._created_namespace = False
            try:
                self._core().delete_namespace(self.namespace)
                procs.wait_until(lambda: not self._core().list_namespaced_pod(self.namespace).items,
                                 timeout, 0.2, f"the pods of namespace {self.namespace} to be deleted")
            except Exception as err:
                log.warning("cleaning up namespace %s: %s", self.namespace, err)

    # -- clients ---------------------------------------------------------------------------------
    def _core(self) -> Any:
        from kubernetes import client

        return client.CoreV1Api(self.api)

    def _apps(self) -> Any:
        from kubernetes import client

        return client.AppsV1Api(self.api)

    def _custom(self) -> Any:
        from kubernetes import client

        return client.CustomObjectsApi(self.api)

    def settings(self) -> Settings:
        """The culler's configuration: short idle limit, no start-up grace, no warning step; Jupyter
        reached through the loopback router (each server serves /notebook/<namespace>/<name>/)."""
        assert self.router is not None
        return load_mapping({
            "idleMinutes": self.idle_minutes, "warnMinutes": 0, "startupGraceMinutes": 0,
            "checkPeriodSeconds": 1,
            "namespaces": {"include": [self.namespace]},
            "urls": {"jupyter": self.router.template("notebook")},
            "probe": {"timeoutSeconds": 2, "connectTimeoutSeconds": 1, "retries": 0},
            "prometheus": {"url": self.gpu.url, "stepSeconds": 1},
        }, "gpu-handoff scenario")

    # -- observation -----------------------------------------------------------------------------
    def pod(self, name: str) -> PodView:
        from kubernetes.client.exceptions import ApiException

        try:
            raw = self.api.sanitize_for_serialization(self._core().read_namespaced_pod(name, self.namespace))
        except ApiException as err:
            if err.status == 404:
                return PodView(name, False)
            raise
        status = raw.get("status") or {}
        message = ""
        for c in status.get("conditions") or []:
            if c.get("type") == "PodScheduled" and c.get("status") == "False":
                message = str(c.get("message") or c.get("reason") or "")
        gpus = 0
        for c in (raw.get("spec") or {}).get("containers") or []:
            gpus += int(((c.get("resources") or {}).get("requests") or {}).get(GPU_RESOURCE, 0))
        node = str((raw.get("spec") or {}).get("nodeName") or "")
        return PodView(name, True, str(status.get("phase", "")), node, message, str(raw["metadata"]["uid"]),
                       gpus)

    def notebook(self, name: str) -> dict[str, Any]:
        nb: dict[str, Any] = self._custom().get_namespaced_custom_object(GROUP, VERSION, self.namespace,
                                                                         PLURAL, name)
        return nb

    def replicas(self, name: str) -> int | None:
        from kubernetes.client.exceptions import ApiException

        try:
            sts = self._apps().read_namespaced_stateful_set(name, self.namespace)
        except ApiException as err:
            if err.status == 404:
                return None
            raise
        return int(sts.spec.replicas)

    def wait(self, what: str, pred: Callable[[], bool], timeout: float | None = None,
             seen: Callable[[], str] | None = None) -> None:
        try:
            procs.wait_until(pred, timeout or self.timeout, 0.1, what)
        except TimeoutError as err:
            detail = f"; seen: {seen()}" if seen is not None else ""
            raise ScenarioError(f"{err}{detail}\n{self.logs()}") from None

    def logs(self, lines: int = 15) -> str:
        return "\n".join(f"--- {n} ---\n{self.cluster.log_tail(n, lines)}"
                         for n in ("notebook-controller", "kube-scheduler", "kwok") if n in self.cluster.logs)

    # -- steps -----------------------------------------------------------------------------------
    def create_notebook(self, name: str, gpus: int = 1) -> None:
        self._custom().create_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL,
                                                       notebook_body(self.namespace, name, gpus))

    def wait_running(self, name: str) -> PodView:
        pod = f"{name}-0"
        self.wait(f"pod {pod} Running on {GPU_NODE}",
                  lambda: (v := self.pod(pod)).phase == "Running" and v.node == GPU_NODE,
                  seen=lambda: repr(self.pod(pod)))
        return self.pod(pod)

    def wait_pending_for_gpu(self, name: str) -> PodView:
        pod = f"{name}-0"
        self.wait(f"pod {pod} Pending with '{INSUFFICIENT_GPU}'",
                  lambda: (v := self.pod(pod)).phase == "Pending" and not v.node
                  and INSUFFICIENT_GPU in v.unschedulable,
                  seen=lambda: repr(self.pod(pod)))
        return self.pod(pod)

    def create_statefulset(self, name: str, gpus: int = 1) -> None:
        body = statefulset_body(self.namespace, name, gpus)
        self._apps().create_namespaced_stateful_set(self.namespace, body)

    def setup(self, via: str = "notebook", culler: bool = True) -> tuple[PodView, PodView]:
        """Namespace, A's Jupyter server and the culler, A Running on the GPU, then B Pending for it.

        via="statefulset" creates the two StatefulSets directly (no Notebook, no notebook-controller),
        for checks of the layers below the controller; culler=False skips Jupyter and the culler."""
        if via not in ("notebook", "statefulset"):
            raise ValueError(f"via must be 'notebook' or 'statefulset', not {via!r}")
        self._core().create_namespace({"metadata": {"name": self.namespace}})
        self._created_namespace = True
        self.timeline = Timeline(self.api, self.namespace).start()
        if culler:
            self.router = Router().start()
            for name in ("a", "b"):
                server = JupyterServer(self.namespace, name)
                self.jupyter[name] = server
                server.start()
                self.router.add("notebook", self.namespace, name, f"http://127.0.0.1:{server.port}",
                                strip=False)
            # B's user is at work: a kernel running code (the culler keeps a busy notebook).
            busy = self.jupyter["b"]
            busy.execute(busy.start_kernel(), "import time\nwhile True: time.sleep(1)")
            self.gpu.start()
            self.runner = build_runner(self.settings(), self.api)
            self.runner.start_cache()
        create = self.create_notebook if via == "notebook" else self.create_statefulset
        create("a")
        a = self.wait_running("a")
        if culler:
            self.gpu.assign("a-0", util=0, used_mib=0)  # A holds the GPU and does nothing with it
            self.gpu.wait_scraped("a-0")
        create("b")
        b = self.wait_pending_for_gpu("b")
        return a, b

    def cycle(self) -> CycleResult:
        assert self.runner is not None
        result = self.runner.once(self.results[-1].memory if self.results else None)  # after the last pass
        self.results.append(result)
        return result

    @staticmethod
    def verdict_of(result: CycleResult, name: str) -> NotebookResult | None:
        return next((r for r in result.results if r.name == name), None)

    def cull_a(self, max_seconds: float | None = None) -> StopDecision:
        """Run culler cycles, one a second, until one stops A (A's Jupyter is idle, its GPU is idle)."""
        deadline = time.monotonic() + (max_seconds or self.timeout)
        cycles = 0
        while time.monotonic() < deadline:
            result = self.cycle()
            cycles += 1
            a = self.verdict_of(result, "a")
            if a is not None and a.verdict.action == "stop":
                return StopDecision(a, result, result.now.timestamp(), cycles)
            time.sleep(1)
        last = self.verdict_of(self.results[-1], "a") if self.results else None
        raise ScenarioError(f"the culler did not stop A within {max_seconds or self.timeout:g} s; "
                            f"last verdict: {last.verdict if last else None}")

    def wait_handoff(self, stop: StopDecision) -> HandoffTimes:
        """Wait for A's StatefulSet at 0, A's pod gone, B's pod Running on the GPU node; time each."""
        assert self.timeline is not None
        tl = self.timeline
        t0 = stop.decided_at  # events are stamped on arrival; the write follows the decision

        revisions: list[int] = []

        def step(kind: str, name: str, pred: Callable[[Seen], bool], what: str) -> float:
            found: list[Seen] = []

            def seen() -> bool:
                ev = tl.first(kind, name, t0, pred)
                if ev is not None:
                    found.append(ev)
                return ev is not None

            self.wait(what, seen, seen=lambda: f"pod a-0 {self.pod('a-0')!r}, pod b-0 {self.pod('b-0')!r}, "
                                              f"replicas(a)={self.replicas('a')}")
            revisions.append(found[0].revision)
            return found[0].at - stop.decided_at

        scaled = step("statefulset", "a", replicas_zero, "A's StatefulSet scaled to 0")
        a_gone = step("pod", "a-0", pod_gone, "A's pod deleted")
        b_bound = step("pod", "b-0", pod_bound, f"B's pod bound to {GPU_NODE}")
        b_running = step("pod", "b-0", pod_running_on(GPU_NODE), f"B's pod Running on {GPU_NODE}")
        r = revisions
        return HandoffTimes(scaled, a_gone, b_bound, b_running, (r[0], r[1], r[2], r[3]))

    def start_a_again(self) -> None:
        """Start A the way the Jupyter web app does: a JSON merge patch that removes the stop key."""
        self._custom().patch_namespaced_custom_object(
            GROUP, VERSION, self.namespace, PLURAL, "a", {"metadata": {"annotations": {STOP_ANNOTATION: None}}},
            _content_type="application/merge-patch+json")

    def scale(self, name: str, replicas: int) -> None:
        body = {"spec": {"replicas": replicas}}
        self._apps().patch_namespaced_stateful_set_scale(name, self.namespace, body)

    def delete_pod(self, name: str) -> str:
        """Delete a pod the plain way (what the culler does NOT do); returns the deleted pod's uid."""
        uid = self.pod(name).uid
        self._core().delete_namespaced_pod(name, self.namespace)
        return uid


def decision_to_running(cluster: LocalCluster,
                        idle_minutes: float = 0.1) -> tuple[HandoffTimes, StopDecision]:
    """One full run in a fresh namespace: the figures the benchmark collects."""
    with GpuHandoff(cluster, idle_minutes=idle_minutes) as scenario:
        scenario.setup()
        stop = scenario.cull_a()
        return scenario.wait_handoff(stop), stop
