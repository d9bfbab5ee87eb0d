"""What to write for a verdict: at most one merge patch of annotations and one Event. Pure."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from kf_culler.model import (
    IDLE_SINCE_ANNOTATION,
    LAST_ACTIVITY_ANNOTATION,
    OWN_ANNOTATIONS,
    REASON_ANNOTATION,
    RESTARTED_AT_ANNOTATION,
    STATE_ANNOTATION,
    STOP_ANNOTATION,
    STOPPED_AT_ANNOTATION,
    STOPPED_BY_ANNOTATION,
    STOPPED_BY_VALUE,
    TRACE_ANNOTATION,
    WARNED_AT_ANNOTATION,
    Verdict,
)
from kf_culler.record import RecordChange, next_record, warned_this_period
from kf_culler.rules.untaken import Reclaim, next_step
from kf_culler.session import SessionView, annotations_of
from kf_culler.timeutil import format_time, parse_time

EVENT_STOP = "IdleNotebookStopped"
EVENT_WARN = "IdleNotebookWarning"
EVENT_RESTART = "NotebookRestarted"
EVENT_CONTESTED = "GpuSeriesContested"  # two GPU series claim one pod's GPU with different values
EVENT_ORPHAN = "GpuPodOrphaned"  # a GPU pod that a stop of its notebook would not remove (kf_culler/runner.py)
EVENT_NOT_TAKEN = "StopNotTaken"  # the culler's stop did not free the session's GPU pod in time (rule 1)


@dataclass(frozen=True)
class EventSpec:
    type: str
    reason: str
    message: str


@dataclass(frozen=True)
class Plan:
    annotations: dict[str, str | None]  # a merge patch of metadata.annotations (None removes a key)
    event: EventSpec | None = None
    # What the culler's own record must keep (rule 15): stored before the patch for a stop or a restart.
    record: RecordChange | None = None
    # A stop that did not take: the safe next step for its target (kf_culler/rules/untaken.py), or None.
    reclaim: Reclaim | None = None

    @property
    def empty(self) -> bool:
        """Nothing to write on the Notebook (a record change alone is not a Notebook write)."""
        return not self.annotations and self.event is None and self.reclaim is None


def plan(notebook: SessionView | dict[str, Any], verdict: Verdict, now: datetime, step_minutes: float,
         trace_id: str | None = None) -> Plan:
    """The writes for a verdict on a notebook (its SessionView, or the Notebook object itself: then no
    record change, the object carries none)."""
    if verdict.rule_id == "1-stop-not-taken" and isinstance(notebook, SessionView):
        return _not_taken_plan(notebook, verdict, now)
    out = _notebook_plan(notebook, verdict, now, step_minutes, trace_id)
    if not isinstance(notebook, SessionView):
        return out
    warned = out.event is not None and out.event.reason == EVENT_WARN
    return replace(out, record=next_record(notebook.record, verdict.action, verdict.rule_id, notebook.pod_start,
                                           now, warned))


def _not_taken_plan(view: SessionView, verdict: Verdict, now: datetime) -> Plan:
    """A stop that did not take (rule 1): no mark on the session (its stop stands); a Warning Event once per stop
    (the culler's record remembers it), and the target's safe next step, if any, every pass until the pod is gone
    (it is idempotent)."""
    told = view.record is not None and view.record.not_taken_told()
    event = None if told else EventSpec("Warning", EVENT_NOT_TAKEN, verdict.reason)
    change = None if told else next_record(view.record, verdict.action, verdict.rule_id, view.pod_start, now,
                                           not_taken=True)
    return Plan({}, event, change, next_step(view))


def _notebook_plan(notebook: SessionView | dict[str, Any], verdict: Verdict, now: datetime, step_minutes: float,
                   trace_id: str | None) -> Plan:
    original = notebook.annotations if isinstance(notebook, SessionView) else annotations_of(notebook)
    if notebook.stopped if isinstance(notebook, SessionView) else STOP_ANNOTATION in original:
        return Plan({})  # stopped stays stopped: never rewrite or remove a stop, ours or another's
    out: dict[str, str | None] = {}
    trace = f" (trace {trace_id})" if trace_id else ""
    event: EventSpec | None = None
    ann = original
    if verdict.rule_id == "3-restarted":
        # The culler's record says it stopped the notebook and the stop annotation is gone: the user started
        # it again. Clear our stale marks (they are for people) and tell them.
        out.update({k: None for k in OWN_ANNOTATIONS if k in original})
        out[RESTARTED_AT_ANNOTATION] = format_time(now)
        ann = {k: v for k, v in original.items() if k not in OWN_ANNOTATIONS}
        event = EventSpec("Normal", EVENT_RESTART,
                          "The notebook was started again; the idle clock and the start-up grace count from now.")

    def describe() -> None:
        out[STATE_ANNOTATION] = verdict.state
        out[REASON_ANNOTATION] = verdict.reason[:1000]
        out[IDLE_SINCE_ANNOTATION] = format_time(verdict.idle_since) if verdict.idle_since else None

    if verdict.action == "stop":
        describe()
        out.update({
            STOP_ANNOTATION: format_time(now),
            STOPPED_BY_ANNOTATION: STOPPED_BY_VALUE,
            STOPPED_AT_ANNOTATION: format_time(now),
            WARNED_AT_ANNOTATION: None,
            RESTARTED_AT_ANNOTATION: None,
        })
        if trace_id:
            out[TRACE_ANNOTATION] = trace_id
        if verdict.idle_since:
            out[LAST_ACTIVITY_ANNOTATION] = format_time(verdict.idle_since)
        return Plan(_minimal(out, original), EventSpec("Warning", EVENT_STOP, verdict.reason + trace))

    if verdict.action == "warn":
        record = notebook.record if isinstance(notebook, SessionView) else None
        if WARNED_AT_ANNOTATION not in ann and not warned_this_period(record, verdict.idle_since):
            describe()
            out[WARNED_AT_ANNOTATION] = format_time(now)
            event = EventSpec("Warning", EVENT_WARN, verdict.reason + trace)
        elif WARNED_AT_ANNOTATION not in ann and record is not None and record.warned_at is not None:
            describe()  # someone removed the mark: put it back for people; no second Event, mail or webhook
            out[WARNED_AT_ANNOTATION] = format_time(record.warned_at)
    elif WARNED_AT_ANNOTATION in ann:
        describe()  # the notebook was used after a warning: withdraw it
        out[WARNED_AT_ANNOTATION] = None

    # The display annotation Kubeflow's web app shows as "Last activity": written only when it moves
    # by at least the step, so an idle notebook costs no writes.
    activity = now if verdict.state == "active" else verdict.idle_since
    if activity is not None and verdict.state in ("active", "connected", "idle"):
        shown = parse_time(ann.get(LAST_ACTIVITY_ANNOTATION))
        if shown is None or abs((activity - shown).total_seconds()) >= step_minutes * 60:
            out[LAST_ACTIVITY_ANNOTATION] = format_time(activity)
            describe()
    return Plan(_minimal(out, original), event)


def _minimal(patch: dict[str, str | None], ann: Mapping[str, Any]) -> dict[str, str | None]:
    """Drop entries that would change nothing: removing an absent key, writing an equal value."""
    return {k: v for k, v in patch.items() if (k in ann if v is None else ann.get(k) != v)}
