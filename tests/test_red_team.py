"""The red team: a Kubeflow profile user tries to keep a GPU past the admin's policy, through the API.

On the local control plane in "full" mode (kube-apiserver, kube-controller-manager, kube-scheduler, kwok
playing a node with one nvidia.com/gpu) with Kubeflow's own notebook-controller v1.11.0. The user, alice,
is a real identity (a client certificate) holding what Kubeflow's `kubeflow-edit` gives a profile
contributor in their namespace (../shared/DESIGN.md section 7): every verb on Notebooks, pods,
StatefulSets, Services, Endpoints and NetworkPolicies; nothing on Nodes or the culler's namespace. She
creates her GPU notebook herself and makes every attack through the API while a culler runs passes.

Each attack must fail to keep the GPU: the notebook is stopped when its policy says so, and Kubeflow's
controller scales its StatefulSet to 0. The controls show the attacks' defences cost nothing legitimate:
a real restart from the web app is honoured, and an exemption an admin grants holds.

The GPU is the one fake part (no GPU here): the node's GPU is a dcgm-exporter-shaped /metrics endpoint
(kf_culler.local.prometheus.FakeGpu: dcgm-exporter's default counter names and labels) scraped by a real
Prometheus; the user cannot write it, as in a cluster where an admin's job scrapes dcgm-exporter.
"""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException
from need import missing
from support.passes import Passes

from kf_culler.config import GPU_MODEL_LABEL, load_mapping
from kf_culler.cycle import NotebookResult
from kf_culler.kube import GROUP, PLURAL, VERSION
from kf_culler.local import procs
from kf_culler.local.cluster import GPU_NODE, LocalCluster
from kf_culler.local.handoff import GpuNode, notebook_body
from kf_culler.local.jupyter import JupyterServer
from kf_culler.local.router import Router
from kf_culler.model import (
    EXEMPT_ANNOTATION,
    RESTARTED_AT_ANNOTATION,
    SERVER_TYPE_ANNOTATION,
    STOP_ANNOTATION,
    STOPPED_AT_ANNOTATION,
    STOPPED_BY_ANNOTATION,
    STOPPED_BY_VALUE,
)
from kf_culler.runner import build_runner
from kf_culler.timeutil import format_time

pytestmark = [pytest.mark.slow, pytest.mark.cluster]
MERGE = "application/merge-patch+json"
# What kubeflow-edit lets a profile contributor do in their own namespace (the parts that matter here).
PROFILE_EDIT_RULES = [
    {"apiGroups": ["kubeflow.org"], "resources": ["notebooks"], "verbs": ["*"]},
    {"apiGroups": [""], "resources": ["pods", "services", "endpoints", "persistentvolumeclaims"], "verbs": ["*"]},
    {"apiGroups": ["apps"], "resources": ["statefulsets", "deployments"], "verbs": ["*"]},
    {"apiGroups": ["networking.k8s.io"], "resources": ["networkpolicies"], "verbs": ["*"]},
    {"apiGroups": [""], "resources": ["events"], "verbs": ["get", "list", "watch"]},
]


class Profile:
    """One profile namespace with alice as its contributor, her notebooks' Jupyter servers behind the
    loopback router, the GPU's metrics in Prometheus, and a culler over the namespace."""

    def __init__(self, cluster: LocalCluster) -> None:
        self.cluster = cluster
        self.namespace = f"red-{uuid.uuid4().hex[:8]}"
        self.admin = cluster.api_client()
        self.router = Router()
        self.jupyter: dict[str, JupyterServer] = {}
        self.gpu = GpuNode(self.namespace)
        self.runner: Passes | None = None
        self.user: Any = None
        self.results: list[NotebookResult] = []

    def __enter__(self) -> Profile:
        core = client.CoreV1Api(self.admin)
        core.create_namespace({"metadata": {"name": self.namespace}})
        rbac = client.RbacAuthorizationV1Api(self.admin)
        rbac.create_namespaced_role(self.namespace, {"metadata": {"name": "profile-edit"},
                                                     "rules": PROFILE_EDIT_RULES})
        rbac.create_namespaced_role_binding(self.namespace, {
            "metadata": {"name": "alice-edit"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "profile-edit"},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "alice@example.com"}]})
        self.user = self.cluster.api_client(self.cluster.user_kubeconfig("alice@example.com"))
        self.router.start()
        self.gpu.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.runner is not None:
            self.runner.close()
        for server in self.jupyter.values():
            server.stop()
        self.router.stop()
        self.gpu.stop()
        core = client.CoreV1Api(self.admin)
        with contextlib.suppress(ApiException):
            core.delete_namespace(self.namespace)
        # the one GPU must be free for the next test
        procs.wait_until(lambda: not core.list_namespaced_pod(self.namespace).items, 90, 0.2,
                         f"the pods of {self.namespace} to be deleted")

    # -- alice's side ---------------------------------------------------------------------------------
    def create(self, name: str, body: dict[str, Any] | None = None, server: bool = True) -> None:
        """Alice creates her notebook (the web app does it as her); its Jupyter server is real and idle."""
        if server:
            jup = self.jupyter[name] = JupyterServer(self.namespace, name)
            jup.start()
            self.router.add("notebook", self.namespace, name, f"http://127.0.0.1:{jup.port}", strip=False)
        client.CustomObjectsApi(self.user).create_namespaced_custom_object(
            GROUP, VERSION, self.namespace, PLURAL, body or notebook_body(self.namespace, name))

    def annotate(self, name: str, annotations: dict[str, str | None]) -> None:
        client.CustomObjectsApi(self.user).patch_namespaced_custom_object(
            GROUP, VERSION, self.namespace, PLURAL, name, {"metadata": {"annotations": annotations}},
            _content_type=MERGE)

    def label(self, name: str, labels: dict[str, str | None]) -> None:
        client.CustomObjectsApi(self.user).patch_namespaced_custom_object(
            GROUP, VERSION, self.namespace, PLURAL, name, {"metadata": {"labels": labels}}, _content_type=MERGE)

    def relabel_pod(self, pod: str, labels: dict[str, str | None]) -> None:
        client.CoreV1Api(self.user).patch_namespaced_pod(pod, self.namespace, {"metadata": {"labels": labels}},
                                                         _content_type=MERGE)

    def delete_pod(self, pod: str) -> None:
        with contextlib.suppress(ApiException):
            client.CoreV1Api(self.user).delete_namespaced_pod(pod, self.namespace)

    # -- the cluster's side ---------------------------------------------------------------------------
    def wait_running(self, name: str, timeout: float = 90) -> dict[str, Any]:
        core = client.CoreV1Api(self.admin)

        def running() -> bool:
            try:
                pod = core.read_namespaced_pod(f"{name}-0", self.namespace)
            except ApiException:
                return False
            return bool(pod.status.phase == "Running" and pod.spec.node_name == GPU_NODE
                        and not pod.metadata.deletion_timestamp)

        procs.wait_until(running, timeout, 0.2, f"pod {name}-0 Running on {GPU_NODE}")
        pod: dict[str, Any] = self.admin.sanitize_for_serialization(core.read_namespaced_pod(f"{name}-0",
                                                                                             self.namespace))
        self.gpu.assign(f"{name}-0", util=0, used_mib=0)  # it holds the GPU and does nothing with it
        self.gpu.wait_scraped(f"{name}-0")
        return pod

    def notebook(self, name: str) -> dict[str, Any]:
        nb: dict[str, Any] = client.CustomObjectsApi(self.admin).get_namespaced_custom_object(
            GROUP, VERSION, self.namespace, PLURAL, name)
        return nb

    def replicas(self, name: str) -> int | None:
        try:
            sts = client.AppsV1Api(self.admin).read_namespaced_stateful_set(name, self.namespace)
        except ApiException:
            return None
        return int(sts.spec.replicas)

    def culler(self, **policy: Any) -> Passes:
        settings = load_mapping({
            "idleMinutes": 0.1, "warnMinutes": 0, "startupGraceMinutes": 0, "checkPeriodSeconds": 1,
            "namespaces": {"include": [self.namespace]}, "urls": {"jupyter": self.router.template("notebook")},
            "probe": {"timeoutSeconds": 2, "connectTimeoutSeconds": 1, "retries": 0},
            "prometheus": {"url": self.gpu.url, "stepSeconds": 1}, **policy}, "red team")
        self.runner = Passes(build_runner(settings, self.admin))
        self.runner.start_cache()
        return self.runner

    def passes_until(self, name: str, done: Callable[[NotebookResult], bool], seconds: float = 90,
                     between: Callable[[], None] | None = None) -> NotebookResult:
        """Culler passes, a second apart (alice's `between` before each), until one's result for `name`
        satisfies `done`; every result is kept in `results`."""
        assert self.runner is not None
        deadline = time.monotonic() + seconds
        last: NotebookResult | None = None
        while time.monotonic() < deadline:
            if between is not None:
                between()
            for r in self.runner.once().results:
                if r.name == name:
                    last = r
                    self.results.append(r)
                    if done(r):
                        return r
            time.sleep(1)
        raise AssertionError(f"no pass gave the expected verdict for {name} in {seconds:g} s; last: "
                             f"{last.verdict if last else None}")

    def stopped(self, name: str, result: NotebookResult) -> None:
        """The stop landed: our patch, the annotation, and Kubeflow's controller scaled the StatefulSet to 0."""
        assert result.write is not None and result.write.outcome == "patched", result.write
        assert STOP_ANNOTATION in self.notebook(name)["metadata"]["annotations"]
        procs.wait_until(lambda: self.replicas(name) == 0, 60, 0.2, f"StatefulSet {name} at 0 replicas")


@pytest.fixture()
def profile(notebook_controller: LocalCluster) -> Iterator[Profile]:
    with Profile(notebook_controller) as p:
        yield p


def is_stop(r: NotebookResult) -> bool:
    return r.verdict.action == "stop"


def test_alice_can_do_what_the_suite_says_and_no_more(profile: Profile) -> None:
    """The control for every attack: alice's identity is real and holds the profile rights, not more."""
    profile.create("nb", server=False)
    nodes = client.CoreV1Api(profile.user)
    with pytest.raises(ApiException) as err:
        nodes.patch_node(GPU_NODE, {"metadata": {"labels": {GPU_MODEL_LABEL: "x"}}})
    assert err.value.status == 403
    with pytest.raises(ApiException) as err:
        nodes.list_namespaced_config_map("default")
    assert err.value.status == 403
    profile.annotate("nb", {STOPPED_BY_ANNOTATION: STOPPED_BY_VALUE})  # her own Notebook: allowed
    assert profile.notebook("nb")["metadata"]["annotations"][STOPPED_BY_ANNOTATION] == STOPPED_BY_VALUE


def test_forged_restart_marks_written_every_pass_keep_nothing(profile: Profile) -> None:
    """Attack: `notebook-culler.io/restarted-at` a minute ago, rewritten before every pass, and the culler's
    stopped-by/stopped-at marks on a running notebook (rule 15): the idle GPU notebook is stopped anyway,
    by its idle rule, never seen as restarted."""
    profile.create("nb")
    profile.wait_running("nb")
    profile.culler()

    def forge() -> None:
        profile.annotate("nb", {RESTARTED_AT_ANNOTATION: format_time(time_ago(60)), STOPPED_BY_ANNOTATION:
                                STOPPED_BY_VALUE, STOPPED_AT_ANNOTATION: format_time(time_ago(90))})

    r = profile.passes_until("nb", is_stop, between=forge)
    assert (r.verdict.state, r.verdict.rule_id) == ("idle", "10-idle"), r.verdict
    assert all(x.verdict.rule_id != "3-restarted" for x in profile.results)
    profile.stopped("nb", r)


def test_relabelled_notebook_and_pod_are_still_paired(profile: Profile) -> None:
    """Attack: `notebook-name=decoy` on the Notebook (Kubeflow's controller copies it onto the pod, a new pod
    rolls out) and on the pod itself: pods are paired by name and ownership, so the idle notebook is stopped."""
    profile.create("nb")
    profile.wait_running("nb")
    profile.label("nb", {"notebook-name": "decoy"})
    profile.relabel_pod("nb-0", {"notebook-name": "decoy", "app": "decoy"})
    profile.culler()
    r = profile.passes_until("nb", is_stop, between=lambda: profile.gpu.assign("nb-0", util=0, used_mib=0))
    assert r.verdict.state == "idle" and r.gpus == 1, r.verdict
    profile.stopped("nb", r)


def test_removing_the_statefulsets_owner_reference_hides_nothing(profile: Profile) -> None:
    """Attack: `kubectl patch sts nb --type=json -p '[{"op":"remove","path":"/metadata/ownerReferences"}]'`,
    and a decoy StatefulSet of another name that claims the Notebook as its controller, its pod asking for a
    GPU. Kubeflow's controller finds the StatefulSet by name (and does not put the ownerReference back), and so
    does the culler: the idle GPU notebook is stopped, the controller scales `nb` (and nothing else) to 0 and
    the GPU pod goes away; nothing is reported as orphaned."""
    profile.create("nb")
    profile.wait_running("nb")
    apps = client.AppsV1Api(profile.user)
    apps.patch_namespaced_stateful_set("nb", profile.namespace,
                                       [{"op": "remove", "path": "/metadata/ownerReferences"}],
                                       _content_type="application/json-patch+json")
    uid = profile.notebook("nb")["metadata"]["uid"]
    apps.create_namespaced_stateful_set(profile.namespace, {
        "metadata": {"name": "decoy", "ownerReferences": [{"apiVersion": f"{GROUP}/{VERSION}", "kind": "Notebook",
                                                           "name": "nb", "uid": uid, "controller": True}]},
        "spec": {"replicas": 1, "serviceName": "decoy", "selector": {"matchLabels": {"app": "decoy"}},
                 "template": {"metadata": {"labels": {"app": "decoy"}}, "spec": {"containers": [{
                     "name": "decoy", "image": "decoy:local",
                     "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}}})
    runner = profile.culler()
    r = profile.passes_until("nb", is_stop, between=lambda: profile.gpu.assign("nb-0", util=0, used_mib=0))
    assert r.verdict.state == "idle" and r.gpus == 1, r.verdict
    assert runner.last.gpu_orphans == []
    profile.stopped("nb", r)
    core = client.CoreV1Api(profile.admin)
    procs.wait_until(lambda: "nb-0" not in {p.metadata.name for p in core.list_namespaced_pod(
        profile.namespace).items}, 60, 0.2, "the GPU pod nb-0 to go away")
    sts = client.AppsV1Api(profile.admin).read_namespaced_stateful_set("nb", profile.namespace)
    assert not sts.metadata.owner_references  # the controller scaled it without taking it back
    assert profile.replicas("decoy") == 1  # a stop of nb scales nb alone, whatever the decoy claims


def test_renumbering_the_statefulsets_pods_hides_nothing(profile: Profile) -> None:
    """Attack: `kubectl patch sts nb -p '{"spec":{"ordinals":{"start":1}}}'`, then `kubectl delete pod nb-0`: the
    StatefulSet controller makes `nb-1`, which takes the GPU; the notebook-controller's next update of the
    StatefulSet drops the field it does not know, so `nb-0` is made again and waits, Pending, for the one GPU,
    and the StatefulSet controller (OrderedReady) removes no pod while `nb-0` is not Ready. The culler finds the
    notebook's pod among all the pods the StatefulSet `nb` controls (the Running one holding the GPU), not only
    `nb-0`: the idle GPU notebook is stopped and both pods go away."""
    profile.create("nb")
    profile.wait_running("nb")
    core = client.CoreV1Api(profile.admin)

    def renumbered() -> bool:
        pods = {p.metadata.name: p for p in core.list_namespaced_pod(profile.namespace).items}
        return "nb-1" in pods and pods["nb-1"].status.phase == "Running"

    def attempt() -> bool:
        """She renumbers and deletes nb-0 at once, before the notebook-controller's next update takes the field
        away; True once nb-1 runs (else she tries again)."""
        client.AppsV1Api(profile.user).patch_namespaced_stateful_set(
            "nb", profile.namespace, {"spec": {"ordinals": {"start": 1}}}, _content_type=MERGE)
        profile.delete_pod("nb-0")
        try:
            procs.wait_until(renumbered, 10, 0.2, "nb-1 Running")
        except TimeoutError:
            return False
        return True

    assert any(attempt() for _ in range(12)), "nb-1 never took the GPU"

    profile.gpu.assign("nb-1", util=0, used_mib=0)
    profile.gpu.wait_scraped("nb-1")
    runner = profile.culler()
    r = profile.passes_until("nb", is_stop, between=lambda: profile.gpu.assign("nb-1", util=0, used_mib=0))
    assert r.verdict.state == "idle" and r.gpus == 1, r.verdict
    assert runner.last.gpu_orphans == []
    profile.stopped("nb", r)
    procs.wait_until(lambda: not core.list_namespaced_pod(profile.namespace).items, 60, 0.2,
                     "the pods of nb to go away")


def test_deleting_ones_pod_does_not_restart_the_lifetime_cap(profile: Profile) -> None:
    """Attack: a kernel kept busy (positive evidence) and the pod deleted again and again (the StatefulSet
    makes a new one each time): the lifetime cap counts from when the culler first saw the notebook running
    (runningSince), so maxRunningMinutes stops it all the same."""
    profile.create("nb")
    profile.wait_running("nb")
    jup = profile.jupyter["nb"]
    jup.execute(jup.start_kernel(), "import time\nwhile True: time.sleep(1)")
    profile.culler(maxRunningMinutes=0.5)
    first = profile.passes_until("nb", lambda r: r.verdict.state == "active")
    assert first.verdict.rule_id == "5-positive-evidence"
    deletions = 0

    def delete() -> None:
        nonlocal deletions
        pod = client.CoreV1Api(profile.admin).read_namespaced_pod("nb-0", profile.namespace)
        if pod.status.phase == "Running" and not pod.metadata.deletion_timestamp:
            profile.delete_pod("nb-0")
            deletions += 1

    stopper = threading.Event()

    def keep_deleting() -> None:  # every 4 s, as a script of alice's would
        while not stopper.wait(4):
            with contextlib.suppress(ApiException):
                delete()

    thread = threading.Thread(target=keep_deleting, daemon=True)
    thread.start()
    try:
        r = profile.passes_until("nb", is_stop, seconds=120)
    finally:
        stopper.set()
        thread.join()
    assert r.verdict.rule_id == "13-lifetime-cap" and deletions >= 2, (r.verdict, deletions)
    profile.stopped("nb", r)


def test_an_unknown_server_type_is_probed_as_jupyter(profile: Profile) -> None:
    """Attack: `notebooks.kubeflow.org/server-type: none` on a Jupyter notebook, to be probed by nothing:
    it is probed as Jupyter (rule 16), found idle and stopped, and the reason names the value."""
    body = notebook_body(profile.namespace, "nb")
    body["metadata"]["annotations"][SERVER_TYPE_ANNOTATION] = "none"
    profile.create("nb", body)
    profile.wait_running("nb")
    profile.culler()
    r = profile.passes_until("nb", is_stop)
    assert (r.verdict.state, r.verdict.rule_id) == ("idle", "10-idle") and "'none'" in r.verdict.reason
    profile.stopped("nb", r)


def test_a_server_that_answers_nothing_does_not_protect_an_idle_gpu(profile: Profile) -> None:
    """Attack: the notebook's server answers 503 to every probe (here: nothing behind the route, what a mesh
    answers for a pod it cannot reach) while its GPU idles: with `noSignal: keep` it stays no-signal until
    the GPU has shown no work for noSignalGpuIdleMinutes, then it is stopped (rule 16)."""
    profile.create("nb", server=False)
    profile.wait_running("nb")
    profile.culler(noSignalGpuIdleMinutes=0.25)
    kept = profile.passes_until("nb", lambda r: r.verdict.state == "no-signal")
    assert kept.verdict.action == "keep", kept.verdict
    r = profile.passes_until("nb", is_stop)
    assert (r.verdict.state, r.verdict.rule_id) == ("no-signal", "16-no-signal-gpu-idle"), r.verdict
    assert "HTTP 503" in r.verdict.reason
    profile.stopped("nb", r)


def test_a_gpu_in_a_native_sidecar_is_a_gpu_notebook(profile: Profile) -> None:
    """Attack: the GPU asked for by an init container that runs beside the notebook (restartPolicy: Always),
    to dodge the admin's rule for GPU notebooks: it counts (rule 17), the GPU rule's short limit applies."""
    body = notebook_body(profile.namespace, "nb", gpus=0)
    body["spec"]["template"]["spec"]["initContainers"] = [{
        "name": "worker", "image": "worker:local", "restartPolicy": "Always",
        "resources": {"limits": {"nvidia.com/gpu": "1"}, "requests": {"nvidia.com/gpu": "1"}}}]
    profile.create("nb", body)
    profile.wait_running("nb")
    profile.culler(idleMinutes=600, rules=[{"name": "gpu", "match": {"gpu": True}, "policy": {"idleMinutes": 0.1}}])
    r = profile.passes_until("nb", is_stop)
    assert r.gpus == 1 and r.verdict.policy_rule == "gpu" and r.verdict.gpu_notebook, r.verdict
    profile.stopped("nb", r)


def test_choosing_the_node_by_another_label_does_not_dodge_a_gpu_model_rule(profile: Profile) -> None:
    """Attack: a rule for H100 notebooks, dodged by choosing the node through node.kubernetes.io/instance-type
    instead of nvidia.com/gpu.product: the model is read from the Node's label (rule 17)."""
    labels = {GPU_MODEL_LABEL: "NVIDIA-H100-80GB-HBM3", "node.kubernetes.io/instance-type": "p5.48xlarge"}
    core = client.CoreV1Api(profile.admin)
    core.patch_node(GPU_NODE, {"metadata": {"labels": labels}})
    try:
        body = notebook_body(profile.namespace, "nb")
        body["spec"]["template"]["spec"]["nodeSelector"] = {"node.kubernetes.io/instance-type": "p5.48xlarge"}
        profile.create("nb", body)
        profile.wait_running("nb")
        profile.culler(idleMinutes=600,
                       rules=[{"name": "h100", "match": {"gpuModels": ["NVIDIA-H100*"]},
                               "policy": {"idleMinutes": 0.1}}])
        procs.wait_until(lambda: profile.runner is not None and profile.runner.cache is not None
                         and profile.runner.cache.node(GPU_NODE) is not None, 30, 0.2, "the Node in the cache")
        r = profile.passes_until("nb", is_stop)
        assert r.verdict.policy_rule == "h100", r.verdict
        profile.stopped("nb", r)
    finally:
        core.patch_node(GPU_NODE, {"metadata": {"labels": dict.fromkeys(labels)}})


def test_control_a_restart_from_the_web_app_is_honoured(profile: Profile) -> None:
    """Control: stopped by the culler, then started again the web app's way (the stop key removed): the
    culler's record says it stopped it, so the restart gets its start-up grace and is not stopped again
    on the old idleness."""
    profile.create("nb")
    profile.wait_running("nb")
    profile.culler(startupGraceMinutes=0.3)
    time.sleep(19)  # past the grace from the pod's start
    r = profile.passes_until("nb", is_stop)
    profile.stopped("nb", r)
    profile.annotate("nb", {STOP_ANNOTATION: None})  # Start, as Kubeflow's web app does it (as alice)
    restarted = profile.passes_until("nb", lambda x: x.verdict.rule_id == "3-restarted")
    assert restarted.verdict.state == "starting"
    later = [profile.passes_until("nb", lambda _x: True) for _ in range(5)]
    assert all(x.verdict.action != "stop" and x.verdict.state == "starting" for x in later), \
        [x.verdict for x in later]


def test_control_an_exemption_the_admin_grants_holds(profile: Profile) -> None:
    """Control: with allowExempt, the exemption an admin writes keeps an idle GPU notebook."""
    profile.create("nb")
    profile.wait_running("nb")
    client.CustomObjectsApi(profile.admin).patch_namespaced_custom_object(
        GROUP, VERSION, profile.namespace, PLURAL, "nb", {"metadata": {"annotations": {EXEMPT_ANNOTATION: "true"}}},
        _content_type=MERGE)
    profile.culler(allowExempt=True)
    kept = [profile.passes_until("nb", lambda _x: True) for _ in range(8)]
    assert all((x.verdict.action, x.verdict.state) == ("keep", "exempt") for x in kept)
    assert profile.replicas("nb") == 1


def time_ago(seconds: float) -> Any:
    from datetime import UTC, datetime, timedelta

    return datetime.now(UTC) - timedelta(seconds=seconds)


def test_forged_stop_marks_from_a_tenant_are_imported_once_and_keep_no_name(kube: Any, api: Any,
                                                                          namespace: str) -> None:
    """Attack, as the tenant on the real API server (alice, impersonated, with kubeflow-edit's rights in her
    namespace and none in the culler's): stopped Notebooks with 200-character names and forged `stopped-by:
    kf-culler` marks, no pods, to fill the culler's shared record buckets. Control: the API server takes them from
    her (without components/exempt-admission nothing refuses the marks). The culler's record keeps none of her
    names, and its import of old marks is done once: the forged Notebooks she adds after the first culler start
    are never imported, by a later pass or a second culler start. (The share of a bucket a namespace may fill is
    tests/test_record_share.py's, with the real bounds.)"""
    if kube.local is None:
        missing("a local control plane (impersonation of a tenant)", "the cluster target is not local")
    culler_ns = f"{namespace}-culler"
    client.CoreV1Api(api).create_namespace({"metadata": {"name": culler_ns}})
    rbac = client.RbacAuthorizationV1Api(api)
    rbac.create_namespaced_role(namespace, {"metadata": {"name": "profile-edit"}, "rules": PROFILE_EDIT_RULES})
    rbac.create_namespaced_role_binding(namespace, {
        "metadata": {"name": "alice-edit"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "profile-edit"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "alice@example.com"}]})
    alice = kube.api_client()
    alice.set_default_header("Impersonate-User", "alice@example.com")
    forged = {STOPPED_BY_ANNOTATION: STOPPED_BY_VALUE, STOPPED_AT_ANNOTATION: "2026-11-01T10:00:00Z",
              STOP_ANNOTATION: "2026-11-01T10:00:00Z"}
    long = "x" * 200

    def forge(i: int) -> str:
        body = notebook_body(namespace, f"{long}-{i:03d}", gpus=0)
        body["metadata"].setdefault("annotations", {}).update(forged)
        body["metadata"]["labels"] = {}
        deadline = time.monotonic() + 30
        while True:  # alice's Role takes a moment to be in force
            try:
                made = client.CustomObjectsApi(alice).create_namespaced_custom_object(
                    GROUP, VERSION, namespace, PLURAL, body)
                return str(made["metadata"]["uid"])
            except ApiException as err:
                if err.status != 403 or time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    with pytest.raises(ApiException) as refused:  # she cannot write the culler's namespace
        client.CoreV1Api(alice).create_namespaced_config_map(culler_ns, {"metadata": {"name": "kf-culler-records-00"}})
    assert refused.value.status == 403
    early = {forge(i) for i in range(20)}
    settings = load_mapping({"namespaces": {"include": [namespace]}, "idleMinutes": 30, "warnMinutes": 0},
                            "red team")

    def stored() -> dict[str, str]:
        return {k: v for cm in client.CoreV1Api(api).list_namespaced_config_map(culler_ns).items
                for k, v in (cm.data or {}).items()}

    with Passes(build_runner(settings, api, records_namespace=culler_ns)) as first:
        first.once()
        late = {forge(i) for i in range(20, 30)}
        time.sleep(1)  # the cache sees them
        first.once()
    with Passes(build_runner(settings, api, records_namespace=culler_ns)) as second:
        second.once()
        second.once()
    records = stored()
    assert early & set(records), "the first start imports the old marks"
    assert not late & set(records), sorted(late & set(records))
    assert all(long not in value for value in records.values())
