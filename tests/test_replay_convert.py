"""`kf-culler convert`: a NotebookOS workload template into a replay trace.

The template here is written by the test in the shape of NotebookOS's published workload templates (the
Adobe excerpt among them): sessions with start/stop ticks of 60 s and trainings with GPUs, VRAM (GB) and
one utilisation per GPU.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from kf_culler.cli import main
from kf_culler.replay.trace import read_header, read_trace

T0 = datetime(2021, 6, 1, tzinfo=UTC)


def training(start: int, end: int, gpus: int, vram: float, utils: list[float]) -> dict[str, Any]:
    return {"start_tick": start, "duration_in_ticks": end - start, "end_tick": end, "cpus": 1.0, "memory": 2.0,
            "vram": vram, "gpus": gpus, "gpu_utilizations": [{"utilization": u} for u in utils]}


def template() -> dict[str, Any]:
    return {"workloadTitle": "two sessions", "timescaleAdjustmentFactor": 0.1, "sessions": [
        {"id": "aaaaaaaa-1111-4000-8000-000000000001", "start_tick": 2, "stop_tick": 40, "num_training_events": 2,
         "max_resource_request": {"cpus": 2.0, "memory": 4.0, "gpus": 2, "vram": 8.0, "gpu_type": "ANY_GPU"},
         "trainings": [training(5, 8, 2, 8.0, [60.0, 80.0]), training(20, 22, 0, 0.0, [])]},
        {"id": "bbbbbbbb-2222-4000-8000-000000000002", "start_tick": 10, "stop_tick": 200, "num_training_events": 1,
         "max_resource_request": {"cpus": 1.0, "memory": 1.0, "gpus": 1, "vram": 4.0, "gpu_type": "ANY_GPU"},
         "trainings": [training(12, 14, 1, 4.0, [90.0])]},
    ]}


def convert(tmp_path: Path, doc: object, *args: str) -> tuple[int, Path]:
    src = tmp_path / "template.json"
    src.write_text(json.dumps(doc))
    out = tmp_path / "trace.jsonl.gz"
    return main(["convert", str(src), "--out", str(out), "--namespace", "adobe", *args]), out


def test_ticks_become_times_and_trainings_become_work(tmp_path: Path) -> None:
    rc, out = convert(tmp_path, template())
    assert rc == 0
    header, records = read_trace(out)
    assert header.start == T0 and header.check_period_seconds == 60 and header.end == T0 + timedelta(minutes=200)
    assert header.generator["convertedFrom"] == "notebookos-workload-template"
    by_id: dict[str, list[Any]] = {}
    for r in records:
        by_id.setdefault(r.id, []).append(r)
    first = by_id["adobe/s-000-aaaaaaaa"]
    # one record per tick from start_tick, and one without a pod at stop_tick
    assert [r.time for r in first] == [T0 + timedelta(minutes=t) for t in range(2, 41)]
    assert first[-1].pod is None and all(r.pod is not None for r in first[:-1])
    assert first[0].pod is not None and first[0].pod["status"]["startTime"] == "2021-06-01T00:02:00Z"
    limits = first[0].notebook["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]
    assert limits["nvidia.com/gpu"] == "2"
    at = {int((r.time - T0).total_seconds() // 60): r for r in first}
    # ticks 5, 6, 7 run the GPU training: working, kernel busy, mean utilisation, VRAM in MiB
    for tick in (5, 6, 7):
        obs = at[tick].observations
        assert at[tick].truth == "working"
        assert obs["jupyter"]["kernels"][0]["execution_state"] == "busy"
        assert obs["gpu"]["samples"] == [{"time": f"2021-06-01T00:{tick:02d}:00Z", "utilPercent": 70.0,
                                          "memoryUsedMiB": 8192}]
    # tick 8: the training ended; the kernel's last activity is its end
    assert at[8].truth == "absent"
    kernel = at[8].observations["jupyter"]["kernels"][0]
    assert kernel["execution_state"] == "idle" and kernel["last_activity"] == "2021-06-01T00:08:00.000000Z"
    assert at[8].observations["gpu"]["samples"][0]["utilPercent"] == 0
    # a training without GPUs: the kernel is busy, the GPU idle
    assert at[21].truth == "working" and at[21].observations["gpu"]["samples"][0]["memoryUsedMiB"] == 0
    assert at[21].observations["jupyter"]["kernels"][0]["execution_state"] == "busy"


def test_replay_of_a_converted_template(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out = convert(tmp_path, template())
    assert rc == 0
    capsys.readouterr()
    assert main(["replay", str(out), "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    # GPUs x (stop - start) ticks: 2 x 38 min + 1 x 190 min
    assert doc["gpuHoursWithoutCuller"] == pytest.approx((2 * 38 + 190) / 60)
    p = doc["policies"][0]
    # the defaults (60 min idle) stop the second session once, 60 min after its training ended at tick 14
    assert p["stops"] == 1 and p["interruptions"] == 0
    assert p["gpuHoursReclaimed"] == pytest.approx((200 - 74) / 60)


def test_until_hours_cuts_the_template(tmp_path: Path) -> None:
    rc, out = convert(tmp_path, template(), "--until-hours", "0.5", "--start", "2026-01-05T08:00:00Z")
    assert rc == 0
    header, records = read_trace(out)
    assert header.end == datetime(2026, 1, 5, 8, 30, tzinfo=UTC)
    times = [r.time for r in records]
    assert max(times) == datetime(2026, 1, 5, 8, 29, tzinfo=UTC)
    assert read_header(out).generator["untilTicks"] == 30


def test_a_bad_template_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    doc = template()
    doc["sessions"][1]["trainings"][0]["start_tick"] = "soon"
    rc, _ = convert(tmp_path, doc)
    assert rc == 2
    assert "sessions[1].trainings[0].start_tick" in capsys.readouterr().err
    rc, _ = convert(tmp_path, {"workload": []})
    assert rc == 2
    assert "not a NotebookOS workload template" in capsys.readouterr().err
