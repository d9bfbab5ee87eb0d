"""The policy sweep: replay a grid of policies over one trace and find the frontier and the recommendation.

Every point of the grid is the admin's configuration (the current one) with some of the policy keys below
set at the top level; it is replayed through the real `decide` (kf_culler/replay/contenders.py
`ConfiguredPolicy`), so a namespace override or a rule that sets a key itself keeps it, as it would in the
culler. Notebooks do not interact in a replay, so one replay gives each point's figures for the whole fleet
and for every group of notebooks (a namespace, or the policy rule that chooses their policy) at once.

For each point: GPU-hours reclaimed, restarts per session-day (a session-day: 24 hours of a notebook's pod
running in the trace), interruptions of running work (stops while the ground truth is `working`; in a
trace without ground truth, stops of a notebook whose IDE reported something running or whose GPU worked
at the stop), warnings, and how late reclaims came (time from the end of work to the stop).

The recommendation, for a budget (restarts per session-day, and no interruption at all): the point with
the most GPU-hours reclaimed for the whole fleet; and, with groups, the best point of each group within the
same budget when that reclaims more in total. It is written as a configuration and replayed again as
written, so the figures it is given with are the written configuration's own.
"""

from __future__ import annotations

import copy
import itertools
import math
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kf_culler.config import ConfigError, Policy, load_mapping, read_data
from kf_culler.config_layers import fragment_paths, merge
from kf_culler.replay.cohorts import CohortReplay
from kf_culler.replay.contenders import Contender
from kf_culler.replay.simulate import HOUR, ReplayResult, replay
from kf_culler.replay.sweep_policy import SweptPolicy as SweptPolicy

DAY = 24 * HOUR
# The policy keys a sweep varies (config-file names); `off` is null (the rule is off).
SWEEP_KEYS = ("idleMinutes", "warnMinutes", "connectedGpuIdleMinutes", "busyKernelGpuIdleMinutes",
              "noSignalGpuIdleMinutes")
_NULLABLE = {"connectedGpuIdleMinutes", "busyKernelGpuIdleMinutes", "noSignalGpuIdleMinutes"}
DEFAULT_GRID: dict[str, tuple[float | None, ...]] = {
    "idleMinutes": (15, 30, 60, 120, 240),
    "connectedGpuIdleMinutes": (None, 120),
    "busyKernelGpuIdleMinutes": (None, 60, 240),
}
GROUPINGS = ("namespace", "rule")
CURRENT = "current"

Point = dict[str, float | None]


def parse_grid(specs: list[str]) -> dict[str, tuple[float | None, ...]]:
    """`KEY=V1,V2,...` (repeatable; `off` for null) -> the grid; the default grid when none is given.
    A key given replaces that key's default values; ConfigError names a bad key or value."""
    grid = dict(DEFAULT_GRID) if not specs else {}
    for spec in specs:
        key, sep, values = spec.partition("=")
        key = key.strip()
        if not sep or key not in SWEEP_KEYS:
            raise ConfigError(f"--grid {spec!r}: give KEY=V1,V2,... with KEY one of {', '.join(SWEEP_KEYS)}")
        out: list[float | None] = []
        for v in values.split(","):
            v = v.strip()
            if v == "off":
                if key not in _NULLABLE:
                    raise ConfigError(f"--grid {spec!r}: {key} cannot be off")
                out.append(None)
                continue
            try:
                number = float(v)
            except ValueError:
                raise ConfigError(f"--grid {spec!r}: {v!r} is not a number (or off)") from None
            if not math.isfinite(number) or number < 0 or (number == 0 and key != "warnMinutes"):
                raise ConfigError(f"--grid {spec!r}: {v!r} is out of range")
            out.append(int(number) if number == int(number) else number)
        grid[key] = tuple(dict.fromkeys(out))
    return grid


def points(grid: Mapping[str, tuple[float | None, ...]]) -> list[Point]:
    keys = [k for k in SWEEP_KEYS if k in grid]
    return [dict(zip(keys, combo, strict=True)) for combo in itertools.product(*(grid[k] for k in keys))]


def label(point: Point) -> str:
    if not point:
        return CURRENT
    return " ".join(f"{k}={'off' if v is None else f'{v:g}'}" for k, v in point.items())


def base_mapping(config: str | None) -> dict[str, Any]:
    """The current configuration as one mapping: the admin's file with its *.fragment.yaml merged in, as
    `kf-culler run --config` reads it (kf_culler/config_layers.py); {} for the built-in defaults."""
    if config is None:
        return {}
    fragments = fragment_paths(config)
    raw = read_data(config)
    if not fragments:
        if raw is None:
            return {}
        if not isinstance(raw, dict):
            raise ConfigError(f"{config}: the configuration must be a mapping")
        load_mapping(raw, config)  # fail fast, naming the key
        return copy.deepcopy(raw)
    merged, origins = merge((config, raw), [(str(p), read_data(p)) for p in fragments])
    load_mapping(merged, origins)
    return merged


def with_point(base: Mapping[str, Any], point: Point) -> dict[str, Any]:
    """The configuration mapping of a grid point: base with the point's keys set at the top level."""
    out = copy.deepcopy(dict(base))
    out.update(point)
    return out


def group_of(grouping: str | None, notebook_id: str, rule: str | None) -> str:
    if grouping == "namespace":
        return notebook_id.split("/", 1)[0]
    if grouping == "rule":
        return rule or "default"
    return "all"


@dataclass
class Figures:
    """One policy's figures over a set of notebooks."""

    reclaimed_gpu_h: float = 0.0
    held_gpu_h: float = 0.0
    baseline_gpu_h: float = 0.0
    session_days: float = 0.0
    restarts: int = 0
    stops: int = 0
    interruptions: int = 0
    warnings: int = 0
    reclaim_delays_s: list[float] = field(default_factory=list)

    def add(self, other: Figures) -> None:
        for k, v in vars(other).items():
            if isinstance(v, list):
                self.reclaim_delays_s.extend(v)
            else:
                setattr(self, k, getattr(self, k) + v)

    @property
    def restarts_per_session_day(self) -> float:
        return self.restarts / self.session_days if self.session_days > 0 else 0.0

    def delay_minutes(self, q: float) -> float | None:
        """Nearest-rank percentile of the reclaim delays, in minutes."""
        if not self.reclaim_delays_s:
            return None
        ordered = sorted(self.reclaim_delays_s)
        return ordered[max(1, math.ceil(q / 100 * len(ordered))) - 1] / 60

    def to_dict(self) -> dict[str, Any]:
        return {"gpuHoursReclaimed": self.reclaimed_gpu_h, "gpuHoursHeld": self.held_gpu_h,
                "gpuHoursWithoutCuller": self.baseline_gpu_h, "sessionDays": self.session_days,
                "restarts": self.restarts, "restartsPerSessionDay": self.restarts_per_session_day,
                "stops": self.stops, "interruptions": self.interruptions, "warnings": self.warnings,
                "reclaimDelayMinutes": {"p50": self.delay_minutes(50), "p90": self.delay_minutes(90)}}


@dataclass
class Evaluated:
    """A point and its figures, for the fleet and per group."""

    point: Point
    label: str
    total: Figures
    groups: dict[str, Figures]


@dataclass(frozen=True)
class Job:
    trace: str
    configs: list[tuple[str, dict[str, Any]]]  # (label, configuration mapping)
    grouping: str | None
    restart_delay_minutes: float
    check_period_minutes: float | None
    shard: int = 0  # this job replays the notebooks of this shard (kf_culler/replay/cohorts.py `shard_of`)
    shards: int = 1


@dataclass
class Piece:
    """One notebook's figures under one configuration, and its group."""

    group: str
    figures: Figures


def pieces_of(result: ReplayResult, i: int, rule: SweptPolicy, grouping: str | None) -> dict[str, Piece]:
    """Per notebook (in the replay's order), the figures of rule i of a replay."""
    out: dict[str, Piece] = {}
    by_id: dict[str, list[float]] = {}
    for s in result.stops[i]:
        if s.truth in ("absent", "present") and s.idle_seconds is not None:
            by_id.setdefault(s.id, []).append(s.idle_seconds)
    for nb_id, tally in result.tallies[i].items():
        totals = result.notebooks[nb_id]
        out[nb_id] = Piece(group_of(grouping, nb_id, rule.rules.get(nb_id)), Figures(
            reclaimed_gpu_h=tally.reclaimed_total_gpu_s / HOUR, held_gpu_h=tally.held_gpu_s / HOUR,
            baseline_gpu_h=totals.baseline_gpu_s / HOUR, session_days=totals.running_s / DAY,
            restarts=tally.restarts, stops=tally.stops, warnings=tally.warnings,
            interruptions=tally.interruptions if result.truth_known else rule.work_stops.get(nb_id, 0),
            reclaim_delays_s=list(by_id.get(nb_id, ()))))
    return out


def fold(pieces: Iterable[Piece]) -> dict[str, Figures]:
    """Per group, the sum of the pieces (added in the order given)."""
    out: dict[str, Figures] = {}
    for piece in pieces:
        out.setdefault(piece.group, Figures()).add(piece.figures)
    return out


def figures_of(result: ReplayResult, i: int, rule: SweptPolicy, grouping: str | None) -> dict[str, Figures]:
    """Per group, the figures of rule i of a replay."""
    return fold(pieces_of(result, i, rule, grouping).values())


@dataclass
class JobResult:
    truth_known: bool
    first_seen: dict[str, int]  # notebook id -> the index of its first record in the trace
    pieces: list[dict[str, Piece]]  # per configuration, per notebook


def run_job(job: Job) -> JobResult:
    """Replay every configuration over one shard of the trace's notebooks, in one pass over the trace (the cohort
    replay, kf_culler/replay/cohorts.py). A top-level function, so a process pool can run it."""
    rules = [SweptPolicy(name, load_mapping(raw, f"sweep point {name}")) for name, raw in job.configs]
    replayer = CohortReplay(rules, restart_delay_minutes=job.restart_delay_minutes,
                            check_period_minutes=job.check_period_minutes,
                            gpu_resources=rules[0].settings.policy.gpu_resources)
    result = replayer.run(job.trace, shard=job.shard, shards=job.shards)
    return JobResult(result.truth_known, replayer.first_seen,
                     [pieces_of(result, i, r, job.grouping) for i, r in enumerate(rules)])


def run_job_plainly(job: Job) -> JobResult:
    """run_job through kf_culler/replay/simulate.py `replay`, each configuration checking each notebook on its own
    (what the cohort replay must give, figure for figure), over the whole trace."""
    rules = [SweptPolicy(name, load_mapping(raw, f"sweep point {name}")) for name, raw in job.configs]
    contenders: list[Contender] = list(rules)
    result = replay(job.trace, contenders, restart_delay_minutes=job.restart_delay_minutes,
                    check_period_minutes=job.check_period_minutes, gpu_resources=rules[0].settings.policy.gpu_resources)
    return JobResult(result.truth_known, {k: n for n, k in enumerate(result.notebooks)},
                     [pieces_of(result, i, r, job.grouping) for i, r in enumerate(rules)])


def combine(results: list[JobResult]) -> tuple[bool, list[dict[str, Figures]]]:
    """The shards' results as one replay's: per configuration, its figures per group, summed notebook by notebook in
    the order the notebooks first appear in the trace (so the sums are those of one pass over it)."""
    first: dict[str, int] = {}
    for r in results:
        first.update(r.first_seen)
    order = sorted(first, key=first.__getitem__)
    n = len(results[0].pieces)
    merged: list[dict[str, Figures]] = []
    for i in range(n):
        pieces: dict[str, Piece] = {}
        for r in results:
            pieces.update(r.pieces[i])
        merged.append(fold(pieces[k] for k in order if k in pieces))
    return all(r.truth_known for r in results), merged


def evaluate(trace: str, configs: list[tuple[Point, dict[str, Any]]], *, grouping: str | None = None,
             restart_delay_minutes: float = 5, check_period_minutes: float | None = None, jobs: int = 1
             ) -> tuple[bool, list[Evaluated]]:
    """Replay every configuration (a point and its mapping); with jobs > 1 the notebooks are split into that many
    shards, each replayed in its own process (each reads the trace once, and replays its own notebooks)."""
    jobs = max(1, jobs)
    named = [(label(p), raw) for p, raw in configs]
    work = [Job(trace, named, grouping, restart_delay_minutes, check_period_minutes, k, jobs) for k in range(jobs)]
    if jobs == 1:
        results = [run_job(work[0])]
    else:
        with ProcessPoolExecutor(max_workers=jobs) as pool:
            results = list(pool.map(run_job, work))
    truth_known, per_config = combine(results)
    out = []
    for (point, _), groups in zip(configs, per_config, strict=True):
        total = Figures()
        for f in groups.values():
            total.add(f)
        out.append(Evaluated(point, label(point), total, groups))
    return truth_known, out


def dominates(a: Figures, b: Figures) -> bool:
    """a is at least as good as b in reclaimed, restarts per session-day and interruptions, and better in one."""
    ge = (a.reclaimed_gpu_h >= b.reclaimed_gpu_h and a.restarts_per_session_day <= b.restarts_per_session_day
          and a.interruptions <= b.interruptions)
    gt = (a.reclaimed_gpu_h > b.reclaimed_gpu_h or a.restarts_per_session_day < b.restarts_per_session_day
          or a.interruptions < b.interruptions)
    return ge and gt


def frontier(items: list[Evaluated], of: Callable[[Evaluated], Figures] = lambda e: e.total) -> list[Evaluated]:
    """The Pareto frontier (no other point is better in one figure and as good in the others), by restarts."""
    front = [e for e in items if not any(dominates(of(o), of(e)) for o in items if o is not e)]
    return sorted(front, key=lambda e: (of(e).restarts_per_session_day, -of(e).reclaimed_gpu_h))


def _key(f: Figures) -> tuple[float, float, int]:
    return (-round(f.reclaimed_gpu_h, 6), round(f.restarts_per_session_day, 9), f.warnings)


def best(items: list[Evaluated], max_restarts: float, of: Callable[[Evaluated], Figures] = lambda e: e.total
         ) -> Evaluated | None:
    """The point with the most GPU-hours reclaimed within the budget and without interruptions (ties: fewer
    restarts, then fewer warnings, then the earlier point of the grid)."""
    fit = [e for e in items if of(e).interruptions == 0 and of(e).restarts_per_session_day <= max_restarts + 1e-12]
    return min(fit, key=lambda e: _key(of(e))) if fit else None


@dataclass
class Plan:
    """What the recommendation sets: a point at the top level, and points for groups that do better alone."""

    top: Evaluated
    per_group: dict[str, Evaluated]  # group -> its own point (only where it differs from the top)
    expected: Figures  # the sum of the chosen points' figures, group by group


def recommend(items: list[Evaluated], max_restarts: float, grouping: str | None) -> Plan | None:
    """The fleet-wide best point, or with a grouping, the best point of each group (each within the budget, so
    the fleet is too) when that reclaims more in total than the fleet-wide one."""
    top = best(items, max_restarts)
    plan = Plan(top, {}, top.total) if top is not None else None
    if grouping is None:
        return plan
    groups = sorted({g for e in items for g in e.groups})
    chosen: dict[str, Evaluated] = {}
    for g in groups:
        found = best(items, max_restarts, of=lambda e, g=g: e.groups.get(g, Figures()))  # type: ignore[misc]
        if found is None:
            return plan
        chosen[g] = found
    expected = Figures()
    for g, e in chosen.items():
        expected.add(e.groups.get(g, Figures()))
    if plan is not None and expected.reclaimed_gpu_h <= plan.expected.reclaimed_gpu_h + 1e-9:
        return plan
    # the top level: the point most groups chose (their session-days), the others get their own
    weight: dict[str, float] = {}
    for g, e in chosen.items():
        weight[e.label] = weight.get(e.label, 0.0) + e.groups.get(g, Figures()).session_days
    top_label = max(sorted(weight), key=lambda k: weight[k])
    top = next(e for e in chosen.values() if e.label == top_label)
    return Plan(top, {g: e for g, e in chosen.items() if e.label != top_label}, expected)


def recommended_mapping(base: Mapping[str, Any], plan: Plan, grouping: str | None) -> dict[str, Any]:
    """The configuration of a plan: the base with the top point's keys at the top level, and for each group with
    its own point, a namespace override (grouping by namespace) or that rule's policy keys (by rule; `default`,
    the top level, is the top point). A key an existing override or rule sets itself is kept, as in the replay."""
    out = with_point(base, {k: v for k, v in plan.top.point.items() if k in base or not _is_default(k, v)})
    for group, e in sorted(plan.per_group.items()):
        point = e.point or _base_values(base, list(plan.top.point))  # the current configuration's own values
        if grouping == "namespace":
            overrides = out.setdefault("namespaceOverrides", {})
            overrides[group] = {**point, **(overrides.get(group) or {})}
        elif grouping == "rule" and group != "default":
            for rule in out.get("rules") or []:
                if isinstance(rule, dict) and rule.get("name") == group:
                    rule["policy"] = {**point, **(rule.get("policy") or {})}
    return out


def _base_values(base: Mapping[str, Any], keys: list[str]) -> Point:
    """The current configuration's top-level values of keys, written out (so that an override keeps them when the
    top level changes): its own, else the policy's defaults (noSignalGpuIdleMinutes: twice idleMinutes)."""
    policy = load_mapping(dict(base), "the current configuration").policy
    values: Point = {"idleMinutes": policy.idle_minutes, "warnMinutes": policy.warn_minutes,
                     "connectedGpuIdleMinutes": policy.connected_gpu_idle_minutes,
                     "busyKernelGpuIdleMinutes": policy.busy_kernel_gpu_idle_minutes,
                     "noSignalGpuIdleMinutes": policy.no_signal_gpu_idle_limit}
    return {k: values[k] for k in keys if k in values}


def _is_default(key: str, value: float | None) -> bool:
    """Whether a top-level key at this value is what the policy has without it (so it need not be written);
    noSignalGpuIdleMinutes without a value is twice idleMinutes, not null."""
    if key == "noSignalGpuIdleMinutes":
        return False
    for name, f in Policy.model_fields.items():
        if (f.alias or name) == key:
            return bool(f.default == value)
    return False


def changes(base: Mapping[str, Any], new: Mapping[str, Any], prefix: str = "") -> list[str]:
    """`key: old -> new` for every key that differs (dotted; lists compared whole)."""
    out = []
    for key in sorted(set(base) | set(new), key=str):
        a, b = base.get(key, "(not set)"), new.get(key, "(not set)")
        if isinstance(a, dict) and isinstance(b, dict):
            out += changes(a, b, f"{prefix}{key}.")
        elif a != b:
            out.append(f"{prefix}{key}: {_show(a)} -> {_show(b)}")
    return out


def _show(v: object) -> str:
    return "null" if v is None else str(v)


def write_yaml(mapping: Mapping[str, Any], path: str | Path, comment: str) -> None:
    import yaml

    text = yaml.safe_dump(dict(mapping), sort_keys=False, default_flow_style=False)
    Path(path).write_text("".join(f"# {line}\n" for line in comment.splitlines()) + text, encoding="utf-8")
