"""What the culler culls: a session kind it can list, pair with its pod, probe, stop and tell (docs/targets.md).

A target maps the neutral verdict onto one kind of API object. Kubeflow v1 Notebooks (`notebooks`) are
stopped with `kubeflow-resource-stopped`, which their notebook-controller turns into a StatefulSet of 0;
Kubeflow Notebooks 2.0 Workspaces (`workspaces`) with `spec.paused: true`, which the Workspace controller
turns into a StatefulSet of 0 (it reverts any other change to that StatefulSet). The rules never see the
difference: each target says whether a session is stopped, which pod is its own, and how a stop is written.
Pure: over the cached objects.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

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
TARGETS = {t.name: t for t in (NOTEBOOKS, WORKSPACES)}
_BY_KIND = {t.kind: t for t in TARGETS.values()}


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
    if target_of(obj) is WORKSPACES:
        return _dict(obj.get("spec")).get("paused") is True
    return STOP_ANNOTATION in _dict(_dict(obj.get("metadata")).get("annotations"))


def session_key(obj: Mapping[str, Any]) -> Key:
    """The session's key in a pass: (namespace, name) for a Notebook, (namespace, `Workspace/<name>`) for a
    Workspace, so a Notebook and a Workspace of one name are two sessions (a `/` is in no object name)."""
    if not isinstance(obj, Mapping):  # not an object at all: deciding it says so
        return "None", "None"
    meta = _dict(obj.get("metadata"))
    ns, name = str(meta.get("namespace")), str(meta.get("name"))
    target = target_of(obj)
    return (ns, name) if target is NOTEBOOKS else (ns, f"{target.kind}/{name}")


def stop_body(obj: Mapping[str, Any], annotations: Mapping[str, str | None]) -> dict[str, Any]:
    """The merge patch that writes a plan's annotations (a stop included) on the session: for a Notebook the
    annotations as they are; for a Workspace the stop is `spec.paused: true` and `kubeflow-resource-stopped`
    is not written (it means nothing there)."""
    if target_of(obj) is not WORKSPACES:
        return {"metadata": {"annotations": dict(annotations)}}
    ann = {k: v for k, v in annotations.items() if k != STOP_ANNOTATION}
    body: dict[str, Any] = {"metadata": {"annotations": ann}}
    if annotations.get(STOP_ANNOTATION) is not None:
        body["spec"] = {"paused": True}
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


def owned_by(objects: Mapping[Key, dict[str, Any]], kind: str) -> dict[str, list[dict[str, Any]]]:
    """The objects controlled by an object of `kind`, by that owner's uid."""
    out: dict[str, list[dict[str, Any]]] = {}
    for obj in objects.values():
        ref = controller_of(obj)
        if ref is not None and ref[0] == kind:
            out.setdefault(ref[2], []).append(obj)
    return out


def workspace_pod(ws: Mapping[str, Any], statefulsets: Mapping[str, list[dict[str, Any]]],
                  pods: Mapping[Key, dict[str, Any]]) -> dict[str, Any] | None:
    """A Workspace's pod: `<statefulset>-0` of the one StatefulSet the Workspace controls, controlled by that
    StatefulSet (the Workspace controller names both with random suffixes: found by ownership, never by name
    or labels, which the user can write). None when there is none or more than one StatefulSet."""
    owned = statefulsets.get(uid_of(ws), [])
    if len(owned) != 1:
        return None
    meta = _dict(owned[0].get("metadata"))
    sts, ns = str(meta.get("name")), str(meta.get("namespace"))
    pod = pods.get((ns, f"{sts}-0"))
    if pod is None or controller_of(pod) != ("StatefulSet", sts, uid_of(owned[0])):
        return None
    return pod


def workspace_service(ws: Mapping[str, Any], services: Mapping[str, list[dict[str, Any]]]
                      ) -> tuple[dict[str, Any] | None, str | None]:
    """The Service the Workspace controller made for the Workspace, or why there is none to trust: it must be
    controlled by the Workspace, of a type that routes to endpoints, and select the Workspace's own pod by both
    labels the controller sets (a user may create and edit Services, not make the controller own one)."""
    name = str(_dict(ws.get("metadata")).get("name"))
    owned = services.get(uid_of(ws), [])
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
