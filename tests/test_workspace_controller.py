"""Kubeflow Notebooks 2.0's own Workspace controller (v2.0.0-beta.0, built from the vendored upstream tree) on
the local control plane in "full" mode: the harness in kf_culler.local.workspaces starts it, and it does to a
Workspace what the culler's Workspace target will count on.

- A Workspace gets a StatefulSet and a Service named `ws-<name>-<random>`, controlled by the Workspace, and
  the pod `<statefulset>-0`, controlled by the StatefulSet, scheduled on the kwok node.
- `spec.paused: true` (the stop the culler will write) makes the controller scale the StatefulSet to 0,
  set `status.state` to Paused and stamp `status.pauseTime`; the pod goes away.
- A StatefulSet edited behind the controller's back is put back (why the culler must never scale it).
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from kf_culler.local import procs
from kf_culler.local.cluster import GPU_NODE, LocalCluster
from kf_culler.local.workspaces import (
    CONTROLLER,
    GROUP,
    KIND_FINALIZER,
    KINDS,
    SELECTOR_LABEL,
    VERSION,
    WORKSPACE_NAME_LABEL,
    WORKSPACES,
    connect_path,
    workspace_body,
    workspace_kind_body,
)

pytestmark = [pytest.mark.cluster]
TIMEOUT = 60.0


@dataclass
class Env:
    cluster: LocalCluster
    namespace: str
    kind: str
    api: Any

    def core(self) -> Any:
        from kubernetes import client

        return client.CoreV1Api(self.api)

    def apps(self) -> Any:
        from kubernetes import client

        return client.AppsV1Api(self.api)

    def custom(self) -> Any:
        from kubernetes import client

        return client.CustomObjectsApi(self.api)

    def workspace(self, name: str) -> dict[str, Any]:
        ws: dict[str, Any] = self.custom().get_namespaced_custom_object(GROUP, VERSION, self.namespace,
                                                                        WORKSPACES, name)
        return ws

    def owned(self, kind: str, owner_uid: str) -> list[dict[str, Any]]:
        """The objects of `kind` in the namespace whose controller is owner_uid, as plain dicts."""
        listers: dict[str, Callable[..., Any]] = {
            "statefulset": self.apps().list_namespaced_stateful_set,
            "service": self.core().list_namespaced_service,
            "serviceaccount": self.core().list_namespaced_service_account,
            "pod": self.core().list_namespaced_pod,
        }
        items = self.api.sanitize_for_serialization(listers[kind](self.namespace))["items"]
        return [o for o in items if any(r.get("controller") and r["uid"] == owner_uid
                                        for r in o["metadata"].get("ownerReferences") or [])]

    def wait(self, what: str, pred: Callable[[], bool], seen: Callable[[], object] | None = None) -> None:
        try:
            procs.wait_until(pred, TIMEOUT, 0.2, what)
        except TimeoutError as err:
            detail = f"; seen: {seen()!r}" if seen is not None else ""
            log = self.cluster.log_tail(CONTROLLER, 20)
            raise AssertionError(f"{err}{detail}\n--- {CONTROLLER} ---\n{log}") from None


@pytest.fixture()
def env(workspace_controller: LocalCluster) -> Iterator[Env]:
    """A fresh namespace and WorkspaceKind; on the way out the namespace is deleted and its pods awaited
    (the kwok node is shared by the session), then the kind."""
    api = workspace_controller.api_client()
    suffix = uuid.uuid4().hex[:8]
    e = Env(workspace_controller, f"ws-{suffix}", f"jupyterlab-{suffix}", api)
    e.core().create_namespace({"metadata": {"name": e.namespace}})
    e.custom().create_cluster_custom_object(GROUP, VERSION, KINDS, workspace_kind_body(e.kind))
    try:
        yield e
    finally:
        with contextlib.suppress(Exception):
            e.core().delete_namespace(e.namespace)
        procs.wait_until(lambda: not e.core().list_namespaced_pod(e.namespace).items, TIMEOUT, 0.2,
                         f"the pods of namespace {e.namespace} to be deleted")
        with contextlib.suppress(Exception):
            e.custom().delete_cluster_custom_object(GROUP, VERSION, KINDS, e.kind)


def running(e: Env, name: str) -> dict[str, Any]:
    """Wait for the Workspace's state Running and return it."""
    e.wait(f"workspace {name} Running", lambda: (e.workspace(name).get("status") or {}).get("state") == "Running",
           seen=lambda: (e.workspace(name).get("status") or {}).get("state"))
    return e.workspace(name)


def test_workspace_gets_statefulset_service_and_pod(env: Env) -> None:
    e = env
    e.custom().create_namespaced_custom_object(GROUP, VERSION, e.namespace, WORKSPACES,
                                               workspace_body(e.namespace, "ws1", e.kind))
    ws = running(e, "ws1")
    uid = ws["metadata"]["uid"]

    # The StatefulSet: generateName ws-<name>-, one replica, controlled by the Workspace.
    [sts] = e.owned("statefulset", uid)
    assert sts["metadata"]["name"].startswith("ws-ws1-")
    assert sts["metadata"]["labels"][WORKSPACE_NAME_LABEL] == "ws1"
    assert sts["spec"]["replicas"] == 1
    [ref] = sts["metadata"]["ownerReferences"]
    assert (ref["apiVersion"], ref["kind"], ref["name"], ref["controller"]) == (f"{GROUP}/{VERSION}", "Workspace",
                                                                                "ws1", True)
    assert sts["spec"]["selector"]["matchLabels"] == {WORKSPACE_NAME_LABEL: "ws1", SELECTOR_LABEL: "ws1"}

    # The Service: same name pattern, the kind's port as http-<port>, selecting the workspace's pod.
    [svc] = e.owned("service", uid)
    assert svc["metadata"]["name"].startswith("ws-ws1-")
    assert [(p["name"], p["port"], p["targetPort"]) for p in svc["spec"]["ports"]] == [("http-8888", 8888, 8888)]
    assert svc["spec"]["selector"] == {WORKSPACE_NAME_LABEL: "ws1", SELECTOR_LABEL: "ws1"}

    # The ServiceAccount has a fixed name, ws-<name>.
    assert [sa["metadata"]["name"] for sa in e.owned("serviceaccount", uid)] == ["ws-ws1"]

    # The pod: <statefulset>-0, controlled by the StatefulSet, on the kwok node, NB_PREFIX the connect path.
    [pod] = e.owned("pod", sts["metadata"]["uid"])
    assert pod["metadata"]["name"] == f"{sts['metadata']['name']}-0"
    assert pod["metadata"]["labels"][WORKSPACE_NAME_LABEL] == "ws1"
    assert pod["spec"]["nodeName"] == GPU_NODE
    assert pod["status"]["phase"] == "Running"
    [main] = pod["spec"]["containers"]
    assert main["name"] == "main"
    env_vars = {v["name"]: v.get("value") for v in main.get("env") or []}
    assert env_vars["NB_PREFIX"] == connect_path(e.namespace, "ws1", "jupyterlab") == \
        f"/workspace/connect/{e.namespace}/ws1/jupyterlab/"

    # The Workspace's status names the pod and its node; it counts Running from when it saw the pod ready.
    status = ws["status"]
    assert status["podTemplatePod"]["name"] == pod["metadata"]["name"]
    assert status["podTemplatePod"]["nodeName"] == GPU_NODE
    assert status["pauseTime"] == 0
    assert status["lastRunningTime"] > 0
    # The controller protects the kind while a Workspace uses it.
    kind = e.custom().get_cluster_custom_object(GROUP, VERSION, KINDS, e.kind)
    assert KIND_FINALIZER in kind["metadata"]["finalizers"]


def test_paused_scales_to_zero_and_reports_paused(env: Env) -> None:
    e = env
    e.custom().create_namespaced_custom_object(GROUP, VERSION, e.namespace, WORKSPACES,
                                               workspace_body(e.namespace, "ws1", e.kind))
    ws = running(e, "ws1")
    [sts] = e.owned("statefulset", ws["metadata"]["uid"])
    sts_name = sts["metadata"]["name"]

    def replicas() -> int:
        return int(e.apps().read_namespaced_stateful_set(sts_name, e.namespace).spec.replicas)

    # Scaled behind the controller's back, the StatefulSet is put back to 1 replica.
    e.apps().patch_namespaced_stateful_set_scale(sts_name, e.namespace, {"spec": {"replicas": 0}})
    e.wait("the controller to restore 1 replica", lambda: replicas() == 1, seen=replicas)
    running(e, "ws1")

    before = int(time.time() * 1000)
    e.custom().patch_namespaced_custom_object(GROUP, VERSION, e.namespace, WORKSPACES, "ws1",
                                              {"spec": {"paused": True}})
    e.wait("the StatefulSet scaled to 0", lambda: replicas() == 0, seen=replicas)
    e.wait("workspace ws1 Paused", lambda: e.workspace("ws1")["status"].get("state") == "Paused",
           seen=lambda: e.workspace("ws1")["status"])
    e.wait("the workspace's pod deleted", lambda: not e.owned("pod", sts["metadata"]["uid"]),
           seen=lambda: [p["metadata"]["name"] for p in e.owned("pod", sts["metadata"]["uid"])])
    status = e.workspace("ws1")["status"]
    assert status["stateMessage"] == "Workspace is paused"
    assert status["pauseTime"] >= before - 1000  # ms since the epoch; allow for clock skew within a second
    assert status["podTemplatePod"]["name"] == ""
    # The same StatefulSet is kept (scaled, not deleted) with its Service.
    assert [s["metadata"]["name"] for s in e.owned("statefulset", ws["metadata"]["uid"])] == [sts_name]
    assert len(e.owned("service", ws["metadata"]["uid"])) == 1
