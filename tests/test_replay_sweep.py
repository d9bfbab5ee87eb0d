"""`kf-culler replay TRACE --sweep`: the frontier, interruptions, the recommendation as written, the plot.

On a small seeded synthetic fleet (ground truth known) and on a converted NotebookOS-shaped template.
"""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path
from typing import Any

import pytest
from need import missing

from kf_culler.cli import main
from kf_culler.config import load_file
from kf_culler.replay.sweep import Evaluated, Figures, frontier, recommend

PNG = b"\x89PNG\r\n\x1a\n"
GRID = ["--grid", "idleMinutes=30,120", "--grid", "busyKernelGpuIdleMinutes=off,30"]


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("sweep") / "fleet.jsonl.gz"
    assert main(["fleet", "--notebooks", "16", "--days", "3", "--seed", "4", "--out", str(path)]) == 0
    return path


def sweep_json(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, Any]:
    capsys.readouterr()
    assert main(["replay", *args, "--sweep", "--format", "json"]) == 0
    doc: dict[str, Any] = json.loads(capsys.readouterr().out)
    return doc


@pytest.fixture(scope="module")
def swept(fleet: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], Path]:
    """One sweep shared by the tests below (a module fixture cannot use capsys: stdout is redirected here)."""
    out = tmp_path_factory.mktemp("rec") / "recommended.yaml"
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(io.StringIO()):
        assert main(["replay", str(fleet), "--sweep", *GRID, "--max-restarts-per-session-day", "5",
                     "--write-config", str(out), "--format", "json"]) == 0
    return json.loads(buf.getvalue()), out


def point(doc: dict[str, Any], **keys: float | None) -> dict[str, Any]:
    (found,) = [p for p in doc["points"] if all(p["point"].get(k) == v for k, v in keys.items())]
    return found


def test_a_stricter_policy_reclaims_more_and_restarts_more(swept: tuple[dict[str, Any], Path]) -> None:
    doc, _ = swept
    assert len(doc["points"]) == 4 and doc["trace"]["groundTruth"] is True
    strict, lax = point(doc, idleMinutes=30, busyKernelGpuIdleMinutes=None), point(
        doc, idleMinutes=120, busyKernelGpuIdleMinutes=None)
    assert strict["gpuHoursReclaimed"] > lax["gpuHoursReclaimed"]
    assert strict["restartsPerSessionDay"] > lax["restartsPerSessionDay"]
    assert strict["restarts"] > lax["restarts"]
    # neither is better in every figure: both are on the frontier
    assert strict["frontier"] and lax["frontier"]
    # a reclaim comes no sooner than the idle limit after the work ended
    assert strict["reclaimDelayMinutes"]["p50"] >= 30 and lax["reclaimDelayMinutes"]["p50"] >= 120
    for p in doc["points"]:
        assert p["gpuHoursReclaimed"] + p["gpuHoursHeld"] == pytest.approx(p["gpuHoursWithoutCuller"])
        assert p["restartsPerSessionDay"] == pytest.approx(p["restarts"] / doc["trace"]["sessionDays"])


def test_interruptions_are_counted_and_never_recommended(swept: tuple[dict[str, Any], Path]) -> None:
    doc, _ = swept
    # a busy kernel stops counting after 30 min of idle GPU: long CPU steps are stopped while working
    hung = point(doc, idleMinutes=30, busyKernelGpuIdleMinutes=30)
    plain = point(doc, idleMinutes=30, busyKernelGpuIdleMinutes=None)
    assert hung["interruptions"] > 0 and plain["interruptions"] == 0
    assert hung["gpuHoursReclaimed"] > plain["gpuHoursReclaimed"]  # it reclaims more, at that price
    rec = doc["recommended"]
    # within 5 restarts per session-day every point fits; the most reclaimed without interruptions is chosen
    assert rec["top"] == {"idleMinutes": 30, "busyKernelGpuIdleMinutes": None}
    assert rec["replayedAsWritten"]["interruptions"] == 0
    assert rec["replayedAsWritten"]["gpuHoursReclaimed"] == pytest.approx(plain["gpuHoursReclaimed"])
    assert "idleMinutes: (not set) -> 30" in rec["changes"]


def test_the_written_configuration_replays_to_the_reported_figures(
        fleet: Path, swept: tuple[dict[str, Any], Path], capsys: pytest.CaptureFixture[str]) -> None:
    doc, written = swept
    settings = load_file(written)
    assert settings.policy.idle_minutes == 30 and settings.policy.busy_kernel_gpu_idle_minutes is None
    assert written.read_text().startswith("# kf-culler replay --sweep")
    capsys.readouterr()
    assert main(["replay", str(fleet), "--config", str(written), "--format", "json"]) == 0
    plain = json.loads(capsys.readouterr().out)["policies"][0]
    rec = doc["recommended"]["replayedAsWritten"]
    assert plain["gpuHoursReclaimed"] == pytest.approx(rec["gpuHoursReclaimed"])
    assert plain["restarts"] == rec["restarts"] and plain["warnings"] == rec["warnings"]
    assert plain["interruptions"] == rec["interruptions"] == 0


def test_a_tight_budget_recommends_the_gentler_point(fleet: Path, capsys: pytest.CaptureFixture[str]) -> None:
    doc = sweep_json(capsys, str(fleet), *GRID, "--max-restarts-per-session-day", "1")
    lax = point(doc, idleMinutes=120, busyKernelGpuIdleMinutes=None)
    assert lax["restartsPerSessionDay"] <= 1 < point(doc, idleMinutes=30, busyKernelGpuIdleMinutes=None)[
        "restartsPerSessionDay"]
    rec = doc["recommended"]
    assert rec["replayedAsWritten"]["restartsPerSessionDay"] <= 1
    assert rec["replayedAsWritten"]["interruptions"] == 0
    # the current configuration (the defaults, 60 min) is a candidate too: the best within the budget wins
    best = max([doc["current"], *[p for p in doc["points"] if p["interruptions"] == 0]],
               key=lambda p: p["gpuHoursReclaimed"] if p["restartsPerSessionDay"] <= 1 else -1)
    assert rec["replayedAsWritten"]["gpuHoursReclaimed"] == pytest.approx(best["gpuHoursReclaimed"])
    doc = sweep_json(capsys, str(fleet), *GRID, "--max-restarts-per-session-day", "0.01")
    assert doc["recommended"] is None


def test_parallel_jobs_give_the_same_figures(fleet: Path, capsys: pytest.CaptureFixture[str]) -> None:
    grid = ["--grid", "idleMinutes=30,60,120"]
    one = sweep_json(capsys, str(fleet), *grid, "--jobs", "1", "--per", "namespace")
    two = sweep_json(capsys, str(fleet), *grid, "--jobs", "2", "--per", "namespace")
    assert one["points"] == two["points"] and one["recommended"] == two["recommended"]
    # groups: one per namespace, adding up to the fleet
    p = one["points"][0]
    assert len(p["groups"]) > 1
    assert sum(g["gpuHoursReclaimed"] for g in p["groups"].values()) == pytest.approx(p["gpuHoursReclaimed"])


def _ev(label: str, groups: dict[str, tuple[float, int, int]]) -> Evaluated:
    """A point with (reclaimed GPU-h, restarts, interruptions) per group, each group one session-day."""
    figs = {g: Figures(reclaimed_gpu_h=r, session_days=1.0, restarts=n, interruptions=i)
            for g, (r, n, i) in groups.items()}
    total = Figures()
    for f in figs.values():
        total.add(f)
    return Evaluated({"idleMinutes": float(label)}, label, total, figs)


def test_per_group_recommendation_where_it_reclaims_more() -> None:
    # namespace a tolerates the strict point (few restarts there), b does not
    strict = _ev("15", {"a": (10.0, 1, 0), "b": (10.0, 3, 0)})
    gentle = _ev("120", {"a": (4.0, 0, 0), "b": (6.0, 1, 0)})
    hurts = _ev("5", {"a": (20.0, 1, 1), "b": (20.0, 1, 0)})
    items = [strict, gentle, hurts]
    # hurts reclaims the most at 1 restart a day but interrupts; none is better in every figure
    assert {e.label for e in frontier(items)} == {"15", "120", "5"}
    assert frontier([*items, _ev("240", {"a": (3.0, 0, 0), "b": (5.0, 1, 0)})]) == frontier(items)
    whole = recommend(items, 1.0, None)
    assert whole is not None and whole.top is gentle  # the strict one averages 2 restarts per session-day
    per = recommend(items, 1.0, "namespace")
    # a: strict (10); b: the point that interrupts work in a but none in b (20)
    assert per is not None and per.expected.reclaimed_gpu_h == 30.0 and per.expected.interruptions == 0
    assert per.top is strict and {g: e.label for g, e in per.per_group.items()} == {"b": "5"}
    assert recommend([hurts], 5.0, None) is None  # interruptions are never recommended


def test_the_frontier_png_marks_the_current_configuration(fleet: Path, tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    try:
        from matplotlib import image
        from PIL import Image
    except ImportError as err:
        missing("matplotlib (the replay extra)", err)
    png = tmp_path / "frontier.png"
    assert main(["replay", str(fleet), "--sweep", "--grid", "idleMinutes=30,120", "--plot", str(png),
                 "--max-restarts-per-session-day", "5"]) == 0
    assert png.read_bytes().startswith(PNG)
    description = Image.open(png).text["Description"]
    marks = dict(part.split(" at ") for part in description.split("; "))
    assert set(marks) == {"current", "recommended"}
    pixels = image.imread(str(png))
    x, y = (int(v) for v in marks["current"].strip("()").split(", "))
    # the current configuration's marker (red) is drawn where the description says
    near = pixels[y - 2:y + 3, x - 2:x + 3, :3]
    red = (near[..., 0] > 0.7) & (near[..., 1] < 0.35) & (near[..., 2] < 0.35)
    assert red.any()
    assert "Frontier" in capsys.readouterr().out


def test_a_group_kept_at_the_current_configuration_is_written_with_its_values() -> None:
    from kf_culler.config import load_mapping
    from kf_culler.replay.sweep import Plan, recommended_mapping

    base = {"idleMinutes": 45, "namespaceOverrides": {"b": {"warnMinutes": 3}}}
    top = _ev("15", {"a": (1.0, 0, 0)})
    top.point = {"idleMinutes": 15, "busyKernelGpuIdleMinutes": 30}
    kept = _ev("0", {"b": (1.0, 0, 0)})
    kept.point = {}  # the current configuration was the best for namespace b
    written = recommended_mapping(base, Plan(top, {"b": kept}, Figures()), "namespace")
    settings = load_mapping(written, "recommended")
    assert settings.policy.idle_minutes == 15 and settings.policy.busy_kernel_gpu_idle_minutes == 30
    b = settings.overrides["b"]
    # namespace b keeps what it had: the old top level's 45 minutes, no busy-kernel limit, its own warning
    assert (b.idle_minutes, b.busy_kernel_gpu_idle_minutes, b.warn_minutes) == (45, None, 3)
