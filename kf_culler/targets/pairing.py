"""Which pod is a notebook's: paired as Kubeflow's notebook-controller acts, never by labels (rule 15).

Kubeflow's notebook-controller (v1.11.0, controllers/notebook_controller.go) finds a Notebook's StatefulSet by
name, `<name>` in the Notebook's namespace, and writes its replicas (0 when the Notebook carries the stop
annotation) whatever that StatefulSet's ownerReferences say; it neither checks them nor puts a removed one
back. The StatefulSet controller then removes the pods it controls, `<name>-0` among them. So a notebook's
pod is a pod controlled (by uid) by the StatefulSet `<name>` of its namespace and named as its members are,
`<name>-<ordinal>`: usually `<name>-0`, but a user may renumber them (`spec.ordinals.start`, a field the
notebook-controller does not keep) and leave `<name>-1` holding the GPU beside a Pending `<name>-0`; of them the
Running one asking for the most GPUs is the notebook's. Removing or changing the StatefulSet's ownerReference
hides nothing, since a stop still scales it. A profile user can relabel their
Notebook (the controller copies its labels onto the pod template) and their pods, so labels decide nothing
here, and a StatefulSet of another name is never a notebook's, whatever it claims to be owned by. A pod named
`<name>-0` that the StatefulSet `<name>` does not control is what a stop cannot reach: when it holds a GPU it
is reported (`Orphan`). Pure: over the cached objects.
"""

from __future__ import annotations

import contextlib
import ipaddress
import math
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from kf_culler.targets.base import Seen

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


_MEMBER = re.compile(r"-(0|[1-9][0-9]{0,8})$")  # what follows `<statefulset>` in a member pod's name


def _gpus(pod: Mapping[str, Any]) -> float:
    total = 0.0
    for c in (pod.get("spec") or {}).get("containers") or []:
        for kind in ("limits", "requests"):
            for res, value in (((c or {}).get("resources") or {}).get(kind) or {}).items():
                if "gpu" in str(res):
                    with contextlib.suppress(ValueError):
                        n = float(str(value))
                        total = max(total, n) if math.isfinite(n) and n > 0 else total
    return total


def named_members(pods: Mapping[Key, object]) -> dict[Key, list[Key]]:
    """The keys of the pods named as a StatefulSet names its members (`<statefulset>-<ordinal>`), by (namespace, that
    StatefulSet's name), read from the keys alone: the name before the last `-` is the only StatefulSet a pod can
    be a member of, so a pairing decodes only the pods named like a session's StatefulSet's members."""
    out: dict[Key, list[Key]] = {}
    for key in pods:
        ns, pod_name = key
        cut = pod_name.rfind("-")
        if cut > 0 and _MEMBER.match(pod_name, cut) is not None:
            out.setdefault((ns, pod_name[:cut]), []).append(key)
    return out


def _holding(pods: list[dict[str, Any]]) -> dict[str, Any]:
    """Of a StatefulSet's member pods, the Running one asking for the most GPUs, then the first by name."""
    if len(pods) == 1:
        return pods[0]
    def rank(p: Mapping[str, Any]) -> tuple[bool, float]:
        meta, status = p.get("metadata") or {}, p.get("status") or {}
        return status.get("phase") == "Running" and not meta.get("deletionTimestamp"), _gpus(p)

    best = max(rank(p) for p in pods)
    return min((p for p in pods if rank(p) == best), key=lambda p: str((p.get("metadata") or {}).get("name")))


@dataclass(frozen=True)
class Orphan:
    """A pod named like a notebook's pod that the StatefulSet `<name>`, which a stop scales, does not control."""

    namespace: str
    notebook: str
    pod: dict[str, Any]
    why: str


def pair(notebooks: Mapping[Key, dict[str, Any]], statefulsets: Mapping[Key, dict[str, Any]],
         pods: Mapping[Key, dict[str, Any]]) -> tuple[list[tuple[dict[str, Any], dict[str, Any] | None]], list[Orphan]]:
    """Every notebook (sorted) with its pod, or None; and the pods named `<name>-0` that a stop would not
    remove (`Orphan`)."""
    orphans: list[Orphan] = []
    return list(pairs(notebooks, statefulsets, pods, orphans)), orphans


def pairs(notebooks: Mapping[Key, dict[str, Any]], statefulsets: Mapping[Key, dict[str, Any]],
          pods: Mapping[Key, dict[str, Any]], orphans: list[Orphan]) -> Iterator[tuple[dict[str, Any],
                                                                                     dict[str, Any] | None]]:
    """`pair`, one notebook at a time, each read from `notebooks` (and its pod from `pods`) when its turn comes, so
    that a reader of an encoded cache (kf_culler/kube/cache.py) holds decoded only the pairs it has not let go of;
    the orphans are added to `orphans` as they are found (all of them once every pair is read)."""
    members = named_members(pods)
    for key in sorted(notebooks):
        nb = notebooks[key]
        ns, name = key
        sts = statefulsets.get(key)
        own: list[dict[str, Any]] = []
        if sts is not None:
            controller = ("StatefulSet", name, _uid(sts))
            for k in members.get(key, ()):
                candidate = pods[k]
                if controller_of(candidate) == controller:
                    own.append(candidate)
        if own:
            yield nb, _holding(own)
            continue
        pod = pods.get((ns, f"{name}-0"))
        if pod is None:
            yield nb, None
            continue
        why = None
        if sts is None:
            why = f"no StatefulSet {name} exists"
        elif controller_of(pod) != ("StatefulSet", name, _uid(sts)):
            why = f"the pod is not controlled by the StatefulSet {name}"
        if why is None:
            yield nb, pod
        else:
            orphans.append(Orphan(ns, name, pod, why))
            yield nb, None


def cluster_ip(service: Mapping[str, Any] | None) -> str | None:
    """The Service's ClusterIP: the address its DNS name `<name>.<namespace>.svc.<domain>` resolves to, or None
    (no Service, a headless one, none allocated yet). The API server allocates it and never changes it."""
    spec = (service or {}).get("spec")
    found = spec.get("clusterIP") if isinstance(spec, Mapping) else None
    if not isinstance(found, str) or not found or found == "None":
        return None
    try:
        return str(ipaddress.ip_address(found))
    except ValueError:
        return None


def named_service_address(session: Mapping[str, Any], seen: Seen,
                          problem: Callable[[Mapping[str, Any], Mapping[str, Any] | None], str | None]
                          ) -> tuple[str, str] | None:
    """(name, ClusterIP) of the Service named like the session, as the cache has it now, when `problem` finds
    nothing wrong with it (`Target.service_address`); else None."""
    meta = session.get("metadata")
    meta = meta if isinstance(meta, Mapping) else {}
    name = str(meta.get("name"))
    service = seen.now("services", (str(meta.get("namespace")), name))
    ip = cluster_ip(service) if problem(session, service) is None else None
    return (name, ip) if ip is not None else None


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
