"""Kubeflow Notebooks 2.0 Workspaces (`targets: [workspaces]`, docs/targets.md): stopped with `spec.paused: true`,
which the Workspace controller turns into a StatefulSet of 0 (it reverts any other change to that StatefulSet);
the pod and the Service are found by ownership, the IDE's port from the WorkspaceKind. Pure."""

from __future__ import annotations

from collections.abc import Mapping
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
    gpus_asked,
    owner_key,
    running,
    statefulset_member,
    uid_of,
)
from kf_culler.targets.fields import (
    SERVICES,
    SESSION_META,
    STATEFULSET_PODS,
    STATEFULSETS_METADATA,
    pick,
    shared,
)
from kf_culler.targets.pairing import cluster_ip

Key = tuple[str, str]
WORKSPACE_NAME_LABEL = "notebooks.kubeflow.org/workspace-name"
CONNECT_PREFIX = "/workspace/connect/{namespace}/{name}/{port_id}/"
# What the culler's cache counted of the objects a Workspace controls, `{"statefulSets": n, "services": m}`: set
# on its own copy of the Workspace (`WorkspaceTarget.pair`), a key no API object has (the cache keeps only
# apiVersion, kind, metadata, spec and status of a Workspace), so no user can write it.
CONTROLS_KEY = "kfCullerControls"


@dataclass(frozen=True)
class WorkspaceTarget(Target):
    def is_stopped(self, obj: Mapping[str, Any]) -> bool:
        """`spec.paused: true` (the culler, its user or the controller's own culling)."""
        return _dict(obj.get("spec")).get("paused") is True

    def stop_body(self, obj: Mapping[str, Any], annotations: Mapping[str, str | None]) -> dict[str, Any]:
        """The stop is `spec.paused: true`; `kubeflow-resource-stopped` is not written (it means nothing here)."""
        body: dict[str, Any] = {"metadata": {"annotations": {k: v for k, v in annotations.items()
                                                             if k != STOP_ANNOTATION}}}
        if annotations.get(STOP_ANNOTATION) is not None:
            body["spec"] = {"paused": True}
        return body

    def start_command(self, namespace: str, name: str) -> str:
        return f"kubectl patch workspace {name} -n {namespace} --type merge -p '{{\"spec\":{{\"paused\":false}}}}'"

    def keep_command(self, namespace: str, name: str, until: str) -> str | None:
        return f"kubectl annotate workspace {name} -n {namespace} {KEEP_UNTIL_ANNOTATION}={until} --overwrite"

    def tampered(self, obj: Mapping[str, Any]) -> str | None:
        return workspace_tampered(obj)

    def watches(self, scope: Scope) -> tuple[Watched, ...]:
        return (Watched(self.plural, self.group, self.version, self.plural, workspace_fields, session_kind=self.kind),
                # cluster-scoped, a handful: how each Workspace's IDE is reached
                Watched("workspacekinds", self.group, self.version, "workspacekinds", workspace_kind_fields,
                        cluster_scoped=True),
                STATEFULSETS_METADATA, STATEFULSET_PODS, SERVICES)

    def pair(self, seen: Seen) -> Pairing:
        """Every Workspace with its pod (`workspace_pod`) and what it controls, counted on the culler's own copy
        (`workspace_tampered`): one with several StatefulSets or Services is one its controller cannot act on."""
        by_owner = seen.owned_by("statefulsets", self.kind)  # by (namespace, Workspace uid)
        members = seen.owned_by("pods", "StatefulSet")  # by (namespace, StatefulSet uid)
        services = seen.owned_by("services", self.kind)
        pods = seen["pods"]
        return Pairing([({**w, CONTROLS_KEY: {"statefulSets": len(by_owner.get(owner_key(w), [])),
                                              "services": len(services.get(owner_key(w), []))}},
                         workspace_pod(w, by_owner, pods, members)) for _, w in sorted(seen[self.plural].items())])

    def endpoint(self, session: Mapping[str, Any], seen: Seen) -> tuple[str, int, str] | str:
        """(Service name, port, path) of a Workspace's IDE as of the last snapshot, or why it cannot be reached
        safely: its own Service (`workspace_service`), the port its WorkspaceKind gives, the connect path unless
        the kind serves the port at `/`."""
        svc, why = workspace_service(session, seen.owned_by("services", self.kind))
        if svc is None:
            return str(why)
        kind_name = str(_dict(session.get("spec")).get("kind"))
        port = workspace_port(session, seen.now("workspacekinds", ("", kind_name)))
        if port is None:
            return f"its WorkspaceKind {kind_name[:63]!r} gives no HTTP port for its image"
        port_id, number, at_root = port
        meta = _dict(session.get("metadata"))
        path = "/" if at_root else CONNECT_PREFIX.format(namespace=meta.get("namespace"), name=meta.get("name"),
                                                         port_id=port_id)
        return str(_dict(svc.get("metadata")).get("name")), number, path

    def service_address(self, session: Mapping[str, Any], seen: Seen) -> tuple[str, str] | None:
        found = self.endpoint(session, seen)
        if isinstance(found, str):
            return None
        ip = cluster_ip(seen.now("services", (str(_dict(session.get("metadata")).get("namespace")), found[0])))
        return (found[0], ip) if ip is not None else None

    def reclaim(self, pod: Mapping[str, Any]) -> tuple[str, str, str] | None:
        """Its pod's StatefulSet (reached by ownership: pod -> StatefulSet by uid -> Workspace by uid): with
        `spec.paused: true` its controller wants it at 0 replicas, so scaling it to 0 is what the controller would
        do, and it cannot undo it."""
        ref = controller_of(pod)
        if ref is None or ref[0] != "StatefulSet" or not ref[1] or not ref[2]:
            return None
        return ref


WORKSPACES = WorkspaceTarget("workspaces", "Workspace", "kubeflow.org", "v1beta1", "workspaces", route="workspaces",
                             rbac="workspaces", reach="endpoint", where_to_start="Kubeflow's Notebooks page",
                             stop_field="paused", image_from_pod=True)


WORKSPACE_STATUS = ("state", "pauseTime", "lastRunningTime")


def workspace_fields(obj: dict[str, Any]) -> dict[str, Any]:
    """What the culler reads of a Workspace: identity, labels and annotations, `spec.paused`, its kind and
    chosen options, and the controller's state. Never its `status.activity`, which is the controller's own
    culling's."""
    meta, spec, status = (_dict(obj.get(k)) for k in ("metadata", "spec", "status"))
    options = _dict(_dict(spec.get("podTemplate")).get("options"))
    return {
        "apiVersion": shared(obj.get("apiVersion", WORKSPACES.api_version)), "kind": WORKSPACES.kind,
        "metadata": pick(meta, SESSION_META),
        "spec": {**{k: spec[k] for k in ("paused", "kind") if k in spec},
                 "podTemplate": {"options": pick(options, ("imageConfig", "podConfig"))}},
        "status": pick(status, WORKSPACE_STATUS),
    }


def workspace_kind_fields(obj: dict[str, Any]) -> dict[str, Any]:
    """A WorkspaceKind's ports (ids, protocol, whether the app serves at `/`) and its images' port numbers:
    how a Workspace's IDE is reached (`workspace_port`)."""
    meta = _dict(obj.get("metadata"))
    template = _dict(_dict(obj.get("spec")).get("podTemplate"))
    ports = [{**pick(p, ("id", "protocol")), "httpProxy": pick(_dict(p).get("httpProxy"), ("removePathPrefix",))}
             for p in template.get("ports") or [] if isinstance(p, dict)]
    values = _dict(_dict(template.get("options")).get("imageConfig")).get("values")
    kept = [{"id": v.get("id"), "spec": {"ports": [pick(q, ("id", "port")) for q in
                                                    _dict(v.get("spec")).get("ports") or [] if isinstance(q, dict)]}}
            for v in (values if isinstance(values, list) else []) if isinstance(v, dict)]
    return {"metadata": {"name": meta.get("name")},
            "spec": {"podTemplate": {"ports": ports, "options": {"imageConfig": {"values": kept}}}}}


def workspace_tampered(obj: Mapping[str, Any]) -> str | None:
    """Why a Workspace's controller cannot act on it, or None: the v2.0.0-beta.0 controller fails every reconcile
    of a Workspace that controls more than one StatefulSet or Service (a user may create one with a controller
    ownerReference to their own Workspace) before it applies `spec.paused`, so such a Workspace is never taken as
    stopped while a pod of it runs (docs/targets.md, "A stop that does not take")."""
    if str(obj.get("kind") or "") != WORKSPACES.kind:
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


def workspace_pod(ws: Mapping[str, Any], statefulsets: Mapping[OwnerKey, list[dict[str, Any]]],
                  pods: Mapping[Key, dict[str, Any]],
                  pods_by_owner: Mapping[OwnerKey, list[dict[str, Any]]] | None = None) -> dict[str, Any] | None:
    """A Workspace's pod: `<statefulset>-0` of a StatefulSet the Workspace controls, controlled by that
    StatefulSet (the Workspace controller names both with random suffixes: found by ownership, never by name
    or labels, which the user can write), or, given `pods_by_owner` (kf_culler/targets/ `owned_by` over the
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
    best = max((running(p), gpus_asked(p)) for p in found)
    return min((p for p in found if (running(p), gpus_asked(p)) == best),
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
