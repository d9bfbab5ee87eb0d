"""One notebook's facts, unwrapped once from the API objects: `NotebookView`.

The Notebook and its pod arrive as untrusted JSON; every reading of them (metadata, annotations,
containers, GPU count, server type, pod start) lives here, so each layer sees the same facts.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from kf_culler.config import Policy
from kf_culler.ide import DEFAULT_SERVER_TYPE
from kf_culler.model import SERVER_TYPE_ANNOTATION, InputError
from kf_culler.timeutil import parse_time

MAX_GPUS = 1 << 20  # a sum of huge requests stays a finite count


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


def gpu_count(notebook: dict[str, Any], pod: dict[str, Any] | None, resources: tuple[str, ...]) -> int:
    """GPUs the pod (or, without a pod, the notebook template) asks for."""
    found = pod_containers(pod) if pod else []
    if not found:
        found = template_containers(notebook)
    total = 0.0
    for c in found:
        res = as_dict(c.get("resources"))
        for kind in ("limits", "requests"):
            q = as_dict(res.get(kind))
            n = max((_quantity(q.get(r, 0)) for r in resources), default=0.0)
            if n > 0:
                total += n
                break
    return int(min(total, MAX_GPUS))


def server_type(notebook: dict[str, Any], policy: Policy) -> str:
    """The annotation's server type, else the first container's image rule, else Jupyter (rule 4)."""
    value = checked_annotations(notebook).get(SERVER_TYPE_ANNOTATION)
    if isinstance(value, str) and value:
        return value
    for c in template_containers(notebook)[:1]:
        image = c.get("image")
        if isinstance(image, str):
            found = policy.server_type_for_image(image)
            if found:
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


def pod_start(pod: object) -> datetime | None:
    """When the pod started running; None when it is not running, or is being deleted (a stopped
    notebook's old pod can still answer for up to its termination grace)."""
    return None if pod_deleting(pod) else running_since(pod)


@dataclass(frozen=True)
class NotebookView:
    """The facts the culler reads from one Notebook and its pod, unwrapped once."""

    namespace: str | None
    name: str | None
    annotations: Mapping[str, Any]
    server_type: str
    gpus: int
    pod: dict[str, Any] | None
    pod_start: datetime | None  # None: no running pod (none, not Running, or being deleted)
    pod_deleting: bool

    @classmethod
    def of(cls, notebook: dict[str, Any], pod: dict[str, Any] | None, policy: Policy) -> NotebookView:
        """The view; InputError when the objects are not a notebook and a pod (or null) at all."""
        if not isinstance(notebook, dict):
            raise InputError("notebook is not an object")
        if pod is not None and not isinstance(pod, dict):
            raise InputError("pod is neither an object nor null")
        ann = checked_annotations(notebook)
        meta = metadata_of(notebook)
        ns, name = meta.get("namespace"), meta.get("name")
        return cls(
            namespace=ns if isinstance(ns, str) else None,
            name=name if isinstance(name, str) else None,
            annotations=ann,
            server_type=server_type(notebook, policy),
            gpus=gpu_count(notebook, pod, policy.gpu_resources),
            pod=pod,
            pod_start=pod_start(pod),
            pod_deleting=pod_deleting(pod),
        )

    @property
    def gpu_notebook(self) -> bool:
        return self.gpus > 0
