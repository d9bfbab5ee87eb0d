"""List+watch Notebooks and their pods into memory, so a cycle needs no per-notebook GET.

One thread per watched collection; a broken watch is resumed from its resourceVersion, and a
410 Gone (or any other failure) leads to a fresh list. Objects are kept as the API's JSON dicts.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from kf_culler.config import GPU_MODEL_LABEL
from kf_culler.kube import GROUP, PLURAL, VERSION
from kf_culler.kube.liststream import list_items
from kf_culler.kube.pairing import Orphan, pair, service_problem
from kf_culler.memory import release
from kf_culler.targets import (
    CONNECT_PREFIX,
    CONTROLS_KEY,
    NOTEBOOKS,
    WORKLOADS,
    WORKSPACES,
    owned_by,
    owner_key,
    session_statefulset,
    target_of,
    workload_pod,
    workload_service_problem,
    workspace_pod,
    workspace_port,
    workspace_service,
)
from kf_culler.targets.coder import WORKSPACE_ID_LABEL

log = logging.getLogger(__name__)
Key = tuple[str, str]
LIST_PAGE = 500  # objects per list request at most (as kubectl pages, --chunk-size=500)
STREAM_CHUNK = 256 * 1024  # a list answer is read in chunks this size and split into its items as it comes
# Collections of which the culler reads metadata only (StatefulSets: their owner): the API server sends
# PartialObjectMetadata, never the pod template, which the notebook-controller copies from the Notebook.
METADATA_LIST = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"
METADATA_WATCH = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1"


def _slim(obj: dict[str, Any]) -> dict[str, Any]:
    """Drop metadata.managedFields, which nothing here reads: two fifths of a pod's JSON, and with
    10,000 notebooks and their pods the largest part of the culler's memory."""
    meta = obj.get("metadata")
    if isinstance(meta, dict):
        meta.pop("managedFields", None)
    return obj


POD_META = ("name", "namespace", "uid", "resourceVersion", "labels", "deletionTimestamp")
CONTAINER_KEYS = ("name", "image", "resources")
INIT_CONTAINER_KEYS = ("name", "image", "resources", "restartPolicy")


def _dict(value: object) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _slim_containers(pod_spec: dict[str, Any]) -> dict[str, Any]:
    """A pod spec's containers and init containers, each with only what the culler reads (a GPU request, an
    init container's restartPolicy: rule 17)."""
    def some(key: str, keys: tuple[str, ...]) -> list[dict[str, Any]]:
        found = pod_spec.get(key)
        return [{k: c[k] for k in keys if k in c} for c in (found if isinstance(found, list) else [])
                if isinstance(c, dict)]

    out: dict[str, Any] = {"containers": some("containers", CONTAINER_KEYS)}
    if isinstance(pod_spec.get("initContainers"), list):
        out["initContainers"] = some("initContainers", INIT_CONTAINER_KEYS)
    return out


def _controller_ref(meta: dict[str, Any]) -> list[dict[str, Any]]:
    """The controller ownerReference alone (pairing reads nothing else of the owners)."""
    refs = meta.get("ownerReferences")
    return [{k: r[k] for k in ("apiVersion", "kind", "name", "uid", "controller") if k in r}
            for r in (refs if isinstance(refs, list) else []) if isinstance(r, dict) and r.get("controller") is True]


def _kept_pod(meta: dict[str, Any], replicaset_pods: bool = False, coder_namespace: str | None = None) -> bool:
    """Pods a notebook can have: controlled by a StatefulSet, or named like a StatefulSet's first pod (a
    notebook's pod taken from its StatefulSet is still `<name>-0`; kf_culler/kube/pairing.py reports it); with
    `targets: [coder]`, the pods of the admin's Coder namespace labelled with a Coder workspace's id."""
    if coder_namespace is not None and meta.get("namespace") == coder_namespace \
            and WORKSPACE_ID_LABEL in _dict(meta.get("labels")):
        return True
    refs = _controller_ref(meta)
    kinds = ("StatefulSet", "ReplicaSet") if replicaset_pods else ("StatefulSet",)
    return any(r.get("kind") in kinds for r in refs) or str(meta.get("name", "")).endswith("-0")


def _slim_pod(obj: dict[str, Any], replicaset_pods: bool = False,
              coder_namespace: str | None = None) -> dict[str, Any] | None:
    """The parts of a pod the culler reads (identity, labels and its controller, containers' and init
    containers' images and resources, the node, phase and start time, the Ready condition and the
    containers' restarts and states); None for a pod no notebook can have. A notebook pod with its sidecars,
    env and volumes is many kilobytes of JSON; 10,000 of them whole would be most of the culler's memory."""
    meta, spec, status = (_dict(obj.get(k)) for k in ("metadata", "spec", "status"))
    if not _kept_pod(meta, replicaset_pods, coder_namespace):
        return None
    pod_spec = _slim_containers(spec)
    if "nodeName" in spec:
        pod_spec["nodeName"] = spec["nodeName"]
    slim_meta = {k: meta[k] for k in POD_META if k in meta}
    owners = _controller_ref(meta)
    if owners:
        slim_meta["ownerReferences"] = owners
    return {
        "apiVersion": obj.get("apiVersion", "v1"), "kind": obj.get("kind", "Pod"),
        "metadata": slim_meta, "spec": pod_spec,
        "status": {**{k: status[k] for k in ("phase", "startTime") if k in status}, **_slim_health(status)},
    }


def _slim_statefulset(obj: dict[str, Any]) -> dict[str, Any] | None:
    """A StatefulSet's identity and controller. Every one is kept, whatever its ownerReferences: Kubeflow's
    notebook-controller scales the StatefulSet named like the Notebook whether or not it still names the
    Notebook as its controller (kf_culler/kube/pairing.py); those a Workspace controls are found by owner."""
    meta = _dict(obj.get("metadata"))
    return {"metadata": {**{k: meta[k] for k in ("name", "namespace", "uid", "resourceVersion", "creationTimestamp")
                            if k in meta}, "ownerReferences": _controller_ref(meta)}}


NOTEBOOK_META = ("name", "namespace", "uid", "resourceVersion", "generation", "creationTimestamp",
                 "deletionTimestamp", "labels", "annotations")
NOTEBOOK_POD_SPEC = ("nodeSelector", "affinity")


def _slim_notebook(obj: dict[str, Any]) -> dict[str, Any]:
    """The parts of a Notebook the culler reads (kf_culler/session.py `SessionView`, the plan, the writer):
    identity and resourceVersion, labels and annotations (the API server bounds them at 256 KiB), the pod
    template's containers' and init containers' images and resources, its node selection and its claims'
    names (`kf_culler/stopped.py`), and the status
    the web app shows. A user's Notebook can be megabytes of spec (env, volumes, commands): kept whole, thirty
    stopped ones crashed the culler at its list; slimmed, each costs what these fields cost."""
    meta, spec, status = (_dict(obj.get(k)) for k in ("metadata", "spec", "status"))
    template = _dict(spec.get("template"))
    pod_spec = _dict(template.get("spec"))
    slim_spec = _slim_containers(pod_spec)
    affinity = _dict(pod_spec.get("affinity"))
    if "nodeAffinity" in affinity:
        slim_spec["affinity"] = {"nodeAffinity": affinity["nodeAffinity"]}
    if "nodeSelector" in pod_spec:
        slim_spec["nodeSelector"] = pod_spec["nodeSelector"]
    found = pod_spec.get("volumes")
    claims = [{"name": v.get("name"), "persistentVolumeClaim": _pick(v.get("persistentVolumeClaim"), ("claimName",))}
              for v in (found if isinstance(found, list) else [])
              if isinstance(v, dict) and isinstance(v.get("persistentVolumeClaim"), dict)]
    if claims:
        slim_spec["volumes"] = claims  # the long-stopped report names the claims a stopped notebook keeps
    out: dict[str, Any] = {
        "apiVersion": obj.get("apiVersion", f"{GROUP}/{VERSION}"), "kind": obj.get("kind", "Notebook"),
        "metadata": {k: meta[k] for k in NOTEBOOK_META if k in meta},
        "spec": {"template": {"spec": slim_spec}},
    }
    if status:
        out["status"] = {k: status[k] for k in ("readyReplicas", "containerState") if k in status}
    return out


Slimmer = Callable[[dict[str, Any]], dict[str, Any] | None]


def _workload_slim(kind: str, keep: Callable[[dict[str, Any]], bool]) -> Slimmer:
    """The slimmer of a plain workload's collection (`targets: [workloads]`): None for the Deployments or
    StatefulSets that are not sessions (`keep`: kf_culler/policy.py `selects_workload`), else what the culler
    reads: identity, labels and annotations, the replica count, the pod template's labels, containers and node
    selection. A built-in list's items carry no kind: it is set here."""
    def slim(obj: dict[str, Any]) -> dict[str, Any] | None:
        obj = {**obj, "apiVersion": "apps/v1", "kind": kind}
        if not keep(obj):
            return None
        meta, spec = _dict(obj.get("metadata")), _dict(obj.get("spec"))
        template = _dict(spec.get("template"))
        out = _slim_notebook(obj)
        out["spec"]["template"]["metadata"] = {"labels": _dict(_dict(template.get("metadata")).get("labels"))}
        if "replicas" in spec:
            out["spec"]["replicas"] = spec["replicas"]
        out["metadata"] = {k: meta[k] for k in NOTEBOOK_META if k in meta}
        owners = _controller_ref(meta)
        if owners:
            out["metadata"]["ownerReferences"] = owners
        out.pop("status", None)
        return out

    return slim


def _slim_replicaset(obj: dict[str, Any]) -> dict[str, Any] | None:
    """A ReplicaSet's identity and controller, for the ones a Deployment controls (a workload's pods)."""
    meta = _dict(obj.get("metadata"))
    owners = _controller_ref(meta)
    if not any(r.get("kind") == "Deployment" for r in owners):
        return None
    return {"metadata": {**{k: meta[k] for k in ("name", "namespace", "uid") if k in meta},
                         "ownerReferences": owners}}


WORKSPACE_STATUS = ("state", "pauseTime", "lastRunningTime")


def _slim_workspace(obj: dict[str, Any]) -> dict[str, Any]:
    """What the culler reads of a Workspace (Kubeflow Notebooks 2.0, kf_culler/targets/): identity, labels and
    annotations, `spec.paused`, its kind and chosen options, and the controller's state. Never its
    `status.activity`, which is the controller's own culling's."""
    meta, spec, status = (_dict(obj.get(k)) for k in ("metadata", "spec", "status"))
    options = _dict(_dict(spec.get("podTemplate")).get("options"))
    return {
        "apiVersion": obj.get("apiVersion", WORKSPACES.api_version), "kind": WORKSPACES.kind,
        "metadata": {k: meta[k] for k in NOTEBOOK_META if k in meta},
        "spec": {**{k: spec[k] for k in ("paused", "kind") if k in spec},
                 "podTemplate": {"options": _pick(options, ("imageConfig", "podConfig"))}},
        "status": _pick(status, WORKSPACE_STATUS),
    }


def _slim_workspace_kind(obj: dict[str, Any]) -> dict[str, Any]:
    """A WorkspaceKind's ports (ids, protocol, whether the app serves at `/`) and its images' port numbers:
    how a Workspace's IDE is reached (kf_culler/targets/ `workspace_port`)."""
    meta = _dict(obj.get("metadata"))
    template = _dict(_dict(obj.get("spec")).get("podTemplate"))
    ports = [{**_pick(p, ("id", "protocol")), "httpProxy": _pick(_dict(p).get("httpProxy"), ("removePathPrefix",))}
             for p in template.get("ports") or [] if isinstance(p, dict)]
    values = _dict(_dict(template.get("options")).get("imageConfig")).get("values")
    kept = [{"id": v.get("id"), "spec": {"ports": [_pick(q, ("id", "port")) for q in
                                                    _dict(v.get("spec")).get("ports") or [] if isinstance(q, dict)]}}
            for v in (values if isinstance(values, list) else []) if isinstance(v, dict)]
    return {"metadata": {"name": meta.get("name")},
            "spec": {"podTemplate": {"ports": ports, "options": {"imageConfig": {"values": kept}}}}}


def _slim_service(obj: dict[str, Any]) -> dict[str, Any] | None:
    """What kf_culler/kube/pairing.py `service_problem` reads of a Service: identity, controller, type,
    selector."""
    meta, spec = _dict(obj.get("metadata")), _dict(obj.get("spec"))
    return {"metadata": {**{k: meta[k] for k in ("name", "namespace") if k in meta},
                         "ownerReferences": _controller_ref(meta)},
            "spec": {k: spec[k] for k in ("type", "selector") if k in spec}}


def _slim_node(obj: dict[str, Any]) -> dict[str, Any] | None:
    """A Node's name and its GPU model label (rule 17); nothing else of a Node is read."""
    meta = _dict(obj.get("metadata"))
    labels = _dict(meta.get("labels"))
    kept = {GPU_MODEL_LABEL: labels[GPU_MODEL_LABEL]} if GPU_MODEL_LABEL in labels else {}
    return {"metadata": {"name": meta.get("name"), "labels": kept}}


def _pick(obj: object, keys: tuple[str, ...]) -> dict[str, Any]:
    d = _dict(obj)
    return {k: d[k] for k in keys if k in d}


def _slim_health(status: dict[str, Any]) -> dict[str, Any]:
    """What rule 14 (broken GPU notebooks) reads: the Ready condition and, per container, its restart
    count, why it waits, and when it last ended (kf_culler.session.pod_trouble)."""
    out: dict[str, Any] = {}
    conditions = status.get("conditions")
    ready = [_pick(c, ("type", "status", "lastTransitionTime")) for c in conditions
             if _dict(c).get("type") == "Ready"] if isinstance(conditions, list) else []
    if ready:
        out["conditions"] = ready
    statuses = status.get("containerStatuses")
    if isinstance(statuses, list):
        out["containerStatuses"] = [{
            **_pick(cs, ("name", "restartCount")),
            "state": {k: _pick(v, ("reason", "startedAt", "finishedAt", "exitCode"))
                      for k, v in _dict(_dict(cs).get("state")).items() if k in ("waiting", "running", "terminated")},
            "lastState": {k: _pick(v, ("reason", "finishedAt", "exitCode"))
                          for k, v in _dict(_dict(cs).get("lastState")).items() if k == "terminated"},
        } for cs in statuses if isinstance(cs, dict)]
    return out


def _key(obj: dict[str, Any]) -> Key:
    meta = obj.get("metadata") or {}
    return (str(meta.get("namespace", "")), str(meta.get("name", "")))


class _Collection:
    """One list+watch loop feeding a dict of objects."""

    def __init__(self, name: str, lister: Callable[..., Any], stop: threading.Event,
                 label_selector: str | None = None, watch_timeout: int = 240,
                 slim: Callable[[dict[str, Any]], dict[str, Any] | None] = _slim, optional: bool = False,
                 metadata_only: bool = False) -> None:
        self.name = name
        self.metadata_only = metadata_only
        # optional: a collection the culler works without (Nodes, when its RBAC has none): a 403 ends it.
        self.optional = optional
        self.forbidden = False
        self.slim = slim
        self.lister = lister
        self.stop = stop
        self.selector = label_selector
        self.watch_timeout = watch_timeout
        self.objects: dict[Key, dict[str, Any]] = {}
        self.lock = threading.Lock()
        self.synced = threading.Event()
        self.lists = 0
        self.watch_events = 0
        self.errors = 0
        self.thread = threading.Thread(target=self._run, name=f"watch-{name}", daemon=True)
        self.watch: Any = None  # the watch in progress, so close() can cut its connection

    def interrupt(self) -> None:
        """Cut the connection of the watch in progress (best effort; the thread then sees `stop`)."""
        resp = getattr(self.watch, "_resp", None)
        sock = getattr(getattr(resp, "connection", None), "sock", None)
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def _kwargs(self, accept: str = METADATA_LIST) -> dict[str, Any]:
        out: dict[str, Any] = {"label_selector": self.selector} if self.selector else {}
        if self.metadata_only:
            out["_headers"] = {"Accept": accept}
        return out

    def _list(self) -> str:
        """List in pages of LIST_PAGE objects, each page read as a stream and split into its objects as it
        comes (kf_culler/kube/liststream.py): one object is decoded at a time and slimmed at once, so neither a
        relist of 10,000 notebooks nor a tenant's hundreds of 1.5 MiB Notebooks is ever held whole.
        An expired continue token is a 410, which the loop answers with a fresh list.

        What a list decoded and dropped (each big object whole for a moment, the previous dict on a relist)
        is free C heap that glibc keeps; it is given back at the end of the list (kf_culler/memory.py), not at
        the end of the next pass, on top of which it would otherwise count (20 stopped Notebooks of 1.4 MiB
        left 11 MiB more resident after the sync, docs/performance.md)."""
        items: dict[Key, dict[str, Any]] = {}
        token = ""
        while True:
            kwargs = {**self._kwargs(), "limit": LIST_PAGE, **({"_continue": token} if token else {})}
            resp = self.lister(_preload_content=False, **kwargs)
            try:
                objects, page = list_items(resp.stream(STREAM_CHUNK))
                for o in objects:
                    kept = self.slim(o)
                    if kept is not None:
                        items[_key(o)] = kept
            finally:
                resp.release_conn()
            meta = page.rest().get("metadata") or {}
            token = str(meta.get("continue") or "")
            if not token:
                break
        with self.lock:
            self.objects = items
        release()
        self.lists += 1
        self.synced.set()
        return str(meta.get("resourceVersion", ""))

    def _run(self) -> None:
        from kubernetes import watch
        from kubernetes.client.rest import ApiException

        backoff = 0.5
        rv = ""
        while not self.stop.is_set():
            progressed = False  # whether this watch delivered anything before it ended or broke
            try:
                if not rv:
                    rv = self._list()
                w = self.watch = watch.Watch()
                for event in w.stream(self.lister, resource_version=rv, timeout_seconds=self.watch_timeout,
                                      allow_watch_bookmarks=True, deserialize=False,
                                      **self._kwargs(METADATA_WATCH)):
                    progressed = True
                    if self.stop.is_set():
                        w.stop()
                        break
                    kind, obj = event["type"], event["object"]
                    if kind == "ERROR":
                        rv = ""  # usually 410 Gone: relist
                        break
                    rv = str(obj.get("metadata", {}).get("resourceVersion", rv))
                    if kind == "BOOKMARK":
                        continue
                    self.watch_events += 1
                    kept = None if kind == "DELETED" else self.slim(obj)
                    with self.lock:
                        if kept is None:
                            self.objects.pop(_key(obj), None)
                        else:
                            self.objects[_key(obj)] = kept
                backoff = 0.5
            except ApiException as err:
                if self.stop.is_set():
                    return
                self.errors += 1
                if err.status == 410:
                    rv = ""
                    continue
                if err.status == 403 and self.optional:
                    self.forbidden = True
                    log.warning("watch %s refused (HTTP 403): working without it", self.name)
                    return
                log.warning("watch %s failed: %s; retrying", self.name, err.reason)
                rv = ""
                self.stop.wait(backoff)
                backoff = min(backoff * 2, 10)
            except Exception as err:  # connection lost, API server restarting, ...
                if self.stop.is_set():
                    return
                self.errors += 1
                if not progressed:
                    # A watch that fails before delivering anything is not worth resuming from the same
                    # resourceVersion: after an API server restart it is often too old (410), and with
                    # deserialize=False the client reports that ERROR event as a KeyError, not a 410.
                    rv = ""
                log.warning("watch %s broke (%s); %s", self.name, type(err).__name__,
                            "resuming" if rv else "listing again")
                self.stop.wait(backoff)
                backoff = min(backoff * 2, 10)

    def put(self, obj: dict[str, Any]) -> None:
        """Record an object the culler itself just wrote (the watch will confirm it)."""
        kept = self.slim(obj)
        with self.lock:
            if kept is not None:
                self.objects[_key(obj)] = kept

    def snapshot(self) -> dict[Key, dict[str, Any]]:
        with self.lock:
            return dict(self.objects)


class ClusterCache:
    """Notebooks and notebook pods, cluster-wide or for a fixed list of namespaces."""

    def __init__(self, api_client: Any, namespaces: tuple[str, ...] = (), records_namespace: str | None = None,
                 targets: tuple[str, ...] = (NOTEBOOKS.name,),
                 workloads: Callable[[dict[str, Any]], bool] | None = None,
                 workload_kinds: tuple[str, ...] = ("Deployment", "StatefulSet"),
                 coder_namespace: str | None = None) -> None:
        from kubernetes import client

        from kf_culler.kube.records import RECORDS_SELECTOR

        self.stop_event = threading.Event()
        custom = client.CustomObjectsApi(api_client)
        core = client.CoreV1Api(api_client)
        apps = client.AppsV1Api(api_client)
        self.notebooks: list[_Collection] = []
        self.workspaces: list[_Collection] = []  # Kubeflow Notebooks 2.0 (`targets: [workspaces]`)
        # Plain Deployments and StatefulSets (`targets: [workloads]`; `workloads` says which are sessions), and
        # the ReplicaSets between a Deployment and its pods.
        self.workloads: list[_Collection] = []
        self.replicasets: list[_Collection] = []
        on = workloads is not None and "workloads" in targets
        keep = workloads or (lambda _o: False)
        self.pods: list[_Collection] = []
        self.coder_namespace = coder_namespace  # `targets: [coder]`: its pods are kept (`coder_pods`)
        self.statefulsets: list[_Collection] = []
        self.services: list[_Collection] = []
        # The culler's own record (kf_culler/kube/records.py): ConfigMaps in its own namespace.
        self.records: list[_Collection] = [] if records_namespace is None else [_Collection(
            f"records/{records_namespace}", _bind(core.list_namespaced_config_map, records_namespace),
            self.stop_event, RECORDS_SELECTOR)]
        # Nodes for their GPU model (rule 17); optional: without the RBAC to read them, models come from the
        # notebook's template as before, and the culler says so once.
        self.nodes = _Collection("nodes", core.list_node, self.stop_event, slim=_slim_node, optional=True)
        ws = WORKSPACES
        if namespaces:
            for ns in namespaces:
                if NOTEBOOKS.name in targets:
                    self.notebooks.append(_Collection(
                        f"notebooks/{ns}", _bind(custom.list_namespaced_custom_object, GROUP, VERSION, ns, PLURAL),
                        self.stop_event, slim=_slim_notebook))
                if ws.name in targets:
                    self.workspaces.append(_Collection(
                        f"workspaces/{ns}", _bind(custom.list_namespaced_custom_object, ws.group, ws.version, ns,
                                                  ws.plural), self.stop_event, slim=_slim_workspace))
                self.pods.append(_Collection(f"pods/{ns}", _bind(core.list_namespaced_pod, ns),
                                             self.stop_event, slim=lambda o: _slim_pod(o, on, coder_namespace)))
                if on:
                    self._watch_workloads(custom, apps, ns, keep, workload_kinds)
                self.statefulsets.append(_Collection(f"statefulsets/{ns}", _bind(apps.list_namespaced_stateful_set, ns),
                                                     self.stop_event, slim=_slim_statefulset, metadata_only=True))
                self.services.append(_Collection(f"services/{ns}", _bind(core.list_namespaced_service, ns),
                                                 self.stop_event, slim=_slim_service))
        else:
            if NOTEBOOKS.name in targets:
                self.notebooks.append(_Collection(
                    "notebooks", _bind(custom.list_cluster_custom_object, GROUP, VERSION, PLURAL), self.stop_event,
                    slim=_slim_notebook))
            if ws.name in targets:
                self.workspaces.append(_Collection(
                    "workspaces", _bind(custom.list_cluster_custom_object, ws.group, ws.version, ws.plural),
                    self.stop_event, slim=_slim_workspace))
            self.pods.append(_Collection("pods", core.list_pod_for_all_namespaces, self.stop_event,
                                         slim=lambda o: _slim_pod(o, on, coder_namespace)))
            if on:
                self._watch_workloads(custom, apps, None, keep, workload_kinds)
            self.statefulsets.append(_Collection("statefulsets", apps.list_stateful_set_for_all_namespaces,
                                                 self.stop_event, slim=_slim_statefulset, metadata_only=True))
            self.services.append(_Collection("services", core.list_service_for_all_namespaces, self.stop_event,
                                             slim=_slim_service))
        # WorkspaceKinds (cluster-scoped, a handful): how each Workspace's IDE is reached.
        self.workspace_kinds: list[_Collection] = [_Collection(
            "workspacekinds", _bind(custom.list_cluster_custom_object, ws.group, ws.version, "workspacekinds"),
            self.stop_event, slim=_slim_workspace_kind)] if ws.name in targets else []
        # by (namespace, the controlling Workspace's uid)
        self._ws_services: dict[tuple[str, str], list[dict[str, Any]]] = {}
        self.orphans: list[Orphan] = []  # pods named like a notebook's that its StatefulSet does not control

    def _watch_workloads(self, custom: Any, apps: Any, ns: str | None, keep: Callable[[dict[str, Any]], bool],
                         kinds: tuple[str, ...]) -> None:
        """The collections of plain workloads in a namespace (None: cluster-wide)."""
        where = f"/{ns}" if ns else ""
        for target in WORKLOADS:
            if target.kind not in kinds:
                continue
            lister = (_bind(custom.list_namespaced_custom_object, target.group, target.version, ns, target.plural)
                      if ns else _bind(custom.list_cluster_custom_object, target.group, target.version,
                                       target.plural))
            self.workloads.append(_Collection(f"workloads/{target.plural}{where}", lister, self.stop_event,
                                              slim=_workload_slim(target.kind, keep)))
        if "Deployment" in kinds:
            lister = (_bind(apps.list_namespaced_replica_set, ns) if ns else apps.list_replica_set_for_all_namespaces)
            self.replicasets.append(_Collection(f"replicasets{where}", lister, self.stop_event,
                                                slim=_slim_replicaset, metadata_only=True))

    def _all(self) -> list[_Collection]:
        """The collections a pass needs synced (Nodes are optional: see `nodes`)."""
        return (self.notebooks + self.workspaces + self.workspace_kinds + self.workloads + self.replicasets
                + self.pods + self.statefulsets + self.services + self.records)

    def start(self) -> None:
        for c in [*self._all(), self.nodes]:
            c.thread.start()

    def wait_synced(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        return all(c.synced.wait(max(0.0, deadline - time.monotonic())) for c in self._all())

    @property
    def synced(self) -> bool:
        return all(c.synced.is_set() for c in self._all())

    def close(self) -> None:
        """Stop watching: the watch threads end and their connections close now, not at their timeout
        (an API server shutting down waits for open watches)."""
        self.stop_event.set()
        for c in [*self._all(), self.nodes]:
            c.interrupt()

    def snapshot(self) -> list[tuple[dict[str, Any], dict[str, Any] | None]]:
        """Every notebook with its pod, sorted: `<name>-0` owned by the StatefulSet `<name>` that the Notebook
        (by uid) controls, else None (kf_culler/kube/pairing.py). The pods that chain does not reach are kept
        in `orphans` until the next snapshot."""
        notebooks: dict[Key, dict[str, Any]] = {}
        for c in self.notebooks:
            notebooks.update(c.snapshot())
        statefulsets: dict[Key, dict[str, Any]] = {}
        for c in self.statefulsets:
            statefulsets.update(c.snapshot())
        pods: dict[Key, dict[str, Any]] = {}
        for c in self.pods:
            pods.update(c.snapshot())
        paired, self.orphans = pair(notebooks, statefulsets, pods)
        if self.workspaces:
            by_owner = owned_by(statefulsets, WORKSPACES.kind)  # by (namespace, Workspace uid)
            members = owned_by(pods, "StatefulSet")  # by (namespace, StatefulSet uid)
            services: dict[Key, dict[str, Any]] = {}
            for c in self.services:
                services.update(c.snapshot())
            self._ws_services = owned_by(services, WORKSPACES.kind)
            found: dict[Key, dict[str, Any]] = {}
            for c in self.workspaces:
                found.update(c.snapshot())
            # What each Workspace controls, counted on the culler's own copy (kf_culler/targets/
            # `workspace_tampered`): one with several StatefulSets or Services is one its controller cannot act on.
            paired += [({**w, CONTROLS_KEY: {"statefulSets": len(by_owner.get(owner_key(w), [])),
                                             "services": len(self._ws_services.get(owner_key(w), []))}},
                        workspace_pod(w, by_owner, pods, members)) for _, w in sorted(found.items())]
        if self.workloads:
            sets: dict[Key, dict[str, Any]] = {}
            for c in self.replicasets:
                sets.update(c.snapshot())
            pods_by_owner = {**owned_by(pods, "ReplicaSet"), **owned_by(pods, "StatefulSet")}
            by_deployment = owned_by(sets, "Deployment")
            # The sessions whose StatefulSet is theirs, not a workload: this cache's Notebooks, and its Workspaces
            # that control one StatefulSet (one with more is paired with the pod holding the most GPUs, and
            # every one of its StatefulSets stays a workload too).
            sessions = {owner_key(nb) for nb, _ in paired if target_of(nb) is NOTEBOOKS}
            workspaces = {owner_key(nb) for nb, _ in paired if target_of(nb) is WORKSPACES}
            ws_sets = owned_by(statefulsets, WORKSPACES.kind)
            sessions |= {key for key, owned in ws_sets.items() if len(owned) == 1 and key in workspaces}
            chosen: list[tuple[tuple[str, str, str], dict[str, Any]]] = []
            for c in self.workloads:
                chosen += [((k[0], str(o.get("kind")), k[1]), o) for k, o in c.snapshot().items()
                           if not session_statefulset(o, sessions, notebooks)]
            paired += [(w, workload_pod(w, by_deployment, pods_by_owner)) for _, w in sorted(chosen,
                                                                                           key=lambda x: x[0])]
        return paired

    def coder_pods(self) -> list[dict[str, Any]]:
        """The pods of the admin's Coder namespace labelled with a Coder workspace's id (`targets: [coder]`)."""
        if self.coder_namespace is None:
            return []
        return [p for c in self.pods for (ns, _), p in c.snapshot().items() if ns == self.coder_namespace
                and WORKSPACE_ID_LABEL in _dict(_dict(p.get("metadata")).get("labels"))]

    def workspace_endpoint(self, ws: dict[str, Any]) -> tuple[str, int, str] | str:
        """(Service name, port, path) of a Workspace's IDE as of the last snapshot, or why it cannot be reached
        safely: its own Service (kf_culler/targets/ `workspace_service`), the port its WorkspaceKind gives, the
        connect path unless the kind serves the port at `/`."""
        svc, why = workspace_service(ws, self._ws_services)
        if svc is None:
            return str(why)
        kind_name = str((ws.get("spec") or {}).get("kind"))
        kind = None
        for c in self.workspace_kinds:
            with c.lock:
                kind = c.objects.get(("", kind_name), kind)
        port = workspace_port(ws, kind)
        if port is None:
            return f"its WorkspaceKind {kind_name[:63]!r} gives no HTTP port for its image"
        port_id, number, at_root = port
        meta = ws.get("metadata") or {}
        path = "/" if at_root else CONNECT_PREFIX.format(namespace=meta.get("namespace"), name=meta.get("name"),
                                                         port_id=port_id)
        return str((svc.get("metadata") or {}).get("name")), number, path

    def service_problem(self, notebook: dict[str, Any]) -> str | None:
        """Why the notebook's (or a workload's) Service `<name>` cannot be trusted to reach its own pod
        (kube/pairing.py, kf_culler/targets/), or None."""
        meta = notebook.get("metadata") or {}
        key = (str(meta.get("namespace")), str(meta.get("name")))
        found = None
        for c in self.services:
            with c.lock:
                found = c.objects.get(key, found)
        if target_of(notebook) in WORKLOADS:
            return workload_service_problem(notebook, found)
        return service_problem(notebook, found)

    def node(self, name: object) -> dict[str, Any] | None:
        """The cached Node (its GPU model label), or None when unknown or Nodes cannot be read."""
        if not isinstance(name, str) or not name:
            return None
        with self.nodes.lock:
            return self.nodes.objects.get(("", name))

    @property
    def reads_nodes(self) -> bool:
        return self.nodes.synced.is_set() and not self.nodes.forbidden

    def record_objects(self) -> list[dict[str, Any]]:
        """The ConfigMaps that hold the culler's records, as the watch has them."""
        return [cm for c in self.records for cm in c.snapshot().values()]

    def record_notebook(self, obj: dict[str, Any]) -> None:
        """Keep a session as the culler's own patch left it (the watch will confirm it)."""
        ns = _key(obj)[0]
        target = target_of(obj)
        if target in WORKLOADS:
            for c in self.workloads:
                if c.name in (f"workloads/{target.plural}", f"workloads/{target.plural}/{ns}"):
                    c.put(obj)
            return
        for c in self.workspaces if target is WORKSPACES else self.notebooks:
            if c.name in (target.plural, f"{target.plural}/{ns}"):
                c.put(obj)

    def stats(self) -> dict[str, int]:
        cols = self._all()
        return {"lists": sum(c.lists for c in cols), "watchEvents": sum(c.watch_events for c in cols),
                "watchErrors": sum(c.errors for c in cols)}


def _bind(fn: Callable[..., Any], *args: Any) -> Callable[..., Any]:
    def call(**kwargs: Any) -> Any:
        return fn(*args, **kwargs)

    return call  # no docstring: kubernetes.watch then leaves objects as plain dicts
