"""Plain workloads (`targets: [workloads]`, docs/targets.md): Deployments and StatefulSets that nothing controls,
stopped by scaling to 0 (the structure of sessions run without Kubeflow: one pod, a GPU, a home PVC); the pod is
found by ownership, the IDE through the Service named like the workload. Pure."""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from kf_culler.model import KEEP_UNTIL_ANNOTATION, STOP_ANNOTATION
from kf_culler.targets.base import (
    OwnerKey,
    Pairing,
    Scope,
    Seen,
    Target,
    Watched,
    _dict,
    controller_of,
    kind_of,
    owner_key,
)
from kf_culler.targets.fields import (
    SERVICES,
    SESSION_META,
    controlled_pod,
    controller_ref,
    pick,
    pod_fields,
    template_fields,
)
from kf_culler.targets.notebooks import NOTEBOOKS
from kf_culler.targets.pairing import named_service_address
from kf_culler.targets.workspaces import WORKSPACES

# The replica count a workload had when the culler scaled it to 0 (for its user: what to scale back to).
REPLICAS_BEFORE_ANNOTATION = "notebook-culler.io/replicas-before"


@dataclass(frozen=True)
class WorkloadTarget(Target):
    def is_stopped(self, obj: Mapping[str, Any]) -> bool:
        """`spec.replicas: 0`."""
        return _dict(obj.get("spec")).get("replicas") == 0

    def stop_body(self, obj: Mapping[str, Any], annotations: Mapping[str, str | None]) -> dict[str, Any]:
        """The stop is `spec.replicas: 0`, with the count it had in `notebook-culler.io/replicas-before` (for its
        user); `kubeflow-resource-stopped` is not written (it means nothing here)."""
        ann = {k: v for k, v in annotations.items() if k != STOP_ANNOTATION}
        body: dict[str, Any] = {"metadata": {"annotations": ann}}
        if annotations.get(STOP_ANNOTATION) is not None:
            before = _dict(obj.get("spec")).get("replicas")
            ann[REPLICAS_BEFORE_ANNOTATION] = str(before if isinstance(before, int) else 1)
            body["spec"] = {"replicas": 0}
        return body

    def start_command(self, namespace: str, name: str) -> str:
        return f"kubectl scale {self.kind.lower()} {name} -n {namespace} --replicas=1"

    def keep_command(self, namespace: str, name: str, until: str) -> str | None:
        return (f"kubectl annotate {self.kind.lower()} {name} -n {namespace} {KEEP_UNTIL_ANNOTATION}={until} "
                "--overwrite")


    def watches(self, scope: Scope) -> tuple[Watched, ...]:
        """The target configured as `workloads` watches every kind of `workloads.kinds` (the registry holds it
        under its first kind): the sessions `workloads.select` takes, the ReplicaSets between a Deployment and
        its pods, the pods and the Services."""
        out = [Watched(f"workloads/{t.plural}", t.group, t.version, t.plural, workload_fields(t.kind, scope),
                       session_kind=t.kind) for t in WORKLOADS if t.kind in scope.workload_kinds]
        if not out:
            return ()
        if DEPLOYMENTS.kind in scope.workload_kinds:
            out.append(REPLICASETS)
        return (*out, WORKLOAD_PODS, SERVICES)

    def pair(self, seen: Seen) -> Pairing:
        """Every workload that is not a Notebook's or a Workspace's own StatefulSet (`session_statefulset`), with
        its pod (`workload_pod`), sorted by namespace, kind and name."""
        pods_by_owner = {**seen.owned_by("pods", "ReplicaSet"), **seen.owned_by("pods", "StatefulSet")}
        by_deployment = seen.owned_by("replicasets", DEPLOYMENTS.kind)
        # The sessions whose StatefulSet is theirs, not a workload: the Notebooks paired before, and the
        # Workspaces that control one StatefulSet (one with more is paired with the pod holding the most GPUs,
        # and every one of its StatefulSets stays a workload too).
        notebooks = {owner_key(nb): nb for nb, _ in seen.paired if kind_of(nb) == NOTEBOOKS.kind}
        names = {(str(_dict(nb.get("metadata")).get("namespace")), str(_dict(nb.get("metadata")).get("name")))
                 for nb in notebooks.values()}
        workspaces = {owner_key(ws) for ws, _ in seen.paired if kind_of(ws) == WORKSPACES.kind}
        sessions = set(notebooks) | {key for key, owned in seen.owned_by("statefulsets", WORKSPACES.kind).items()
                                     if len(owned) == 1 and key in workspaces}
        chosen: list[tuple[tuple[str, str, str], dict[str, Any]]] = []
        for t in WORKLOADS:
            chosen += [((k[0], str(o.get("kind")), k[1]), o) for k, o in seen[f"workloads/{t.plural}"].items()
                       if not session_statefulset(o, sessions, names)]
        return Pairing([(w, workload_pod(w, by_deployment, pods_by_owner))
                        for _, w in sorted(chosen, key=lambda x: x[0])])

    def service_problem(self, session: Mapping[str, Any], seen: Seen) -> str | None:
        meta = _dict(session.get("metadata"))
        return workload_service_problem(
            session, seen.now("services", (str(meta.get("namespace")), str(meta.get("name")))))

    def service_address(self, session: Mapping[str, Any], seen: Seen) -> tuple[str, str] | None:
        return named_service_address(session, seen, workload_service_problem)


def _workload(kind: str, plural: str) -> WorkloadTarget:
    return WorkloadTarget("workloads", kind, "apps", "v1", plural, route=plural, rbac="workloads", reach="workload",
                          where_to_start="Kubeflow's Notebooks page", stop_field="replicas")


DEPLOYMENTS = _workload("Deployment", "deployments")
STATEFULSETS = _workload("StatefulSet", "statefulsets")
WORKLOADS = (DEPLOYMENTS, STATEFULSETS)


def workload_fields(kind: str, scope: Scope) -> Callable[[dict[str, Any]], dict[str, Any] | None]:
    """The projection of a plain workload's collection: None for the Deployments or StatefulSets that are not
    sessions (`scope.selects_workload`: kf_culler/policy.py `selects_workload`), else what the culler reads:
    identity, labels and annotations, the replica count, the pod template's labels, containers and node
    selection. A built-in list's items carry no kind: it is set here."""
    def project(obj: dict[str, Any]) -> dict[str, Any] | None:
        obj = {**obj, "apiVersion": "apps/v1", "kind": kind}
        if not scope.selects_workload(obj):
            return None
        meta, spec = _dict(obj.get("metadata")), _dict(obj.get("spec"))
        template = _dict(spec.get("template"))
        out = template_fields(obj, "apps/v1", kind)
        out["spec"]["template"]["metadata"] = {"labels": _dict(_dict(template.get("metadata")).get("labels"))}
        if "replicas" in spec:
            out["spec"]["replicas"] = spec["replicas"]
        out["metadata"] = pick(meta, SESSION_META)
        owners = controller_ref(meta)
        if owners:
            out["metadata"]["ownerReferences"] = owners
        out.pop("status", None)
        return out

    return project


def replicaset_fields(obj: dict[str, Any]) -> dict[str, Any] | None:
    """A ReplicaSet's identity and controller, for the ones a Deployment controls (a workload's pods)."""
    meta = _dict(obj.get("metadata"))
    owners = controller_ref(meta)
    if not any(r.get("kind") == DEPLOYMENTS.kind for r in owners):
        return None
    return {"metadata": {**pick(meta, ("name", "namespace", "uid")), "ownerReferences": owners}}


REPLICASETS = Watched("replicasets", "apps", "v1", "replicasets", replicaset_fields, metadata_only=True)
# A workload's pods are its StatefulSet's or its Deployment's ReplicaSets'.
WORKLOAD_PODS = Watched("pods", "", "v1", "pods", pod_fields, keep=controlled_pod(("StatefulSet", "ReplicaSet")))


def is_workload(obj: Mapping[str, Any]) -> bool:
    """Whether the object is of a kind this target handles (a Deployment or a StatefulSet)."""
    return any(str(obj.get("kind") or "") == t.kind for t in WORKLOADS)


def controlled_by_kind(obj: Mapping[str, Any], skips: Iterable[tuple[str, Collection[str]]]) -> bool:
    """Whether the object is in one of the namespaces of a `skips` entry (`<API group>/<Kind>`, namespaces: the
    admin's `workloads.skipControlledBy`) and its controller is of that entry's kind. The namespace is what a
    profile user cannot forge: an ownerReference is its object's owner's to write, to any object of their own of
    any kind they may create, and a namespaced owner is always in its dependent's namespace; so only workloads in
    namespaces where profile users cannot create objects are skipped. The group must match too (an ownerReference
    to an owner that does not exist in an unserved API is not garbage-collected)."""
    meta = _dict(obj.get("metadata"))
    namespace = str(meta.get("namespace") or "")
    refs = meta.get("ownerReferences")
    for ref in refs if isinstance(refs, list) else []:
        if isinstance(ref, dict) and ref.get("controller") is True:
            group = str(ref.get("apiVersion") or "").rpartition("/")[0]
            kind = f"{group}/{ref.get('kind')}"
            return any(kind == skip and namespace in namespaces for skip, namespaces in skips)
    return False


def session_statefulset(sts: Mapping[str, Any], sessions: frozenset[OwnerKey] | set[OwnerKey],
                        notebooks: Collection[tuple[str, str]] = ()) -> bool:
    """Whether a StatefulSet is the one a Notebook or a Workspace session is paired with (culled through that
    session, scaled by its controller): named like a Notebook the culler lists in its namespace (`notebooks`:
    (namespace, name); Kubeflow's notebook-controller scales it by name, whatever its ownerReferences say), or
    controlled by a session the culler lists (`sessions`: (namespace, uid) of its Notebooks and of its
    Workspaces that control one StatefulSet), and for a Notebook its `<name>`. An ownerReference is its owner's
    to write, to a made-up or unlisted owner as well: any other StatefulSet is a workload."""
    if str(sts.get("kind") or "") != STATEFULSETS.kind:
        return False
    meta = _dict(sts.get("metadata"))
    if (str(meta.get("namespace") or ""), str(meta.get("name") or "")) in notebooks:
        return True
    ref = controller_of(sts)
    if ref is None:
        return False
    kind, name, uid = ref
    if (str(_dict(sts.get("metadata")).get("namespace") or ""), uid) not in sessions:
        return False
    if kind == NOTEBOOKS.kind:
        return name == str(_dict(sts.get("metadata")).get("name"))
    return kind == WORKSPACES.kind


def workload_pod(workload: Mapping[str, Any], replicasets: Mapping[OwnerKey, list[dict[str, Any]]],
                 pods_by_owner: Mapping[OwnerKey, list[dict[str, Any]]]) -> dict[str, Any] | None:
    """A workload's pod, by ownership: a StatefulSet's pods are controlled by it, a Deployment's by its
    ReplicaSets. With several (a rollout, more than one replica), the Running one that started first (the
    session's), else the first by name. None when it has none."""
    key = owner_key(workload)
    if str(workload.get("kind") or "") == DEPLOYMENTS.kind:
        pods = [p for rs in replicasets.get(key, []) for p in pods_by_owner.get(owner_key(rs), [])]
    else:
        pods = list(pods_by_owner.get(key, []))
    if not pods:
        return None
    running = [p for p in pods if _dict(p.get("status")).get("phase") == "Running"
               and not _dict(p.get("metadata")).get("deletionTimestamp")]
    if running:
        return min(running, key=lambda p: (str(_dict(p.get("status")).get("startTime") or ""),
                                          str(_dict(p.get("metadata")).get("name"))))
    return min(pods, key=lambda p: str(_dict(p.get("metadata")).get("name")))


def workload_service_problem(workload: Mapping[str, Any], service: Mapping[str, Any] | None) -> str | None:
    """Why the Service named like the workload cannot be trusted to reach the workload's own pods, or None: it
    must route to endpoints (not ExternalName, not selector-less) and select a subset of the workload's pod
    template labels. Every pod it can reach is then in the workload's namespace."""
    name = str(_dict(workload.get("metadata")).get("name"))
    if service is None:
        return f"the workload has no Service {name}"
    spec = _dict(service.get("spec"))
    kind = spec.get("type") or "ClusterIP"
    if kind not in ("ClusterIP", "NodePort", "LoadBalancer"):
        return f"the Service {name} is of type {str(kind)[:20]}"
    selector = spec.get("selector")
    labels = _dict(_dict(_dict(_dict(workload.get("spec")).get("template")).get("metadata")).get("labels"))
    if not isinstance(selector, dict) or not selector or any(labels.get(k) != v for k, v in selector.items()):
        return f"the Service {name} does not select the workload's pods"
    return None
