"""Plain workloads culled end to end (`targets: [workloads]`, docs/targets.md), the structure of sessions run
without Kubeflow: a Deployment of one pod with a GPU and a home PVC, its IDE behind a Service, stopped by
scaling to 0 with the reason in annotations and an Event. On the full local cluster: kube-apiserver,
kube-controller-manager (Deployments, ReplicaSets, the PersistentVolume binder), kube-scheduler and a kwok
node with one `nvidia.com/gpu`; a real Jupyter server stands where the session's Service would route (kwok's
pods run no containers).

- The GPU hand-off: session A idle on the node's one GPU, session B Pending for it; the culler scales A to 0
  and the scheduler gives the GPU to B (the time from the culler's patch to B Running is printed; the figure
  with its method is in docs/performance.md). A's home PVC stays bound.
- A restart is the replicas coming back: seen from the culler's record, not stopped again at once.
- Which workloads are sessions: the admin's label selector (its owner can remove the label), or with
  `gpuWorkloads` every workload asking for a GPU; never one that something else controls.
- `workloads.skipControlledBy` only in the admin's namespaces: a tenant's GPU Deployment "owned" by a small
  InferenceService of their own stays a session (on the API server alone).
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
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
from kf_culler.local import procs
from kf_culler.local.cluster import GPU_NODE
from kf_culler.local.jupyter import JupyterServer
from kf_culler.local.router import Router
from kf_culler.model import REASON_ANNOTATION, STOP_ANNOTATION, STOPPED_BY_ANNOTATION
from kf_culler.plan import EVENT_STOP
from kf_culler.runner import build_runner
from kf_culler.targets import REPLICAS_BEFORE_ANNOTATION, session_key

pytestmark = pytest.mark.cluster
TIMEOUT = 90.0
SESSION_LABEL = "sessions.example.com/reclaim"


@dataclass
class Env:
    api: Any
    namespace: str
    router: Router

    @property
    def apps(self) -> Any:
        return client.AppsV1Api(self.api)

    @property
    def core(self) -> Any:
        return client.CoreV1Api(self.api)

    def session(self, name: str, labelled: bool = True, gpus: int = 1) -> None:
        """A Deployment like the write-up's session: one replica (Recreate), a GPU, a home PVC, a Service."""
        self.core.create_persistent_volume({
            "metadata": {"name": f"{self.namespace}-{name}"},
            "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
                     "storageClassName": "manual", "hostPath": {"path": f"/tmp/{self.namespace}-{name}"},
                     "claimRef": {"namespace": self.namespace, "name": f"home-{name}"}}})
        self.core.create_namespaced_persistent_volume_claim(self.namespace, {
            "metadata": {"name": f"home-{name}"},
            "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "manual",
                     "resources": {"requests": {"storage": "1Gi"}}}})
        resources: dict[str, Any] = {"requests": {"cpu": "100m"}}
        if gpus:
            resources["limits"] = {"nvidia.com/gpu": str(gpus)}
            resources["requests"]["nvidia.com/gpu"] = str(gpus)
        self.apps.create_namespaced_deployment(self.namespace, {
            "metadata": {"name": name, "labels": {SESSION_LABEL: "true"} if labelled else {}},
            "spec": {"replicas": 1, "strategy": {"type": "Recreate"},
                     "selector": {"matchLabels": {"session": name}},
                     "template": {"metadata": {"labels": {"session": name}}, "spec": {
                         "containers": [{"name": "ide", "image": "codercom/code-server:4", "resources": resources,
                                         "volumeMounts": [{"name": "home", "mountPath": "/home/coder"}]}],
                         "volumes": [{"name": "home", "persistentVolumeClaim": {"claimName": f"home-{name}"}}]}}}})
        self.core.create_namespaced_service(self.namespace, {
            "metadata": {"name": name}, "spec": {"selector": {"session": name}, "ports": [{"port": 80}]}})

    def pods(self, name: str) -> list[Any]:
        return list(self.core.list_namespaced_pod(self.namespace, label_selector=f"session={name}").items)

    def running(self, name: str) -> bool:
        return any(p.status.phase == "Running" and p.spec.node_name == GPU_NODE and not p.metadata.deletion_timestamp
                   for p in self.pods(name))

    def culler(self, **workloads: Any) -> Passes:
        settings = load_mapping({
            "targets": ["workloads"], "namespaces": {"include": [self.namespace]},
            "workloads": workloads or {"selector": {"matchLabels": {SESSION_LABEL: "true"}}},
            "idleMinutes": 0.05, "warnMinutes": 0, "startupGraceMinutes": 0.1, "gpuWithoutMetrics": "ide-only",
            "urls": {"workload": f"{self.router.base}/workload/{{namespace}}/{{name}}/"},
            "probe": {"timeoutSeconds": 5}}, "test")
        return Passes(build_runner(settings, self.api, records_namespace=self.namespace))


@pytest.fixture()
def env(full_cluster: Any) -> Iterator[Env]:
    api = full_cluster.api_client()
    core = client.CoreV1Api(api)
    namespace = f"wl-{uuid.uuid4().hex[:8]}"
    core.create_namespace({"metadata": {"name": namespace}})
    with Router() as router:
        try:
            yield Env(api, namespace, router)
        finally:
            with contextlib.suppress(Exception):
                core.delete_namespace(namespace)
            procs.wait_until(lambda: not core.list_namespaced_pod(namespace).items, TIMEOUT, 0.2,
                             f"the pods of namespace {namespace} to be deleted")
            for pv in core.list_persistent_volume().items:
                if pv.metadata.name.startswith(namespace):
                    with contextlib.suppress(Exception):
                        core.delete_persistent_volume(pv.metadata.name)


def result_for(results: list[NotebookResult], name: str) -> NotebookResult:
    found = [r for r in results if r.name == f"Deployment/{name}"]
    assert len(found) == 1, [r.name for r in results]
    return found[0]


def until_stopped(runner: Passes, name: str, timeout: float = 30) -> NotebookResult:
    """Passes until the session's verdict is a stop (its idle limit is seconds)."""
    deadline = time.monotonic() + timeout
    while (r := result_for(runner.once().results, name)).verdict.action != "stop":
        assert time.monotonic() < deadline, r.verdict
        time.sleep(1)
    return r


def test_an_idle_session_is_scaled_to_zero_and_the_waiting_one_gets_the_gpu(env: Env) -> None:
    env.session("a")
    procs.wait_until(lambda: env.running("a"), TIMEOUT, 0.2, "session a to run on the GPU node")
    env.session("b", labelled=False)
    procs.wait_until(lambda: any(c.type == "PodScheduled" and c.status == "False"
                                 for p in env.pods("b") for c in (p.status.conditions or [])),
                     TIMEOUT, 0.2, "session b to wait for the GPU")
    with JupyterServer(env.namespace, "a", base_path="/") as server:
        server.start_kernel()
        env.router.add("workload", env.namespace, "a", f"http://127.0.0.1:{server.port}", strip=True)
        with env.culler() as runner:
            r = until_stopped(runner, "a")
            patched = time.monotonic()
            assert r.write is not None and r.write.outcome == "patched" and r.write.event == "created", r.write
            procs.wait_until(lambda: env.running("b"), TIMEOUT, 0.1, "session b to get the GPU")
            print(f"\nculler's patch to the waiting session Running: {time.monotonic() - patched:.2f} s")
            assert [x.name for x in runner.once().results] == ["Deployment/a"]  # b carries no label
    a = env.apps.read_namespaced_deployment("a", env.namespace)
    ann = a.metadata.annotations or {}
    assert a.spec.replicas == 0
    assert ann[REPLICAS_BEFORE_ANNOTATION] == "1" and ann[STOPPED_BY_ANNOTATION] == "kf-culler"
    assert STOP_ANNOTATION not in ann and "idle" in ann[REASON_ANNOTATION].lower()
    events = [e for e in env.core.list_namespaced_event(env.namespace).items
              if e.involved_object.kind == "Deployment" and e.involved_object.name == "a" and e.reason == EVENT_STOP]
    assert len(events) == 1
    pvc = env.core.read_namespaced_persistent_volume_claim("home-a", env.namespace)
    assert pvc.status.phase == "Bound"  # the home volume stays


def test_a_scaled_up_session_is_seen_restarted_and_gpu_workloads_takes_every_gpu_session(env: Env) -> None:
    env.session("a")
    procs.wait_until(lambda: env.running("a"), TIMEOUT, 0.2, "session a to run on the GPU node")
    env.session("cpu", labelled=False, gpus=0)
    with JupyterServer(env.namespace, "a", base_path="/") as server:
        env.router.add("workload", env.namespace, "a", f"http://127.0.0.1:{server.port}", strip=True)
        with env.culler() as runner:
            until_stopped(runner, "a")
            procs.wait_until(lambda: not env.pods("a"), TIMEOUT, 0.2, "session a's pod to go")
            env.apps.patch_namespaced_deployment_scale("a", env.namespace, {"spec": {"replicas": 1}})  # its user
            procs.wait_until(lambda: env.running("a"), TIMEOUT, 0.2, "session a to run again")
            time.sleep(1)  # the cache sees it
            again = result_for(runner.once().results, "a")
        assert again.verdict.rule_id == "3-restarted" and again.verdict.action == "keep", again.verdict
        assert env.apps.read_namespaced_deployment("a", env.namespace).spec.replicas == 1
        # gpuWorkloads: every GPU workload is a session, labelled or not; the CPU one is not.
        with env.culler(gpuWorkloads=True) as wide:
            names = sorted(x.name for x in wide.once().results)
    assert names == ["Deployment/a"]
    rs = env.apps.list_namespaced_replica_set(env.namespace).items
    assert rs and all(x.metadata.owner_references for x in rs)  # ReplicaSets are their Deployment's, never sessions


def test_components_workloads_rbac_scales_a_session_and_nothing_more(env: Env, full_cluster: Any,
                                                                     tmp_path: Path) -> None:
    """The culler as its ServiceAccount with the base's RBAC and components/workloads: a session is scaled to 0
    and told why; deleting it, changing its template, its pods and its PVC are out of reach."""
    objs = component_rbac("workloads", env.namespace, tmp_path)
    try:
        for o in objs:
            utils.create_from_dict(env.api, o)
        sa_api = full_cluster.api_client(full_cluster.service_account_kubeconfig(env.namespace, "kf-culler"))
        env.session("a")
        procs.wait_until(lambda: env.running("a"), TIMEOUT, 0.2, "session a to run")
        with JupyterServer(env.namespace, "a", base_path="/") as server:
            env.router.add("workload", env.namespace, "a", f"http://127.0.0.1:{server.port}", strip=True)
            settings = env.culler().settings
            with Passes(build_runner(settings, sa_api, records_namespace=env.namespace)) as runner:
                r = until_stopped(runner, "a")
        assert r.write is not None and r.write.outcome == "patched" and r.write.event == "created", r.write
        assert env.apps.read_namespaced_deployment("a", env.namespace).spec.replicas == 0
        apps, core = client.AppsV1Api(sa_api), client.CoreV1Api(sa_api)

        def status(call: Any) -> int:
            try:
                call()
            except ApiException as err:
                return int(err.status)
            return 200

        assert status(lambda: apps.delete_namespaced_deployment("a", env.namespace)) == 403
        assert status(lambda: apps.create_namespaced_deployment(env.namespace, {
            "metadata": {"name": "new"}, "spec": {"selector": {"matchLabels": {"x": "y"}}, "template": {
                "metadata": {"labels": {"x": "y"}}, "spec": {"containers": [{"name": "c", "image": "i"}]}}}})) == 403
        assert status(lambda: core.delete_namespaced_persistent_volume_claim("home-a", env.namespace)) == 403
        assert status(lambda: core.list_namespaced_persistent_volume_claim(env.namespace)) == 403
        assert status(lambda: apps.delete_namespaced_replica_set("x", env.namespace)) == 403
    finally:
        delete_cluster_rbac(env.api, objs)


ISVC_CRD = {
    "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
    "metadata": {"name": "inferenceservices.serving.kserve.io"},
    "spec": {"group": "serving.kserve.io", "scope": "Namespaced",
             "names": {"plural": "inferenceservices", "singular": "inferenceservice", "kind": "InferenceService",
                       "listKind": "InferenceServiceList"},
             "versions": [{"name": "v1beta1", "served": True, "storage": True,
                           "schema": {"openAPIV3Schema": {"type": "object",
                                                          "x-kubernetes-preserve-unknown-fields": True}}}]}}
# What kubeflow-edit gives a profile contributor here: workloads, and KServe's edit role (inferenceservices).
TENANT_RULES = [
    {"apiGroups": ["apps"], "resources": ["deployments", "statefulsets"], "verbs": ["*"]},
    {"apiGroups": ["serving.kserve.io"], "resources": ["inferenceservices"], "verbs": ["*"]},
]


def _isvc_and_deployment(api: Any, namespace: str, isvc: str, name: str) -> None:
    """An InferenceService `isvc` and a one-GPU Deployment `name` whose controller ownerReference points at it,
    created through `api` (a tenant's identity or the admin's)."""
    made = client.CustomObjectsApi(api).create_namespaced_custom_object(
        "serving.kserve.io", "v1beta1", namespace, "inferenceservices",
        {"apiVersion": "serving.kserve.io/v1beta1", "kind": "InferenceService", "metadata": {"name": isvc},
         "spec": {"predictor": {"model": {"modelFormat": {"name": "sklearn"}}}}})
    client.AppsV1Api(api).create_namespaced_deployment(namespace, {
        "metadata": {"name": name, "ownerReferences": [
            {"apiVersion": "serving.kserve.io/v1beta1", "kind": "InferenceService", "name": isvc,
             "uid": made["metadata"]["uid"], "controller": True}]},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": name}},
                 "template": {"metadata": {"labels": {"app": name}}, "spec": {"containers": [
                     {"name": "c", "image": "i", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}}})


def test_skip_controlled_by_cannot_be_satisfied_by_a_tenants_own_owner(kube: Any, namespace: str) -> None:
    """`workloads.skipControlledBy` as a profile user would try it, on the real API server (the pairing is the
    culler's cache's; no controller needs to run). Alice, with kubeflow-edit's rights on workloads and KServe's
    edit role, creates a small InferenceService and a GPU Deployment whose controller ownerReference points at
    it: the API server accepts it, and the culler still lists her Deployment as a session. The same shape in the
    admin's namespace that the entry names (where the operator creates its Deployments) is skipped. The
    InferenceService CRD is registered with an open schema (KServe's controller does not run here)."""
    if kube.local is None:
        missing("a local control plane (a client certificate for a user)", "the cluster target is not local")
    admin = kube.api_client()
    ext = client.ApiextensionsV1Api(admin)
    with contextlib.suppress(ApiException):
        ext.create_custom_resource_definition(ISVC_CRD)
    procs.wait_until(lambda: any(c.type == "Established" and c.status == "True" for c in (
        ext.read_custom_resource_definition(ISVC_CRD["metadata"]["name"]).status.conditions or [])),
        TIMEOUT, 0.2, "the InferenceService CRD to be established")
    rbac, core = client.RbacAuthorizationV1Api(admin), client.CoreV1Api(admin)
    rbac.create_namespaced_role(namespace, {"metadata": {"name": "profile-edit"}, "rules": TENANT_RULES})
    rbac.create_namespaced_role_binding(namespace, {
        "metadata": {"name": "alice-edit"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "profile-edit"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "alice@example.com"}]})
    alice = kube.api_client(kube.local.user_kubeconfig("alice@example.com"))
    models = f"models-{uuid.uuid4().hex[:8]}"
    core.create_namespace({"metadata": {"name": models}})
    try:
        procs.wait_until(lambda: _can_create(alice, namespace), TIMEOUT, 0.2, "alice's Role to take effect")
        _isvc_and_deployment(alice, namespace, "small", "big")  # the attack, as alice
        _isvc_and_deployment(admin, models, "served", "served-predictor")  # the operator's
        with pytest.raises(ApiException) as refused:  # alice cannot write the admin's namespace
            _isvc_and_deployment(alice, models, "mine", "mine-predictor")
        assert refused.value.status == 403
        settings = load_mapping({
            "targets": ["workloads"], "namespaces": {"include": [namespace, models]},
            "workloads": {"gpuWorkloads": True, "skipControlledBy": [
                {"kind": "serving.kserve.io/InferenceService", "namespaces": [models]}]}}, "test")
        # its cache started and synced
        with Passes(build_runner(settings, admin, records_namespace=namespace)) as runner:
            assert runner.cache is not None
            sessions = sorted(session_key(obj) for obj, _ in runner.cache.snapshot())
        assert sessions == [(namespace, "Deployment/big")]
    finally:
        with contextlib.suppress(ApiException):
            core.delete_namespace(models)


def _can_create(api: Any, namespace: str) -> bool:
    review = client.AuthorizationV1Api(api).create_self_subject_access_review({"spec": {"resourceAttributes": {
        "namespace": namespace, "verb": "create", "group": "apps", "resource": "deployments"}}})
    return bool(review.status.allowed)
