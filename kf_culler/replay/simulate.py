"""Replay a trace through one or more rules and count what each would have reclaimed and interrupted.

The trace says what every notebook looked like while it ran; the replay overlays each rule's stops:

- a `stop` verdict stops the notebook from that check on: it holds no GPU and is not evaluated;
- a stopped notebook is started again the first time the trace's ground truth is `working` (the user is
  back, or a job would be running; a stop made while `working` is restarted at once): its pod runs again
  `restart_delay` later, with a new start time (so the startup grace applies again);
- if the trace itself shows a newer pod (the user started it in the recorded world), that pod is used;
- a notebook whose trace pod is not running, or that carries `kubeflow-resource-stopped`, is not
  evaluated (decide keeps such notebooks by rules 1 and 3) and holds no GPU.

A record's situation lasts until that notebook's next record (the last one for one check period).
Each rule is given the GPU samples its culler would have queried: the look-back it needs, from the
samples of this and earlier records, never from before the pod started.
Rules are run side by side on one pass over the trace.
"""

from __future__ import annotations

import bisect
import math
import time as wallclock
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, Protocol

from kf_culler.ide import IDE_KINDS
from kf_culler.model import STOP_ANNOTATION
from kf_culler.readings import Unreadable, parse_gpu
from kf_culler.replay.contenders import Check, ConfiguredPolicy, Contender
from kf_culler.replay.fleet import BEHAVIOUR_LABEL
from kf_culler.replay.trace import Record, TraceHeader, read_trace
from kf_culler.session import annotations_of, gpu_count, metadata_of, running_since
from kf_culler.timeutil import format_time, parse_time

HOUR = 3600.0


@dataclass(frozen=True)
class Stop:
    time: datetime
    id: str
    truth: str | None
    reason: str
    idle_seconds: float | None  # since the truth was last `working` (None when the trace has no truth)


@dataclass
class Tally:
    """What one rule did to one notebook (or, summed, to a fleet)."""

    held_gpu_s: float = 0.0  # GPU-seconds held
    reclaimed_gpu_s: dict[str, float] = field(default_factory=dict)  # by truth ("unknown" without truth)
    oracle_matched_gpu_s: float = 0.0  # reclaimed inside the oracle's reclaimable windows
    working_lost_s: float = 0.0  # seconds of `working` spent stopped or restarting
    stops: int = 0
    interruptions: int = 0
    interrupted_intervals: int = 0
    present_stops: int = 0
    absent_stops: int = 0
    restarts: int = 0
    warnings: int = 0
    checks: int = 0

    def add(self, other: Tally) -> None:
        for k, v in vars(other).items():
            if isinstance(v, dict):
                for kk, vv in v.items():
                    self.reclaimed_gpu_s[kk] = self.reclaimed_gpu_s.get(kk, 0.0) + vv
            else:
                setattr(self, k, getattr(self, k) + v)

    @property
    def reclaimed_total_gpu_s(self) -> float:
        return sum(self.reclaimed_gpu_s.values())


@dataclass
class NotebookTotals:
    """Contender-independent figures for one notebook."""

    id: str
    behaviour: str | None
    gpus: int = 0
    baseline_gpu_s: float = 0.0  # GPU-seconds the trace's pods held (no culler)
    oracle_gpu_s: float = 0.0  # held while absent beyond the oracle's idle limit
    working_s: float = 0.0
    running_s: float = 0.0  # seconds the trace's pod ran (no culler): the notebook's session-time
    records: int = 0


@dataclass
class TimelineRow:
    time: datetime
    truth: str | None
    world_running: bool
    gpus: int
    signals: dict[str, Any]
    rules: list[tuple[bool, Check | None]]  # per rule: running, the check made at this record (if any)


@dataclass
class ReplayResult:
    header: TraceHeader
    rule_names: list[str]
    oracle_idle_minutes: float
    restart_delay_minutes: float
    check_period_seconds: float | None
    notebooks: dict[str, NotebookTotals]
    tallies: list[dict[str, Tally]]  # per rule: notebook id -> tally
    stops: list[list[Stop]]  # per rule, in time order
    truth_known: bool
    records: int
    seconds: float
    decide_calls: int
    timeline: list[TimelineRow] = field(default_factory=list)
    timeline_id: str | None = None

    def total(self, rule: int) -> Tally:
        out = Tally()
        for t in self.tallies[rule].values():
            out.add(t)
        return out

    @property
    def baseline_gpu_s(self) -> float:
        return sum(n.baseline_gpu_s for n in self.notebooks.values())

    @property
    def oracle_gpu_s(self) -> float:
        return sum(n.oracle_gpu_s for n in self.notebooks.values())


class _Run:
    """One rule's view of one notebook."""

    __slots__ = ("last_action", "last_check", "memo", "pod_cache", "restart_at", "running", "start_override",
                 "stopped_at", "stops", "tally", "work_run_hit")

    def __init__(self) -> None:
        self.memo: dict[str, Any] = {}
        self.running = True
        self.stopped_at: datetime | None = None
        self.restart_at: datetime | None = None
        self.start_override: datetime | None = None
        self.pod_cache: tuple[object, datetime | None, dict[str, Any] | None] = (None, None, None)
        self.stops: list[Stop] = []
        self.last_check: datetime | None = None
        self.last_action = "keep"
        self.work_run_hit = -1
        self.tally = Tally()


class Situation(Protocol):
    """What a replay knows of one notebook between two records (its `_Nb`): the interval's accounting reads it."""

    @property
    def totals(self) -> NotebookTotals: ...
    @property
    def prev_time(self) -> datetime | None: ...
    @property
    def prev_truth(self) -> str | None: ...
    @property
    def prev_world(self) -> bool: ...
    @property
    def absent_start(self) -> datetime | None: ...


class TruthRuns(Protocol):
    """A replay's notebook as the runs of its ground truth change it (`note_truth`)."""

    world_running: bool
    prev_truth: str | None
    absent_start: datetime | None
    idle_start: datetime | None
    work_run: int


def note_truth(nb: TruthRuns, truth: str | None, now: datetime) -> None:
    """The runs of the ground truth at a record: when the user left (absent while the world runs), when it went
    idle, and a new run of work. One place for the plain replay and the cohort replay (replay/cohorts.py)."""
    if truth == "absent" and nb.world_running:
        if nb.absent_start is None:
            nb.absent_start = now
    else:
        nb.absent_start = None
    if truth == "working":
        if nb.prev_truth != "working":
            nb.work_run += 1
        nb.idle_start = None
    elif nb.idle_start is None:
        nb.idle_start = now


def account_interval(nb: Situation, end: datetime, oracle_limit: timedelta,
                     runs: Iterable[tuple[bool, Tally]]) -> None:
    """Account [prev_time, end) with the situation after the previous record: the notebook's totals, and for
    each policy's run (running?, its tally) the GPU-time held, reclaimed and matched with the oracle, and the
    working time lost. One place for the plain replay and the cohort replay (replay/cohorts.py)."""
    if nb.prev_time is None:
        return
    start = nb.prev_time
    dt = (end - start).total_seconds()
    if dt <= 0:
        return
    t = nb.totals
    truth = nb.prev_truth or "unknown"
    gpus = t.gpus if nb.prev_world else 0
    if truth == "working":
        t.working_s += dt
    if nb.prev_world:
        t.running_s += dt
    oracle_s = 0.0
    if gpus:
        t.baseline_gpu_s += gpus * dt
        if truth == "absent" and nb.absent_start is not None:
            window = max(start, nb.absent_start + oracle_limit)
            oracle_s = max(0.0, (end - window).total_seconds())
            t.oracle_gpu_s += gpus * oracle_s
    for running, tally in runs:
        if running:
            tally.held_gpu_s += gpus * dt
        else:
            if gpus:
                tally.reclaimed_gpu_s[truth] = tally.reclaimed_gpu_s.get(truth, 0.0) + gpus * dt
                tally.oracle_matched_gpu_s += gpus * oracle_s
            if truth == "working" and nb.prev_world:
                tally.working_lost_s += dt


class _Nb:
    __slots__ = ("absent_start", "gpu", "idle_start", "nb_obj", "pod_obj", "prev_time", "prev_truth",
                 "prev_world", "runs", "totals", "work_run", "world_running", "world_start")

    def __init__(self, rec: Record, rules: int) -> None:
        labels = metadata_of(rec.notebook).get("labels")
        behaviour = labels.get(BEHAVIOUR_LABEL) if isinstance(labels, dict) else None
        self.totals = NotebookTotals(rec.id, behaviour if isinstance(behaviour, str) else None)
        self.runs = [_Run() for _ in range(rules)]
        self.nb_obj: object = None
        self.pod_obj: object = False
        self.world_running = False
        self.world_start: datetime | None = None
        self.prev_time: datetime | None = None
        self.prev_truth: str | None = None
        self.prev_world = False
        self.absent_start: datetime | None = None
        self.idle_start: datetime | None = None
        self.work_run = 0
        self.gpu = GpuHistory()


def _with_start(pod: dict[str, Any], start: datetime) -> dict[str, Any]:
    status = dict(pod.get("status") or {})
    status["startTime"] = format_time(start)
    return {**pod, "status": status}


def _reading(value: object) -> bool:
    """A number decide would read (readings._number): not a bool, finite, not negative."""
    return not isinstance(value, bool) and isinstance(value, int | float) and math.isfinite(value) and value >= 0


def essential_samples(samples: list[dict[str, Any]], util: float, mem: float) -> list[dict[str, Any]]:
    """Of readable GPU samples in time order, those that determine decide's reading of them under the
    thresholds (util %, mem MiB): the first (the GPU's idle clock when nothing worked), the latest (is it
    working now) and the latest that shows work. decide gives the same verdict on these as on all of them
    (tests/test_replay_counting.py checks it); a long look-back then costs a replay no more than a short one.
    """
    n = len(samples)
    if n <= 3:
        return samples
    last_work = -1
    for i in range(n - 1, -1, -1):
        s = samples[i]
        if s["utilPercent"] >= util and s["memoryUsedMiB"] >= mem:
            last_work = i
            break
    if last_work in (-1, 0, n - 1):
        return [samples[0], samples[-1]]
    return [samples[0], samples[last_work], samples[-1]]


class GpuHistory:
    """The GPU samples of one notebook seen so far, so each rule gets the look-back its culler would query.

    A record carries the samples its source returned (the synthetic fleet: the last 30 minutes); the
    culler widens its GPU query to its longest idle limit plus 10 minutes (`runner.gpu_window_minutes`),
    so a rule is given the samples of the history inside its own window and the pod's life. A record
    whose samples decide could not read is passed on as it is.
    """

    __slots__ = ("keys", "samples", "times", "unreadable")

    def __init__(self) -> None:
        self.times: list[datetime] = []
        self.samples: list[dict[str, Any]] = []
        self.keys: set[str] = set()
        self.unreadable = False

    def merge(self, raw: object, now: datetime, keep: timedelta) -> None:
        samples = raw.get("samples") if isinstance(raw, dict) else None
        self.unreadable = not isinstance(samples, list)
        if self.unreadable:
            return
        assert isinstance(samples, list)
        for s in samples:
            key = s.get("time") if isinstance(s, dict) else None
            if isinstance(key, str) and key in self.keys:
                continue
            t = parse_time(key)
            if t is None or not _reading(s.get("utilPercent")) or not _reading(s.get("memoryUsedMiB")):
                self.unreadable = True
                return
            assert isinstance(key, str)
            self.keys.add(key)
            i = bisect.bisect_right(self.times, t)
            self.times.insert(i, t)
            self.samples.insert(i, s)
        cut = bisect.bisect_left(self.times, now - keep)
        if cut:
            for s in self.samples[:cut]:
                self.keys.discard(s["time"])
            del self.times[:cut], self.samples[:cut]

    def window(self, obs: dict[str, Any], now: datetime, since: datetime,
               thresholds: tuple[float, float] | None) -> dict[str, Any]:
        """obs with its GPU samples replaced by the history's samples in [since, now] (only the essential
        ones when the rule gives its thresholds)."""
        raw = obs.get("gpu")
        if self.unreadable or not isinstance(raw, dict) or "error" in raw:
            return obs
        lo = bisect.bisect_left(self.times, since)
        hi = bisect.bisect_right(self.times, now)
        samples = self.samples[lo:hi]
        if thresholds is not None:
            samples = essential_samples(samples, *thresholds)
        return {**obs, "gpu": {**raw, "samples": samples}}


def signals(rec: Record) -> dict[str, Any]:
    """A short summary of what the sources said, for timelines."""
    out: dict[str, Any] = {}
    for kind in IDE_KINDS:
        key = kind.source
        if key in rec.observations:
            try:
                r = kind.parse(rec.observations[key])
                out["ide"] = {"source": key, "busy": r.busy, "connected": r.connected,
                              "lastActivity": max(r.activity + ((r.connected_at,) if r.connected_at else ()),
                                                  default=None)}
            except Unreadable as err:
                out["ide"] = {"source": key, "error": str(err)}
    if "gpu" in rec.observations:
        try:
            s = parse_gpu(rec.observations["gpu"])[-1]
            out["gpu"] = {"util": s.util_percent, "mem": s.memory_mib}
        except Unreadable as err:
            out["gpu"] = {"error": str(err)}
    return out


def replay(path: str | Path, rules: list[Contender], *, restart_delay_minutes: float = 5,
           oracle_idle_minutes: float | None = None, check_period_minutes: float | None = None,
           timeline_id: str | None = None,
           gpu_resources: tuple[str, ...] = ("nvidia.com/gpu",)) -> ReplayResult:
    """Run every rule over the trace at path. `check_period_minutes`: how often a rule looks at a notebook
    (default: at every record); `oracle_idle_minutes` defaults to the first rule's idle limit."""
    started_at = wallclock.perf_counter()
    header, records = read_trace(path)
    oracle_limit = timedelta(minutes=oracle_idle_minutes if oracle_idle_minutes is not None
                             else rules[0].idle_minutes)
    delay = timedelta(minutes=restart_delay_minutes)
    period = timedelta(minutes=check_period_minutes) if check_period_minutes else None
    due_slack = timedelta(seconds=1)
    nbs: dict[str, _Nb] = {}
    truth_known = True
    count = 0
    timeline: list[TimelineRow] = []
    n_rules = len(rules)
    lookbacks = [timedelta(minutes=r.gpu_lookback_minutes) for r in rules]
    keep_gpu = max(lookbacks, default=timedelta(0))

    def close(nb: _Nb, end: datetime) -> None:
        """Account [prev_time, end) with the situation after the previous record."""
        account_interval(nb, end, oracle_limit, ((run.running, run.tally) for run in nb.runs))

    for rec in records:
        count += 1
        nb = nbs.get(rec.id)
        if nb is None:
            nb = nbs[rec.id] = _Nb(rec, n_rules)
        now = rec.time
        close(nb, now)
        totals = nb.totals
        totals.records += 1
        if rec.notebook is not nb.nb_obj or rec.pod is not nb.pod_obj:
            nb.nb_obj, nb.pod_obj = rec.notebook, rec.pod
            start = running_since(rec.pod)  # the recorded world's pod, deleting or not
            nb.world_running = start is not None and STOP_ANNOTATION not in annotations_of(rec.notebook)
            nb.world_start = start
            totals.gpus = max(totals.gpus, gpu_count(rec.notebook, rec.pod, gpu_resources))
        truth = rec.truth
        if truth is None:
            truth_known = False
        note_truth(nb, truth, now)  # runs of the ground truth

        if keep_gpu and nb.world_running and any(_may_decide(run, nb) for run in nb.runs) and \
                "gpu" in (obs := rec.observations):
            nb.gpu.merge(obs["gpu"], now, keep_gpu)
        row: list[tuple[bool, Check | None]] | None = [] if rec.id == timeline_id else None
        for rule, run, lookback in zip(rules, nb.runs, lookbacks, strict=True):
            check = _step(rule, run, nb, rec, now, delay, period, due_slack, lookback)
            if row is not None:
                row.append((run.running, check))
        if row is not None:
            timeline.append(TimelineRow(now, truth, nb.world_running, totals.gpus, signals(rec), row))
        nb.prev_time, nb.prev_truth, nb.prev_world = now, truth, nb.world_running

    period_end = timedelta(seconds=header.check_period_seconds)
    for nb in nbs.values():
        if nb.prev_time is not None:
            close(nb, nb.prev_time + period_end)

    stops: list[list[Stop]] = [[] for _ in rules]
    for nb in nbs.values():
        for i, run in enumerate(nb.runs):
            stops[i].extend(run.stops)
    for s in stops:
        s.sort(key=lambda x: (x.time, x.id))
    return ReplayResult(
        header=header, rule_names=[r.name for r in rules],
        oracle_idle_minutes=oracle_limit.total_seconds() / 60, restart_delay_minutes=restart_delay_minutes,
        check_period_seconds=period.total_seconds() if period else None,
        notebooks={k: nb.totals for k, nb in nbs.items()},
        tallies=[{k: nb.runs[i].tally for k, nb in nbs.items()} for i in range(n_rules)],
        stops=stops, truth_known=truth_known, records=count,
        seconds=wallclock.perf_counter() - started_at,
        decide_calls=sum(r.calls for r in rules if isinstance(r, ConfiguredPolicy)),
        timeline=timeline, timeline_id=timeline_id,
    )


def _may_decide(run: _Run, nb: _Nb) -> bool:
    """Whether the rule may decide this notebook at this record (else its observations are not read)."""
    return run.running or run.restart_at is not None or (
        run.stopped_at is not None and nb.world_start is not None and nb.world_start > run.stopped_at)


def _step(rule: Contender, run: _Run, nb: _Nb, rec: Record, now: datetime, delay: timedelta,
          period: timedelta | None, slack: timedelta, lookback: timedelta) -> Check | None:
    tally = run.tally
    if not run.running:
        if nb.world_start is not None and run.stopped_at is not None and nb.world_start > run.stopped_at:
            # the recorded world started a new pod after our stop: the user started it anyway
            run.running, run.stopped_at, run.restart_at, run.start_override = True, None, None, None
        else:
            if run.restart_at is None and rec.truth == "working":
                run.restart_at = now + delay
                tally.restarts += 1
            if run.restart_at is None or now < run.restart_at:
                return None
            run.running, run.stopped_at = True, None
            run.start_override, run.restart_at = run.restart_at, None
            run.last_check = None
    if not nb.world_running or nb.world_start is None:
        return None
    if period is not None and run.last_check is not None and now + slack < run.last_check + period:
        return None
    run.last_check = now
    pod = rec.pod
    started = nb.world_start
    obs = rec.observations
    if run.start_override is not None and run.start_override > started and pod is not None:
        started = run.start_override
        if run.pod_cache[0] is not pod or run.pod_cache[1] != started or run.pod_cache[2] is None:
            run.pod_cache = (pod, started, _with_start(pod, started))
        pod = run.pod_cache[2]
    if lookback and "gpu" in obs:
        thresholds = rule.gpu_thresholds(run.memo, rec.notebook, pod, rec.context)
        obs = nb.gpu.window(obs, now, max(now - lookback, started), thresholds)
    tally.checks += 1
    check = rule.check(run.memo, rec.notebook, pod, obs, now, started, rec.context)
    if check.action == "warn" and run.last_action != "warn":
        tally.warnings += 1
    run.last_action = check.action
    if check.action == "stop":
        run.running, run.stopped_at, run.last_action = False, now, "keep"
        tally.stops += 1
        truth = rec.truth
        if truth == "working":
            tally.interruptions += 1
            if run.work_run_hit != nb.work_run:
                run.work_run_hit = nb.work_run
                tally.interrupted_intervals += 1
            run.restart_at = now + delay  # the user is there: starts it again at once
            tally.restarts += 1
        elif truth == "present":
            tally.present_stops += 1
        elif truth == "absent":
            tally.absent_stops += 1
        idle = None if truth is None or nb.idle_start is None else (now - nb.idle_start).total_seconds()
        if truth == "working":
            idle = 0.0
        run.stops.append(Stop(now, rec.id, truth, check.reason, idle))
    return check
