"""plan(): what a verdict writes, in particular around a user's restart of a notebook the culler stopped."""

from __future__ import annotations

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

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
IDLE_JUPYTER = {"jupyter": {"status": {"started": "2026-11-29T04:00:00Z", "last_activity": "2026-11-29T09:00:00Z",
                                       "connections": 0, "kernels": 0}, "kernels": [], "terminals": []}}


def notebook(**ann: str) -> dict[str, Any]:
    return {"metadata": {"name": "nb", "namespace": "ns", "annotations": dict(ann)}}


def old_pod() -> dict[str, Any]:
    return {"metadata": {"name": "nb-0"}, "status": {"phase": "Running", "startTime": "2026-11-29T04:00:00Z"}}


def test_a_restart_is_seen_once_marked_and_announced() -> None:
    nb = notebook(**{STOPPED_BY_ANNOTATION: STOPPED_BY_VALUE, STOPPED_AT_ANNOTATION: "2026-11-29T11:59:30Z"})
    verdict = decide(nb, old_pod(), IDLE_JUPYTER, Policy(), NOW)
    assert (verdict.action, verdict.state, verdict.rule) == ("keep", "starting", "3-restarted")
    p = plan(nb, verdict, NOW, 120)
    assert p.annotations == {STOPPED_BY_ANNOTATION: None, STOPPED_AT_ANNOTATION: None,
                             RESTARTED_AT_ANNOTATION: "2026-11-29T12:00:00Z"}
    assert p.event is not None and p.event.reason == EVENT_RESTART


def test_the_grace_counts_from_the_restart_then_the_idle_notebook_is_stopped_again() -> None:
    policy = Policy()
    nb = notebook(**{RESTARTED_AT_ANNOTATION: "2026-11-29T12:00:00Z"})
    grace = timedelta(minutes=policy.startup_grace_minutes)
    inside = decide(nb, old_pod(), IDLE_JUPYTER, policy, NOW + grace - timedelta(seconds=1))
    assert (inside.action, inside.state) == ("keep", "starting")
    late = NOW + timedelta(minutes=policy.idle_minutes) + timedelta(seconds=1)
    after = decide(nb, old_pod(), IDLE_JUPYTER, policy, late)
    assert after.action == "stop"
    p = plan(nb, after, late, 120)
    assert p.annotations[RESTARTED_AT_ANNOTATION] is None and STOP_ANNOTATION in p.annotations
    assert p.event is not None and p.event.reason == EVENT_STOP


def test_a_stop_annotation_we_did_not_write_is_never_a_restart() -> None:
    nb = notebook(**{STOP_ANNOTATION: "odh-lock"})
    verdict = decide(nb, old_pod(), IDLE_JUPYTER, Policy(), NOW)
    assert verdict.rule == "1-stopped"
    assert plan(nb, verdict, NOW, 120).empty


def test_keep_verdict_without_restart_writes_no_restart_mark() -> None:
    verdict = Verdict("keep", "starting", "x", "3-starting")
    assert RESTARTED_AT_ANNOTATION not in plan(notebook(), verdict, NOW, 120).annotations


def test_a_notebook_view_plans_like_the_notebook_object() -> None:
    from kf_culler.notebook import NotebookView

    nb = notebook(**{STOPPED_BY_ANNOTATION: STOPPED_BY_VALUE, STOPPED_AT_ANNOTATION: "2026-11-29T11:59:30Z"})
    policy = Policy()
    view = NotebookView.of(nb, old_pod(), policy)
    assert (view.namespace, view.name, view.server_type, view.gpus) == ("ns", "nb", "jupyter", 0)
    for v in (decide(nb, old_pod(), IDLE_JUPYTER, policy, NOW),
              decide(notebook(), old_pod(), IDLE_JUPYTER, policy, NOW + timedelta(hours=3))):
        assert plan(view, v, NOW, 120) == plan(nb, v, NOW, 120)
