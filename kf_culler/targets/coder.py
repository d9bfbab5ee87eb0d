"""Coder workspaces (`targets: [coder]`, docs/targets.md, "Coder workspaces"): not Kubernetes objects but what
Coder's API lists (kf_culler/sources/coder.py), each made into a synthetic session object here and stopped by a
stop build through Coder's API (kf_culler/kube/coder.py), never patched. A Coder workspace is its own IDE, so the
target is named like its IDE kind. Pure.

A Coder workspace is not a Kubernetes object: what the culler knows of it is what Coder's
`GET /api/v2/workspaces` answers the admin's token (codersdk/workspaces.go `Workspace`). `coder_session` makes
each into a synthetic session object that the rules read like any other target's:

    {"apiVersion": "coder.com/v2", "kind": "CoderWorkspace",
     "metadata": {"namespace": <coder.namespace>, "name": "<owner_name>.<workspace name>", "uid": <workspace id>,
                  "annotations": {server-type: coder, keep-until: <a deadline the user extended>}},
     "spec": {"transition": <latest build's transition>}, "status": {<the Coder source>: <its raw reading>}}

A dot is in neither a Coder user name nor a workspace name (codersdk/name.go: letters, digits and hyphens), so
names cannot collide. Nothing in it is the user's to write beyond Coder's own extension of the deadline,
which the admin's maxExtendMinutes bounds (rule 12); the pod is found by the label Coder's upstream
Kubernetes template sets, `com.coder.workspace.id`, in the admin's namespace only, where Coder's users have
no Kubernetes rights.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from kf_culler.errors import InputError
from kf_culler.ide import CODER_SERVER_TYPE
from kf_culler.model import KEEP_UNTIL_ANNOTATION, SERVER_TYPE_ANNOTATION
from kf_culler.targets.base import Scope, SessionKey, Target, Watched, _dict, gpus_asked, running
from kf_culler.targets.fields import pod_fields
from kf_culler.timeutil import format_time, parse_time


@dataclass(frozen=True)
class CoderTarget(Target):
    def is_stopped(self, obj: Mapping[str, Any]) -> bool:
        """Its latest build stops or deletes it (whoever asked: its user, Coder's autostop, the culler)."""
        return _dict(obj.get("spec")).get("transition") in ("stop", "delete")

    def stop_body(self, obj: Mapping[str, Any], annotations: Mapping[str, str | None]) -> dict[str, Any]:
        raise InputError("a Coder workspace is stopped by a stop build through Coder's API, never patched")

    def start_command(self, namespace: str, name: str) -> str:
        owner, _, workspace = name.partition(".")  # `<owner>.<workspace>`: a dot is in neither
        return f"coder start {owner}/{workspace}"

    def keep_command(self, namespace: str, name: str, until: str) -> str | None:
        return None  # its user extends its deadline in Coder, which maxExtendMinutes bounds (rule 12)

    def carried(self, obj: Mapping[str, Any]) -> Any:
        return observation_of(obj)

    def watches(self, scope: Scope) -> tuple[Watched, ...]:
        """Its sessions are Coder's API's (kf_culler/sources/coder.py); the cache keeps the pods of the admin's
        Coder namespace labelled with a Coder workspace's id (`pods_by_workspace`)."""
        namespace = scope.coder_namespace
        if namespace is None:
            return ()

        def keep(obj: Mapping[str, Any]) -> bool:
            meta = _dict(obj.get("metadata"))
            return meta.get("namespace") == namespace and WORKSPACE_ID_LABEL in _dict(meta.get("labels"))

        return (Watched("pods", "", "v1", "pods", pod_fields, keep=keep),)


# Its RBAC component (kustomize/components/coder) is named like the target.
CODER = CoderTarget(CODER_SERVER_TYPE, "CoderWorkspace", "coder.com", "v2", "workspaces", route="coderworkspaces",
                    rbac=CODER_SERVER_TYPE, reach="carried", where_to_start="Coder's dashboard",
                    server_type=CODER_SERVER_TYPE)


# The label Coder's upstream Kubernetes template (examples/templates/kubernetes/main.tf) puts on the workspace's
# Deployment, its pod template and its PVC.
WORKSPACE_ID_LABEL = "com.coder.workspace.id"
# A workspace counts as connected while an agent is connected and Coder saw it used this recently: Coder writes
# `last_used_at` in batches every 60 s (coderd/workspacestats/tracker.go) while a client is connected or an app
# reports usage, and the write-up saw it stop moving about 80 s after the client left.
CONNECTED_SECONDS = 180.0
# How far Coder's own activity bump moves a used workspace's deadline (a template's `activity_bump`, 1 h unless
# the template says otherwise): a deadline within it of the last use is Coder's schedule, not the user's request.
ACTIVITY_BUMP = timedelta(hours=1)
SLACK = timedelta(seconds=60)
STARTING_BUILDS = ("pending", "starting")  # no pod of this build is the session's yet


def _time(value: object) -> datetime | None:
    """A Coder time, or None when absent, unreadable or Go's zero time (`0001-01-01T00:00:00Z`: not set)."""
    t = parse_time(value)
    return t if t is not None and t.year > 1 else None


def session_name(ws: Mapping[str, Any]) -> str:
    return f"{ws.get('owner_name')}.{ws.get('name')}"


def agents_of(ws: Mapping[str, Any]) -> list[dict[str, Any]]:
    build = _dict(ws.get("latest_build"))
    resources = build.get("resources")
    out: list[dict[str, Any]] = []
    for r in resources if isinstance(resources, list) else []:
        agents = _dict(r).get("agents")
        out.extend(a for a in (agents if isinstance(agents, list) else []) if isinstance(a, dict))
    return out


def coder_reading(ws: Mapping[str, Any], now: datetime) -> dict[str, Any]:
    """The raw observation of the workspace (kf_culler/readings.py `parse_coder`): connected while one of its
    agents is connected and Coder saw it used within CONNECTED_SECONDS; the agent alone being connected is the
    pod running, not someone using it."""
    build = _dict(ws.get("latest_build"))
    agents = agents_of(ws)
    raw_last = ws.get("last_used_at")
    last = _time(raw_last)
    agent_up = any(a.get("status") == "connected" for a in agents)
    recent = last is not None and (now - last).total_seconds() <= CONNECTED_SECONDS
    return {
        "connected": bool(agent_up and recent),
        "lastUsedAt": format_time(last) if last is not None else (None if raw_last in (None, "") else raw_last),
        "build": build.get("status"),
        "agents": ", ".join(f"{str(a.get('name'))[:40]}: {str(a.get('status'))[:20]}" for a in agents[:5]),
    }


def user_extension(ws: Mapping[str, Any]) -> datetime | None:
    """The deadline the workspace's user moved (`PUT /api/v2/workspaces/{id}/extend`), or None: Coder's latest
    build deadline when it is later than what Coder's own schedule gives it, the build's end plus the
    workspace's autostop (`ttl_ms`) and the last use plus the activity bump."""
    build = _dict(ws.get("latest_build"))
    deadline = _time(build.get("deadline"))
    ended = _time(_dict(build.get("job")).get("completed_at"))
    ttl = ws.get("ttl_ms")
    if deadline is None or ended is None or isinstance(ttl, bool) or not isinstance(ttl, int) or ttl <= 0:
        return None
    schedule = ended + timedelta(milliseconds=ttl)
    last = _time(ws.get("last_used_at"))
    if last is not None:
        schedule = max(schedule, last + ACTIVITY_BUMP)
    return deadline if deadline > schedule + SLACK else None


def coder_session(ws: Mapping[str, Any], namespace: str, now: datetime) -> dict[str, Any]:
    """The synthetic session object of one workspace of Coder's list (see the module's docstring)."""
    build = _dict(ws.get("latest_build"))
    annotations = {SERVER_TYPE_ANNOTATION: CODER_SERVER_TYPE}
    until = user_extension(ws)
    if until is not None:
        annotations[KEEP_UNTIL_ANNOTATION] = format_time(until)
    return {
        "apiVersion": CODER.api_version, "kind": CODER.kind,
        "metadata": {"namespace": namespace, "name": session_name(ws), "uid": str(ws.get("id") or ""),
                     "annotations": annotations},
        "spec": {"transition": build.get("transition")},
        "status": {CODER_SERVER_TYPE: coder_reading(ws, now)},
    }


def fairness_key(key: tuple[str, str], owner: str | None = None) -> str:
    """Whose share a session takes where shares are fair (the notices' queue and rate, the brakes' weighting and
    per-pass caps): for a Coder workspace (all of them in the admin's one namespace) its Coder owner,
    `<namespace>/<owner>` (a `/` is in no namespace); else the owner of its namespace where one is known
    (kf_culler/kube/tenants.py), `owner:<owner>` (a `:` is in no namespace), so that the namespaces of one user
    take one share; else its namespace. `key` is the pass's key (`session_key`)."""
    key = SessionKey(*key)
    if key.kind == CODER.kind:
        return f"{key.namespace}/{key.object_name.split('.', 1)[0]}"
    if owner:
        return f"owner:{owner}"
    return key.namespace


def pods_by_workspace(pods: Iterable[dict[str, Any]], namespace: str) -> dict[str, list[dict[str, Any]]]:
    """The pods of the admin's Coder namespace by their `com.coder.workspace.id` label (pods elsewhere are
    not Coder's, whatever their labels say)."""
    out: dict[str, list[dict[str, Any]]] = {}
    for pod in pods:
        meta = _dict(pod.get("metadata"))
        ws_id = _dict(meta.get("labels")).get(WORKSPACE_ID_LABEL)
        if meta.get("namespace") == namespace and isinstance(ws_id, str) and ws_id:
            out.setdefault(ws_id, []).append(pod)
    return out


def coder_pod(ws: Mapping[str, Any], pods: Mapping[str, list[dict[str, Any]]]) -> dict[str, Any] | None:
    """The workspace's pod: of the pods labelled with its id, the Running one asking for the most GPUs (as for a
    Workspace, `workspace_pod`), else the first by name. None while its latest build is pending or starting (no
    pod of it is the session's yet: rule 3 counts it starting) or when it has none."""
    if _dict(ws.get("latest_build")).get("status") in STARTING_BUILDS:
        return None
    found = pods.get(str(ws.get("id") or ""), [])
    if not found:
        return None
    best = max((running(p), gpus_asked(p)) for p in found)
    return min((p for p in found if (running(p), gpus_asked(p)) == best),
               key=lambda p: str(_dict(p.get("metadata")).get("name")))


Item = tuple[dict[str, Any], dict[str, Any] | None]


def coder_items(workspaces: Iterable[Mapping[str, Any]], namespace: str, pods: Iterable[dict[str, Any]],
                now: datetime) -> list[Item]:
    """(session, pod) for every workspace Coder listed, sorted by name."""
    by_ws = pods_by_workspace(pods, namespace)
    items = [(coder_session(ws, namespace, now), coder_pod(ws, by_ws)) for ws in workspaces if isinstance(ws, dict)]
    return sorted(items, key=lambda item: str(item[0]["metadata"]["name"]))


def observation_of(session: Mapping[str, Any]) -> Any:
    """The Coder observation a session object carries (its `status`), for the pass to read as the IDE's."""
    return _dict(session.get("status")).get(CODER_SERVER_TYPE, {"error": "Coder said nothing of this workspace"})


def unread(session: dict[str, Any], why: str) -> dict[str, Any]:
    """The session with no Coder signal (Coder could not be read this pass): its reading is `{"error": why}`."""
    return {**session, "status": {CODER_SERVER_TYPE: {"error": why[:300]}}}
