"""What the culler reads of the API objects its targets watch: each projection keeps those fields and drops
the rest, so the cache (kf_culler/kube/cache.py) holds, of 10,000 pods, StatefulSets and Services, what the
rules, the pairing and the writer read and nothing else. The projections of the objects several targets
watch (pods, StatefulSets, Services) are here; each target module has those of its own sessions.
tests/test_cache_fields.py checks that every rule decides the same on the projections as on the whole objects.

A string that thousands of objects repeat is kept once (`sys.intern`): a namespace, a kind, an apiVersion, a
resource name, the names, uids and labels that a Notebook, its StatefulSet, pod and Service repeat (a
decoded JSON answer makes a new string of each), and the keys of annotations. The cache holds each object
encoded (`marshal`, kf_culler/kube/cache.py), which marks those strings, so each decoding shares them again
with what is decoded beside it. Pure."""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from typing import Any

from kf_culler.targets.base import Watched, _dict

Projection = Callable[[dict[str, Any]], "dict[str, Any] | None"]
POD_META = ("name", "namespace", "uid", "resourceVersion", "labels", "deletionTimestamp")
CONTAINER_KEYS = ("name", "image", "resources")
INIT_CONTAINER_KEYS = ("name", "image", "resources", "restartPolicy")
SESSION_META = ("name", "namespace", "uid", "resourceVersion", "generation", "creationTimestamp",
                "deletionTimestamp", "labels", "annotations")
SHORT = 253  # the longest name; a longer string is not looked for elsewhere


def _interning_frees() -> bool:
    """Whether an interned string is freed with its last reference (Python 3.11 and 3.13; on 3.12 every interned
    string lives as long as the process)."""
    probe = sys.intern("".join(("kf-culler:", "interned")))
    return sys.getrefcount(probe) < 1 << 24


# Tenants write the labels and annotations kept once here: where an interned string is never freed, a user who keeps
# writing new keys would grow the culler's memory for good, so there each object keeps its own strings.
INTERN = _interning_frees()


def shared(value: Any) -> Any:
    """The one copy of a string many objects repeat (itself where interning never frees, `INTERN`)."""
    return sys.intern(value) if INTERN and type(value) is str and len(value) <= SHORT else value


def strings(value: Any, depth: int = 2) -> Any:
    """A map of strings (labels, a selector, a container's resources: maps of maps) with its keys and values
    kept once each."""
    if type(value) is dict and depth > 0:
        return {shared(k): strings(v, depth - 1) for k, v in value.items()}
    return shared(value)


def annotation_strings(value: Any) -> Any:
    """Annotations with each key kept once, and each value as short as a server type or a flag ("jupyter",
    "true"); a longer value (a time, a message) is the session's own, not looked for elsewhere. A pass holds the
    annotations of every session it chose from its select phase to its act phase: ten thousand copies of the
    same few keys, each decoded again from the cache's bytes, before."""
    if type(value) is not dict:
        return value
    return {shared(k): shared(v) if type(v) is str and len(v) <= SHORT_VALUE else v for k, v in value.items()}


SHORT_VALUE = 16
# Keys whose values other objects repeat: kept once (`shared`); labels and selectors (`strings`); annotations'
# keys (`annotation_strings`).
_SHARED = frozenset(("namespace", "apiVersion", "kind", "name", "uid", "type"))
_MAPS = frozenset(("labels", "selector", "resources"))


def pick(obj: object, keys: tuple[str, ...]) -> dict[str, Any]:
    d = _dict(obj)
    return {k: (shared(d[k]) if k in _SHARED else strings(d[k]) if k in _MAPS
                else annotation_strings(d[k]) if k == "annotations" else d[k]) for k in keys if k in d}


def controller_ref(meta: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The controller ownerReference alone (pairing reads nothing else of the owners)."""
    refs = meta.get("ownerReferences")
    return [pick(r, ("apiVersion", "kind", "name", "uid", "controller"))
            for r in (refs if isinstance(refs, list) else []) if isinstance(r, dict) and r.get("controller") is True]


def containers_fields(pod_spec: Mapping[str, Any]) -> dict[str, Any]:
    """A pod spec's containers and init containers, each with only what the culler reads (a GPU request, an
    init container's restartPolicy: rule 17)."""
    def some(key: str, keys: tuple[str, ...]) -> list[dict[str, Any]]:
        found = pod_spec.get(key)
        return [pick(c, keys) for c in (found if isinstance(found, list) else []) if isinstance(c, dict)]

    out: dict[str, Any] = {"containers": some("containers", CONTAINER_KEYS)}
    if isinstance(pod_spec.get("initContainers"), list):
        out["initContainers"] = some("initContainers", INIT_CONTAINER_KEYS)
    return out


def health_fields(status: Mapping[str, Any]) -> dict[str, Any]:
    """What rule 14 (broken GPU notebooks) reads: the Ready condition and, per container, its restart
    count, why it waits, and when it last ended (kf_culler.session.pod_trouble)."""
    out: dict[str, Any] = {}
    conditions = status.get("conditions")
    ready = [pick(c, ("type", "status", "lastTransitionTime")) for c in conditions
             if _dict(c).get("type") == "Ready"] if isinstance(conditions, list) else []
    if ready:
        out["conditions"] = ready
    statuses = status.get("containerStatuses")
    if isinstance(statuses, list):
        out["containerStatuses"] = [{
            **pick(cs, ("name", "restartCount")),
            "state": {k: pick(v, ("reason", "startedAt", "finishedAt", "exitCode"))
                      for k, v in _dict(_dict(cs).get("state")).items() if k in ("waiting", "running", "terminated")},
            "lastState": {k: pick(v, ("reason", "finishedAt", "exitCode"))
                          for k, v in _dict(_dict(cs).get("lastState")).items() if k == "terminated"},
        } for cs in statuses if isinstance(cs, dict)]
    return out


def pod_fields(obj: dict[str, Any]) -> dict[str, Any]:
    """The parts of a pod the culler reads (identity, labels and its controller, containers' and init
    containers' images and resources, the node, phase and start time, the Ready condition and the
    containers' restarts and states). A notebook pod with its sidecars, env and volumes is many kilobytes of
    JSON; 10,000 of them whole would be most of the culler's memory."""
    meta, spec, status = (_dict(obj.get(k)) for k in ("metadata", "spec", "status"))
    pod_spec = containers_fields(spec)
    if "nodeName" in spec:
        pod_spec["nodeName"] = spec["nodeName"]
    slim_meta = pick(meta, POD_META)
    owners = controller_ref(meta)
    if owners:
        slim_meta["ownerReferences"] = owners
    return {
        "apiVersion": shared(obj.get("apiVersion", "v1")), "kind": shared(obj.get("kind", "Pod")),
        "metadata": slim_meta, "spec": pod_spec,
        "status": {**{k: status[k] for k in ("phase", "startTime") if k in status}, **health_fields(status)},
    }


def controlled_pod(kinds: tuple[str, ...]) -> Callable[[Mapping[str, Any]], bool]:
    """Pods controlled by an object of one of `kinds`, or named like a StatefulSet's first pod (a notebook's
    pod taken from its StatefulSet is still `<name>-0`; kf_culler/targets/pairing.py reports it)."""
    def keep(obj: Mapping[str, Any]) -> bool:
        meta = _dict(obj.get("metadata"))
        return any(r.get("kind") in kinds for r in controller_ref(meta)) or str(meta.get("name", "")).endswith("-0")

    return keep


def owner_fields(obj: dict[str, Any]) -> dict[str, Any]:
    """An object's identity and controller, all that pairing reads of a StatefulSet: every one is kept,
    whatever its ownerReferences (Kubeflow's notebook-controller scales the StatefulSet named like the Notebook
    whether or not it still names the Notebook as its controller, kf_culler/targets/pairing.py; those a
    Workspace controls are found by owner)."""
    meta = _dict(obj.get("metadata"))
    return {"metadata": {**pick(meta, ("name", "namespace", "uid")), "ownerReferences": controller_ref(meta)}}


def service_fields(obj: dict[str, Any]) -> dict[str, Any]:
    """What the Service checks read (kf_culler/targets/pairing.py `service_problem`, `workspace_service`,
    `workload_service_problem`): identity, controller, type, selector; and the ClusterIP the probes connect to
    (`cluster_ip`)."""
    meta, spec = _dict(obj.get("metadata")), _dict(obj.get("spec"))
    return {"metadata": {**pick(meta, ("name", "namespace")), "ownerReferences": controller_ref(meta)},
            "spec": {k: shared(spec[k]) if k == "type" else spec[k] for k in ("type", "selector", "clusterIP")
                     if k in spec}}


def template_fields(obj: dict[str, Any], api_version: str, kind: str) -> dict[str, Any]:
    """The parts of a session with a pod template that the culler reads (kf_culler/session.py
    `SessionView`, the plan, the writer): identity and resourceVersion, labels and annotations (the API
    server bounds them at 256 KiB), the pod template's containers' and init containers' images and resources,
    its node selection and its claims' names (`kf_culler/stopped.py`), and the status the web app shows. A
    user's Notebook can be megabytes of spec (env, volumes, commands): kept whole, thirty stopped ones crashed
    the culler at its list; projected, each costs what these fields cost."""
    meta, spec, status = (_dict(obj.get(k)) for k in ("metadata", "spec", "status"))
    template = _dict(spec.get("template"))
    pod_spec = _dict(template.get("spec"))
    slim_spec = containers_fields(pod_spec)
    affinity = _dict(pod_spec.get("affinity"))
    if "nodeAffinity" in affinity:
        slim_spec["affinity"] = {"nodeAffinity": affinity["nodeAffinity"]}
    if "nodeSelector" in pod_spec:
        slim_spec["nodeSelector"] = pod_spec["nodeSelector"]
    found = pod_spec.get("volumes")
    claims = [{"name": v.get("name"), "persistentVolumeClaim": pick(v.get("persistentVolumeClaim"), ("claimName",))}
              for v in (found if isinstance(found, list) else [])
              if isinstance(v, dict) and isinstance(v.get("persistentVolumeClaim"), dict)]
    if claims:
        slim_spec["volumes"] = claims  # the long-stopped report names the claims a stopped notebook keeps
    out: dict[str, Any] = {
        "apiVersion": shared(obj.get("apiVersion", api_version)), "kind": shared(obj.get("kind", kind)),
        "metadata": pick(meta, SESSION_META),
        "spec": {"template": {"spec": slim_spec}},
    }
    if status:
        out["status"] = {k: status[k] for k in ("readyReplicas", "containerState") if k in status}
    return out


# What the targets whose pod is a StatefulSet's read besides their own sessions: the StatefulSets (metadata
# only: the API server never sends their pod template, which the notebook-controller copies from the Notebook),
# their pods, and the Services.
STATEFULSET_PODS = Watched("pods", "", "v1", "pods", pod_fields, keep=controlled_pod(("StatefulSet",)))
STATEFULSETS_METADATA = Watched("statefulsets", "apps", "v1", "statefulsets", owner_fields, metadata_only=True)
SERVICES = Watched("services", "", "v1", "services", service_fields)
