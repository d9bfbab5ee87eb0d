"""The replay's counting on a small hand-built trace whose answer is worked out by hand below,
and the two reference rules on their own."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from kf_culler.config import Policy
from kf_culler.replay.contenders import GpuOnlyRule, KubeflowKernelRule, make_contenders
from kf_culler.replay.report import percentile, reclaim_delays, summary
from kf_culler.replay.simulate import HOUR, ReplayResult, replay
from kf_culler.replay.trace import TraceHeader, TraceWriter, Truth, open_text

T0 = datetime(2026, 3, 2, tzinfo=UTC)
PERIOD = 10  # minutes between records
END = 420  # records at 0, 10, ..., 410; the last one lasts until 420
MIN = 60.0  # seconds


def at(minute: int) -> datetime:
    return T0 + timedelta(minutes=minute)


def z(minute: int) -> str:
    return at(minute).strftime("%Y-%m-%dT%H:%M:%SZ")


def notebook(name: str) -> dict[str, Any]:
    return {"apiVersion": "kubeflow.org/v1", "kind": "Notebook",
            "metadata": {"name": name, "namespace": "team", "annotations": {}},
            "spec": {"template": {"spec": {"containers": [{
                "name": name, "image": "jupyter", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}}}


def pod(name: str) -> dict[str, Any]:
    return {"metadata": {"name": f"{name}-0", "namespace": "team"},
            "spec": {"containers": [{"name": name, "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
            "status": {"phase": "Running", "startTime": z(0)}}


def jupyter(last: int, connections: int, kernels: list[tuple[int, str]], terminal: int | None = None
            ) -> dict[str, Any]:
    return {"status": {"started": z(0), "last_activity": z(last), "connections": connections,
                       "kernels": len(kernels)},
            "kernels": [{"id": f"k{i}", "name": "python3", "last_activity": z(t), "execution_state": s,
                         "connections": connections} for i, (t, s) in enumerate(kernels)],
            "terminals": [] if terminal is None else [{"name": "1", "last_activity": z(terminal)}]}


def gpu(t: int, util: int, mem: int) -> dict[str, Any]:
    return {"samples": [{"time": z(t), "utilPercent": util, "memoryUsedMiB": mem}]}


def coder(t: int) -> tuple[dict[str, Any], Truth]:
    """Works until 120 (last action 115), away until 360, back from 360; GPU idle throughout."""
    if t < 120 or t >= 360:
        return {"jupyter": jupyter(t, 1, [(t, "idle")]), "gpu": gpu(t, 0, 0)}, "working"
    return {"jupyter": jupyter(115, 0, [(115, "idle")]), "gpu": gpu(t, 0, 0)}, "absent"


def nohup(t: int) -> tuple[dict[str, Any], Truth]:
    """Training started from a terminal at 0: no kernels, GPU busy the whole time."""
    return {"jupyter": jupyter(0, 0, [], terminal=0), "gpu": gpu(t, 90, 20000)}, "working"


def tab(t: int) -> tuple[dict[str, Any], Truth]:
    """Works until 60 (last cell at 55), then leaves the tab open (it polls: server activity is fresh)."""
    if t < 60:
        return {"jupyter": jupyter(t, 1, [(t, "idle")]), "gpu": gpu(t, 0, 0)}, "working"
    return {"jupyter": jupyter(t, 1, [(55, "idle")]), "gpu": gpu(t, 0, 0)}, "present"


@pytest.fixture(scope="module")
def trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("counting") / "hand.jsonl"
    with open_text(path, "w") as out:
        w = TraceWriter(out, TraceHeader(start=T0, check_period_seconds=PERIOD * 60, synthetic=True))
        for t in range(0, END, PERIOD):
            for name, story in (("coder", coder), ("nohup", nohup), ("tab", tab)):
                o, truth = story(t)
                w.write(at(t), notebook(name), pod(name), o, truth)
    return path


@pytest.fixture(scope="module")
def config(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("config") / "hand.yaml"
    path.write_text("idleMinutes: 60\nwarnMinutes: 10\nstartupGraceMinutes: 10\n"
                    "gpu: {utilPercent: 5, memoryMiB: 256}\n")
    return path


def run(trace: Path, config: Path, **kw: Any) -> ReplayResult:
    rules = make_contenders(str(config), ["kubeflow-kernel", "gpu-only"])
    return replay(trace, rules, restart_delay_minutes=10, **kw)


def hours(minutes: float) -> float:
    return minutes * MIN / HOUR


def test_fleet_totals(trace: Path, config: Path) -> None:
    r = run(trace, config)
    assert r.records == 3 * END // PERIOD
    assert r.truth_known
    assert r.rule_names == ["hand", "kubeflow-kernel (60 min)", "gpu-only (60 min, <5 %)"]
    # three 1-GPU notebooks held for 420 min each without a culler
    assert r.baseline_gpu_s == pytest.approx(3 * 420 * MIN)
    # only the coder is ever absent: [120, 360); the oracle waits the 60 min limit, then reclaims [180, 360)
    assert r.oracle_gpu_s == pytest.approx(180 * MIN)
    assert r.notebooks["team/coder"].oracle_gpu_s == pytest.approx(180 * MIN)


def test_policy_counts(trace: Path, config: Path) -> None:
    r = run(trace, config)
    t = r.total(0)
    # coder: last action 115 -> warned at 170 (idle 55 >= 60 - 10), stopped at 180 (idle 65), absent then.
    # Back at 360 (working): restarted, the pod runs again at 370. Held [0, 180) + [370, 420) = 230 min.
    # nohup: the GPU works -> active, held 420. tab: connected -> kept, held 420.
    assert t.held_gpu_s == pytest.approx((230 + 420 + 420) * MIN)
    assert t.reclaimed_gpu_s == pytest.approx({"absent": 180 * MIN, "working": 10 * MIN})
    assert t.oracle_matched_gpu_s == pytest.approx(180 * MIN)
    assert (t.stops, t.absent_stops, t.present_stops) == (1, 1, 0)
    assert (t.interruptions, t.interrupted_intervals) == (0, 0)
    assert (t.restarts, t.warnings) == (1, 1)
    assert t.working_lost_s == pytest.approx(10 * MIN)
    assert [(s.time, s.id, s.truth) for s in r.stops[0]] == [(at(180), "team/coder", "absent")]
    assert reclaim_delays(r.stops[0]) == [60 * MIN]  # from the first absent record (120) to the stop
    # decide ran at every record of every running notebook: 42 + 42 + coder (0..180: 19, 370..410: 5)
    assert t.checks == 42 + 42 + 19 + 5


def test_kubeflow_kernel_rule_counts(trace: Path, config: Path) -> None:
    r = run(trace, config)
    t = r.total(1)
    # coder: kernel last_activity 115 -> stopped at 180 (115 + 60 < 180); back at 360, runs from 370: 230 min.
    # nohup: no kernels, so last-activity stays at the pod start: stopped at 70 (0 + 60 < 70), restarted at
    #   80 (the job's truth is working), stopped at 150, 230, 310, 390: five interruptions of one interval;
    #   held [0,70) [80,150) [160,230) [240,310) [320,390) [400,420) = 370 min.
    # tab: last kernel activity 55 -> stopped at 120 while present; nobody comes back: held 120 min.
    assert t.held_gpu_s == pytest.approx((230 + 370 + 120) * MIN)
    assert t.reclaimed_gpu_s == pytest.approx({"absent": 180 * MIN, "working": (10 + 50) * MIN,
                                               "present": 300 * MIN})
    assert (t.stops, t.present_stops, t.absent_stops) == (7, 1, 1)
    assert (t.interruptions, t.interrupted_intervals) == (5, 1)
    assert t.restarts == 1 + 5
    assert t.working_lost_s == pytest.approx((10 + 50) * MIN)
    assert [s.time for s in r.stops[1] if s.id == "team/nohup"] == [at(m) for m in (70, 150, 230, 310, 390)]
    assert sorted(reclaim_delays(r.stops[1])) == [60 * MIN, 60 * MIN]  # coder 120->180, tab 60->120


def test_gpu_only_rule_counts(trace: Path, config: Path) -> None:
    r = run(trace, config)
    t = r.total(2)
    # coder: GPU never >= 5 %: stopped at 60 while working (interruption), restarted at 70, stopped at 130
    #   (absent), restarted at 370: held [0,60) [70,130) [370,420) = 170 min.
    # nohup: 90 % -> never stopped. tab: stopped at 60, present: held 60 min.
    assert t.held_gpu_s == pytest.approx((170 + 420 + 60) * MIN)
    assert t.reclaimed_gpu_s == pytest.approx({"working": 20 * MIN, "absent": 230 * MIN,
                                               "present": 360 * MIN})
    assert t.oracle_matched_gpu_s == pytest.approx(180 * MIN)
    assert (t.stops, t.present_stops, t.absent_stops) == (3, 1, 1)
    assert (t.interruptions, t.interrupted_intervals) == (1, 1)
    assert t.restarts == 2


def test_summary_and_percentiles(trace: Path, config: Path) -> None:
    s = summary(run(trace, config))
    assert s["gpuHoursWithoutCuller"] == pytest.approx(21.0)
    assert s["oracleReclaimableGpuHours"] == pytest.approx(3.0)
    hand, kubeflow, gpu_only = s["policies"]
    assert hand["oracleShare"] == pytest.approx(1.0)
    assert hand["gpuHoursReclaimed"] == pytest.approx(hours(190))
    assert kubeflow["interruptions"] == 5
    assert [i["time"] for i in kubeflow["interruptionList"]] == [z(m) for m in (70, 150, 230, 310, 390)]
    assert gpu_only["timeToReclaimMinutes"]["p50"] == pytest.approx(0)  # tab: stopped at its first present
    assert gpu_only["timeToReclaimMinutes"]["p99"] == pytest.approx(10)  # coder: absent at 120, stopped 130
    assert percentile([5, 1, 3, 2, 4], 50) == 3 and percentile([], 90) is None


def test_check_period_and_oracle_limit(trace: Path, config: Path) -> None:
    # deciding every 40 min: the coder is seen idle at 160 (45 min) and stopped at 200, not 180
    r = run(trace, config, check_period_minutes=40)
    assert [(s.time, s.id) for s in r.stops[0]] == [(at(200), "team/coder")]
    assert r.total(0).held_gpu_s == pytest.approx((250 + 420 + 420) * MIN)
    assert r.total(0).oracle_matched_gpu_s == pytest.approx(160 * MIN)
    # a 120 min oracle only reclaims [240, 360)
    assert run(trace, config, oracle_idle_minutes=120).oracle_gpu_s == pytest.approx(120 * MIN)


def test_timeline_of_one_notebook(trace: Path, config: Path) -> None:
    r = run(trace, config, timeline_id="team/coder")
    assert len(r.timeline) == END // PERIOD
    row = next(x for x in r.timeline if x.time == at(180))
    assert row.truth == "absent" and row.rules[0][1] is not None and row.rules[0][1].action == "stop"
    stopped = next(x for x in r.timeline if x.time == at(300))
    assert stopped.rules[0] == (False, None)
    assert next(x for x in r.timeline if x.time == at(370)).rules[0][1].state == "starting"  # type: ignore[union-attr]


# --- the reference rules on their own ----------------------------------------------------------------


def check(rule: Any, memo: dict[str, Any], observations: dict[str, Any], minute: int,
          started: int = 0) -> str:
    return str(rule.check(memo, notebook("x"), pod("x"), observations, at(minute), at(started), {}).action)


def test_kubeflow_rule_counts_no_answer_and_no_kernels_as_never_active() -> None:
    rule = KubeflowKernelRule(60)
    for obs in ({}, {"jupyter": {"error": "timeout"}}, {"jupyter": jupyter(50, 1, [])},
                {"codeServer": {"healthz": {"status": "alive", "lastHeartbeat": 0}}}):
        memo: dict[str, Any] = {}
        assert [check(rule, memo, obs, m) for m in (30, 60, 61)] == ["keep", "keep", "stop"]
    memo = {}
    assert check(rule, memo, {"jupyter": jupyter(50, 0, [(50, "busy")])}, 100) == "keep"  # busy -> now
    assert check(rule, memo, {}, 160) == "keep" and check(rule, memo, {}, 161) == "stop"
    memo = {}
    assert check(rule, memo, {"jupyter": jupyter(0, 0, [(90, "idle"), (20, "idle")])}, 100) == "keep"
    assert check(rule, memo, {"jupyter": jupyter(0, 0, [(90, "idle")])}, 151) == "stop"
    # a new pod starts the clock again
    assert check(rule, memo, {}, 200, started=190) == "keep"


def test_gpu_only_rule_reads_utilisation_only() -> None:
    rule = GpuOnlyRule(60, 5)
    memo: dict[str, Any] = {}
    # utilisation without memory counts as use for this rule
    assert check(rule, memo, {"gpu": gpu(50, 40, 0)}, 50) == "keep"
    assert check(rule, memo, {"gpu": gpu(100, 0, 30000)}, 100) == "keep"
    assert check(rule, memo, {"gpu": {"error": "no metrics"}}, 110) == "stop"
    cpu = notebook("c")
    cpu["spec"]["template"]["spec"]["containers"][0]["resources"] = {}
    assert rule.check({}, cpu, None, {}, at(500), at(0), {}).action == "keep"


def test_rule_names_and_parameters(config: Path) -> None:
    rules = make_contenders(None, ["kubeflow-kernel:1440", "gpu-only:30:10", "defaults", "gpu-only"])
    assert [r.name for r in rules] == ["defaults", "kubeflow-kernel (1440 min)", "gpu-only (30 min, <10 %)",
                                       "defaults #2", "gpu-only (60 min, <5 %)"]
    assert rules[0].idle_minutes == Policy().idle_minutes
    from kf_culler.config import ConfigError

    with pytest.raises(ConfigError, match="not a number"):
        make_contenders(None, ["gpu-only:soon"])
    with pytest.raises(ConfigError, match="cannot read"):
        make_contenders(str(config.parent / "missing.yaml"), [])


def test_each_policy_gets_the_gpu_look_back_its_culler_would_query(tmp_path: Path) -> None:
    """Records carry one GPU sample each; the culler queries its idle limit + 10 min, and so does the
    replay, from the samples of earlier records. A job runs until 200 (GPU at 90 %), then nothing."""
    path = tmp_path / "job.jsonl"
    with open_text(path, "w") as out:
        w = TraceWriter(out, TraceHeader(start=T0, check_period_seconds=PERIOD * 60, synthetic=True))
        for t in range(0, END, PERIOD):
            working = t < 200
            o = {"jupyter": jupyter(0, 0, [], terminal=0), "gpu": gpu(t, 90 if working else 0,
                                                                      20000 if working else 0)}
            w.write(at(t), notebook("job"), pod("job"), o, "working" if working else "absent")
    p60, p120 = tmp_path / "p60.yaml", tmp_path / "p120.yaml"
    p60.write_text("idleMinutes: 60\nwarnMinutes: 10\n")
    p120.write_text("idleMinutes: 120\nwarnMinutes: 10\n")
    r = replay(path, make_contenders(str(p60), [str(p120), "gpu-only"]))
    # the last GPU work (190) stays in the 70 / 130 min windows: stopped 60 / 120 min after it,
    # not at once on the terminal's activity at 0
    assert [[s.time for s in stops] for stops in r.stops] == [[at(250)], [at(310)], [at(250)]]
    assert r.total(0).warnings == 1 and r.total(0).interruptions == 0
