"""Which pod is a notebook's: paired by name and ownership, never by labels (rule 15).

Kubeflow's notebook-controller owns the StatefulSet `<name>` (a controller ownerReference to the Notebook's
uid), which owns the pod `<name>-0`. A profile user can relabel their Notebook (the controller copies its
labels onto the pod template) and their pods, so labels decide nothing here. A pod named `<name>-0` that the
chain does not reach is not the notebook's running pod; when it holds a GPU it is reported (`Orphan`): its
GPU is held by nothing the culler can stop. Pure: over the cached objects.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

Key = tuple[str, str]


def controller_of(obj: Mapping[str, Any]) -> tuple[str, str, str] | None:
    """(kind, name, uid) of the object's controller ownerReference, if it has one."""
    refs = (obj.get("metadata") or {}).get("ownerReferences")
    for ref in refs if isinstance(refs, list) else []:
        if isinstance(ref, dict) and ref.get("controller") is True:
            return str(ref.get("kind")), str(ref.get("name")), str(ref.get("uid"))
    return None


def _uid(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("uid") or "")


@dataclass(frozen=True)
class Orphan:
    """A pod named like a notebook's pod that the notebook's ownership chain does not reach."""

    namespace: str
    notebook: str
    pod: dict[str, Any]
    why: str


def pair(notebooks: Mapping[Key, dict[str, Any]], statefulsets: Mapping[Key, dict[str, Any]],
         pods: Mapping[Key, dict[str, Any]]) -> tuple[list[tuple[dict[str, Any], dict[str, Any] | None]], list[Orphan]]:
    """Every notebook (sorted) with its pod, or None; and the pods named `<name>-0` that are not its."""
    out: list[tuple[dict[str, Any], dict[str, Any] | None]] = []
    orphans: list[Orphan] = []
    for key in sorted(notebooks):
        nb = notebooks[key]
        ns, name = key
        pod = pods.get((ns, f"{name}-0"))
        if pod is None:
            out.append((nb, None))
            continue
        sts = statefulsets.get(key)
        why = None
        if sts is None:
            why = f"no StatefulSet {name} exists"
        elif controller_of(sts) != ("Notebook", name, _uid(nb)):
            why = f"the StatefulSet {name} is not controlled by this Notebook"
        elif controller_of(pod) != ("StatefulSet", name, _uid(sts)):
            why = f"the pod is not controlled by the StatefulSet {name}"
        if why is None:
            out.append((nb, pod))
        else:
            out.append((nb, None))
            orphans.append(Orphan(ns, name, pod, why))
    return out, orphans


def service_problem(notebook: Mapping[str, Any], service: Mapping[str, Any] | None) -> str | None:
    """Why the Service `<name>` cannot be trusted to reach this notebook's own pod, or None when it can.

    Kubeflow's notebook-controller makes the Service `<name>` (a controller ownerReference to the Notebook's
    uid), of type ClusterIP, selecting `statefulset: <name>`: its endpoints are then pods of the notebook's own
    namespace, kept by the endpoints controller. A user can edit their Services: an ExternalName, a Service
    without a selector (Endpoints of their choosing) or one made by hand would send the probe to any host —
    another user's notebook, an internal service — and its answer would be taken for this notebook's."""
    meta = notebook.get("metadata") or {}
    name = str(meta.get("name"))
    if service is None:
        return f"the notebook has no Service {name}"
    spec = service.get("spec") or {}
    if controller_of(service) != ("Notebook", name, _uid(notebook)):
        return f"the Service {name} is not controlled by this Notebook"
    kind = spec.get("type") or "ClusterIP"
    if kind not in ("ClusterIP", "NodePort", "LoadBalancer"):
        return f"the Service {name} is of type {str(kind)[:20]}"
    if spec.get("selector") != {"statefulset": name}:
        return f"the Service {name} does not select the notebook's pods (statefulset: {name})"
    return None
