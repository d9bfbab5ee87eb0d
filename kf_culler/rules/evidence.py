"""Evidence: everything the rules read about one notebook, computed once before any rule runs.

Which source speaks for the IDE (rule 4), what it and the GPU said or why they could not be read
(rule 6), when the pod started (rule 3) and the idle clock (rule 7): docs/decisions.md.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar, cast

from kf_culler.config import Policy
from kf_culler.ide import IdeKind, for_server_type
from kf_culler.model import SOURCES
from kf_culler.readings import GpuSample, IdeReading, Unreadable, parse_gpu, source_error
from kf_culler.session import SessionView
from kf_culler.timeutil import format_time


def works(s: GpuSample, policy: Policy) -> bool:
    """Rule 8: GPU work needs both utilisation and memory."""
    return s.util_percent >= policy.gpu.util_percent and s.memory_mib >= policy.gpu.memory_mib


@dataclass(frozen=True)
class GpuReading:
    samples: tuple[GpuSample, ...]
    last_work: datetime | None
    idle_since: datetime  # conservative: we only know it idle since the last work or the first sample
    working_now: bool


def read_gpu(raw: object, policy: Policy, parsed: dict[str, object] | None = None) -> GpuReading:
    samples = _parsed(parsed, "gpu", raw, parse_gpu)
    util, mem = policy.gpu.util_percent, policy.gpu.memory_mib  # works(), read once
    work = [s.time for s in samples if s.util_percent >= util and s.memory_mib >= mem]
    last_work = max(work) if work else None
    return GpuReading(samples, last_work, last_work or samples[0].time, works(samples[-1], policy))


T = TypeVar("T")


def _parsed(memo: dict[str, object] | None, key: str, raw: object, parse: Callable[[object], T]) -> T:
    """parse(raw), or what it gave (or raised) for the same observations before, kept in memo under key."""
    if memo is None:
        return parse(raw)
    found = memo.get(key)
    if found is None:
        try:
            found = memo[key] = (parse(raw),)
        except Unreadable as err:
            found = memo[key] = err
    if isinstance(found, Unreadable):
        raise Unreadable(str(found))
    return cast(tuple[T], found)[0]


@dataclass(frozen=True)
class Clock:
    """When the pod counts as started, and the idle clock (rule 7), for a notebook with a running pod."""

    started: datetime  # the pod's start, or a later restart the culler recorded (rules 3, 15); never after now
    since: datetime  # what the idle clock and the lifetime cap count from: the culler's runningSince when
    # it has one (a pod deleted and recreated does not start them over, rule 15), else `started`
    idle_since: datetime  # latest of every readable activity, connection, GPU work and `since`
    work_since: datetime  # the same without connections: a connection is not work (rule 9)

    def idle_seconds(self, now: datetime) -> float:
        return (now - self.idle_since).total_seconds()


@dataclass(frozen=True)
class Evidence:
    view: SessionView
    ide_kind: IdeKind | None  # None: an unknown server type
    ide: IdeReading | None
    ide_problem: str | None  # why there is no IDE reading
    gpu: GpuReading | None
    gpu_problem: str | None  # why a GPU notebook has no GPU reading
    clock: Clock | None  # None: no running pod
    record: dict[str, Any]  # how each source's answer was read: the verdict's `evidence`

    @property
    def annotations(self) -> Mapping[str, Any]:
        return self.view.annotations

    @property
    def missing(self) -> str | None:
        """What is missing for a full reading (rule 6), if anything."""
        return self.ide_problem or self.gpu_problem


def _past(t: datetime | None, now: datetime) -> datetime | None:
    """A recorded time, when it is not in the future (a record from the future is not one to count from)."""
    return t if t is not None and t <= now else None


def _read_ide(kind: IdeKind | None, stype: str, observations: dict[str, Any],
              record: dict[str, Any], parsed: dict[str, object] | None) -> tuple[IdeReading | None, str | None]:
    if kind is None:  # not reached: an unknown server type is read as Jupyter (SessionView.server_type)
        return None, f"unknown server type {stype!r}"
    if kind.source not in observations:
        return None, f"{kind.name} was not asked"
    try:
        ide = _parsed(parsed, kind.source, observations[kind.source], kind.parse)
    except Unreadable as err:
        record[kind.source] = {"read": False, "error": str(err)}
        return None, f"could not read {kind.name}: {err}"
    record[kind.source] = {"read": True, **ide.summary}
    return ide, None


def _read_gpu(gpus: int, observations: dict[str, Any], policy: Policy,
              record: dict[str, Any], parsed: dict[str, object] | None) -> tuple[GpuReading | None, str | None]:
    if gpus == 0 and "gpu" not in observations:
        return None, None
    if "gpu" not in observations:  # no GPU source is configured (the culler asks one whenever there is)
        if policy.gpu_without_metrics == "ide-only":
            record["gpu"] = {"read": False, "ignored": "no GPU metrics source is configured; "
                             "gpuWithoutMetrics: ide-only judges the notebook by its IDE alone"}
            return None, None
        return None, "no GPU metrics source is configured (gpuWithoutMetrics: keep)"
    raw = observations["gpu"]
    try:
        gpu = read_gpu(raw, policy, parsed)
    except Unreadable as err:
        record["gpu"] = {"read": False, "error": str(err)}
        # a CPU notebook needs no GPU evidence
        return None, None if gpus == 0 else (
            f"no GPU metrics: {err}" if source_error(raw) is None else f"no GPU metrics ({err})")
    latest = gpu.samples[-1]
    record["gpu"] = {
        "read": True, "samples": len(gpu.samples),
        "latest": {"time": format_time(latest.time), "utilPercent": latest.util_percent,
                   "memoryUsedMiB": latest.memory_mib},
        "lastWork": format_time(gpu.last_work) if gpu.last_work else None,
    }
    return gpu, None


def _clock(view: SessionView, ide: IdeReading | None, gpu: GpuReading | None, now: datetime) -> Clock | None:
    if view.pod_start is None:
        return None
    started = min(view.pod_start, now)
    record = view.record
    restarted = _past(record.restarted_at, now) if record is not None else None
    if restarted is not None and restarted > started:
        started = restarted
    since = started
    running = _past(record.current_running_since(), now) if record is not None else None
    if running is not None:
        since = max(running, restarted) if restarted is not None else running
    work = [since]
    connections = []
    if ide is not None:
        work.extend(ide.activity)
        if ide.connected_at is not None:
            connections.append(ide.connected_at)
    if gpu is not None and gpu.last_work is not None:
        work.append(gpu.last_work)
    return Clock(started, since, min(max(work + connections), now), min(max(work), now))


def read_evidence(view: SessionView, observations: dict[str, Any], policy: Policy, now: datetime,
                  parsed: dict[str, object] | None = None) -> Evidence:
    """Read every source once (rules 4, 6, 7, 8). Never raises for a broken observation. `parsed`: a memo for
    decisions on these same observations (one dict per observations object): each source is parsed once."""
    kind = for_server_type(view.server_type)
    ide_source = kind.source if kind is not None else None
    record: dict[str, Any] = {}
    for key in SOURCES:
        if key in observations and key not in (ide_source, "gpu"):
            record[key] = {"ignored": f"not the source for server type {view.server_type!r}"}
    ide, ide_problem = _read_ide(kind, view.server_type, observations, record, parsed)
    gpu, gpu_problem = _read_gpu(view.gpus, observations, policy, record, parsed)
    return Evidence(view, kind, ide, ide_problem, gpu, gpu_problem, _clock(view, ide, gpu, now), record)
