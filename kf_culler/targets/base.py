"""What every target is: the descriptor (`Target`), what it asks the watch cache for (`Watched`, `Scope`) and
what the cache hands its pairing (`Seen`), a session's key (`SessionKey`) and the helpers over API objects that
several targets share (ownership, a pod's GPUs). Pure: a target describes, kf_culler/kube/cache.py lists and
watches."""

from __future__ import annotations

import contextlib
import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple

from kf_culler.errors import InputError

Key = tuple[str, str]
OwnerKey = tuple[str, str]  # (namespace, the owner's uid): an owner is in its dependents' namespace
# The kind whose sessions a pass names by their bare name (v1 Notebooks, the first target), and the kind of an
# object that has none (a scenario's notebook, a replayed trace).
BARE_KIND = "Notebook"
# How a session's IDE is reached (kf_culler/cycle.py picks the URL by it): through the Service named like the
# session with the admin's per-IDE template (`service`), through the endpoint its controller made (`endpoint`),
# through the Service named like it with `urls.workload` (`workload`), or not probed: its signal comes with the
# session's own listing (`carried`).
Reach = Literal["service", "endpoint", "workload", "carried"]


Item = tuple[dict[str, Any], "dict[str, Any] | None"]  # a session and its pod (None: it has none)


@dataclass(frozen=True)
class Watched:
    """A collection a target asks the watch cache to list and watch (kf_culler/kube/cache.py does the I/O, in
    every namespace the culler reads or cluster-wide): the API path's parts, and what of each object is kept.
    Targets that ask for one collection (by `name`) ask for it alike; the cache keeps an object any of their
    `keep` takes."""

    name: str  # how pairing names it (`Seen`): "pods", "statefulsets", "services", a target's own sessions...
    group: str  # "" for the core API (/api/v1)
    version: str
    plural: str
    # What of each object is kept (kf_culler/targets/fields.py): None drops the object.
    project: Callable[[dict[str, Any]], dict[str, Any] | None]
    keep: Callable[[Mapping[str, Any]], bool] | None = None  # which objects are kept (None: every one)
    metadata_only: bool = False  # only metadata is read: listed and watched as PartialObjectMetadata
    cluster_scoped: bool = False
    # The kind of the sessions it holds, for a target's own (a session the culler writes is kept as written).
    session_kind: str | None = None


@dataclass(frozen=True)
class Scope:
    """What of the admin's configuration decides what the targets watch: the workload kinds and which
    workloads are sessions (`targets: [workloads]`), and the Coder namespace (`targets: [coder]`)."""

    workload_kinds: tuple[str, ...] = ()
    selects_workload: Callable[[dict[str, Any]], bool] = lambda _obj: False
    coder_namespace: str | None = None


@dataclass
class Seen:
    """What the watch cache holds at one snapshot, for the targets' pairing: each collection (`Watched.name`)
    as (namespace, name) -> object, the sessions paired so far (a target pairs after the ones before it in
    the registry), and the owner indexes pairing asks for, each made once. `now` reads an object as the cache
    has it now (a Service or WorkspaceKind changed since the snapshot)."""

    collections: Mapping[str, Mapping[Key, dict[str, Any]]] = field(default_factory=dict)
    now: Callable[[str, Key], dict[str, Any] | None] = lambda _name, _key: None
    paired: list[Item] = field(default_factory=list)
    _owned: dict[tuple[str, str], dict[OwnerKey, list[dict[str, Any]]]] = field(default_factory=dict)

    def __getitem__(self, name: str) -> Mapping[Key, dict[str, Any]]:
        return self.collections.get(name, {})

    def owned_by(self, name: str, kind: str) -> dict[OwnerKey, list[dict[str, Any]]]:
        """The collection's objects controlled by an object of `kind` (`owned_by`), made once per snapshot."""
        found = self._owned.get((name, kind))
        if found is None:
            found = self._owned[(name, kind)] = owned_by(self[name], kind)
        return found


class Pairing(NamedTuple):
    """A target's sessions with their pods, sorted, and the pods that look like a session's but that its stop
    cannot reach (kf_culler/targets/pairing.py `Orphan`). `items` may be made as it is read (a Notebook's pairing):
    `orphans` is then complete once every item is read."""

    items: Iterable[Item]
    orphans: Sequence[Any] = ()


class UnknownKind(InputError):
    """An object of a kind no target handles: refused, never taken as another kind's session."""


def _dict(value: object) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


@dataclass(frozen=True)
class Target(ABC):
    """One kind of session: how the culler lists, reads, stops and tells about it. Each target module makes
    one (or, for workloads, one per API kind); kf_culler/targets/__init__.py lists them."""

    name: str  # as configuration names it: `targets: [notebooks, workspaces]`
    kind: str  # the API kind of its sessions
    group: str
    version: str
    plural: str
    route: str  # the verdict API's resource for its sessions: /api/v1/namespaces/<ns>/<route>/<name>
    rbac: str | None  # its RBAC component under kustomize/components (None: in the base)
    reach: Reach
    where_to_start: str  # where its user starts it again, in a notice
    stop_field: str | None = None  # the `spec` field its stop writes (a guarded patch tests it); None: none
    stop_is_annotation: bool = False  # its stop is `kubeflow-resource-stopped` (GPU-hours, long-stopped counts)
    paired_by_name: bool = False  # its pod is `<name>-0` of the StatefulSet `<name>` (orphans are told on it)
    old_marks: bool = False  # the culler's old per-object marks were written on it (imported once)
    server_type: str | None = None  # its only IDE (Coder's), whatever the object says; None: by rule 4
    image_from_pod: bool = False  # its IDE image is read from its pod (it has no pod template of its own)

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}"

    @abstractmethod
    def is_stopped(self, obj: Mapping[str, Any]) -> bool:
        """Whether the session is stopped, by this target's meaning."""

    @abstractmethod
    def stop_body(self, obj: Mapping[str, Any], annotations: Mapping[str, str | None]) -> dict[str, Any]:
        """The merge patch that writes a plan's annotations (a stop included) on the session."""

    @abstractmethod
    def start_command(self, namespace: str, name: str) -> str:
        """The command its user runs to start it again."""

    @abstractmethod
    def keep_command(self, namespace: str, name: str, until: str) -> str | None:
        """The command its user runs to keep it until `until` (None: none exists)."""

    def watches(self, scope: Scope) -> tuple[Watched, ...]:
        """The collections the watch cache lists and watches for this target's sessions (none: its sessions are
        not Kubernetes objects)."""
        return ()

    def pair(self, seen: Seen) -> Pairing:
        """Each of its sessions the cache holds with its pod (or None), sorted."""
        return Pairing([])

    def service_problem(self, session: Mapping[str, Any], seen: Seen) -> str | None:
        """Why the Service its IDE is probed through cannot be trusted to reach its own pod, or None."""
        return None

    def service_address(self, session: Mapping[str, Any], seen: Seen) -> tuple[str, str] | None:
        """(the name, the ClusterIP) of the Service its IDE is probed through, once that Service passed its checks
        (`service_problem`, `endpoint`): the probes connect to that address rather than look the name up in DNS
        (`probe.serviceClusterIP`). None: the name is looked up."""
        return None

    def endpoint(self, session: Mapping[str, Any], seen: Seen) -> tuple[str, int, str] | str:
        """(Service name, port, path) of its IDE when its controller made the endpoint (`reach` "endpoint"), or
        why it cannot be reached safely."""
        return "this kind of session is not reached through an endpoint of its controller"

    def tampered(self, obj: Mapping[str, Any]) -> str | None:
        """Why its controller cannot act on it, or None."""
        return None

    def carried(self, obj: Mapping[str, Any]) -> Any:
        """Its IDE's reading as its listing carried it (`reach` "carried"): the observation of its source."""
        return {"error": "this kind of session carries no reading"}

    def reclaim(self, pod: Mapping[str, Any]) -> tuple[str, str, str] | None:
        """(kind, name, uid) of what the culler may scale to 0 when its stop did not take and `pod` still runs
        (kf_culler/rules/untaken.py), or None: report only."""
        return None


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
        return cls(namespace, name if kind == BARE_KIND else f"{kind}/{name}")

    @classmethod
    def parse(cls, text: str) -> SessionKey | None:
        """From `NAMESPACE/NAME` (a Notebook) or `NAMESPACE/KIND/NAME`; None without a namespace or a name."""
        namespace, _, name = text.partition("/")
        return cls(namespace, name) if namespace and name else None

    @property
    def kind(self) -> str:
        """The session's API kind (a Notebook when the pass name has no kind)."""
        kind, sep, _ = self.name.partition("/")
        return kind if sep else BARE_KIND

    @property
    def object_name(self) -> str:
        """The name of the session's object (without its kind)."""
        _, sep, plain = self.name.partition("/")
        return plain if sep else self.name

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


def kind_of(obj: Mapping[str, Any]) -> str:
    """The object's `kind` (set by the API server; a user cannot change it); a v1 Notebook when it has none."""
    return str(obj.get("kind") or "") or BARE_KIND


def session_key(obj: Mapping[str, Any]) -> SessionKey:
    """The session's key in a pass (`SessionKey`): (namespace, name) for a Notebook, (namespace,
    `Workspace/<name>`) for a Workspace, so a Notebook and a Workspace of one name are two sessions."""
    if not isinstance(obj, Mapping):  # not an object at all: deciding it says so
        return SessionKey("None", "None")
    meta = _dict(obj.get("metadata"))
    return SessionKey.of(str(meta.get("namespace")), kind_of(obj), str(meta.get("name")))


def controller_of(obj: Mapping[str, Any]) -> tuple[str, str, str] | None:
    """(kind, name, uid) of the object's controller ownerReference, if it has one."""
    refs = _dict(obj.get("metadata")).get("ownerReferences")
    for ref in refs if isinstance(refs, list) else []:
        if isinstance(ref, dict) and ref.get("controller") is True:
            return str(ref.get("kind")), str(ref.get("name")), str(ref.get("uid"))
    return None


def identity(session: Mapping[str, Any]) -> dict[str, Any]:
    """What is read of a session once a lean pass has it (kf_culler/runner.py, kf_culler/kube/cache.py): its
    apiVersion, kind, and its name, namespace, uid and resourceVersion (the records kept, the Events about orphaned
    pods, the namespaces with sessions, the workloads' pairing after the sessions paired before them)."""
    meta = _dict(session.get("metadata"))
    out: dict[str, Any] = {k: session[k] for k in ("apiVersion", "kind") if k in session}
    out["metadata"] = {k: meta[k] for k in ("name", "namespace", "uid", "resourceVersion") if k in meta}
    return out


def uid_of(obj: Mapping[str, Any]) -> str:
    return str(_dict(obj.get("metadata")).get("uid") or "")


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


def gpus_asked(pod: Mapping[str, Any]) -> float:
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


def running(pod: Mapping[str, Any]) -> bool:
    return _dict(pod.get("status")).get("phase") == "Running" and not _dict(pod.get("metadata")).get(
        "deletionTimestamp")


def statefulset_member(pod: Mapping[str, Any], name: str) -> bool:
    """Whether the pod is named as a member of the StatefulSet `name` is: `<name>-<ordinal>`."""
    pod_name = str(_dict(pod.get("metadata")).get("name"))
    ordinal = pod_name.removeprefix(f"{name}-")
    return ordinal != pod_name and ordinal.isascii() and ordinal.isdigit() and ordinal == str(int(ordinal))
