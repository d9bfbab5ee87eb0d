"""The sweep's cohort replay and shared decisions give exactly what replaying each policy through `decide` gives.

kf_culler/replay/cohorts.py steps the configurations that are in the same state together and gives them their
verdicts through kf_culler/replay/shared_decide.py (one `decide` call for the policies that read alike). Here
the plain replay (kf_culler/replay/simulate.py `replay`, one `SweptPolicy.check` per configuration and check)
is the reference: every tally, every stop and every figure must be equal, on generated fleets (every
behaviour: restarts, warnings, interruptions, unreachable IDEs), with namespace overrides and policy rules,
with a check period, with the notebooks split over shards, and on a converted trace without ground truth.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import asdict
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from test_replay_convert import template

from kf_culler.cli import main
from kf_culler.config import Policy, load_mapping
from kf_culler.local import objects as obj
from kf_culler.policy import select
from kf_culler.record import parse_record
from kf_culler.replay import shared_decide
from kf_culler.replay import sweep as sw
from kf_culler.replay.cohorts import CohortReplay
from kf_culler.replay.contenders import Contender
from kf_culler.replay.simulate import ReplayResult, replay
from kf_culler.replay.trace import TraceHeader, TraceWriter, open_text
from kf_culler.rules import decide_view
from kf_culler.rules.table import decide_evidence
from kf_culler.session import SessionView
from kf_culler.timeutil import format_time, parse_time

GRID = ["idleMinutes=15,240", "warnMinutes=0,10", "connectedGpuIdleMinutes=off,30",
        "busyKernelGpuIdleMinutes=off,60", "noSignalGpuIdleMinutes=off,90"]
# every team-0N namespace of the generated fleet: one with its own override, and policy rules by server type and GPU
BASE: dict[str, Any] = {
    "idleMinutes": 45,
    "namespaceOverrides": {"team-03": {"warnMinutes": 3, "idleMinutes": 20}, "team-07": {"allowExempt": False}},
    "rules": [{"name": "code", "match": {"serverTypes": ["group-one"]}, "policy": {"idleMinutes": 30}},
              {"name": "gpu", "match": {"gpu": True}, "policy": {"connectedGpuIdleMinutes": 90}}],
}
HERE = Path(__file__).resolve().parent
SCENARIOS = sorted((HERE / "scenarios").glob("*.json"))


def _configs(base: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    return [("current", dict(base))] + [(sw.label(p), sw.with_point(base, p)) for p in sw.points(sw.parse_grid(GRID))]


def _rules(configs: list[tuple[str, dict[str, Any]]]) -> list[sw.SweptPolicy]:
    return [sw.SweptPolicy(name, load_mapping(raw, name)) for name, raw in configs]


def _everything(result: ReplayResult, rules: list[sw.SweptPolicy]) -> dict[str, Any]:
    return {"tallies": [{k: asdict(t) for k, t in per.items()} for per in result.tallies],
            "stops": [[asdict(s) for s in per] for per in result.stops],
            "notebooks": {k: asdict(n) for k, n in result.notebooks.items()},
            "truth": result.truth_known, "records": result.records,
            "rules": [r.rules for r in rules], "workStops": [r.work_stops for r in rules]}


def _both(trace: Path, configs: list[tuple[str, dict[str, Any]]], period: float | None = None
          ) -> tuple[dict[str, Any], dict[str, Any], int, int]:
    """(cohort replay, plain replay) of the configurations, everything they counted; and their decide calls."""
    fast_rules, plain_rules = _rules(configs), _rules(configs)
    cohort = CohortReplay(fast_rules, check_period_minutes=period)
    fast = cohort.run(trace)
    contenders: list[Contender] = list(plain_rules)
    plain = replay(trace, contenders, check_period_minutes=period)
    return _everything(fast, fast_rules), _everything(plain, plain_rules), cohort.calls, plain.decide_calls


def _figures(results: tuple[bool, list[dict[str, sw.Figures]]]) -> tuple[bool, list[dict[str, Any]]]:
    return results[0], [{g: asdict(f) for g, f in per.items()} for per in results[1]]


def _fleet(tmp_path: Path, seed: int, notebooks: int = 12, days: str = "2", mix: tuple[str, ...] = ()) -> Path:
    trace = tmp_path / f"fleet-{seed}.jsonl.gz"
    assert main(["fleet", "--notebooks", str(notebooks), "--days", days, "--seed", str(seed), "--out", str(trace),
                 *mix]) == 0
    return trace


@pytest.mark.parametrize("seed", [1, 2])
def test_generated_fleets_count_alike(tmp_path: Path, seed: int) -> None:
    trace = _fleet(tmp_path, seed)
    fast, plain, calls, plain_calls = _both(trace, _configs({}))
    assert fast == plain
    tallies = [t for per in fast["tallies"] for t in per.values()]
    assert sum(t["stops"] for t in tallies) and sum(t["warnings"] for t in tallies)
    assert sum(t["restarts"] for t in tallies) and sum(t["interruptions"] for t in tallies)
    assert calls * 3 < plain_calls  # the policies that read alike shared their decisions


def test_overrides_rules_and_no_signal_count_alike(tmp_path: Path) -> None:
    trace = _fleet(tmp_path, 4, notebooks=24, mix=(
        "--mix", "unreachable=2,coding-bursts=1,code-server=1,rstudio=1,hung-kernel=1,cpu-only=1"))
    fast, plain, _, _ = _both(trace, _configs(BASE))
    assert fast == plain
    chosen = {rule for per in fast["rules"] for rule in per.values()}
    assert {"namespaceOverrides.team-03", "code", "gpu", "default"} <= chosen
    reasons = [s["reason"] for per in fast["stops"] for s in per]
    assert any("IDE could not be read" in r for r in reasons)  # rule 16, the no-signal GPU stop


def test_a_check_period_counts_alike(tmp_path: Path) -> None:
    trace = _fleet(tmp_path, 5)
    fast, plain, _, _ = _both(trace, _configs({}), period=12)
    assert fast == plain


def test_shards_give_the_figures_of_one_pass(tmp_path: Path) -> None:
    trace = _fleet(tmp_path, 6)
    configs = _configs(BASE)
    one = sw.combine([sw.run_job(sw.Job(str(trace), configs, "rule", 5, None))])
    shards = [sw.run_job(sw.Job(str(trace), configs, "rule", 5, None, k, 3)) for k in range(3)]
    assert all(r.first_seen for r in shards)  # every shard had notebooks
    assert _figures(sw.combine(shards)) == _figures(one)
    assert _figures(one) == _figures(sw.combine([sw.run_job_plainly(sw.Job(str(trace), configs, "rule", 5, None))]))


def test_a_converted_trace(tmp_path: Path) -> None:
    src, trace = tmp_path / "template.json", tmp_path / "trace.jsonl.gz"
    src.write_text(json.dumps(template()))
    assert main(["convert", str(src), "--out", str(trace), "--namespace", "adobe"]) == 0
    fast, plain, _, _ = _both(trace, _configs({}))
    assert fast == plain


def _hung_kernel_recording(path: Path) -> None:
    """A recording (no ground truth) of a GPU notebook whose kernel stays busy with its GPU idle for 6 hours, and
    of a CPU notebook with a busy kernel beside it."""
    start = datetime(2026, 3, 2, 9, tzinfo=UTC)
    with open_text(path, "w") as out:
        writer = TraceWriter(out, TraceHeader(start=start, check_period_seconds=300))
        for minute in range(0, 6 * 60, 5):
            now = start + timedelta(minutes=minute)
            for gpus in (1, 0):
                nb = obj.notebook(f"hung-{gpus}", gpus=gpus)
                nb["metadata"]["namespace"] = "team-a"
                pod = {"metadata": {"name": f"hung-{gpus}-0", "namespace": "team-a"},
                       "spec": {"containers": [{"name": "nb", "resources": nb["spec"]["template"]["spec"][
                           "containers"][0]["resources"]}]},
                       "status": {"phase": "Running", "startTime": format_time(start)}}
                obs: dict[str, Any] = {"jupyter": {
                    "status": {"started": format_time(start), "last_activity": format_time(start + timedelta(
                        minutes=20)), "connections": 0, "kernels": 1},
                    "kernels": [{"id": "k", "name": "python3", "last_activity": format_time(start + timedelta(
                        minutes=20)), "execution_state": "busy", "connections": 0}], "terminals": []}}
                if gpus:
                    obs["gpu"] = {"samples": [{"time": format_time(now), "utilPercent": 0, "memoryUsedMiB": 9000}]}
                writer.write(now, nb, pod, obs)


def test_a_trace_without_ground_truth(tmp_path: Path) -> None:
    """A recording has no ground truth: interruptions are the stops made while the recorded world showed work (here,
    busyKernelGpuIdleMinutes stopping a busy kernel whose GPU does nothing)."""
    trace = tmp_path / "recorded.jsonl.gz"
    _hung_kernel_recording(trace)
    fast, plain, _, _ = _both(trace, _configs({}))
    assert fast == plain
    assert not fast["truth"] and any(per for per in fast["workStops"])


@pytest.mark.parametrize("path", SCENARIOS, ids=[p.stem for p in SCENARIOS])
def test_shared_verdicts_are_decides(path: Path) -> None:
    """Every scenario, under the grid's policies around its own: each verdict is decide_view's."""
    doc = json.loads(path.read_text())
    now = parse_time(doc["now"])
    assert now is not None
    settings = load_mapping(doc.get("config"), path.name)
    view = SessionView.of(doc["notebook"], doc.get("pod"), settings.policy, node=doc.get("node"),
                           record=parse_record(doc.get("cullerRecord")), access_problem=doc.get("accessProblem"))
    view = dataclasses.replace(view, stop_deadline_seconds=settings.operations.stop_deadline_seconds)
    policy = select(view, doc.get("namespaceLabels"), settings)[0]
    fields = {(f.alias or name): name for name, f in Policy.model_fields.items()}
    policies = [policy] + [policy.model_copy(update={fields[k]: v for k, v in p.items()})
                           for p in sw.points(sw.parse_grid(GRID))]
    obs = doc.get("observations") or {}
    for at in (now, now + timedelta(minutes=50), now + timedelta(hours=5)):
        shared, _ = shared_decide.shared_verdicts(view, obs, policies, at, shared_decide.Signatures())
        given = {i: v for v, positions in shared for i in positions}
        assert sorted(given) == list(range(len(policies)))
        for i, p in enumerate(policies):
            assert given[i] == decide_view(view, obs, p, at), f"{path.name}, policy {i} at {at}"


def test_a_policy_method_read_gives_every_policy_its_own_call(monkeypatch: pytest.MonkeyPatch) -> None:
    doc = json.loads(SCENARIOS[0].read_text())
    now = parse_time(doc["now"])
    assert now is not None
    policy = load_mapping(doc.get("config"), "scenario").policy
    view = SessionView.of(doc["notebook"], doc.get("pod"), policy)
    real = decide_evidence

    def reads_a_method(ev: Any, policy: Any, at: Any) -> Any:  # the rules, had one of them called a policy method
        policy.server_type_for_image("x")
        return real(ev, policy, at)

    monkeypatch.setattr(shared_decide, "decide_evidence", reads_a_method)
    policies = [policy, policy.model_copy(), policy.model_copy(update={"idle_minutes": 5})]
    shared, calls = shared_decide.shared_verdicts(view, doc["observations"], policies, now, shared_decide.Signatures())
    assert calls == 3 and sorted(len(positions) for _, positions in shared) == [1, 1, 1]
