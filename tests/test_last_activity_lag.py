"""The web app's "Last activity" (notebooks.kubeflow.org/last-activity) with the default settings: an
active notebook's column never lags by more than lastActivityStepMinutes + checkPeriodSeconds (at most
15 minutes), at one write per step."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from kf_culler.config import Operations
from kf_culler.model import LAST_ACTIVITY_ANNOTATION, Verdict
from kf_culler.plan import plan
from kf_culler.timeutil import parse_time


def test_default_step_keeps_last_activity_within_15_minutes_of_an_active_notebook() -> None:
    ops = Operations()
    step, period = ops.last_activity_step_minutes, ops.check_period_seconds
    assert step * 60 + period <= 15 * 60, "the documented lag bound"
    nb: dict[str, Any] = {"metadata": {"namespace": "team", "name": "nb", "annotations": {
        LAST_ACTIVITY_ANNOTATION: "2026-01-01T07:00:00Z"}}}  # as left by an older culler
    t0 = datetime(2026, 1, 1, 8, 0, 3, tzinfo=UTC)
    worst, writes, hours = 0.0, 0, 3
    for i in range(int(hours * 3600 / period)):
        now = t0 + timedelta(seconds=i * period + (i % 7))  # passes a check period apart, a few seconds late
        p = plan(nb, Verdict("keep", "active", "working", "5-positive-evidence"), now, step)
        if LAST_ACTIVITY_ANNOTATION in p.annotations:
            writes += 1
            nb["metadata"]["annotations"][LAST_ACTIVITY_ANNOTATION] = p.annotations[LAST_ACTIVITY_ANNOTATION]
        shown = parse_time(nb["metadata"]["annotations"][LAST_ACTIVITY_ANNOTATION])
        assert shown is not None
        # What a user sees just before the next pass: the value shown, one period (and the lateness) on.
        worst = max(worst, (now + timedelta(seconds=period + 6) - shown).total_seconds())
    assert worst <= step * 60 + period + 6 <= 15 * 60 + 6, worst
    # One write per step (per step plus a period at worst, when a pass falls just short of the step).
    assert 60 / (step + period / 60) * hours - 1 <= writes <= 60 / step * hours + 1, writes
