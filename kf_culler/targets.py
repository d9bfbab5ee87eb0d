"""What the culler culls: a session kind it can list, pair with its pod, probe, stop and tell (docs/targets.md).

A target maps the neutral verdict onto one kind of API object. Kubeflow v1 Notebooks (`notebooks`) are
stopped with `kubeflow-resource-stopped`, which their notebook-controller turns into a StatefulSet of 0;
Kubeflow Notebooks 2.0 Workspaces (`workspaces`) with `spec.paused: true`, which the Workspace controller
turns into a StatefulSet of 0 (it reverts any other change to that StatefulSet). The rules never see the
difference: each target says whether a session is stopped, which pod is its own, and how a stop is written.
Pure: over the cached objects.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

from kf_culler.ide import CODER_SERVER_TYPE
from kf_culler.model import STOP_ANNOTATION

Key = tuple[str, str]
WORKSPACE_NAME_LABEL = "notebooks.kubeflow.org/workspace-name"
CONNECT_PREFIX = "/workspace/connect/{namespace}/{name}/{port_id}/"


@dataclass(frozen=True)
class Target:
    name: str  # as configuration names it: `targets: [notebooks, workspaces]`
    kind: str  # the API kind of its sessions
    group: str
    version: str
    plural: str

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}"


NOTEBOOKS = Target("notebooks", "Notebook", "kubeflow.org", "v1", "notebooks")
WORKSPACES = Target("workspaces", "Workspace", "kubeflow.org", "v1beta1", "workspaces")
# Plain workloads (`targets: [workloads]`): Deployments and StatefulSets that nothing controls, stopped by
# scaling to 0 (the structure of sessions run without Kubeflow: one pod, a GPU, a home PVC).
DEPLOYMENTS = Target("workloads", "Deployment", "apps", "v1", "deployments")
STATEFULSETS = Target("workloads", "StatefulSet", "apps", "v1", "statefulsets")
# Coder workspaces (`targets: [coder]`, docs/targets.md): not Kubernetes objects but what Coder's API lists, each
# made into a synthetic session object (kf_culler/coder_sessions.py) and stopped by a stop build through Coder's
# API (kf_culler/kube/coder.py). A Coder workspace is its own IDE, so the target is named like its IDE kind.
CODER = Target(CODER_SERVER_TYPE, "CoderWorkspace", "coder.com", "v2", "workspaces")
TARGETS = {t.name: t for t in (NOTEBOOKS, WORKSPACES, DEPLOYMENTS, CODER)}
WORKLOADS = (DEPLOYMENTS, STATEFULSETS)
KINDS = {t.kind: t for t in (NOTEBOOKS, WORKSPACES, *WORKLOADS, CODER)}  # the session kinds' targets
_BY_KIND = KINDS
# The replica count a workload had when the culler scaled it to 0 (for its user: what to scale back to).
REPLICAS_BEFORE_ANNOTATION = "notebook-culler.io/replicas-before"
# What the culler's cache counted of the objects a Workspace controls, `{"statefulSets": n, "services": m}`: set
# on its own copy of the Workspace (kf_culler/kube/cache.py), a key no API object has (the cache keeps only
# apiVersion, kind, metadata, spec and status of a Workspace), so no user can write it.
CONTROLS_KEY = "kfCullerControls"


class SessionKey(NamedTuple):
    """A session's key in a pass, made once (`session_key` from its object, `SessionKey.of` from its parts,
    `SessionKey.parse` from text) and read back only here: its namespace and its pass name, which is the
    object's name for a v1 Notebook and `<Kind>/<name>` for every other kind (a `/` is in no object name, so
    sessions of two kinds with one name stay two). A pair, so it reads as `(namespace, name)` wherever one is
    logged or stored."""

    namespace: str
    name: str  # the pass name: `<name>` (a Notebook), `Workspace/<name>`, `CoderWorkspace/<owner>.<workspace>`

    @classmethod
    def of(cls, namespace: str, kind: str, name: str) -> SessionKey:
        return cls(namespace, name if kind == NOTEBOOKS.kind else f"{kind}/{name}")

    @classmethod
    def parse(cls, text: str) -> SessionKey | None:
        """From `NAMESPACE/NAME` (a Notebook) or `NAMESPACE/KIND/NAME`; None without a namespace or a name."""
        namespace, _, name = text.partition("/")
        return cls(namespace, name) if namespace and name else None

    @property
    def kind(self) -> str:
        """The session's API kind (a Notebook when the pass name has no kind)."""
        kind, sep, _ = self.name.partition("/")
        return kind if sep else NOTEBOOKS.kind

    @property
    def object_name(self) -> str:
        """The name of the session's object (without its kind)."""
        _, sep, plain = self.name.partition("/")
        return plain if sep else self.name

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


def target_of(obj: Mapping[str, Any]) -> Target:
    """The target of a session object, by its `kind` (set by the API server; a user cannot change it). An
    object without one (a scenario's notebook, a replayed trace) is a v1 Notebook."""
    return _BY_KIND.get(str(obj.get("kind") or ""), NOTEBOOKS)


def _dict(value: object) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def is_stopped(obj: Mapping[str, Any]) -> bool:
    """Whether the session is stopped, by its own target's meaning: a Notebook with `kubeflow-resource-stopped`
    (whoever set it), a Workspace with `spec.paused: true` (the culler, its user or the controller's own
    culling)."""
    target = target_of(obj)
    if target is WORKSPACES:
        return _dict(obj.get("spec")).get("paused") is True
    if target in WORKLOADS:
        return _dict(obj.get("spec")).get("replicas") == 0
    if target is CODER:  # its latest build stops or deletes it (whoever asked: its user, Coder's autostop, us)
        return _dict(obj.get("spec")).get("transition") in ("stop", "delete")
    return STOP_ANNOTATION in _dict(_dict(obj.get("metadata")).get("annotations"))


def workspace_tampered(obj: Mapping[str, Any]) -> str | None:
    """Why a Workspace's controller cannot act on it, or None: the v2.0.0-beta.0 controller fails every reconcile
    of a Workspace that controls more than one StatefulSet or Service (a user may create one with a controller
    ownerReference to their own Workspace) before it applies `spec.paused`, so such a Workspace is never taken as
    stopped while a pod of it runs (docs/targets.md, "A stop that does not take")."""
    if target_of(obj) is not WORKSPACES:
        return None
    counts = _dict(obj.get(CONTROLS_KEY))
    found = []
    for key, what in (("statefulSets", "StatefulSets"), ("services", "Services")):
        n = counts.get(key)
        if isinstance(n, int) and not isinstance(n, bool) and n > 1:
            found.append(f"{n} {what}")
    if not found:
        return None
    return f"the workspace controls {' and '.join(found)}, so its controller fails before it applies spec.paused"


def session_key(obj: Mapping[str, Any]) -> SessionKey:
    """The session's key in a pass (`SessionKey`): (namespace, name) for a Notebook, (namespace,
    `Workspace/<name>`) for a Workspace, so a Notebook and a Workspace of one name are two sessions."""
    if not isinstance(obj, Mapping):  # not an object at all: deciding it says so
        return SessionKey("None", "None")
    meta = _dict(obj.get("metadata"))
    return SessionKey.of(str(meta.get("namespace")), target_of(obj).kind, str(meta.get("name")))


def stop_body(obj: Mapping[str, Any], annotations: Mapping[str, str | None]) -> dict[str, Any]:
    """The merge patch that writes a plan's annotations (a stop included) on the session: for a Notebook the
    annotations as they are; for a Workspace the stop is `spec.paused: true`, for a workload `spec.replicas: 0`
    (with the count it had in `notebook-culler.io/replicas-before`), and `kubeflow-resource-stopped` is not
    written on either (it means nothing there)."""
    target = target_of(obj)
    if target is NOTEBOOKS:
        return {"metadata": {"annotations": dict(annotations)}}
    ann = {k: v for k, v in annotations.items() if k != STOP_ANNOTATION}
    body: dict[str, Any] = {"metadata": {"annotations": ann}}
    if annotations.get(STOP_ANNOTATION) is None:
        return body
    if target is WORKSPACES:
        body["spec"] = {"paused": True}
    else:  # a workload: scaled to 0, the count it had kept for its user
        before = _dict(obj.get("spec")).get("replicas")
        ann[REPLICAS_BEFORE_ANNOTATION] = str(before if isinstance(before, int) else 1)
        body["spec"] = {"replicas": 0}
    return body


def controller_of(obj: Mapping[str, Any]) -> tuple[str, str, str] | None:
    """(kind, name, uid) of the object's controller ownerReference, if it has one."""
    refs = _dict(obj.get("metadata")).get("ownerReferences")
    for ref in refs if isinstance(refs, list) else []:
        if isinstance(ref, dict) and ref.get("controller") is True:
            return str(ref.get("kind")), str(ref.get("name")), str(ref.get("uid"))
    return None


def uid_of(obj: Mapping[str, Any]) -> str:
    return str(_dict(obj.get("metadata")).get("uid") or "")


OwnerKey = tuple[str, str]  # (namespace, the owner's uid): an owner is in its dependents' namespace


def owner_key(obj: Mapping[str, Any]) -> OwnerKey:
    meta = _dict(obj.get("metadata"))
    return str(meta.get("namespace") or ""), uid_of(obj)


def owned_by(objects: Mapping[Key, dict[str, Any]], kind: str) -> dict[OwnerKey, list[dict[str, Any]]]:
    """The objects controlled by an object of `kind`, by (namespace, that owner's uid): a uid written in another
    namespace's ownerReference names nothing of this one."""
    out: dict[OwnerKey, list[dict[str, Any]]] = {}
    for obj in objects.values():
        ref = controller_of(obj)
        if ref is not None and ref[0] == kind:
            out.setdefault((str(_dict(obj.get("metadata")).get("namespace") or ""), ref[2]), []).append(obj)
    return out


def _gpus(pod: Mapping[str, Any]) -> float:
    """What the pod's containers ask of resources named like GPUs (to choose among a session's pods)."""
    total = 0.0
    for c in _dict(pod.get("spec")).get("containers") or []:
        for kind in ("limits", "requests"):
            for name, value in _dict(_dict(_dict(c).get("resources")).get(kind)).items():
                if "gpu" in str(name):
                    with contextlib.suppress(ValueError):
                        n = float(str(value))
                        total += n if math.isfinite(n) and n > 0 else 0.0
    return total


def _running(pod: Mapping[str, Any]) -> bool:
    return _dict(pod.get("status")).get("phase") == "Running" and not _dict(pod.get("metadata")).get(
        "deletionTimestamp")


def statefulset_member(pod: Mapping[str, Any], name: str) -> bool:
    """Whether the pod is named as a member of the StatefulSet `name` is: `<name>-<ordinal>`."""
    pod_name = str(_dict(pod.get("metadata")).get("name"))
    ordinal = pod_name.removeprefix(f"{name}-")
    return ordinal != pod_name and ordinal.isascii() and ordinal.isdigit() and ordinal == str(int(ordinal))


def workspace_pod(ws: Mapping[str, Any], statefulsets: Mapping[OwnerKey, list[dict[str, Any]]],
                  pods: Mapping[Key, dict[str, Any]],
                  pods_by_owner: Mapping[OwnerKey, list[dict[str, Any]]] | None = None) -> dict[str, Any] | None:
    """A Workspace's pod: `<statefulset>-0` of a StatefulSet the Workspace controls, controlled by that
    StatefulSet (the Workspace controller names both with random suffixes: found by ownership, never by name
    or labels, which the user can write), or, given `pods_by_owner` (kf_culler/targets.py `owned_by` over the
    pods, "StatefulSet"), any `<statefulset>-<ordinal>` it controls (a user may renumber its pods with
    `spec.ordinals`). A user can attach more StatefulSets to their Workspace: of all their pods, the Running one
    asking for the most GPUs, so that none can hide the one holding a GPU. None when there is none."""
    found = []
    for sts in statefulsets.get(owner_key(ws), []):
        meta = _dict(sts.get("metadata"))
        name = str(meta.get("name"))
        mine = ("StatefulSet", name, uid_of(sts))
        pod = pods.get((str(meta.get("namespace")), f"{name}-0"))
        if pod is not None and controller_of(pod) == mine:
            found.append(pod)
        found += [p for p in (pods_by_owner or {}).get(owner_key(sts), [])
                  if p is not pod and controller_of(p) == mine and statefulset_member(p, name)]
    if not found:
        return None
    best = max((_running(p), _gpus(p)) for p in found)
    return min((p for p in found if (_running(p), _gpus(p)) == best),
               key=lambda p: str(_dict(p.get("metadata")).get("name")))


def workspace_service(ws: Mapping[str, Any], services: Mapping[OwnerKey, list[dict[str, Any]]]
                      ) -> tuple[dict[str, Any] | None, str | None]:
    """The Service the Workspace controller made for the Workspace, or why there is none to trust: it must be
    controlled by the Workspace, of a type that routes to endpoints, and select the Workspace's own pod by both
    labels the controller sets (a user may create and edit Services, not make the controller own one)."""
    name = str(_dict(ws.get("metadata")).get("name"))
    owned = services.get(owner_key(ws), [])
    if len(owned) != 1:
        return None, ("the workspace has no Service of its own" if not owned
                      else f"the workspace controls {len(owned)} Services")
    svc = owned[0]
    spec = _dict(svc.get("spec"))
    kind = spec.get("type") or "ClusterIP"
    if kind not in ("ClusterIP", "NodePort", "LoadBalancer"):
        return None, f"the workspace's Service is of type {str(kind)[:20]}"
    if spec.get("selector") != {WORKSPACE_NAME_LABEL: name, "statefulset": name}:
        return None, "the workspace's Service does not select the workspace's own pod"
    return svc, None


def workspace_port(ws: Mapping[str, Any], kind: Mapping[str, Any] | None) -> tuple[str, int, bool] | None:
    """(port id, port number, whether the app serves at `/`) of the Workspace's first HTTP port, from its
    WorkspaceKind: the imageConfig value the Workspace chose gives the number, the kind's `ports` the id's
    `httpProxy.removePathPrefix`. None when the kind does not say."""
    if kind is None:
        return None
    template = _dict(_dict(kind.get("spec")).get("podTemplate"))
    value_id = _dict(_dict(_dict(ws.get("spec")).get("podTemplate")).get("options")).get("imageConfig")
    image_config = _dict(_dict(template.get("options")).get("imageConfig"))
    values = image_config.get("values")
    value = next((v for v in (values if isinstance(values, list) else [])
                  if isinstance(v, dict) and v.get("id") == value_id), None)
    if value is None:
        return None
    kind_ports = {str(p.get("id")): p for p in template.get("ports") or [] if isinstance(p, dict)}
    for port in _dict(value.get("spec")).get("ports") or []:
        if not isinstance(port, dict) or not isinstance(port.get("port"), int):
            continue
        pid = str(port.get("id"))
        declared = kind_ports.get(pid)
        if declared is None or declared.get("protocol", "HTTP") != "HTTP":
            continue
        at_root = _dict(declared.get("httpProxy")).get("removePathPrefix") is True
        return pid, int(port["port"]), at_root
    return None


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
    if target_of(sts) is not STATEFULSETS:
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
    if target_of(workload) is DEPLOYMENTS:
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
