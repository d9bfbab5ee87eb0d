"""What the culler culls: the targets, one module each, and their registry (docs/targets.md).

A target maps the neutral verdict onto one kind of session: which pod is its own, how its IDE is reached,
what "stopped" is, how a stop is written, what its user is told and which verdict API route serves it
(`Target`, kf_culler/targets/base.py). The rules never see the difference; the rest of the culler asks this
registry (`target_of`, `for_key`, `ROUTES`) instead of naming a kind, and an object of a kind no target
handles is refused (`UnknownKind`), never taken as another kind's session. Pure: over the cached objects.
tests/test_target_registry.py checks that every target has every hook and that no other module names one.

    notebooks.py   Kubeflow v1 Notebooks          workloads.py  Deployments and StatefulSets
    workspaces.py  Kubeflow Notebooks 2.0         coder.py      Coder workspaces (through Coder's API)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kf_culler.targets.base import (
    BARE_KIND,
    Key,
    OwnerKey,
    Pairing,
    Scope,
    Seen,
    SessionKey,
    Target,
    UnknownKind,
    Watched,
    controller_of,
    gpus_asked,
    identity,
    kind_of,
    owned_by,
    owner_key,
    running,
    session_key,
    statefulset_member,
    uid_of,
)
from kf_culler.targets.coder import CODER, fairness_key
from kf_culler.targets.notebooks import NOTEBOOKS
from kf_culler.targets.workloads import (
    DEPLOYMENTS,
    REPLICAS_BEFORE_ANNOTATION,
    STATEFULSETS,
    WORKLOADS,
    controlled_by_kind,
    is_workload,
    session_statefulset,
    workload_pod,
    workload_service_problem,
)
from kf_culler.targets.workspaces import (
    CONNECT_PREFIX,
    CONTROLS_KEY,
    WORKSPACE_NAME_LABEL,
    WORKSPACES,
    workspace_pod,
    workspace_port,
    workspace_service,
    workspace_tampered,
)

ALL: tuple[Target, ...] = (NOTEBOOKS, WORKSPACES, *WORKLOADS, CODER)  # every session kind's target
TARGETS: dict[str, Target] = {}  # by the name configuration gives (`targets:`): workloads by its first kind
for _t in ALL:
    TARGETS.setdefault(_t.name, _t)
KINDS = {t.kind: t for t in ALL}  # by the API kind of their sessions
ROUTES = {t.route: t for t in ALL}  # by their verdict API resource

__all__ = [
    "ALL",
    "BARE_KIND",
    "CODER",
    "CONNECT_PREFIX",
    "CONTROLS_KEY",
    "DEPLOYMENTS",
    "KINDS",
    "NOTEBOOKS",
    "REPLICAS_BEFORE_ANNOTATION",
    "ROUTES",
    "STATEFULSETS",
    "TARGETS",
    "WORKLOADS",
    "WORKSPACES",
    "WORKSPACE_NAME_LABEL",
    "Key",
    "OwnerKey",
    "Pairing",
    "Scope",
    "Seen",
    "SessionKey",
    "Target",
    "UnknownKind",
    "Watched",
    "controlled_by_kind",
    "controller_of",
    "fairness_key",
    "for_key",
    "gpus_asked",
    "identity",
    "is_stopped",
    "is_workload",
    "kind_of",
    "owned_by",
    "owner_key",
    "running",
    "session_key",
    "session_statefulset",
    "statefulset_member",
    "stop_body",
    "target_of",
    "uid_of",
    "workload_pod",
    "workload_service_problem",
    "workspace_pod",
    "workspace_port",
    "workspace_service",
    "workspace_tampered",
]


def target_of(obj: Mapping[str, Any]) -> Target:
    """The target of a session object, by its `kind` (set by the API server; a user cannot change it). An object
    without one (a scenario's notebook, a replayed trace) is a v1 Notebook; UnknownKind for a kind no target
    handles."""
    kind = kind_of(obj)
    found = KINDS.get(kind)
    if found is None:
        raise UnknownKind(f"no target handles objects of kind {kind[:63]!r}")
    return found


def for_key(key: tuple[str, str]) -> Target:
    """The target of a pass's session key; UnknownKind for a kind no target handles."""
    return target_of({"kind": SessionKey(*key).kind})


def is_stopped(obj: Mapping[str, Any]) -> bool:
    """Whether the session is stopped, by its own target's meaning: a Notebook with `kubeflow-resource-stopped`
    (whoever set it), a Workspace with `spec.paused: true` (the culler, its user or the controller's own
    culling), a workload with 0 replicas, a Coder workspace whose latest build stops or deletes it."""
    return target_of(obj).is_stopped(obj)


def stop_body(obj: Mapping[str, Any], annotations: Mapping[str, str | None]) -> dict[str, Any]:
    """The merge patch that writes a plan's annotations (a stop included) on the session, by its target."""
    return target_of(obj).stop_body(obj, annotations)
