"""The targets' projections keep every field their pairing, Service checks and endpoints read: over a fleet of
whole API objects (managedFields, pod templates, Service ports and IPs as the API server sends them), each
target pairs the same sessions with the same pods, finds the same orphans, judges the same Services and gives the
same endpoints on the objects as the cache keeps them (`Watched.project`, kf_culler/targets/fields.py) as on the
whole ones. A pairing or check that starts reading a field a projection drops fails here (the rules' fields:
tests/test_cache_fields.py)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from kf_culler.local.workspaces import workspace_body, workspace_kind_body
from kf_culler.targets import (
    CONTROLS_KEY,
    TARGETS,
    WORKSPACE_NAME_LABEL,
    Scope,
    Seen,
    Watched,
    identity,
    session_key,
)
from kf_culler.targets.coder import WORKSPACE_ID_LABEL

NS = "team"
MANAGED = [{"manager": "kubectl", "operation": "Update", "fieldsType": "FieldsV1",
            "fieldsV1": {"f:metadata": {"f:labels": {}}, "f:spec": {}}}]
GPU = {"limits": {"nvidia.com/gpu": "1"}, "requests": {"cpu": "1", "nvidia.com/gpu": "1"}}


def meta(name: str, uid: str, owner: tuple[str, str, str, str] | None = None, **extra: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"name": name, "namespace": NS, "uid": uid, "resourceVersion": "7",
                           "creationTimestamp": "2026-12-01T08:00:00Z", "managedFields": copy.deepcopy(MANAGED),
                           "labels": {"app": name}, "annotations": {"note": "x" * 50}, **extra}
    if owner is not None:
        api_version, kind, owner_name, owner_uid = owner
        out["ownerReferences"] = [{"apiVersion": "v1", "kind": "Other", "name": "gc", "uid": "u-gc"},
                                  {"apiVersion": api_version, "kind": kind, "name": owner_name, "uid": owner_uid,
                                   "controller": True, "blockOwnerDeletion": True}]
    return out


def template(name: str, gpu: bool = False) -> dict[str, Any]:
    return {"metadata": {"labels": {"app": name, "statefulset": name}},
            "spec": {"containers": [{"name": name, "image": "jupyter:1", "env": [{"name": "V", "value": "y" * 200}],
                                     "resources": GPU if gpu else {"requests": {"cpu": "1"}}}],
                     "volumes": [{"name": "home", "persistentVolumeClaim": {"claimName": f"{name}-home"}}]}}


def notebook(name: str, uid: str) -> dict[str, Any]:
    return {"apiVersion": "kubeflow.org/v1", "kind": "Notebook", "metadata": meta(name, uid),
            "spec": {"template": template(name, gpu=True)}, "status": {"readyReplicas": 1}}


def statefulset(name: str, uid: str, owner: tuple[str, str, str, str] | None, replicas: int = 1) -> dict[str, Any]:
    return {"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": meta(name, uid, owner),
            "spec": {"replicas": replicas, "serviceName": "", "selector": {"matchLabels": {"statefulset": name}},
                     "template": template(name)},
            "status": {"replicas": replicas, "readyReplicas": replicas}}


def pod(name: str, uid: str, owner: tuple[str, str, str, str] | None, phase: str = "Running",
        gpu: bool = True, labels: dict[str, str] | None = None) -> dict[str, Any]:
    body = {"apiVersion": "v1", "kind": "Pod", "metadata": meta(name, uid, owner),
            "spec": {**template(name, gpu)["spec"], "nodeName": "node-1", "restartPolicy": "Always"},
            "status": {"phase": phase, "startTime": "2026-12-01T09:00:00Z", "podIP": "10.0.0.9",
                       "conditions": [{"type": "Ready", "status": "True"}, {"type": "PodScheduled", "status": "True"}],
                       "containerStatuses": [{"name": name, "restartCount": 0, "image": "jupyter:1", "imageID": "x",
                                              "state": {"running": {"startedAt": "2026-12-01T09:00:01Z"}}}]}}
    if labels:
        body["metadata"]["labels"].update(labels)
    return body


def service(name: str, owner: tuple[str, str, str, str] | None, selector: dict[str, str] | None,
            kind: str = "ClusterIP") -> dict[str, Any]:
    spec: dict[str, Any] = {"type": kind, "clusterIP": "10.96.0.9", "clusterIPs": ["10.96.0.9"],
                            "ipFamilies": ["IPv4"], "ports": [{"name": "http", "port": 80, "targetPort": 8888}]}
    if selector is not None:
        spec["selector"] = selector
    return {"apiVersion": "v1", "kind": "Service", "metadata": meta(name, f"u-svc-{name}", owner), "spec": spec}


def fleet() -> dict[tuple[str, str], list[dict[str, Any]]]:
    """Whole objects by (API group, plural)."""
    nb = ("kubeflow.org/v1", "Notebook")
    sts = ("apps/v1", "StatefulSet")
    rs = ("apps/v1", "ReplicaSet")
    ws = workspace_body(NS, "ws1", "jupyterlab")
    ws["metadata"].update(meta("ws1", "u-ws1"))
    ws["status"] = {"state": "Running", "pauseTime": 0, "activity": {"lastActivity": 5}}
    ws2 = workspace_body(NS, "ws2", "jupyterlab")
    ws2["metadata"].update(meta("ws2", "u-ws2"))
    wsk = workspace_kind_body("jupyterlab")
    deployment = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": meta("dep", "u-dep"),
                  "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "dep"}}, "template": template("dep")}}
    return {
        ("kubeflow.org", "notebooks"): [notebook("nb", "u-nb"), notebook("orphaned", "u-or"),
                                        notebook("badsvc", "u-bad"), notebook("stopped", "u-stop")],
        ("kubeflow.org", "workspaces"): [ws, ws2],
        ("kubeflow.org", "workspacekinds"): [wsk],
        ("apps", "statefulsets"): [
            statefulset("nb", "u-sts-nb", (*nb, "nb", "u-nb")),
            statefulset("orphaned", "u-sts-or", (*nb, "orphaned", "u-or")),
            statefulset("badsvc", "u-sts-bad", (*nb, "badsvc", "u-bad")),
            statefulset("stopped", "u-sts-stop", (*nb, "stopped", "u-stop"), replicas=0),
            statefulset("ws-ws1-abcde", "u-sts-ws1", ("kubeflow.org/v1beta1", "Workspace", "ws1", "u-ws1")),
            statefulset("ws-ws2-a", "u-sts-ws2a", ("kubeflow.org/v1beta1", "Workspace", "ws2", "u-ws2")),
            statefulset("ws-ws2-b", "u-sts-ws2b", ("kubeflow.org/v1beta1", "Workspace", "ws2", "u-ws2")),
            statefulset("wl", "u-wl", None)],
        ("apps", "deployments"): [deployment],
        ("apps", "replicasets"): [{"apiVersion": "apps/v1", "kind": "ReplicaSet",
                                   "metadata": meta("dep-5f", "u-rs", ("apps/v1", "Deployment", "dep", "u-dep")),
                                   "spec": {"template": template("dep")}}],
        ("", "pods"): [
            pod("nb-0", "u-p-nb", (*sts, "nb", "u-sts-nb")),
            pod("orphaned-0", "u-p-or", (*sts, "orphaned", "u-forged")),
            pod("badsvc-0", "u-p-bad", (*sts, "badsvc", "u-sts-bad")),
            pod("ws-ws1-abcde-0", "u-p-ws1", (*sts, "ws-ws1-abcde", "u-sts-ws1")),
            pod("ws-ws2-b-0", "u-p-ws2", (*sts, "ws-ws2-b", "u-sts-ws2b"), gpu=False),
            pod("dep-5f-xyz", "u-p-dep", (*rs, "dep-5f", "u-rs")),
            pod("wl-0", "u-p-wl", (*sts, "wl", "u-wl")),
            pod("coder-ws-1", "u-p-coder", None, labels={WORKSPACE_ID_LABEL: "w-1"}),
            pod("unrelated", "u-p-x", None)],
        ("", "services"): [
            service("nb", (*nb, "nb", "u-nb"), {"statefulset": "nb"}),
            service("orphaned", (*nb, "orphaned", "u-or"), {"statefulset": "orphaned"}),
            service("badsvc", (*nb, "badsvc", "u-bad"), None, kind="ExternalName"),
            service("ws-ws1-svc", ("kubeflow.org/v1beta1", "Workspace", "ws1", "u-ws1"),
                    {WORKSPACE_NAME_LABEL: "ws1", "statefulset": "ws1"}),
            service("dep", None, {"app": "dep"}),
            service("wl", None, {"app": "other"})],
    }


SCOPE = Scope(workload_kinds=("Deployment", "StatefulSet"), selects_workload=lambda _o: True, coder_namespace=NS)


def seen_of(targets: list[Any], project: bool) -> Seen:
    """The collections the targets ask for, as the cache would hold them (`project`) or whole (each object the
    projection keeps, untouched: what a consumer would read without the cache)."""
    objects = fleet()
    collections: dict[str, dict[tuple[str, str], dict[str, Any]]] = {}
    asked: dict[str, list[Watched]] = {}
    for t in targets:
        for w in t.watches(SCOPE):
            asked.setdefault(w.name, []).append(w)
    for name, asks in asked.items():
        w = asks[0]
        held = collections.setdefault(name, {})
        for obj in objects[(w.group, w.plural)]:
            if not any(a.keep is None or a.keep(obj) for a in asks):
                continue
            kept = w.project(copy.deepcopy(obj))
            if kept is not None:
                key = ("" if w.cluster_scoped else NS, obj["metadata"]["name"])
                held[key] = kept if project else copy.deepcopy({**obj, "kind": kept.get("kind", obj.get("kind"))})
    return Seen(collections, now=lambda name, key: collections.get(name, {}).get(key))


def readings(targets: list[Any], project: bool, identities: bool = False) -> dict[str, Any]:
    """What the targets read; `identities`: the sessions paired before a target are given to it as a lean pass's
    cache gives them (kf_culler/kube/cache.py `packed_pairs`: their identity alone)."""
    seen = seen_of(targets, project)
    out: dict[str, Any] = {"pairs": [], "orphans": [], "services": {}, "endpoints": {}, "tampered": {},
                           "stopped": {}, "controls": {}, "addresses": {}}
    for t in targets:
        paired = t.pair(seen)
        items = list(paired.items)  # a pairing may make them as they are read
        seen.paired += [(identity(nb), None) for nb, _ in items] if identities else items
        out["orphans"] += [(o.namespace, o.notebook, o.why, o.pod["metadata"]["name"]) for o in paired.orphans]
        for session, found in items:
            key = str(session_key(session))
            out["pairs"].append((key, None if found is None else found["metadata"]["name"]))
            out["services"][key] = t.service_problem(session, seen)
            out["addresses"][key] = t.service_address(session, seen)
            out["endpoints"][key] = t.endpoint(session, seen)
            out["tampered"][key] = t.tampered(session)
            out["stopped"][key] = t.is_stopped(session)
            out["controls"][key] = session.get(CONTROLS_KEY)
    return out


@pytest.mark.parametrize("names", [["notebooks"], ["workspaces"], ["workloads"],
                                   ["notebooks", "workspaces", "workloads", "coder"]])
def test_the_targets_read_the_same_on_the_projections_as_on_the_whole_objects(names: list[str]) -> None:
    targets = [t for name, t in TARGETS.items() if name in names]
    whole, kept = readings(targets, project=False), readings(targets, project=True)
    assert kept == whole
    assert whole["pairs"], "the fleet has sessions of every target asked"


def test_a_lean_pass_pairs_the_same_sessions_from_the_identities_of_those_paired_before() -> None:
    targets = [t for name, t in TARGETS.items() if name in ("notebooks", "workspaces", "workloads")]
    whole, lean = readings(targets, project=True), readings(targets, project=True, identities=True)
    assert lean == whole
    assert "team/nb" in dict(whole["pairs"]) and any(key.startswith("team/StatefulSet/") for key, _ in whole["pairs"])
    assert "team/StatefulSet/nb" not in dict(whole["pairs"])  # the Notebook's own StatefulSet is no workload


def test_the_fleet_covers_what_pairing_decides() -> None:
    """Every branch the comparison above must hold on is in the fleet: a pod found, an orphan, a Service
    refused, a Workspace controlling two StatefulSets, a workload with its pod, a Notebook's StatefulSet that is
    not a workload."""
    out = readings([t for name, t in TARGETS.items() if name != "coder"], project=True)
    pairs = dict(out["pairs"])
    assert pairs["team/nb"] == "nb-0" and pairs["team/orphaned"] is None and pairs["team/stopped"] is None
    assert [o[1] for o in out["orphans"]] == ["orphaned"]
    assert out["services"]["team/nb"] is None and "ExternalName" in str(out["services"]["team/badsvc"])
    assert out["addresses"]["team/nb"] == ("nb", "10.96.0.9") and out["addresses"]["team/badsvc"] is None
    assert out["addresses"]["team/Workspace/ws1"] == ("ws-ws1-svc", "10.96.0.9")
    assert out["addresses"]["team/Deployment/dep"] == ("dep", "10.96.0.9")
    assert out["addresses"]["team/StatefulSet/wl"] is None  # its Service does not select its pods
    assert pairs["team/Workspace/ws1"] == "ws-ws1-abcde-0" and out["endpoints"]["team/Workspace/ws1"][1] == 8888
    assert out["tampered"]["team/Workspace/ws2"] is not None
    assert pairs["team/Deployment/dep"] == "dep-5f-xyz" and out["services"]["team/Deployment/dep"] is None
    assert pairs["team/StatefulSet/wl"] == "wl-0" and "does not select" in str(out["services"]["team/StatefulSet/wl"])
    assert "team/StatefulSet/nb" not in pairs  # a Notebook's own StatefulSet is not a workload
    assert "team/StatefulSet/ws-ws1-abcde" not in pairs  # nor one a Workspace controls alone


def test_what_is_kept_is_small() -> None:
    """The StatefulSets are kept without their pod template (metadata only), the Services without ports and with
    one IP (the ClusterIP the probes connect to), every object without managedFields."""
    seen = seen_of([t for name, t in TARGETS.items() if name in ("notebooks", "workspaces")], project=True)
    sts = seen["statefulsets"][(NS, "nb")]
    assert set(sts) == {"metadata"} and "managedFields" not in sts["metadata"]
    assert set(seen["services"][(NS, "nb")]["spec"]) == {"type", "selector", "clusterIP"}
    assert all("managedFields" not in o["metadata"] for c in seen.collections.values() for o in c.values())
