"""Kubeflow Notebooks 2.0 Workspaces culled end to end (docs/targets.md): Kubeflow's own Workspace controller
(v2.0.0-beta.0, built from the vendored source), kube-controller-manager, kube-scheduler and a kwok node on the
local control plane, and a real Jupyter server serving the Workspace's connect path behind the culler's URL
template (kwok's pods run no containers: the router stands where the Workspace's Service would route).

- An idle Workspace is paused by the culler: `spec.paused: true` (the controller then scales its StatefulSet to
  0 and shows it Paused), the reason in our annotations and in a Warning Event on the Workspace, the culler's
  record kept; `kubeflow-resource-stopped` is not written and the StatefulSet is never touched by the culler.
- A Workspace whose kernel is busy is kept.
- A Workspace its user resumes is seen as restarted (the culler's record) and not paused again at once.
- A Workspace that something else paused (its user, the controller's own culling) is left alone: no record
  of a stop, no restart claimed when it is resumed.
- The v2 backend (the REST API of the v2 web app, built from the same release) lists a Workspace the culler
  paused as paused and Paused.
- An idle GPU Workspace is paused on GPU evidence from a real Prometheus scraping a dcgm-exporter-shaped
  endpoint, the series paired with the Workspace's pod found by ownership.
- A GPU Workspace its tenant made the controller fail on (a second StatefulSet it "controls"): the pause does
  not take, the culler reports it (Event, metric) and frees the GPU through the Workspace's own StatefulSet.
"""

from __future__ import annotations

import contextlib
import json
import re
import time
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, utils
from kubernetes.client.rest import ApiException
from need import missing
from support.kustomize import component_rbac, delete_cluster_rbac
from support.passes import Passes

from kf_culler.config import load_mapping
from kf_culler.cycle import NotebookResult
from kf_culler.kube.records import bucket_of
from kf_culler.local import procs
from kf_culler.local.cluster import GPU_NODE
from kf_culler.local.handoff import GpuNode
from kf_culler.local.handoff import Unavailable as GpuNodeUnavailable
from kf_culler.local.jupyter import JupyterServer
from kf_culler.local.router import Router
from kf_culler.local.workspaces import (
    GROUP,
    KINDS,
    VERSION,
    WORKSPACES,
    WorkspaceControllerUnavailable,
    connect_path,
    start_workspace_backend,
    workspace_body,
    workspace_kind_body,
)
from kf_culler.model import REASON_ANNOTATION, STATE_ANNOTATION, STOP_ANNOTATION, STOPPED_BY_ANNOTATION
from kf_culler.plan import EVENT_RESTART, EVENT_STOP
from kf_culler.runner import build_runner

pytestmark = pytest.mark.cluster
TIMEOUT = 60.0
GPU_RESOURCE = "nvidia.com/gpu"
# The backend authorizes each request by a SubjectAccessReview for the user of kubeflow-userid and the
# groups of kubeflow-groups; system:masters stands for a user with the RBAC to list Workspaces.
BACKEND_HEADERS = {"kubeflow-userid": "alice@example.com", "kubeflow-groups": "system:masters"}


@dataclass
class Env:
    api: Any
    namespace: str
    kind: str
    router: Router
    kinds: list[str] = field(default_factory=list)  # more WorkspaceKinds, deleted with the namespace

    @property
    def custom(self) -> Any:
        return client.CustomObjectsApi(self.api)

    @property
    def core(self) -> Any:
        return client.CoreV1Api(self.api)

    def workspace(self, name: str) -> dict[str, Any]:
        found: dict[str, Any] = self.custom.get_namespaced_custom_object(GROUP, VERSION, self.namespace, WORKSPACES,
                                                                         name)
        return found

    def add_kind(self, suffix: str, **kw: Any) -> str:
        """Another WorkspaceKind (workspace_kind_body's keywords, e.g. gpus=1) for this test alone."""
        kind = f"{self.kind}-{suffix}"
        self.custom.create_cluster_custom_object(GROUP, VERSION, KINDS, workspace_kind_body(kind, **kw))
        self.kinds.append(kind)
        return kind

    def create(self, name: str, kind: str | None = None) -> None:
        self.custom.create_namespaced_custom_object(GROUP, VERSION, self.namespace, WORKSPACES,
                                                    workspace_body(self.namespace, name, kind or self.kind))
        procs.wait_until(lambda: self.workspace(name).get("status", {}).get("state") == "Running", TIMEOUT, 0.2,
                         f"workspace {name} to be Running")

    def pause(self, name: str, paused: bool) -> None:
        self.custom.patch_namespaced_custom_object(GROUP, VERSION, self.namespace, WORKSPACES, name,
                                                   {"spec": {"paused": paused}})

    def serve(self, name: str) -> JupyterServer:
        """A real Jupyter server at the Workspace's connect path, reached through the router."""
        server = JupyterServer(self.namespace, name, base_path=connect_path(self.namespace, name, "jupyterlab"))
        server.__enter__()
        self.router.add("ws", self.namespace, name, f"http://127.0.0.1:{server.port}", strip=True)
        return server

    def culler(self, **extra: Any) -> Passes:
        settings = load_mapping({
            "targets": ["workspaces"], "namespaces": {"include": [self.namespace]},
            "idleMinutes": 0.05, "warnMinutes": 0, "startupGraceMinutes": 0.1,
            "urls": {"workspace": f"{self.router.base}/ws/{{namespace}}/{{name}}{{path}}"},
            "probe": {"timeoutSeconds": 5}, **extra}, "test")
        return Passes(build_runner(settings, self.api, records_namespace=self.namespace))

    def events(self, name: str) -> list[Any]:
        return [e for e in self.core.list_namespaced_event(self.namespace).items
                if e.involved_object.kind == "Workspace" and e.involved_object.name == name]

    def record(self, name: str) -> str | None:
        uid = self.workspace(name)["metadata"]["uid"]
        cm = self.core.read_namespaced_config_map(bucket_of(uid), self.namespace)
        return (cm.data or {}).get(uid)

    def pod_of(self, name: str) -> Any:
        """The Workspace's pod, by ownership: the one StatefulSet the Workspace controls, its one pod."""

        def controlled_by(obj: Any, uid: str) -> bool:
            return any(o.controller and o.uid == uid for o in obj.metadata.owner_references or [])

        uid = self.workspace(name)["metadata"]["uid"]
        sts = [s for s in client.AppsV1Api(self.api).list_namespaced_stateful_set(self.namespace).items
               if controlled_by(s, uid)]
        assert len(sts) == 1, [s.metadata.name for s in sts]
        pods = [p for p in self.core.list_namespaced_pod(self.namespace).items
                if controlled_by(p, sts[0].metadata.uid)]
        assert len(pods) == 1, [p.metadata.name for p in pods]
        return pods[0]


@pytest.fixture()
def env(workspace_controller: Any) -> Iterator[Env]:
    api = workspace_controller.api_client()
    suffix = uuid.uuid4().hex[:8]
    core = client.CoreV1Api(api)
    custom = client.CustomObjectsApi(api)
    namespace, kind = f"wse-{suffix}", f"jupyterlab-{suffix}"
    core.create_namespace({"metadata": {"name": namespace}})
    custom.create_cluster_custom_object(GROUP, VERSION, KINDS, workspace_kind_body(kind))
    with Router() as router:
        env = Env(api, namespace, kind, router)
        try:
            yield env
        finally:
            with contextlib.suppress(Exception):
                core.delete_namespace(namespace)
            procs.wait_until(lambda: not core.list_namespaced_pod(namespace).items, TIMEOUT, 0.2,
                             f"the pods of namespace {namespace} to be deleted")
            for k in [kind, *env.kinds]:
                with contextlib.suppress(Exception):
                    custom.delete_cluster_custom_object(GROUP, VERSION, KINDS, k)


@pytest.fixture(scope="module")
def backend(workspace_controller: Any) -> str:
    """The base URL of Kubeflow's v2 Workspaces backend on the session's cluster (built on first use:
    hack/controlplane/build.sh workspaces-backend), in a network namespace of its own."""
    try:
        return start_workspace_backend(workspace_controller)
    except WorkspaceControllerUnavailable as why:
        missing("Kubeflow's Workspaces backend", why)


def backend_get(base: str, path: str) -> Any:
    req = urllib.request.Request(base + path, headers=BACKEND_HEADERS)
    with urllib.request.urlopen(req, timeout=10) as resp:
        return json.load(resp)


def listening_addresses(port: int) -> set[str]:
    """The local addresses (hex, as /proc/net/tcp{,6} write them) listening on port in this network
    namespace: "0100007F" is 127.0.0.1, "00000000" and the IPv6 zeros are every interface."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            cols = line.split()
            address, _, hex_port = cols[1].rpartition(":")
            if cols[3] == "0A" and int(hex_port, 16) == port:  # 0A: LISTEN
                found.add(address)
    return found


def result_for(results: list[NotebookResult], name: str) -> NotebookResult:
    found = [r for r in results if r.name == f"Workspace/{name}"]
    assert len(found) == 1, [r.name for r in results]
    return found[0]


def until_action(runner: Passes, name: str, action: str, timeout: float = 30) -> NotebookResult:
    deadline = time.monotonic() + timeout
    while True:
        r = result_for(runner.once().results, name)
        if r.verdict.action == action or time.monotonic() > deadline:
            return r
        time.sleep(1)


def past_start(runner: Passes, name: str, timeout: float = 30) -> NotebookResult:
    """The first pass's result for name once its start grace is over (a busy machine starts one
    Workspace's pod seconds after another's, so it may still be "starting" when the other is judged)."""
    deadline = time.monotonic() + timeout
    while True:
        r = result_for(runner.once().results, name)
        if r.verdict.state != "starting" or time.monotonic() > deadline:
            return r
        time.sleep(1)


def test_an_idle_workspace_is_paused_with_its_reason_and_a_busy_one_is_kept(env: Env) -> None:
    env.create("idle")
    env.create("busy")
    idle, busy = env.serve("idle"), env.serve("busy")
    try:
        kernel = busy.start_kernel()
        busy.execute(kernel, "import time; time.sleep(600)")
        with env.culler() as runner:
            stopped = until_action(runner, "idle", "stop")
            kept = past_start(runner, "busy")
    finally:
        idle.__exit__(None, None, None)
        busy.__exit__(None, None, None)
    assert stopped.verdict.action == "stop", stopped.verdict
    assert stopped.write is not None and stopped.write.outcome == "patched", stopped.write
    assert kept.verdict.action == "keep" and kept.verdict.state == "active", kept.verdict

    ws = env.workspace("idle")
    ann = ws["metadata"].get("annotations") or {}
    assert ws["spec"]["paused"] is True
    assert STOP_ANNOTATION not in ann  # a Workspace's stop is spec.paused alone
    assert ann[STOPPED_BY_ANNOTATION] == "kf-culler" and ann[STATE_ANNOTATION] == "idle"
    assert "idle" in ann[REASON_ANNOTATION].lower()
    events = [e for e in env.events("idle") if e.reason == EVENT_STOP]
    assert len(events) == 1 and events[0].type == "Warning" and events[0].message.startswith(ann[REASON_ANNOTATION])
    record = env.record("idle")
    assert record is not None and "stoppedAt" in record
    # The controller does the rest: the StatefulSet at 0 and the Workspace Paused.
    procs.wait_until(lambda: env.workspace("idle").get("status", {}).get("state") == "Paused", TIMEOUT, 0.2,
                     "the controller to show the workspace Paused")
    assert env.workspace("busy")["spec"]["paused"] is False


def test_a_resumed_workspace_is_seen_restarted_and_one_paused_by_another_is_left_alone(env: Env) -> None:
    env.create("mine")
    env.create("theirs")
    mine, theirs = env.serve("mine"), env.serve("theirs")
    try:
        env.pause("theirs", True)  # paused by its user (or the controller's own culling), not by the culler
        with env.culler() as runner:
            first = until_action(runner, "mine", "stop")
            assert first.write is not None and first.write.outcome == "patched", first.write
            other = result_for(runner.once().results, "theirs")
            assert other.verdict.rule_id == "1-stopped" and other.write is None  # nothing written
            env.pause("mine", False)  # the user resumes it, as the v2 web app's Start does
            env.pause("theirs", False)
            procs.wait_until(lambda: env.workspace("mine").get("status", {}).get("state") == "Running", TIMEOUT,
                             0.2, "the resumed workspace to run")
            procs.wait_until(lambda: env.workspace("theirs").get("status", {}).get("state") == "Running",
                             TIMEOUT, 0.2, "the other workspace to run")
            time.sleep(1)  # the cache sees the new pods
            after = runner.once().results
    finally:
        mine.__exit__(None, None, None)
        theirs.__exit__(None, None, None)
    again = result_for(after, "mine")
    assert again.verdict.rule_id == "3-restarted", again.verdict
    assert again.verdict.action == "keep"
    assert env.workspace("mine")["spec"]["paused"] is False  # not paused again at once
    assert [e.reason for e in env.events("mine")].count(EVENT_RESTART) == 1
    resumed = result_for(after, "theirs")
    assert resumed.verdict.rule_id != "3-restarted", resumed.verdict  # the culler never stopped it
    assert not [e for e in env.events("theirs") if e.reason in (EVENT_STOP, EVENT_RESTART)]


def test_components_workspaces_rbac_pauses_a_workspace_and_nothing_more(env: Env, workspace_controller: Any,
                                                                        tmp_path: Path) -> None:
    """The culler as its ServiceAccount with the base's RBAC and components/workspaces: a Workspace is paused
    and told why; its status, its StatefulSet (but for its replica count) and the Workspace itself are out of
    reach."""
    objs = component_rbac("workspaces", env.namespace, tmp_path)
    try:
        for o in objs:
            utils.create_from_dict(env.api, o)
        sa_api = workspace_controller.api_client(
            workspace_controller.service_account_kubeconfig(env.namespace, "kf-culler"))
        env.create("nb")
        server = env.serve("nb")
        try:
            with env.culler() as admin_view:  # the settings, built once
                settings = admin_view.settings
            with Passes(build_runner(settings, sa_api, records_namespace=env.namespace)) as runner:
                r = until_action(runner, "nb", "stop")
        finally:
            server.__exit__(None, None, None)
        assert r.write is not None and r.write.outcome == "patched" and r.write.event == "created", r.write
        assert env.workspace("nb")["spec"]["paused"] is True
        custom, apps = client.CustomObjectsApi(sa_api), client.AppsV1Api(sa_api)
        sts = [s for s in client.AppsV1Api(env.api).list_namespaced_stateful_set(env.namespace).items
               if s.metadata.owner_references and s.metadata.owner_references[0].kind == "Workspace"]
        assert sts

        def status(call: Any) -> int:
            try:
                call()
            except ApiException as err:
                return int(err.status)
            return 200

        merge = "application/merge-patch+json"
        assert status(lambda: custom.patch_namespaced_custom_object_status(
            GROUP, VERSION, env.namespace, WORKSPACES, "nb", {"status": {"stateMessage": "x"}})) == 403
        assert status(lambda: custom.delete_namespaced_custom_object(GROUP, VERSION, env.namespace, WORKSPACES,
                                                                     "nb")) == 403
        assert status(lambda: custom.create_namespaced_custom_object(
            GROUP, VERSION, env.namespace, WORKSPACES, workspace_body(env.namespace, "new", env.kind))) == 403
        assert status(lambda: apps.patch_namespaced_stateful_set(sts[0].metadata.name, env.namespace,
                                                                 {"spec": {"replicas": 0}},
                                                                 _content_type=merge)) == 403
        # Only its replica count, through `scale` (the next step of a stop that did not take, docs/targets.md).
        assert status(lambda: apps.patch_namespaced_stateful_set_scale(sts[0].metadata.name, env.namespace,
                                                                       {"spec": {"replicas": 0}},
                                                                       _content_type=merge)) == 200
        assert status(lambda: custom.patch_cluster_custom_object(GROUP, VERSION, KINDS, env.kind,
                                                                 {"metadata": {"labels": {"x": "y"}}})) == 403
    finally:
        delete_cluster_rbac(env.api, objs)


def test_the_v2_backend_lists_a_workspace_the_culler_paused_as_paused(env: Env, backend: str) -> None:
    """GET /api/v1/workspaces/<ns> of the real v2 backend shows the culler's pause: `paused` (spec.paused),
    `state` Paused and `pausedTime` (the controller's status), "Workspace is paused".

    It does not show the culler's reason: the backend's Workspace models carry no metadata annotations of
    the Workspace (only the `notebooks.kubeflow.org/{created,updated}-*` ones, folded into `audit`) and no
    Events, neither in the list nor in GET /workspaces/<ns>/<name>. So the reason is asserted absent there;
    it is on the Workspace itself (annotations, Event), as the first test of this file shows."""
    port = int(backend.rsplit(":", 1)[1])
    assert listening_addresses(port) == {"0100007F"}, listening_addresses(port)  # 127.0.0.1 and nothing else
    env.create("idle")
    server = env.serve("idle")
    try:
        with env.culler() as runner:
            stopped = until_action(runner, "idle", "stop")
    finally:
        server.__exit__(None, None, None)
    assert stopped.write is not None and stopped.write.outcome == "patched", stopped.write
    reason = env.workspace("idle")["metadata"]["annotations"][REASON_ANNOTATION]

    def listed() -> dict[str, Any]:
        items = backend_get(backend, f"/api/v1/workspaces/{env.namespace}")["data"]
        found = [w for w in items if w["name"] == "idle"]
        assert len(found) == 1, items
        item: dict[str, Any] = found[0]
        return item

    procs.wait_until(lambda: listed()["state"] == "Paused", TIMEOUT, 0.2, "the backend to list the workspace Paused")
    item = listed()
    assert item["paused"] is True and item["state"] == "Paused", item
    assert item["namespace"] == env.namespace and item["workspaceKind"]["name"] == env.kind, item
    assert item["pausedTime"] == env.workspace("idle")["status"]["pauseTime"] > 0, item
    assert item["stateMessage"] == "Workspace is paused", item
    one = backend_get(backend, f"/api/v1/workspaces/{env.namespace}/idle")["data"]
    for shown in (item, one):
        text = json.dumps(shown)
        assert REASON_ANNOTATION not in text and reason not in text, shown  # the backend does not show it


def test_an_idle_gpu_workspace_is_paused_on_gpu_evidence_from_prometheus(env: Env) -> None:
    """A Workspace with a GPU (the kind's podConfig asks for nvidia.com/gpu: 1), its Jupyter idle, its GPU idle
    as a real Prometheus reads it from a dcgm-exporter-shaped endpoint: paused with the GPU in the evidence
    and the reason. The series is paired with the pod the Workspace controls through its StatefulSet: a series
    naming a pod of the same shape that no Workspace controls gives no GPU evidence and no pause."""
    gpu_kind = env.add_kind("gpu", gpus=1)
    node = GpuNode(env.namespace)
    try:
        node.start()
    except GpuNodeUnavailable as why:
        missing("Prometheus", why)
    try:
        env.create("gpu", kind=gpu_kind)
        pod = env.pod_of("gpu")
        name = pod.metadata.name
        assert re.fullmatch(r"ws-gpu-[a-z0-9]{5}-0", name), name
        assert env.workspace("gpu")["status"]["podTemplatePod"]["name"] == name
        assert pod.spec.node_name == GPU_NODE
        assert pod.spec.containers[0].resources.requests[GPU_RESOURCE] == "1"
        decoy = "ws-gpu-decoy-0"
        node.assign(decoy, util=0, used_mib=0)
        node.wait_scraped(decoy)
        server = env.serve("gpu")
        try:
            with env.culler(prometheus={"url": node.url, "stepSeconds": 1}) as runner:
                # Past the start-up grace and the idle limit: no series of the Workspace's pod, no stop.
                until = time.monotonic() + 8
                while time.monotonic() < until:
                    r = result_for(runner.once().results, "gpu")
                    assert r.verdict.action != "stop", r.verdict
                    assert r.verdict.evidence.get("gpu", {}).get("read") is not True, r.verdict.evidence
                    time.sleep(1)
                assert r.verdict.rule_id == "6-no-signal", r.verdict
                assert r.verdict.evidence["gpu"] == {"read": False, "error": "no GPU series for pod"}, r.verdict
                node.assign(name, util=0, used_mib=0)  # the GPU is the Workspace pod's, and idle
                node.wait_scraped(name)
                stopped = until_action(runner, "gpu", "stop")
        finally:
            server.__exit__(None, None, None)
    finally:
        node.stop()
    verdict = stopped.verdict
    assert verdict.action == "stop" and verdict.state == "idle", verdict
    assert verdict.gpu_notebook is True, verdict
    gpu = verdict.evidence["gpu"]
    assert gpu["read"] is True and gpu["samples"] >= 2, gpu
    assert gpu["latest"]["utilPercent"] == 0 and gpu["latest"]["memoryUsedMiB"] == 0 and gpu["lastWork"] is None
    assert "an idle GPU" in verdict.reason, verdict.reason
    assert verdict.rule_id == "10-idle", verdict.rule_id
    assert stopped.write is not None and stopped.write.outcome == "patched", stopped.write
    ws = env.workspace("gpu")
    assert ws["spec"]["paused"] is True
    assert ws["metadata"]["annotations"][REASON_ANNOTATION] == verdict.reason[:1000]
    assert any(e.reason == EVENT_STOP for e in env.events("gpu"))
    procs.wait_until(lambda: env.workspace("gpu").get("status", {}).get("state") == "Paused", TIMEOUT, 0.2,
                     "the controller to show the GPU workspace Paused")
    with pytest.raises(ApiException) as gone:
        env.core.read_namespaced_pod(name, env.namespace)
    assert gone.value.status == 404  # the pod is gone, its GPU free


def test_the_controllers_own_culling_and_the_cullers_never_fight(env: Env) -> None:
    """The Workspace controller's own culling left on (the kind's Jupyter activity probe and a rule pausing after
    16 s, its minimum): it probes the pod's IP (kwok's pod IPs are loopback addresses, where a real Jupyter server
    serves the connect path) and pauses the workspace first, silently. The culler, with a longer limit, sees it
    stopped (rule 1), writes nothing, records no stop of its own, and takes its resumption for no restart.
    (The rule's minRunningSeconds keeps the controller from pausing the resumed workspace again at once: its
    probe then reads Jupyter's last_activity from before the pause.)"""
    kind = env.add_kind("probed", jupyter_probe=True, activity_rules=[
        {"config": {"secondsSinceActive": 16, "minRunningSeconds": 20}, "effect": {"pauseWorkspace": True}}])
    env.create("own", kind=kind)
    pod = env.pod_of("own")
    assert pod.status.pod_ip.startswith("127."), pod.status.pod_ip  # kwok --cidr (kf_culler/local/cluster.py)
    server = JupyterServer(env.namespace, "own", base_path=connect_path(env.namespace, "own", "jupyterlab"),
                           ip=pod.status.pod_ip, port=8888)
    server.__enter__()
    env.router.add("ws", env.namespace, "own", f"http://127.0.0.1:{server.port}", strip=True)
    try:
        with env.culler(idleMinutes=60) as runner:
            before = result_for(runner.once().results, "own")
            assert before.verdict.action == "keep" and before.verdict.rule_id != "1-stopped", before.verdict
            procs.wait_until(lambda: env.workspace("own")["spec"].get("paused") is True, 90, 0.5,
                             "the Workspace controller's own culling to pause the workspace")
            activity = env.workspace("own").get("status", {}).get("activity") or {}
            assert activity.get("lastProbe", {}).get("result") == "Success", activity  # it read our server
            time.sleep(1)  # the cache sees the pause
            paused = result_for(runner.once().results, "own")
            assert paused.verdict.rule_id == "1-stopped" and paused.write is None, (paused.verdict, paused.write)
            record = env.record("own")
            assert record is None or "stoppedAt" not in record  # not the culler's stop
            env.pause("own", False)  # its user starts it again
            procs.wait_until(lambda: env.workspace("own").get("status", {}).get("state") == "Running", TIMEOUT,
                             0.2, "the workspace to run again")
            time.sleep(1)
            again = result_for(runner.once().results, "own")
    finally:
        server.__exit__(None, None, None)
    assert again.verdict.rule_id != "3-restarted" and again.verdict.action == "keep", again.verdict
    assert not [e for e in env.events("own") if e.reason in (EVENT_STOP, EVENT_RESTART)]


# What kubeflow-edit lets a profile contributor do in their own namespace (the parts that matter here): every verb
# on their Workspaces, StatefulSets, pods and Services.
TENANT_RULES = [
    {"apiGroups": ["kubeflow.org"], "resources": ["workspaces"], "verbs": ["*"]},
    {"apiGroups": [""], "resources": ["pods", "services", "endpoints", "persistentvolumeclaims"], "verbs": ["*"]},
    {"apiGroups": ["apps"], "resources": ["statefulsets", "deployments"], "verbs": ["*"]},
    {"apiGroups": [""], "resources": ["events"], "verbs": ["get", "list", "watch"]},
]


def metric(text: str, name: str, labels: str) -> float | None:
    """A sample's value from the Prometheus text format, or None when it is not there."""
    for line in text.splitlines():
        if line.startswith(f"{name}{{{labels}}} "):
            return float(line.rsplit(" ", 1)[1])
    return None


def test_a_workspace_its_controller_cannot_pause_is_reported_and_its_gpu_freed(env: Env,
                                                                               workspace_controller: Any) -> None:
    """The tenant (a real identity with kubeflow-edit's rights in the namespace) runs a GPU Workspace and attaches a
    second StatefulSet (replicas 0) with a controller ownerReference to it: the real controller goes to Error on
    every reconcile before it copies the replica count, so the culler's `spec.paused: true` is never applied. Its
    GPU and Jupyter idle (GPU metrics from a real Prometheus scraping a dcgm-exporter-shaped endpoint: the fake
    GPU, as there is none here), the culler pauses it; `stopDeadlineMinutes` later the pod still runs, and the
    culler reports the stop as not taken (a StopNotTaken Warning Event, `kf_culler_stops_not_taken`) and takes
    the next step: the StatefulSet the pod belongs to scaled to 0, after which the pod is gone and the Workspace
    is stopped (rule 1), told once."""
    from kf_culler.metrics import Metrics
    from kf_culler.plan import EVENT_NOT_TAKEN
    from kf_culler.service import instrument

    gpu_kind = env.add_kind("tamper", gpus=1)
    rbac = client.RbacAuthorizationV1Api(env.api)
    rbac.create_namespaced_role(env.namespace, {"metadata": {"name": "tenant-edit"}, "rules": TENANT_RULES})
    rbac.create_namespaced_role_binding(env.namespace, {
        "metadata": {"name": "alice-edit"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "tenant-edit"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "alice@example.com"}]})
    alice = workspace_controller.api_client(workspace_controller.user_kubeconfig("alice@example.com"))
    node = GpuNode(env.namespace)
    try:
        node.start()
    except GpuNodeUnavailable as why:
        missing("Prometheus", why)
    try:
        client.CustomObjectsApi(alice).create_namespaced_custom_object(
            GROUP, VERSION, env.namespace, WORKSPACES, workspace_body(env.namespace, "gpu", gpu_kind))
        procs.wait_until(lambda: env.workspace("gpu").get("status", {}).get("state") == "Running", TIMEOUT, 0.2,
                         "the GPU workspace to be Running")
        pod = env.pod_of("gpu")
        name, sts_name = pod.metadata.name, pod.metadata.owner_references[0].name
        assert pod.spec.containers[0].resources.requests[GPU_RESOURCE] == "1"
        ws = env.workspace("gpu")
        # The attack, as the tenant: a second StatefulSet the Workspace "controls", with no pod.
        client.AppsV1Api(alice).create_namespaced_stateful_set(env.namespace, {
            "metadata": {"name": "gpu-extra", "ownerReferences": [{
                "apiVersion": f"{GROUP}/{VERSION}", "kind": "Workspace", "name": "gpu",
                "uid": ws["metadata"]["uid"], "controller": True}]},
            "spec": {"replicas": 0, "serviceName": "gpu-extra", "selector": {"matchLabels": {"app": "gpu-extra"}},
                     "template": {"metadata": {"labels": {"app": "gpu-extra"}},
                                  "spec": {"containers": [{"name": "c", "image": "busybox"}]}}}})
        procs.wait_until(lambda: env.workspace("gpu").get("status", {}).get("state") == "Error", TIMEOUT, 0.2,
                         "the Workspace controller to fail on the workspace")
        node.assign(name, util=0, used_mib=0)  # the Workspace pod's GPU, idle
        node.wait_scraped(name)
        server = env.serve("gpu")
        metrics = Metrics()
        try:
            with env.culler(prometheus={"url": node.url, "stepSeconds": 1}, checkPeriodSeconds=1,
                            stopDeadlineMinutes=0.1) as runner:
                runner.runner = instrument(runner.runner, metrics)
                stopped = until_action(runner, "gpu", "stop")
                assert stopped.verdict.rule_id == "10-idle" and stopped.write is not None, stopped.verdict
                assert stopped.write.outcome == "patched", stopped.write
                assert env.workspace("gpu")["spec"]["paused"] is True
                time.sleep(2)
                # The controller cannot act: the pause is written, the pod runs on with its GPU.
                assert env.core.read_namespaced_pod(name, env.namespace).status.phase == "Running"
                deadline = time.monotonic() + 30
                while True:
                    r = result_for(runner.once().results, "gpu")
                    if r.verdict.rule_id != "1-stopped" or time.monotonic() > deadline:
                        break
                    time.sleep(1)
                assert (r.verdict.action, r.verdict.state, r.verdict.rule_id) == \
                    ("keep", "stopped", "1-stop-not-taken"), r.verdict
                assert "did not take" in r.verdict.reason and sts_name in r.verdict.reason, r.verdict.reason
                assert "2 StatefulSets" in r.verdict.reason, r.verdict.reason
                assert r.reclaim == "scaled", r.reclaim
                told = metrics.render().decode()
                assert metric(told, "kf_culler_stops_not_taken", 'kind="Workspace"') == 1, told
                assert metric(told, "kf_culler_stop_next_steps_total", 'outcome="scaled"') == 1, told
                events = [e for e in env.events("gpu") if e.reason == EVENT_NOT_TAKEN]
                assert len(events) == 1 and events[0].type == "Warning", events
                assert sts_name in events[0].message
                # The next step: the Workspace's own StatefulSet at 0, its pod gone, its GPU free.
                apps = client.AppsV1Api(env.api)
                assert apps.read_namespaced_stateful_set(sts_name, env.namespace).spec.replicas == 0
                assert apps.read_namespaced_stateful_set("gpu-extra", env.namespace).spec.replicas == 0

                def gone() -> bool:
                    try:
                        env.core.read_namespaced_pod(name, env.namespace)
                    except ApiException as err:
                        return err.status == 404
                    return False

                procs.wait_until(gone, TIMEOUT, 0.2, "the GPU pod to be gone")
                time.sleep(1)  # the cache sees it gone
                after = result_for(runner.once().results, "gpu")
                assert after.verdict.rule_id == "1-stopped", after.verdict
                told = metrics.render().decode()
                assert metric(told, "kf_culler_stops_not_taken", 'kind="Workspace"') == 0, told
        finally:
            server.__exit__(None, None, None)
    finally:
        node.stop()
    assert len([e for e in env.events("gpu") if e.reason == EVENT_NOT_TAKEN]) == 1  # told once
    record = env.record("gpu")
    assert record is not None and "stopNotTakenAt" in record, record
