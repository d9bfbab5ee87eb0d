"""One notebook's facts, unwrapped once from the API objects: `SessionView`.

The Notebook and its pod arrive as untrusted JSON; every reading of them (metadata, annotations,
containers, GPU count, server type, pod start) lives here, so each layer sees the same facts.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from kf_culler.config import GPU_MODEL_LABEL, Policy
from kf_culler.ide import DEFAULT_SERVER_TYPE, NOTEBOOK_SERVER_TYPES
from kf_culler.model import SERVER_TYPE_ANNOTATION, InputError
from kf_culler.record import CullerRecord
from kf_culler.targets import BARE_KIND, SessionKey, target_of
from kf_culler.timeutil import parse_time

MAX_GPUS = 1 << 20  # a sum of huge requests stays a finite count

# The sets of resource names views hold, one object each (a fleet asks for a handful: `cpu`, `memory`, a GPU), so
# that a pass holding 10,000 views holds a few sets, not 10,000; at most SHARED_SETS of them, then new ones are
# not shared (a tenant naming resources at random cannot grow it).
SHARED_SETS = 256
_shared_sets: dict[frozenset[str], frozenset[str]] = {}


def shared_set(names: frozenset[str]) -> frozenset[str]:
    """`names`, or the equal set already shared."""
    found = _shared_sets.get(names)
    if found is not None:
        return found
    if len(_shared_sets) < SHARED_SETS:
        _shared_sets[names] = names
    return names


def as_dict(value: object) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def metadata_of(obj: object) -> dict[str, Any]:
    """An object's metadata; {} when it has none or it is not an object."""
    return as_dict(as_dict(obj).get("metadata"))


def annotations_of(obj: object) -> dict[str, Any]:
    """An object's annotations, leniently: {} when any level is missing or not an object."""
    return as_dict(metadata_of(obj).get("annotations"))


def checked_annotations(notebook: dict[str, Any]) -> dict[str, Any]:
    """The notebook's annotations; InputError when metadata or annotations are not objects."""
    meta = notebook.get("metadata")
    if meta is None:
        return {}
    if not isinstance(meta, dict):
        raise InputError("notebook.metadata is not an object")
    ann = meta.get("annotations") or {}
    if not isinstance(ann, dict):
        raise InputError("notebook.metadata.annotations is not an object")
    return ann


def containers(obj: object, *path: str) -> list[dict[str, Any]]:
    """The container objects at path (others are skipped); [] when the path does not lead to a list."""
    cur: Any = obj
    for key in path:
        cur = cur.get(key) if isinstance(cur, dict) else None
    return [c for c in cur if isinstance(c, dict)] if isinstance(cur, list) else []


def template_containers(notebook: object) -> list[dict[str, Any]]:
    return containers(notebook, "spec", "template", "spec", "containers")


def pod_containers(pod: object) -> list[dict[str, Any]]:
    return containers(pod, "spec", "containers")


def _quantity(value: object) -> float:
    """A plain resource count (units and garbage count as 0); an infinite one is capped, NaN is 0."""
    try:
        number = float(str(value))
    except ValueError:
        return 0.0
    if math.isnan(number):
        return 0.0
    return min(number, MAX_GPUS)


def _pod_spec_containers(notebook: dict[str, Any], pod: dict[str, Any] | None
                         ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(containers, initContainers) of the pod, or of the notebook's pod template when there is no pod."""
    if pod:
        found = pod_containers(pod), containers(pod, "spec", "initContainers")
        if found[0] or found[1]:
            return found
    return (template_containers(notebook),
            containers(notebook, "spec", "template", "spec", "initContainers"))


def _container_amount(c: dict[str, Any], resources: tuple[str, ...]) -> float:
    """What one container asks of the resources: its limit, else its request (extended resources such as
    GPUs must have both equal when both are given)."""
    res = as_dict(c.get("resources"))
    for kind in ("limits", "requests"):
        q = as_dict(res.get(kind))
        n = max((_quantity(q.get(r, 0)) for r in resources), default=0.0)
        if n > 0:
            return n
    return 0.0


def _is_sidecar(c: dict[str, Any]) -> bool:
    """An init container that runs beside the others for the pod's life (a native sidecar)."""
    return c.get("restartPolicy") == "Always"


def effective_amount(main: list[dict[str, Any]], init: list[dict[str, Any]], resources: tuple[str, ...]) -> float:
    """The pod's effective request of the resources, as the scheduler counts it (rule 17): the containers plus
    every native sidecar, or, when larger, what one ordinary init container needs beside the sidecars started
    before it."""
    sidecars = 0.0
    peak_init = 0.0
    for c in init:
        n = _container_amount(c, resources)
        if _is_sidecar(c):
            sidecars += n
        else:
            peak_init = max(peak_init, sidecars + n)
    running = sum(_container_amount(c, resources) for c in main) + sidecars
    return max(running, peak_init)


def gpu_count(notebook: dict[str, Any], pod: dict[str, Any] | None, resources: tuple[str, ...]) -> int:
    """GPUs the pod (or, without a pod, the notebook template) holds: every container's, native sidecars
    included (rule 17)."""
    main, init = _pod_spec_containers(notebook, pod)
    return int(min(effective_amount(main, init, resources), MAX_GPUS))


def requested_resources(notebook: dict[str, Any], pod: dict[str, Any] | None) -> frozenset[str]:
    """The resource names the pod (or, without a pod, the notebook template) asks for a positive amount of,
    in any container, init containers included."""
    main, init = _pod_spec_containers(notebook, pod)
    names: set[str] = set()
    for c in main + init:
        res = as_dict(c.get("resources"))
        for kind in ("limits", "requests"):
            names.update(str(k) for k, v in as_dict(res.get(kind)).items() if _quantity(v) > 0)
    return shared_set(frozenset(names))


def string_labels(obj: object) -> dict[str, str]:
    """An object's labels whose keys and values are strings (others are skipped)."""
    labels = as_dict(metadata_of(obj).get("labels"))
    return {k: v for k, v in labels.items() if isinstance(k, str) and isinstance(v, str)}


def node_gpu_model(node: object) -> tuple[str, ...]:
    """The GPU model of a Node, from GPU feature discovery's label (rule 17); () when it has none."""
    model = string_labels(node).get(GPU_MODEL_LABEL)
    return (model,) if model else ()


def gpu_models(notebook: object) -> tuple[str, ...]:
    """The GPU models the notebook's pod template asks for: the value of `nvidia.com/gpu.product` in its
    nodeSelector, and the values of `In` terms on that key in its required node affinity. Only used while
    the pod's Node is not known: a user may choose a node by any other label (rule 17)."""
    spec = as_dict(as_dict(as_dict(notebook).get("spec")).get("template"))
    pod_spec = as_dict(spec.get("spec"))
    models: list[str] = []
    chosen = as_dict(pod_spec.get("nodeSelector")).get(GPU_MODEL_LABEL)
    if isinstance(chosen, str):
        models.append(chosen)
    required = as_dict(as_dict(as_dict(pod_spec.get("affinity")).get("nodeAffinity")).get(
        "requiredDuringSchedulingIgnoredDuringExecution"))
    terms = required.get("nodeSelectorTerms")
    for term in terms if isinstance(terms, list) else []:
        exprs = as_dict(term).get("matchExpressions")
        for e in exprs if isinstance(exprs, list) else []:
            e = as_dict(e)
            values = e.get("values")
            if e.get("key") == GPU_MODEL_LABEL and e.get("operator") == "In" and isinstance(values, list):
                models.extend(v for v in values if isinstance(v, str))
    return tuple(dict.fromkeys(models))


def declared_server_type(notebook: dict[str, Any]) -> str | None:
    """The server-type annotation as written, when it is set to a string."""
    value = checked_annotations(notebook).get(SERVER_TYPE_ANNOTATION)
    return value if isinstance(value, str) and value else None


def server_type(notebook: dict[str, Any], policy: Policy, pod: dict[str, Any] | None = None) -> str:
    """The server type the culler treats the notebook as (rule 4): the annotation's known value, else the
    first container's image rule (a Workspace has no pod template of its own: its pod's), else Jupyter. An
    unknown annotation value is Jupyter, Kubeflow's default (rule 16): writing another value never turns the
    probe off. A Coder workspace is always Coder, and nothing else can be (kf_culler/ide.py)."""
    target = target_of(notebook)
    if target.server_type is not None:
        return target.server_type
    value = declared_server_type(notebook)
    if value is not None:
        return value if value in NOTEBOOK_SERVER_TYPES else DEFAULT_SERVER_TYPE
    first = pod_containers(pod) if target.image_from_pod else template_containers(notebook)
    for c in first[:1]:
        image = c.get("image")
        if isinstance(image, str):
            found = policy.server_type_for_image(image)
            if found in NOTEBOOK_SERVER_TYPES:
                return found
    return DEFAULT_SERVER_TYPE


def pod_deleting(pod: object) -> bool:
    return bool(metadata_of(pod).get("deletionTimestamp"))


def running_since(pod: object) -> datetime | None:
    """The pod's start time when its phase is Running, else None."""
    status = as_dict(pod).get("status")
    if not isinstance(status, dict) or status.get("phase") != "Running":
        return None
    return parse_time(status.get("startTime"))


@dataclass(frozen=True)
class PodTrouble:
    """Why a pod cannot serve, as one pod object shows it (rule 14): crash-looping or not Ready."""

    since: datetime  # the earliest of the Ready condition's lastTransitionTime (when False) and the start
    # of a crash-looping container's wait (its lastState.terminated.finishedAt)
    what: str  # in words, for the reason
    restarts: int


def _restart_count(cs: dict[str, Any]) -> int:
    n = cs.get("restartCount")
    return n if isinstance(n, int) and not isinstance(n, bool) and n > 0 else 0


def pod_trouble(pod: object) -> PodTrouble | None:
    """A pod that is crash-looping (a container waiting in CrashLoopBackOff, or restarted and not running
    now) or whose Ready condition is False, with the time that began; None when the pod looks healthy, is
    being deleted, or no time can be read."""
    status = as_dict(as_dict(pod).get("status"))
    if pod_deleting(pod) or status.get("phase") not in ("Running", "Pending"):
        return None
    since: list[datetime] = []
    what: list[str] = []
    restarts = 0
    for cs in containers(pod, "status", "containerStatuses"):
        state = as_dict(cs.get("state"))
        waiting = as_dict(state.get("waiting")).get("reason")
        n = _restart_count(cs)
        if waiting != "CrashLoopBackOff" and (n == 0 or "running" in state):
            continue
        restarts += n
        what.append(f"container {str(cs.get('name'))[:63]!r} is crash-looping ({n} restarts)")
        t = parse_time(as_dict(as_dict(cs.get("lastState")).get("terminated")).get("finishedAt"))
        if t is not None:
            since.append(t)
    for cond in containers(pod, "status", "conditions"):
        if cond.get("type") == "Ready" and cond.get("status") == "False":
            what.append("the pod is not Ready")
            t = parse_time(cond.get("lastTransitionTime"))
            if t is not None:
                since.append(t)
    if not what or not since:
        return None
    return PodTrouble(min(since), "; ".join(what), restarts)


def pod_start(pod: object) -> datetime | None:
    """When the pod started running; None when it is not running, or is being deleted (a stopped
    notebook's old pod can still answer for up to its termination grace)."""
    return None if pod_deleting(pod) else running_since(pod)


@dataclass(frozen=True)
class SessionView:
    """The facts the culler reads from one Notebook, its pod, the pod's Node and its own record, unwrapped once."""

    namespace: str | None
    name: str | None
    annotations: Mapping[str, Any]
    server_type: str  # the type the culler treats it as (a known one)
    gpus: int
    pod: dict[str, Any] | None
    pod_start: datetime | None  # None: no running pod (none, not Running, or being deleted)
    pod_deleting: bool
    labels: Mapping[str, str] = field(default_factory=dict)  # the Notebook's labels (policy rules)
    resources: frozenset[str] = frozenset()  # resource names requested (policy rules' gpuResources)
    gpu_models: tuple[str, ...] = ()  # the Node's GPU model, else what the template asks (policy rules' gpuModels)
    record: CullerRecord | None = None  # what the culler itself recorded about this uid (rule 15)
    access_problem: str | None = None  # the culler's own access is confirmed missing (rule 16)
    unknown_server_type: str | None = None  # the annotation's value when it is not a known type (rule 16)
    kind: str = BARE_KIND  # the session's kind (kf_culler/targets/): Notebook, Workspace, ...
    stopped: bool = False  # stopped by its target's meaning (rule 1): the stop annotation, spec.paused
    # Its stop is written (the stop annotation, spec.paused, replicas 0), whether or not it took: `stopped` but
    # for a Workspace its controller cannot act on (`tampered`) while a pod of it holds a GPU.
    stop_written: bool = False
    tampered: str | None = None  # why the session's controller cannot act on it (kf_culler/targets/)
    # How long after the culler's own stop the session's pod must be gone (`stopDeadlineMinutes`, rule 1,
    # kf_culler/rules/untaken.py); None: not checked. Set by whoever runs the rules (the cycle, `decide`).
    stop_deadline_seconds: float | None = None

    @property
    def key(self) -> SessionKey:
        """The session's key in a pass (kf_culler/targets/ `session_key`)."""
        return SessionKey.of(str(self.namespace), self.kind, str(self.name))

    @classmethod
    def of(cls, notebook: dict[str, Any], pod: dict[str, Any] | None, policy: Policy, *,
           node: dict[str, Any] | None = None, record: CullerRecord | None = None,
           access_problem: str | None = None) -> SessionView:
        """The view; InputError when the objects are not a notebook and a pod (or null) at all."""
        if not isinstance(notebook, dict):
            raise InputError("notebook is not an object")
        if pod is not None and not isinstance(pod, dict):
            raise InputError("pod is neither an object nor null")
        if node is not None and not isinstance(node, dict):
            raise InputError("node is neither an object nor null")
        ann = checked_annotations(notebook)
        meta = metadata_of(notebook)
        ns, name = meta.get("namespace"), meta.get("name")
        declared = declared_server_type(notebook)
        target = target_of(notebook)  # UnknownKind (an InputError) for a kind no target handles
        written, tampered = target.is_stopped(notebook), target.tampered(notebook)
        gpus = gpu_count(notebook, pod, policy.gpu_resources)
        holding = pod_start(pod) is not None and gpus > 0  # a running pod holds its GPUs
        return cls(
            namespace=ns if isinstance(ns, str) else None,
            name=name if isinstance(name, str) else None,
            annotations=ann,
            server_type=server_type(notebook, policy, pod),
            gpus=gpus,
            pod=pod,
            pod_start=pod_start(pod),
            pod_deleting=pod_deleting(pod),
            labels=string_labels(notebook),
            resources=requested_resources(notebook, pod),
            gpu_models=node_gpu_model(node) if node is not None else gpu_models(notebook),
            record=record,
            access_problem=access_problem,
            unknown_server_type=declared if declared is not None and declared not in NOTEBOOK_SERVER_TYPES
            and target.server_type is None else None,
            kind=target.kind,
            stopped=written and not (tampered is not None and holding),
            stop_written=written,
            tampered=tampered,
        )

    @property
    def gpu_notebook(self) -> bool:
        return self.gpus > 0
