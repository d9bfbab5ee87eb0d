"""`kf-culler fleet` and `kf-culler replay` end to end on a small fleet: output, plots, determinism,
errors, and a replay of a recorded trace (no ground truth)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from kf_culler.cli import main
from kf_culler.replay.recorder import TraceRecorder
from kf_culler.replay.trace import read_header, read_trace

PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("fleet") / "fleet.jsonl.gz"
    assert main(["fleet", "--notebooks", "12", "--days", "3", "--seed", "4", "--out", str(path)]) == 0
    return path


def replay_json(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, Any]:
    capsys.readouterr()
    assert main(["replay", *args, "--format", "json"]) == 0
    doc: dict[str, Any] = json.loads(capsys.readouterr().out)
    return doc


def test_fleet_header(fleet: Path) -> None:
    h = read_header(fleet)
    assert h.synthetic and h.check_period_seconds == 300
    assert h.generator["seed"] == 4 and h.generator["notebooks"] == 12
    assert h.end is not None and h.end - h.start == timedelta(days=3)


def test_replay_compares_policies_and_is_deterministic(fleet: Path, capsys: pytest.CaptureFixture[str],
                                                       tmp_path: Path) -> None:
    config = tmp_path / "strict.yaml"
    config.write_text("idleMinutes: 30\nwarnMinutes: 0\n")
    args = [str(fleet), "--compare", str(config), "--compare", "kubeflow-kernel", "--compare", "gpu-only"]
    first = replay_json(capsys, *args)
    second = replay_json(capsys, *args)
    first["replay"].pop("seconds")
    second["replay"].pop("seconds")
    assert first == second
    names = [p["name"] for p in first["policies"]]
    assert names == ["defaults", "strict", "kubeflow-kernel (60 min)", "gpu-only (60 min, <5 %)"]
    defaults, strict = first["policies"][:2]
    assert first["oracleReclaimableGpuHours"] > 0
    assert 0 < defaults["oracleShare"] <= 1
    # a shorter limit reclaims at least as much while people are away
    assert strict["gpuHoursReclaimedByTruth"]["absent"] >= defaults["gpuHoursReclaimedByTruth"]["absent"]
    for p in first["policies"]:
        assert p["gpuHoursHeld"] + p["gpuHoursReclaimed"] == pytest.approx(first["gpuHoursWithoutCuller"])
    assert {b["behaviour"] for b in first["behaviours"]} <= {
        "coding-bursts", "nohup-training", "hung-kernel", "tab-overnight", "friday-forgotten", "code-server",
        "rstudio", "unreachable", "gpu-util-no-memory", "cpu-only"}


def test_text_report_plots_and_timeline(fleet: Path, capsys: pytest.CaptureFixture[str],
                                        tmp_path: Path) -> None:
    _, records = read_trace(fleet)
    target = next(r.id for r in records if "nohup" in r.id or "coding" in r.id)
    png = tmp_path / "cmp.png"
    rc = main(["replay", str(fleet), "--compare", "kubeflow-kernel", "--compare", "gpu-only",
               "--plot", str(png), "--timeline", target])
    out = capsys.readouterr().out
    assert rc == 0
    assert "GPU-hours held without a culler" in out and "share of oracle reclaimable" in out
    assert f"Timeline of {target}" in out
    assert png.read_bytes().startswith(PNG)
    assert (tmp_path / "cmp-timeline.png").read_bytes().startswith(PNG)
    assert main(["replay", str(fleet), "--format", "markdown"]) == 0
    assert "| GPU-hours held |" in capsys.readouterr().out


def test_replay_errors_exit_2(fleet: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("idleMinutes: soon\n")
    assert main(["replay", str(fleet), "--config", str(bad)]) == 2
    assert "idleMinutes" in capsys.readouterr().err
    assert main(["replay", str(tmp_path / "none.jsonl")]) == 2
    not_trace = tmp_path / "x.jsonl"
    not_trace.write_text("{}\n")
    assert main(["replay", str(not_trace)]) == 2
    assert "not a kf-culler trace header" in capsys.readouterr().err
    assert main(["replay", str(fleet), "--timeline", "no/such"]) == 2
    assert main(["fleet", "--mix", "sleepy=1", "--out", str(tmp_path / "f.jsonl")]) == 2
    assert "unknown behaviour" in capsys.readouterr().err


def test_a_recorded_trace_replays_without_ground_truth(tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    t0 = datetime(2026, 3, 2, tzinfo=UTC)
    nb = {"apiVersion": "kubeflow.org/v1", "kind": "Notebook",
          "metadata": {"name": "nb", "namespace": "a", "annotations": {}},
          "spec": {"template": {"spec": {"containers": [
              {"name": "nb", "image": "jupyter", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}}}
    pod = {"metadata": {"name": "nb-0", "namespace": "a"},
           "spec": {"containers": [{"name": "nb", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
           "status": {"phase": "Running", "startTime": "2026-03-02T00:00:00Z"}}
    path = tmp_path / "rec.jsonl"
    with TraceRecorder(path, check_period_seconds=600) as rec:
        for m in range(0, 180, 10):
            now = t0 + timedelta(minutes=m)
            stamp = "2026-03-02T00:00:00.000000Z"
            rec.record(now, nb, pod, {
                "jupyter": {"status": {"last_activity": stamp, "connections": 0}, "kernels": [],
                            "terminals": []},
                "gpu": {"samples": [{"time": now.strftime("%Y-%m-%dT%H:%M:%SZ"), "utilPercent": 0,
                                     "memoryUsedMiB": 0}]}})
    doc = replay_json(capsys, str(path))
    assert doc["replay"]["truthKnown"] is False and doc["oracleReclaimableGpuHours"] is None
    p = doc["policies"][0]
    assert p["interruptions"] is None and p["stops"] == 1
    # idle since the start, stopped at 60 min, never restarted without ground truth: 3 h held, 2 h reclaimed
    assert p["gpuHoursHeld"] == pytest.approx(1.0) and p["gpuHoursReclaimed"] == pytest.approx(2.0)
    assert main(["replay", str(path)]) == 0
    assert "no ground truth in this trace" in capsys.readouterr().out
