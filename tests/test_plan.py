"""plan(): what a verdict writes, in particular around a user's restart of a notebook the culler stopped."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta
from typing import Any

from kf_culler.config import Policy
from kf_culler.decide import decide
from kf_culler.model import (
    RESTARTED_AT_ANNOTATION,
    STOP_ANNOTATION,
    STOPPED_AT_ANNOTATION,
    STOPPED_BY_ANNOTATION,
    STOPPED_BY_VALUE,
    Verdict,
)
from kf_culler.plan import EVENT_RESTART, EVENT_STOP, plan
from kf_culler.record import CullerRecord
from kf_culler.session import SessionView

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
IDLE_JUPYTER = {"jupyter": {"status": {"started": "2026-11-29T04:00:00Z", "last_activity": "2026-11-29T09:00:00Z",
                                       "connections": 0, "kernels": 0}, "kernels": [], "terminals": []}}


def notebook(**ann: str) -> dict[str, Any]:
    return {"metadata": {"name": "nb", "namespace": "ns", "annotations": dict(ann)}}


def old_pod() -> dict[str, Any]:
    return {"metadata": {"name": "nb-0"}, "status": {"phase": "Running", "startTime": "2026-11-29T04:00:00Z"}}


STOPPED = CullerRecord(stopped_at=datetime(2026, 11, 29, 11, 59, 30, tzinfo=UTC))


def test_a_restart_is_seen_once_recorded_and_announced() -> None:
    nb = notebook(**{STOPPED_BY_ANNOTATION: STOPPED_BY_VALUE, STOPPED_AT_ANNOTATION: "2026-11-29T11:59:30Z"})
    view = SessionView.of(nb, old_pod(), Policy(), record=STOPPED)
    verdict = decide(nb, old_pod(), IDLE_JUPYTER, Policy(), NOW, record=STOPPED)
    assert (verdict.action, verdict.state, verdict.rule_id) == ("keep", "starting", "3-restarted")
    p = plan(view, verdict, NOW, 120)
    assert p.annotations == {STOPPED_BY_ANNOTATION: None, STOPPED_AT_ANNOTATION: None,
                             RESTARTED_AT_ANNOTATION: "2026-11-29T12:00:00Z"}
    assert p.event is not None and p.event.reason == EVENT_RESTART
    assert p.record is not None and p.record.before_patch
    assert p.record.record == CullerRecord(stopped_at=STOPPED.stopped_at, restarted_at=NOW)
    # the next pass reads the stored restart: no second restart
    again = decide(nb, old_pod(), IDLE_JUPYTER, Policy(), NOW + timedelta(seconds=60), record=p.record.record)
    assert (again.state, again.rule_id) == ("starting", "3-starting")


def test_the_marks_alone_are_no_restart() -> None:
    nb = notebook(**{STOPPED_BY_ANNOTATION: STOPPED_BY_VALUE, STOPPED_AT_ANNOTATION: "2026-11-29T11:59:30Z"})
    verdict = decide(nb, old_pod(), IDLE_JUPYTER, Policy(), NOW)
    assert (verdict.action, verdict.rule_id) == ("stop", "10-idle")


def test_the_grace_counts_from_the_restart_then_the_idle_notebook_is_stopped_again() -> None:
    policy = Policy()
    record = CullerRecord(stopped_at=NOW - timedelta(minutes=5), restarted_at=NOW)
    nb = notebook(**{RESTARTED_AT_ANNOTATION: "2026-11-29T12:00:00Z"})
    grace = timedelta(minutes=policy.startup_grace_minutes)
    inside = decide(nb, old_pod(), IDLE_JUPYTER, policy, NOW + grace - timedelta(seconds=1), record=record)
    assert (inside.action, inside.state) == ("keep", "starting")
    late = NOW + timedelta(minutes=policy.idle_minutes) + timedelta(seconds=1)
    after = decide(nb, old_pod(), IDLE_JUPYTER, policy, late, record=record)
    assert after.action == "stop"
    p = plan(SessionView.of(nb, old_pod(), policy, record=record), after, late, 120)
    assert p.annotations[RESTARTED_AT_ANNOTATION] is None and STOP_ANNOTATION in p.annotations
    assert p.event is not None and p.event.reason == EVENT_STOP
    assert p.record is not None and p.record.before_patch and p.record.record.stopped_at == late


def test_running_since_is_recorded_once_and_never_before_the_last_stop() -> None:
    policy = Policy()
    verdict = decide(notebook(), old_pod(), IDLE_JUPYTER, policy, NOW - timedelta(hours=3))
    p = plan(SessionView.of(notebook(), old_pod(), policy), verdict, NOW, 120)
    assert p.record is not None and not p.record.before_patch
    assert p.record.record.running_since == datetime(2026, 11, 29, 4, 0, tzinfo=UTC)
    known = SessionView.of(notebook(), old_pod(), policy, record=p.record.record)
    assert plan(known, verdict, NOW, 120).record is None
    # the old pod still runs after a stop and a restart: running since the restart, not the old start
    restarted = CullerRecord(stopped_at=NOW - timedelta(minutes=20), restarted_at=NOW - timedelta(minutes=15))
    view = SessionView.of(notebook(), old_pod(), policy, record=restarted)
    again = plan(view, Verdict("keep", "idle", "x", "10-idle"), NOW, 120)
    assert again.record is not None and again.record.record.running_since == restarted.restarted_at


def test_a_stop_annotation_we_did_not_write_is_never_a_restart() -> None:
    nb = notebook(**{STOP_ANNOTATION: "odh-lock"})
    verdict = decide(nb, old_pod(), IDLE_JUPYTER, Policy(), NOW)
    assert verdict.rule_id == "1-stopped"
    assert plan(nb, verdict, NOW, 120).empty


def test_keep_verdict_without_restart_writes_no_restart_mark() -> None:
    verdict = Verdict("keep", "starting", "x", "3-starting")
    assert RESTARTED_AT_ANNOTATION not in plan(notebook(), verdict, NOW, 120).annotations


def test_a_notebook_view_plans_like_the_notebook_object() -> None:
    nb = notebook(**{STOPPED_BY_ANNOTATION: STOPPED_BY_VALUE, STOPPED_AT_ANNOTATION: "2026-11-29T11:59:30Z"})
    policy = Policy()
    view = SessionView.of(nb, old_pod(), policy)
    assert (view.namespace, view.name, view.server_type, view.gpus) == ("ns", "nb", "jupyter", 0)
    for v in (decide(nb, old_pod(), IDLE_JUPYTER, policy, NOW),
              decide(notebook(), old_pod(), IDLE_JUPYTER, policy, NOW + timedelta(hours=3))):
        assert dataclasses.replace(plan(view, v, NOW, 120), record=None) == plan(nb, v, NOW, 120)


def test_a_warning_is_given_once_per_idle_period_whatever_happens_to_its_mark() -> None:
    """The culler remembers its warnings itself (issue: deleting warned-at re-armed the warning, its Event,
    mail and webhook, every pass)."""
    from kf_culler.model import WARNED_AT_ANNOTATION
    from kf_culler.plan import EVENT_WARN

    idle_since = NOW - timedelta(minutes=55)
    warn = Verdict("warn", "idle", "Idle for 55 min", "10-idle", idle_since=idle_since)
    first = plan(SessionView.of(notebook(), old_pod(), Policy()), warn, NOW, 120)
    assert first.event is not None and first.event.reason == EVENT_WARN
    assert first.record is not None and first.record.before_patch and first.record.record.warned_at == NOW
    # the user removed the mark: no second Event, the mark comes back with the first warning's time
    later = NOW + timedelta(minutes=1)
    again = plan(SessionView.of(notebook(), old_pod(), Policy(), record=first.record.record), warn, later, 120)
    assert again.event is None and again.annotations[WARNED_AT_ANNOTATION] == "2026-11-29T12:00:00Z"
    assert again.record is None or again.record.record.warned_at == NOW
    # used again, idle again: a new idle period gets its own warning
    new_period = Verdict("warn", "idle", "Idle for 55 min", "10-idle", idle_since=NOW + timedelta(minutes=30))
    third = plan(SessionView.of(notebook(), old_pod(), Policy(), record=first.record.record), new_period,
                 NOW + timedelta(minutes=85), 120)
    assert third.event is not None and third.event.reason == EVENT_WARN
