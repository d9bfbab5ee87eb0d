"""Notebooks stopped for a long time (`kf-culler check`, `kf_culler_long_stopped_notebooks`). Pure.

A stopped notebook keeps its volumes, and a GPU request that comes back on every start; the culler only
reports them: deleting a notebook is an admin's decision, never the culler's.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from kf_culler.config import Policy, Settings
from kf_culler.model import STOP_ANNOTATION, STOPPED_AT_ANNOTATION, STOPPED_BY_ANNOTATION
from kf_culler.policy import policy_of
from kf_culler.session import annotations_of, as_dict, gpu_count, metadata_of
from kf_culler.targets import target_of
from kf_culler.timeutil import format_time, parse_time


@dataclass(frozen=True)
class LongStopped:
    namespace: str
    name: str
    gpus: int  # what its template requests: the GPUs a start would take again
    stopped_at: datetime
    days: float
    volumes: tuple[str, ...]  # the PersistentVolumeClaims its template mounts (kept while stopped)
    stopped_by: str | None  # notebook-culler.io/stopped-by, when the culler stopped it

    def to_dict(self) -> dict[str, Any]:
        return {"namespace": self.namespace, "name": self.name, "gpus": self.gpus,
                "stoppedAt": format_time(self.stopped_at), "days": round(self.days, 1),
                "volumes": list(self.volumes), "stoppedBy": self.stopped_by}


def stopped_since(notebook: object) -> datetime | None:
    """When the notebook was stopped: `kubeflow-resource-stopped`'s value when it is a timestamp (Kubeflow's
    web app and the culler write one), else `notebook-culler.io/stopped-at`; None when not stopped or unknown."""
    ann = annotations_of(notebook)
    if STOP_ANNOTATION not in ann:
        return None
    return parse_time(ann.get(STOP_ANNOTATION)) or parse_time(ann.get(STOPPED_AT_ANNOTATION))


def volumes(notebook: object) -> tuple[str, ...]:
    """The claim names of the template's persistentVolumeClaim volumes."""
    spec = as_dict(as_dict(as_dict(as_dict(notebook).get("spec")).get("template")).get("spec"))
    found = spec.get("volumes")
    claims = (as_dict(as_dict(v).get("persistentVolumeClaim")).get("claimName") for v in
              (found if isinstance(found, list) else []))
    return tuple(c for c in claims if isinstance(c, str))


def long_stopped(notebooks: Iterable[dict[str, Any]], now: datetime, days: float,
                 gpu_resources: Callable[[dict[str, Any]], tuple[str, ...]]) -> list[LongStopped]:
    """Notebooks stopped more than `days` ago, longest first. `gpu_resources(notebook)`: the resources that
    make a notebook a GPU notebook in its policy."""
    out = []
    for nb in notebooks:
        since = stopped_since(nb)
        if since is None or (now - since).total_seconds() <= days * 86400:
            continue
        meta = metadata_of(nb)
        ns, name = str(meta.get("namespace", "")), str(meta.get("name", ""))
        by = annotations_of(nb).get(STOPPED_BY_ANNOTATION)
        out.append(LongStopped(ns, name, gpu_count(nb, None, gpu_resources(nb)), since,
                               (now - since).total_seconds() / 86400, volumes(nb),
                               by if isinstance(by, str) else None))
    return sorted(out, key=lambda s: (s.stopped_at, s.namespace, s.name))


def long_stopped_in(settings: Settings, notebooks: Iterable[dict[str, Any]], now: datetime,
                    policy_for: Callable[[dict[str, Any]], Policy] | None = None) -> list[LongStopped]:
    """`long_stopped` over the notebooks of the namespaces the configuration selects, with its
    `longStoppedDays` and each notebook's policy's `gpuResources`. `policy_for`: the culler's choice of a
    notebook's policy (Runner.policy_of, which knows namespace labels); default kf_culler/policy.py without
    namespace labels."""
    ops = settings.operations
    chosen = (nb for nb in notebooks if ops.namespaces.selects(str(metadata_of(nb).get("namespace", "")))
              and target_of(nb).stop_is_annotation)  # Notebooks only (docs/targets.md, "Limits")
    choose = policy_for or (lambda nb: policy_of(nb, None, settings)[0])
    return long_stopped(chosen, now, ops.long_stopped_days, lambda nb: choose(nb).gpu_resources)
