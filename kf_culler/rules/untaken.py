"""A stop is done when the session's pod is gone (docs/decisions.md, rule 1; docs/targets.md, "A stop that does not
take"). Pure: the clock and the bound are passed in.

The culler knows it wrote a stop from its own record (`stoppedAt`, kf_culler/record.py), never from a mark on the
session. When, `stopDeadlineMinutes` after that stop, the stop still stands and a pod of the session still runs
holding a GPU, the stop did not take: the verdict says so (rule `1-stop-not-taken`), the plan tells an admin once
(a Warning Event) and, where a safe next step exists for the target, takes it (`next_step`).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from kf_culler.model import Verdict
from kf_culler.session import SessionView, metadata_of
from kf_culler.targets import KINDS
from kf_culler.timeutil import clock_text as hhmm
from kf_culler.timeutil import duration_text as minutes
from kf_culler.timeutil import format_time


@dataclass(frozen=True)
class Reclaim:
    """Scale the session's own StatefulSet to 0: its name and uid (a precondition of the write), in the session's
    namespace."""

    kind: str
    name: str
    uid: str


def overdue(view: SessionView, deadline_seconds: float | None, now: datetime) -> datetime | None:
    """When the culler's last stop of the session should have freed its pod, if that is past and a pod of the
    session still runs holding a GPU while the stop stands; else None."""
    record = view.record
    if deadline_seconds is None or record is None or record.stopped_at is None or not record.awaiting_restart():
        return None
    if not view.stop_written or view.pod_start is None or view.gpus <= 0:
        return None
    due = record.stopped_at + timedelta(seconds=deadline_seconds)
    return due if now >= due else None


def plan_reads_pod(view: SessionView) -> bool:
    """Whether planning the session reads its pod (`next_step`: only a session whose stop is written has one); a
    pass that holds pods apart from their views (kf_culler/cycle.py, lean) puts the pod back for these alone."""
    return view.stop_written


def next_step(view: SessionView) -> Reclaim | None:
    """The safe next step for a stop that did not take, or None (report only).

    A Workspace's pod is reached by ownership (kf_culler/targets/ `workspace_pod`: pod -> StatefulSet by uid ->
    Workspace by uid); with `spec.paused: true` its controller wants that StatefulSet at 0 replicas, so scaling it
    to 0 is what the controller would do, and it cannot undo it. A v1 Notebook's StatefulSet, a workload's
    replicas and a Coder workspace's build are their controllers' to change: the culler only reports those."""
    if not plan_reads_pod(view) or view.pod is None:
        return None
    step = KINDS[view.kind].reclaim(view.pod)  # its target's (kf_culler/targets/workspaces.py)
    return Reclaim(*step) if step is not None else None


def not_taken(view: SessionView, deadline_seconds: float | None, now: datetime) -> Verdict | None:
    """The verdict for a session whose stop did not take, or None. It comes before every other rule: such a
    session is neither "stopped" (rule 1) nor "restarted" (rule 3)."""
    due = overdue(view, deadline_seconds, now)
    if due is None or view.record is None or view.record.stopped_at is None:
        return None
    stopped_at = view.record.stopped_at
    pod = str(metadata_of(view.pod).get("name"))[:63]
    why = f" ({view.tampered})" if view.tampered else ""
    step = next_step(view)
    then = (f" The culler scales the {step.kind} {step.name[:63]}, which the pod belongs to, to 0."
            if step is not None else f" The culler cannot do more for a {view.kind}: an administrator must free it.")
    reason = (f"The stop did not take: the culler stopped it at {hhmm(stopped_at, now)}, and "
              f"{minutes((now - stopped_at).total_seconds())} later its pod {pod} still runs with {view.gpus} "
              f"GPU(s){why}.{then}")
    return Verdict("keep", "stopped", reason, "1-stop-not-taken", server_type=view.server_type,
                   gpu_notebook=view.gpu_notebook,
                   evidence={"stop": {"stoppedAt": format_time(stopped_at), "due": format_time(due), "pod": pod,
                                      **({"tampered": view.tampered} if view.tampered else {}),
                                      "nextStep": f"{step.kind}/{step.name}" if step is not None else None}})
