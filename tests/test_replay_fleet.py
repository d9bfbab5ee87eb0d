"""The synthetic fleet: each behaviour produces what it claims, observations have the scenario shapes,
and a fleet is reproducible from its seed."""

from __future__ import annotations

import hashlib
import random
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from kf_culler.model import STOP_ANNOTATION
from kf_culler.readings import (
    GpuSample,
    Unreadable,
    parse_code_server,
    parse_gpu,
    parse_jupyter,
    parse_rstudio,
)
from kf_culler.replay.fleet import (
    BEHAVIOURS,
    DAY,
    DEFAULT_START,
    FleetSpec,
    allocate,
    build_notebook,
    write_fleet,
)
from kf_culler.replay.trace import TRUTHS
from kf_culler.timeutil import parse_time

SEEDS = (1, 2, 3)
T0 = DEFAULT_START.timestamp()
Row = tuple[int, dict[str, Any], dict[str, Any] | None, dict[str, Any], str]


def rows(behaviour: str, seed: int, days: int = 7) -> list[Row]:
    spec = FleetSpec(notebooks=1, days=days, seed=seed, mix={behaviour: 1})
    sim = build_notebook(spec, 0, behaviour)
    return [(m, *sim.observe(m)) for m in range(0, spec.total_minutes, spec.check_minutes)]


def latest_gpu(o: dict[str, Any]) -> GpuSample | None:
    return parse_gpu(o["gpu"])[-1] if "gpu" in o else None


def gpu_works(o: dict[str, Any]) -> bool:
    s = latest_gpu(o)
    return s is not None and s.util_percent >= 5 and s.memory_mib >= 256


def hour(minute: int) -> float:
    return (minute % DAY) / 60


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("behaviour", sorted(BEHAVIOURS))
def test_every_record_is_well_formed_and_working_is_observable(behaviour: str, seed: int) -> None:
    """Observations parse with the culler's own parsers, and whenever the truth is `working` some
    signal says so (without that, no culler could avoid interrupting work)."""
    b = BEHAVIOURS[behaviour]
    recs = rows(behaviour, seed)
    assert len(recs) == 7 * DAY // 5
    parsers = {"jupyter": parse_jupyter, "codeServer": parse_code_server, "rstudio": parse_rstudio}
    for minute, nb, pod, o, truth in recs:
        assert truth in TRUTHS
        stopped = STOP_ANNOTATION in nb["metadata"]["annotations"]
        assert stopped == (pod is None)
        if stopped:
            assert o == {} and truth == "absent"
            continue
        assert set(o) <= {b.ide, "gpu"}
        reading = None
        try:
            reading = parsers[b.ide](o[b.ide])
        except Unreadable:
            assert behaviour == "unreachable" and "error" in o[b.ide]
        if "gpu" in o:
            assert parse_gpu(o["gpu"])  # readable and not empty
            assert all(parse_time(s["time"]) is not None for s in o["gpu"]["samples"])
        if truth == "working":
            assert reading is not None, f"{behaviour}: unreachable while working at minute {minute}"
            recent = any((minute - (t.timestamp() - T0) / 60) <= 10 for t in reading.activity)
            assert reading.busy or reading.connected or gpu_works(o) or recent, \
                f"{behaviour} seed {seed}: working at minute {minute} with no signal of it"


@pytest.mark.parametrize("seed", SEEDS)
def test_coding_bursts_have_short_gpu_runs_from_the_kernel(seed: int) -> None:
    recs = rows("coding-bursts", seed)
    runs = [o for _, _, _, o, t in recs if t == "working" and o["jupyter"]["status"]["connections"]
            and any(k["execution_state"] == "busy" for k in o["jupyter"]["kernels"]) and gpu_works(o)]
    assert runs, "no GPU run from a kernel"
    # runs while the user watches last at most 25 min: never more than 6 records (5 min apart) in a row
    longest = streak = 0
    for _, _, _, o, t in recs:
        watching = t == "working" and o["jupyter"]["status"]["connections"] > 0 and gpu_works(o)
        streak = streak + 1 if watching else 0
        longest = max(longest, streak)
    assert 1 <= longest <= 6
    # nights are quiet: nobody connected at 03:00 on any day
    assert all(o["jupyter"]["status"]["connections"] == 0 for m, _, _, o, _ in recs if hour(m) == 3)


@pytest.mark.parametrize("seed", SEEDS)
def test_nohup_training_runs_on_the_gpu_without_kernels(seed: int) -> None:
    recs = rows("nohup-training", seed)
    assert all(o["jupyter"]["kernels"] == [] for *_, o, _ in recs)  # never a kernel
    training = [o for _, _, _, o, t in recs if t == "working" and not o["jupyter"]["status"]["connections"]]
    assert len(training) >= 4 * 12  # at least 4 h of unattended training
    for o in training:
        s = latest_gpu(o)
        assert s is not None and s.util_percent >= 70 and s.memory_mib >= 12000
        assert o["jupyter"]["terminals"], "the job was started from a terminal"
    # the terminal goes quiet while the job runs on: at some point its activity is hours behind the GPU
    gaps = []
    for o in training:
        term = parse_time(o["jupyter"]["terminals"][0]["last_activity"])
        newest = parse_time(o["gpu"]["samples"][-1]["time"])
        assert term is not None and newest is not None
        gaps.append((newest - term).total_seconds())
    assert max(gaps) >= 3 * 3600


@pytest.mark.parametrize("seed", SEEDS)
def test_hung_kernel_is_busy_with_an_idle_gpu_while_nobody_is_there(seed: int) -> None:
    recs = rows("hung-kernel", seed)
    hung = []
    for m, _, _, o, t in recs:
        kernels = o["jupyter"]["kernels"]
        if t == "absent" and kernels and kernels[0]["execution_state"] == "busy":
            hung.append((m, o))
    assert len(hung) >= 12 * 6  # at least 6 hours
    for _, o in hung:
        s = latest_gpu(o)
        assert s is not None and s.util_percent == 0 and s.memory_mib >= 4000
        assert o["jupyter"]["status"]["connections"] == 0
    # the kernel's last activity stays where the call hung
    stamps = {o["jupyter"]["kernels"][0]["last_activity"] for _, o in hung}
    assert len(stamps) == 1


@pytest.mark.parametrize("seed", SEEDS)
def test_tab_left_open_overnight_is_present_and_connected(seed: int) -> None:
    nights = [(t, o) for m, _, _, o, t in rows("tab-overnight", seed) if hour(m) == 3 and m > DAY]
    present = [o for t, o in nights if t == "present"]
    assert len(present) >= 3
    for o in present:
        assert o["jupyter"]["status"]["connections"] >= 1
        assert not any(k["execution_state"] == "busy" for k in o["jupyter"]["kernels"])
        assert not gpu_works(o)


@pytest.mark.parametrize("seed", SEEDS)
def test_friday_forgotten_stops_each_night_but_friday(seed: int) -> None:
    recs = {m: (nb, pod, o, t) for m, nb, pod, o, t in rows("friday-forgotten", seed)}
    for day in (1, 2, 3, 4):  # the nights after Monday .. Thursday (03:00 Tuesday .. Friday)
        nb, pod, o, t = recs[day * DAY + 180]
        assert pod is None and STOP_ANNOTATION in nb["metadata"]["annotations"] and t == "absent"
    for day in (5, 6):  # Saturday and Sunday: running, nobody there, a model in GPU memory
        for m in range(day * DAY, (day + 1) * DAY, 60):
            nb, pod, o, t = recs[m]
            assert pod is not None and STOP_ANNOTATION not in nb["metadata"]["annotations"]
            assert t == "absent"
            s = latest_gpu(o)
            assert s is not None and s.util_percent == 0 and s.memory_mib > 0


@pytest.mark.parametrize("seed", SEEDS)
def test_code_server_user_is_seen_only_through_healthz(seed: int) -> None:
    recs = rows("code-server", seed)
    assert all(set(o) == {"codeServer", "gpu"} for *_, o, _ in recs)
    alive = [o for *_, o, t in recs if o["codeServer"]["healthz"]["status"] == "alive"]
    expired = [(m, o) for m, _, _, o, t in recs if o["codeServer"]["healthz"]["status"] == "expired"
               and o["codeServer"]["healthz"]["lastHeartbeat"] > 0]
    assert alive and expired
    # overnight the tab has been closed for hours
    closed_for = [m - (o["codeServer"]["healthz"]["lastHeartbeat"] / 1000 - T0) / 60 for m, o in expired]
    assert max(closed_for) >= 6 * 60


@pytest.mark.parametrize("seed", SEEDS)
def test_rstudio_answers_in_the_rstudio_source_shape(seed: int) -> None:
    recs = rows("rstudio", seed)
    shapes = {tuple(sorted(o["rstudio"])) for *_, o, _ in recs}
    assert shapes == {("busy", "connected", "lastActivity", "lastConnected", "via")}
    assert any(o["rstudio"]["connected"] for *_, o, t in recs if t == "working")
    assert any(o["rstudio"]["busy"] for *_, o, _ in recs)
    assert all(not o["rstudio"]["connected"] for m, _, _, o, _ in recs if hour(m) == 3)


@pytest.mark.parametrize("seed", SEEDS)
def test_unreachable_endpoint_for_hours_with_gpu_metrics(seed: int) -> None:
    recs = rows("unreachable", seed)
    longest = streak = 0
    for *_, o, t in recs:
        down = "error" in o["jupyter"]
        if down:
            assert t == "absent" and parse_gpu(o["gpu"])
        streak = streak + 1 if down else 0
        longest = max(longest, streak)
    assert longest >= 4 * 12


@pytest.mark.parametrize("seed", SEEDS)
def test_gpu_utilisation_without_memory_while_away(seed: int) -> None:
    ghost = [latest_gpu(o) for *_, o, t in rows("gpu-util-no-memory", seed) if t == "absent"]
    ghost = [s for s in ghost if s is not None and s.util_percent >= 30 and s.memory_mib == 0]
    assert len(ghost) >= 12 * 24


@pytest.mark.parametrize("seed", SEEDS)
def test_cpu_only_has_no_gpu(seed: int) -> None:
    recs = rows("cpu-only", seed)
    assert all("gpu" not in o for *_, o, _ in recs)
    nb = recs[0][1]
    assert all("nvidia.com/gpu" not in c["resources"]["limits"]
               for c in nb["spec"]["template"]["spec"]["containers"])
    assert Counter(t for *_, t in recs)["working"] > 0


def test_allocation_follows_the_mix_exactly() -> None:
    mix = {n: b.weight for n, b in BEHAVIOURS.items()}
    names = allocate(500, mix, random.Random(0))
    counts = Counter(names)
    assert sum(counts.values()) == 500
    assert {n: counts[n] for n in mix} == {n: round(500 * w) for n, w in mix.items()}
    assert names != sorted(names)  # shuffled
    assert Counter(allocate(7, {"cpu-only": 1, "rstudio": 1}, random.Random(0))) in (
        Counter({"cpu-only": 4, "rstudio": 3}), Counter({"cpu-only": 3, "rstudio": 4}))
    with pytest.raises(ValueError, match="unknown behaviour"):
        allocate(3, {"sleepy": 1}, random.Random(0))


def test_a_fleet_is_reproducible_from_its_seed(tmp_path: Path) -> None:
    def digest(seed: int, name: str) -> str:
        path = tmp_path / name
        write_fleet(FleetSpec(notebooks=12, days=1, seed=seed), path)
        return hashlib.sha256(path.read_bytes()).hexdigest()

    assert digest(5, "a.jsonl") == digest(5, "b.jsonl")
    assert digest(5, "a.jsonl") != digest(6, "c.jsonl")
