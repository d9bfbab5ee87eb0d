"""A stop is done when the GPU is free (rule 1-stop-not-taken, docs/targets.md "A stop that does not take"): what
the plan writes for one, the target's next step, the bound's configuration, and what `check` and the metrics say.
Pure: no cluster (tests/test_e2e_workspaces.py has the real Workspace controller's case)."""

from __future__ import annotations

import copy
import dataclasses
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from kf_culler.config import ConfigError, load_mapping
from kf_culler.cycle import CycleResult, NotebookResult
from kf_culler.decide import decide_view
from kf_culler.metrics import Metrics
from kf_culler.model import STOP_ANNOTATION
from kf_culler.plan import EVENT_NOT_TAKEN, plan
from kf_culler.record import CullerRecord, parse_record
from kf_culler.report import render
from kf_culler.rules.untaken import Reclaim, next_step
from kf_culler.session import SessionView
from kf_culler.targets import CONTROLS_KEY

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
STOPPED_AT = NOW - timedelta(minutes=10)
BASE = json.loads((Path(__file__).parent / "scenarios" / "01-jupyter-idle-kernel.json").read_text())
STS_UID = "5e7f0000-0000-4000-8000-000000000001"
SETTINGS = load_mapping({"idleMinutes": 60, "warnMinutes": 0}, "test")
DEADLINE = SETTINGS.operations.stop_deadline_seconds


def notebook(stopped: bool = True) -> dict[str, Any]:
    nb: dict[str, Any] = copy.deepcopy(BASE["notebook"])
    if stopped:
        nb["metadata"]["annotations"][STOP_ANNOTATION] = "2026-11-29T11:50:00Z"
    return nb


def workspace(paused: bool = True, controls: dict[str, int] | None = None) -> dict[str, Any]:
    ws: dict[str, Any] = {"apiVersion": "kubeflow.org/v1beta1", "kind": "Workspace",
                          "metadata": {"name": "ws", "namespace": "team-a", "uid": "ws-uid"},
                          "spec": {"paused": paused}}
    if controls is not None:
        ws[CONTROLS_KEY] = controls
    return ws


def pod(owner: dict[str, Any] | None = None, **changes: Any) -> dict[str, Any]:
    p: dict[str, Any] = copy.deepcopy(BASE["pod"])
    if owner is not None:
        p["metadata"]["ownerReferences"] = [owner]
    p.update(changes)
    return p


STS_REF = {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "ws-abcde", "uid": STS_UID, "controller": True}


def view(session: dict[str, Any], the_pod: dict[str, Any] | None, record: CullerRecord | None) -> SessionView:
    v = SessionView.of(session, the_pod, SETTINGS.policy, record=record)
    return dataclasses.replace(v, stop_deadline_seconds=DEADLINE)


def test_a_workspace_stop_that_did_not_take_is_told_once_and_its_own_statefulset_scaled_to_0() -> None:
    """The first pass past the deadline: a Warning Event, the record remembers it was told, and the next step is
    the StatefulSet the pod's controller ownerReference names (by uid). The next pass: no second Event, the step
    again (it is idempotent) until the pod is gone."""
    v = view(workspace(controls={"statefulSets": 2, "services": 1}), pod(STS_REF), CullerRecord(stopped_at=STOPPED_AT))
    verdict = decide_view(v, {}, SETTINGS.policy, NOW)
    assert (verdict.action, verdict.state, verdict.rule_id) == ("keep", "stopped", "1-stop-not-taken")
    assert "did not take" in verdict.reason and "2 StatefulSets" in verdict.reason, verdict.reason
    assert "ws-abcde" in verdict.reason
    first = plan(v, verdict, NOW, 10)
    assert first.annotations == {}  # the stop stands: nothing on the Workspace changes
    assert first.event is not None and (first.event.type, first.event.reason) == ("Warning", EVENT_NOT_TAKEN)
    assert first.reclaim == Reclaim("StatefulSet", "ws-abcde", STS_UID)
    assert first.record is not None and first.record.record.not_taken_at == NOW
    assert first.record.record.stopped_at == STOPPED_AT and not first.record.before_patch
    later = NOW + timedelta(minutes=1)
    again = plan(dataclasses.replace(v, record=first.record.record), decide_view(
        dataclasses.replace(v, record=first.record.record), {}, SETTINGS.policy, later), later, 10)
    assert again.event is None and again.record is None
    assert again.reclaim == Reclaim("StatefulSet", "ws-abcde", STS_UID)


@pytest.mark.parametrize("session,owner,why", [
    (notebook(), STS_REF, "a v1 Notebook's StatefulSet is its controller's"),
    (workspace(), {**STS_REF, "kind": "ReplicaSet"}, "a Workspace pod not controlled by a StatefulSet"),
    (workspace(), None, "a Workspace pod without a controller"),
])
def test_only_a_workspace_pod_of_a_statefulset_has_a_next_step(session: dict[str, Any], owner: dict[str, Any] | None,
                                                              why: str) -> None:
    v = view(session, pod(owner), CullerRecord(stopped_at=STOPPED_AT))
    verdict = decide_view(v, {}, SETTINGS.policy, NOW)
    assert verdict.rule_id == "1-stop-not-taken", why
    assert next_step(v) is None, why
    p = plan(v, verdict, NOW, 10)
    assert p.reclaim is None and p.event is not None, why
    assert "an administrator must free it" in verdict.reason, verdict.reason


def test_a_report_after_the_stop_is_not_the_report_of_a_later_stop() -> None:
    """`stopNotTakenAt` before the last `stoppedAt` (an earlier stop's report): this stop is told again."""
    record = CullerRecord(stopped_at=STOPPED_AT, not_taken_at=STOPPED_AT - timedelta(days=1))
    assert not record.not_taken_told()
    v = view(notebook(), pod(), record)
    assert plan(v, decide_view(v, {}, SETTINGS.policy, NOW), NOW, 10).event is not None


def test_the_record_field_round_trips_and_an_old_record_reads() -> None:
    record = CullerRecord(stopped_at=STOPPED_AT, not_taken_at=NOW)
    assert parse_record(record.to_dict()) == record
    assert parse_record({"stoppedAt": "2026-11-29T11:50:00Z"}) == CullerRecord(stopped_at=STOPPED_AT)
    assert not CullerRecord(not_taken_at=NOW).empty


@pytest.mark.parametrize("config,seconds", [
    ({}, 180.0), ({"checkPeriodSeconds": 10}, 120.0), ({"checkPeriodSeconds": 300}, 900.0),
    ({"stopDeadlineMinutes": 7}, 420.0), ({"checkPeriodSeconds": 30, "stopDeadlineMinutes": 0.5}, 30.0),
])
def test_the_deadline_defaults_to_three_periods_and_may_be_set(config: dict[str, Any], seconds: float) -> None:
    assert load_mapping(config, "test").operations.stop_deadline_seconds == seconds


@pytest.mark.parametrize("value,words", [
    (0, "stopDeadlineMinutes"), (-1, "stopDeadlineMinutes"), (1441, "stopDeadlineMinutes"),
    ("soon", "stopDeadlineMinutes"), (0.5, "shorter than one pass"),
])
def test_a_bad_deadline_names_its_key(value: Any, words: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_mapping({"stopDeadlineMinutes": value}, "test")
    assert words in str(err.value) and "stopDeadlineMinutes" in str(err.value), str(err.value)


def result_of(session: dict[str, Any], record: CullerRecord) -> NotebookResult:
    v = view(session, pod(STS_REF), record)
    verdict = decide_view(v, {}, SETTINGS.policy, NOW)
    return NotebookResult(*v.key, v.server_type, v.gpus, verdict, {})


def test_check_warns_and_the_metric_counts_the_stops_not_taken_by_kind() -> None:
    taken = result_of(notebook(), CullerRecord(stopped_at=NOW - timedelta(seconds=30)))
    assert taken.verdict.rule_id == "1-stopped"
    results = [result_of(workspace(), CullerRecord(stopped_at=STOPPED_AT)),
               result_of(notebook(), CullerRecord(stopped_at=STOPPED_AT)), taken]
    cycle = CycleResult(NOW, NOW, 0.1, results)
    text = render(cycle, "table")
    assert "# warning: the stop of team-a/Workspace/ws did not take" in text, text
    assert "# warning: the stop of team-a/nb-idle did not take" in text, text
    assert len(json.loads(render(cycle, "json"))["warnings"]) == 2
    metrics = Metrics()
    metrics.observe_cycle(cycle)
    samples = {s.labels["kind"]: s.value for m in metrics.registry.collect() if m.name == "kf_culler_stops_not_taken"
               for s in m.samples}
    assert samples["Workspace"] == 1 and samples["Notebook"] == 1 and samples["StatefulSet"] == 0, samples


def test_a_notebook_whose_stop_did_not_take_is_not_counted_as_reclaimed() -> None:
    """GPU-hours reclaimed count from the stop; a stop that did not take holds its GPU and adds nothing."""
    nb = notebook()
    nb["metadata"]["annotations"]["notebook-culler.io/stopped-at"] = "2026-11-29T11:50:00Z"
    items: list[tuple[dict[str, Any], dict[str, Any] | None]] = [(nb, None)]

    def gpu_hours(not_taken: frozenset[tuple[str, str]]) -> float:
        metrics = Metrics()
        metrics._started = 0.0  # counted from the stop, not from this process's start
        metrics.account_reclaimed(items, NOW, lambda _nb: ("nvidia.com/gpu",), lambda _nb: True,
                                  not_taken=not_taken)
        return next(s.value for m in metrics.registry.collect() if m.name == "kf_culler_gpu_hours_reclaimed"
                    for s in m.samples if s.name.endswith("_total"))

    assert gpu_hours(frozenset()) == pytest.approx(10 / 60)
    assert gpu_hours(frozenset({("team-a", "nb-idle")})) == 0


def test_explain_says_what_the_culler_would_do_next() -> None:
    from kf_culler.report import explain

    v = view(workspace(controls={"statefulSets": 2, "services": 1}), pod(STS_REF), CullerRecord(stopped_at=STOPPED_AT))
    verdict = decide_view(v, {}, SETTINGS.policy, NOW)
    r = NotebookResult(*v.key, v.server_type, v.gpus, verdict, {}, plan=plan(v, verdict, NOW, 10), record=v.record)
    text = explain(r)
    assert "rule 1-stop-not-taken" in text and f"Event {EVENT_NOT_TAKEN}" in text, text
    assert "scale the StatefulSet ws-abcde to 0" in text, text
    assert '"stopNotTakenAt"' not in text  # the record as the pass read it: not told yet
