"""The target layer's pure parts (kf_culler/targets.py, docs/targets.md): what a Workspace's stop, pod, Service and
port are, read from objects shaped as Kubeflow Notebooks 2.0's Workspace controller v2.0.0-beta.0 makes them
(tests/test_workspace_controller.py shows the real ones), and that a Notebook keeps its v1 meaning."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from kf_culler.config import load_mapping
from kf_culler.decide import decide_view
from kf_culler.local.workspaces import workspace_body, workspace_kind_body
from kf_culler.model import REASON_ANNOTATION, STOP_ANNOTATION
from kf_culler.notify.message import Notice, keep_command, start_command
from kf_culler.policy import selects_workload
from kf_culler.session import SessionView
from kf_culler.targets import (
    REPLICAS_BEFORE_ANNOTATION,
    WORKSPACE_NAME_LABEL,
    WORKSPACES,
    is_stopped,
    owned_by,
    session_key,
    session_statefulset,
    stop_body,
    target_of,
    workload_pod,
    workload_service_problem,
    workspace_pod,
    workspace_port,
    workspace_service,
)

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def ws(name: str = "ws1", paused: bool = False, annotations: dict[str, str] | None = None) -> dict[str, Any]:
    body = workspace_body("team", name, "jupyterlab", paused=paused)
    body["metadata"]["uid"] = f"uid-{name}"
    body["metadata"]["annotations"] = annotations or {}
    return body


def owned(kind: str, name: str, owner_kind: str, owner: str, uid: str, **extra: Any) -> dict[str, Any]:
    return {"kind": kind, "metadata": {"name": name, "namespace": "team", "uid": f"uid-{name}", "ownerReferences": [
        {"kind": owner_kind, "name": owner, "uid": uid, "controller": True}]}, **extra}


def test_a_workspaces_renumbered_gpu_pod_is_found_and_a_decoy_claiming_its_statefulset_is_not() -> None:
    """The tenant renumbers their Workspace's StatefulSet (`spec.ordinals.start: 1`) and deletes `-0`: its pod
    `-1` holds the GPU, `-0` may come back Pending. The Workspace's pod is the Running member asking for the most
    GPUs; a pod of the tenant's own whose ownerReference names the StatefulSet but whose name is no member's is
    never chosen."""
    w = ws()
    sts = owned("StatefulSet", "ws-ws1-abcde", "Workspace", "ws1", "uid-ws1")
    gpu = {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}

    def pod(name: str, phase: str, spec: dict[str, Any]) -> dict[str, Any]:
        return owned("Pod", name, "StatefulSet", "ws-ws1-abcde", "uid-ws-ws1-abcde", spec=spec,
                     status={"phase": phase})

    one = pod("ws-ws1-abcde-1", "Running", gpu)
    pods = {("team", p["metadata"]["name"]): p for p in (
        one, pod("ws-ws1-abcde-0", "Pending", gpu), pod("ws-ws1-abcde-x", "Running", {"containers": [
            {"name": "c", "resources": {"limits": {"nvidia.com/gpu": "8"}}}]}), pod("aaa", "Running", gpu))}
    by_ws = owned_by({("team", "s"): sts}, "Workspace")
    assert workspace_pod(w, by_ws, pods, owned_by(pods, "StatefulSet")) is one
    del pods[("team", "ws-ws1-abcde-0")]
    assert workspace_pod(w, by_ws, pods, owned_by(pods, "StatefulSet")) is one


def test_a_workspace_is_stopped_by_spec_paused_and_never_by_the_v1_annotation() -> None:
    assert target_of(ws()) is WORKSPACES
    assert is_stopped(ws(paused=True))
    assert not is_stopped(ws(annotations={STOP_ANNOTATION: "2026-12-01T00:00:00Z"}))  # a user's mark: nothing
    notebook = {"metadata": {"name": "nb", "namespace": "team", "annotations": {STOP_ANNOTATION: "x"}}}
    assert is_stopped(notebook) and session_key(notebook) == ("team", "nb")
    assert session_key(ws()) == ("team", "Workspace/ws1")


def test_the_rules_keep_a_paused_workspace_and_stop_one_idle() -> None:
    settings = load_mapping({"idleMinutes": 30, "warnMinutes": 0, "startupGraceMinutes": 0}, "t")
    pod = {"metadata": {"name": "ws-ws1-abcde-0", "namespace": "team"},
           "spec": {"containers": [{"name": "main", "image": "jupyter:1"}]},
           "status": {"phase": "Running", "startTime": "2026-12-01T09:00:00Z"}}
    idle = {"jupyter": {"status": {"last_activity": "2026-12-01T10:00:00Z", "started": "2026-12-01T09:00:00Z",
                                   "connections": 0, "kernels": 0}, "kernels": [], "terminals": []}}
    paused = decide_view(SessionView.of(ws(paused=True), None, settings.policy), {}, settings.policy, NOW)
    assert paused.rule_id == "1-stopped" and paused.action == "keep"
    running = decide_view(SessionView.of(ws(), pod, settings.policy), idle, settings.policy, NOW)
    assert running.action == "stop", running


def test_a_workspace_stop_is_spec_paused_with_our_annotations_and_no_v1_mark() -> None:
    body = stop_body(ws(), {STOP_ANNOTATION: "2026-12-01T12:00:00Z", REASON_ANNOTATION: "idle"})
    assert body == {"metadata": {"annotations": {REASON_ANNOTATION: "idle"}}, "spec": {"paused": True}}
    assert stop_body(ws(), {REASON_ANNOTATION: "idle"}) == {"metadata": {"annotations": {REASON_ANNOTATION: "idle"}}}
    notebook = {"kind": "Notebook", "metadata": {"name": "nb"}}
    assert stop_body(notebook, {STOP_ANNOTATION: "t"}) == {"metadata": {"annotations": {STOP_ANNOTATION: "t"}}}


def test_a_workspace_pod_is_found_by_ownership_only() -> None:
    w = ws()
    sts = owned("StatefulSet", "ws-ws1-abcde", "Workspace", "ws1", "uid-ws1")
    pod = owned("Pod", "ws-ws1-abcde-0", "StatefulSet", "ws-ws1-abcde", "uid-ws-ws1-abcde")
    pods = {("team", "ws-ws1-abcde-0"): pod}
    assert workspace_pod(w, owned_by({("team", "s"): sts}, "Workspace"), pods) is pod
    # a StatefulSet of the same name owned by something else, or a pod not owned by the StatefulSet: no pod
    other = owned("StatefulSet", "ws-ws1-abcde", "Workspace", "ws1", "uid-someone-else")
    assert workspace_pod(w, owned_by({("team", "s"): other}, "Workspace"), pods) is None
    stray = owned("Pod", "ws-ws1-abcde-0", "StatefulSet", "ws-ws1-abcde", "uid-forged")
    assert workspace_pod(w, owned_by({("team", "s"): sts}, "Workspace"), {("team", "ws-ws1-abcde-0"): stray}) is None
    two = {("team", "a"): sts, ("team", "b"): owned("StatefulSet", "ws-ws1-zzzzz", "Workspace", "ws1", "uid-ws1")}
    assert workspace_pod(w, owned_by(two, "Workspace"), pods) is pod  # the only one with a pod
    elsewhere = {**sts, "metadata": {**sts["metadata"], "namespace": "other"}}  # a uid written in another namespace
    assert workspace_pod(w, owned_by({("other", "s"): elsewhere}, "Workspace"), pods) is None


def test_only_the_workspaces_own_routing_service_is_probed() -> None:
    w = ws()
    good = owned("Service", "ws-ws1-h6nmx", "Workspace", "ws1", "uid-ws1",
                 spec={"type": "ClusterIP", "selector": {WORKSPACE_NAME_LABEL: "ws1", "statefulset": "ws1"}})
    assert workspace_service(w, owned_by({("team", "s"): good}, "Workspace")) == (good, None)
    external = {**good, "spec": {"type": "ExternalName", "externalName": "elsewhere.example.com"}}
    assert workspace_service(w, owned_by({("team", "s"): external}, "Workspace"))[1] == \
        "the workspace's Service is of type ExternalName"
    wide = {**good, "spec": {"type": "ClusterIP", "selector": {"statefulset": "ws1"}}}
    assert "does not select" in str(workspace_service(w, owned_by({("team", "s"): wide}, "Workspace"))[1])
    made_by_user = {**good, "metadata": {**good["metadata"], "ownerReferences": []}}
    assert workspace_service(w, owned_by({("team", "s"): made_by_user}, "Workspace"))[1] == \
        "the workspace has no Service of its own"


def test_the_port_and_path_come_from_the_workspace_kind() -> None:
    kind = workspace_kind_body("jupyterlab", port_id="jupyterlab", port=8888)
    assert workspace_port(ws(), kind) == ("jupyterlab", 8888, False)
    kind["spec"]["podTemplate"]["ports"][0]["httpProxy"]["removePathPrefix"] = True
    assert workspace_port(ws(), kind) == ("jupyterlab", 8888, True)  # code-server, RStudio: served at `/`
    assert workspace_port(ws(), None) is None
    other = ws()
    other["spec"]["podTemplate"]["options"]["imageConfig"] = "not-in-the-kind"
    assert workspace_port(other, kind) is None


def test_notices_tell_a_workspace_user_the_workspace_commands() -> None:
    n = Notice("stop", "team", "Workspace/ws1", None, "idle", "idle", "5-idle", NOW, NOW, max_extend_minutes=60)
    assert start_command(n) == """kubectl patch workspace ws1 -n team --type merge -p '{"spec":{"paused":false}}'"""
    assert str(keep_command(n)).startswith("kubectl annotate workspace ws1 -n team ")
    v1 = Notice("stop", "team", "nb", None, "idle", "idle", "5-idle", NOW, NOW)
    assert start_command(v1) == f"kubectl annotate notebook nb -n team {STOP_ANNOTATION}-"


def deployment(name: str = "s", replicas: int = 1, labels: dict[str, str] | None = None, gpus: int = 1,
               owner: str | None = None) -> dict[str, Any]:
    res = {"limits": {"nvidia.com/gpu": str(gpus)}} if gpus else {}
    meta: dict[str, Any] = {"name": name, "namespace": "team", "uid": f"uid-{name}", "labels": labels or {}}
    if owner:
        meta["ownerReferences"] = [{"kind": owner, "name": "x", "uid": "u", "controller": True}]
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": meta,
            "spec": {"replicas": replicas, "template": {"metadata": {"labels": {"session": name}},
                                                        "spec": {"containers": [{"name": "c", "resources": res}]}}}}


def test_a_workload_is_stopped_at_zero_replicas_and_its_stop_keeps_the_count() -> None:
    assert not is_stopped(deployment()) and is_stopped(deployment(replicas=0))
    assert session_key(deployment()) == ("team", "Deployment/s")
    body = stop_body(deployment(replicas=2), {STOP_ANNOTATION: "t", REASON_ANNOTATION: "idle"})
    assert body == {"metadata": {"annotations": {REASON_ANNOTATION: "idle", REPLICAS_BEFORE_ANNOTATION: "2"}},
                    "spec": {"replicas": 0}}
    n = Notice("stop", "team", "Deployment/s", None, "idle", "idle", "5-idle", NOW, NOW)
    assert start_command(n) == "kubectl scale deployment s -n team --replicas=1"


def test_which_workloads_are_sessions() -> None:
    labelled = load_mapping({"targets": ["workloads"], "workloads": {"selector": {"matchLabels": {"s": "1"}}}}, "t")
    gpu = load_mapping({"targets": ["workloads"], "workloads": {"gpuWorkloads": True}}, "t")
    assert selects_workload(deployment(labels={"s": "1"}), labelled)
    assert not selects_workload(deployment(), labelled)  # the label removed: not a session (docs/targets.md)
    assert selects_workload(deployment(), gpu) and not selects_workload(deployment(gpus=0), gpu)
    assert selects_workload(deployment(labels={"s": "1"}, owner="Notebook"), labelled)  # its owner's write
    sts = {**deployment(labels={"s": "1"}), "kind": "StatefulSet"}
    only_deployments = load_mapping({"targets": ["workloads"], "workloads": {
        "selector": {"matchLabels": {"s": "1"}}, "kinds": ["Deployment"]}}, "t")
    assert selects_workload(sts, labelled) and not selects_workload(sts, only_deployments)


def test_a_deployments_pod_is_found_through_its_replicasets_and_its_service_checked() -> None:
    d = deployment()
    rs = owned("ReplicaSet", "s-abc", "Deployment", "s", "uid-s")
    old = owned("Pod", "s-abc-1", "ReplicaSet", "s-abc", "uid-s-abc", status={"phase": "Running",
                                                                               "startTime": "2026-12-01T09:00:00Z"})
    new = owned("Pod", "s-abc-2", "ReplicaSet", "s-abc", "uid-s-abc", status={"phase": "Pending"})
    forged = owned("Pod", "s-zzz-1", "ReplicaSet", "s-zzz", "uid-other", status={"phase": "Running"})
    pods = {("team", p["metadata"]["name"]): p for p in (old, new, forged)}
    found = workload_pod(d, owned_by({("team", "r"): rs}, "Deployment"), owned_by(pods, "ReplicaSet"))
    assert found is old
    assert workload_pod(d, {}, owned_by(pods, "ReplicaSet")) is None
    svc = {"metadata": {"name": "s"}, "spec": {"type": "ClusterIP", "selector": {"session": "s"}}}
    assert workload_service_problem(d, svc) is None
    assert workload_service_problem(d, {**svc, "spec": {"type": "ExternalName"}}) == \
        "the Service s is of type ExternalName"
    assert "does not select" in str(workload_service_problem(d, {**svc, "spec": {"selector": {}}}))
    assert "does not select" in str(workload_service_problem(d, {**svc, "spec": {"selector": {"app": "other"}}}))


def test_ownerreferences_a_user_writes_keep_no_workload_out_of_culling() -> None:
    """A user may write any ownerReference on their own objects, to made-up owners too: only the StatefulSet of a
    Notebook (its `<name>`) or a Workspace that the culler lists, in its namespace, is left to that session; a
    Workspace with StatefulSets its user attached is paired with the Running pod asking for the most GPUs; an
    operator's kind is skipped only with its API group."""
    gpu = load_mapping({"targets": ["workloads"], "workloads": {"gpuWorkloads": True}}, "t")
    mine = deployment("nb", owner="Notebook")
    assert selects_workload(mine, gpu) and not session_statefulset(mine, {("team", "n")})  # a Deployment
    notebook_sts = {**deployment("nb"), "kind": "StatefulSet"}
    notebook_sts["metadata"]["ownerReferences"] = [{"kind": "Notebook", "name": "nb", "uid": "n", "controller": True}]
    assert session_statefulset(notebook_sts, {("team", "n")})
    assert not session_statefulset(notebook_sts, set())  # a Notebook the culler does not list: made up
    assert not session_statefulset(notebook_sts, {("other", "n")})  # another namespace's
    renamed = {**notebook_sts, "metadata": {**notebook_sts["metadata"], "name": "other"}}
    assert not session_statefulset(renamed, {("team", "n")})  # not the notebook-controller's <name>
    # its ownerReference removed: still the one the notebook-controller scales, by name, for a listed Notebook
    bare = {**notebook_sts, "metadata": {k: v for k, v in notebook_sts["metadata"].items() if k != "ownerReferences"}}
    assert session_statefulset(bare, set(), {("team", "nb")})
    assert not session_statefulset(bare, set(), {("other", "nb")}) and not session_statefulset(bare, set())
    assert not session_statefulset(renamed, {("team", "n")}, {("team", "nb")})
    decoy = owned("StatefulSet", "ws-ws1-aaaaa", "Workspace", "ws1", "uid-ws1")  # empty, made first by its user
    real = owned("StatefulSet", "ws-ws1-zzzzz", "Workspace", "ws1", "uid-ws1")
    gpu_pod = {**owned("Pod", "ws-ws1-zzzzz-0", "StatefulSet", "ws-ws1-zzzzz", "uid-ws-ws1-zzzzz"),
               "spec": {"containers": [{"resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
               "status": {"phase": "Running"}}
    idle_pod = {**owned("Pod", "ws-ws1-aaaaa-0", "StatefulSet", "ws-ws1-aaaaa", "uid-ws-ws1-aaaaa"),
                "status": {"phase": "Running"}}
    both = owned_by({("team", "a"): decoy, ("team", "b"): real}, "Workspace")
    pods = {("team", "ws-ws1-zzzzz-0"): gpu_pod, ("team", "ws-ws1-aaaaa-0"): idle_pod}
    assert workspace_pod(ws(), both, pods) is gpu_pod  # the GPU cannot be hidden behind another StatefulSet
    operator = load_mapping({"targets": ["workloads"], "workloads": {"gpuWorkloads": True, "skipControlledBy": [
        {"kind": "serving.kserve.io/InferenceService", "namespaces": ["models"]}]}}, "t")
    isvc = [{"apiVersion": "serving.kserve.io/v1beta1", "kind": "InferenceService", "name": "p", "uid": "i",
             "controller": True}]
    served = deployment("p")
    served["metadata"].update(namespace="models", ownerReferences=isvc)
    assert not selects_workload(served, operator)  # the operator's, in the admin's namespace
    forged = deployment("p")
    forged["metadata"]["ownerReferences"] = isvc  # a user's GPU Deployment "owned" by a small InferenceService
    assert selects_workload(forged, operator)  # of their own, in their namespace: still a session
    borrowed = deployment("q")
    borrowed["metadata"].update(namespace="models", ownerReferences=[
        {"apiVersion": "x.example/v1", "kind": "InferenceService", "name": "q", "uid": "i", "controller": True}])
    assert selects_workload(borrowed, operator)  # the kind alone, from an unserved API: still a session
    for bad, says in ((["InferenceService"], "skipControlledBy"),
                      (["serving.kserve.io/InferenceService"], "is a kind alone"),
                      ([{"kind": "serving.kserve.io/InferenceService"}], "namespaces"),
                      ([{"kind": "serving.kserve.io/InferenceService", "namespaces": []}], "namespaces")):
        try:
            load_mapping({"targets": ["workloads"], "workloads": {"gpuWorkloads": True, "skipControlledBy": bad}},
                         "t")
        except Exception as err:
            assert says in str(err) and "skipControlledBy" in str(err), str(err)
        else:
            raise AssertionError(f"{bad} was accepted")


def test_a_recorded_session_keeps_what_stopped_is_read_from() -> None:
    """`run --record` keeps of each session what the rules read: a paused Workspace and a workload at 0
    replicas replay as stopped, a running one as running."""
    from kf_culler.replay.recorder import minimal_notebook

    settings = load_mapping({}, "t")
    for obj, stopped in ((ws(paused=True), True), (ws(), False), (deployment(replicas=0), True),
                         (deployment(), False)):
        view = SessionView.of(minimal_notebook(obj), None, settings.policy)
        assert view.stopped is stopped and view.kind == obj["kind"], obj
