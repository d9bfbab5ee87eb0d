"""GPU points reduced to the ends of runs of equal values (kf_culler.sources.gpu.runs) keep what the rules
read: the first time, the latest sample, and the last time the GPU worked under any thresholds."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from kf_culler.sources.gpu import Point, answer, runs

values = st.tuples(st.sampled_from([0.0, 5.0, 40.0, 85.0]), st.sampled_from([0.0, 300.0, 6000.0]))


@st.composite
def series(draw: st.DrawFn) -> list[Point]:
    vals = draw(st.lists(values, min_size=1, max_size=80))
    return [(1_800_000_000.0 + 60 * i, u, m) for i, (u, m) in enumerate(vals)]


def last_work(points: list[Point], util: float, mem: float) -> float | None:
    work = [t for t, u, m in points if u >= util and m >= mem]
    return max(work) if work else None


@settings(max_examples=500, deadline=None)
@given(series(), st.sampled_from([0.0, 10.0, 50.0]), st.sampled_from([0.0, 100.0, 1000.0]))
def test_runs_keep_what_the_rules_read(points: list[Point], util: float, mem: float) -> None:
    kept = runs(points)
    assert kept[0] == points[0] and kept[-1] == points[-1]
    assert last_work(kept, util, mem) == last_work(points, util, mem)
    assert all(p in points for p in kept) and kept == sorted(kept)


def test_an_idle_look_back_is_two_samples_and_a_change_keeps_both_sides() -> None:
    idle = [(1_800_000_000.0 + 60 * i, 0.0, 0.0) for i in range(70)]
    assert runs(idle) == [idle[0], idle[-1]]
    worked = [*idle[:30], (idle[30][0], 90.0, 8000.0), *idle[31:]]
    assert runs(worked) == [idle[0], idle[29], worked[30], idle[31], idle[-1]]
    a = answer(idle, 1, "prometheus")
    assert a["points"] == 70 and [s["time"] for s in a["samples"]] == ["2027-01-15T08:00:00Z", "2027-01-15T09:09:00Z"]
