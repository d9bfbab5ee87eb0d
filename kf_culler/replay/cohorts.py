"""The sweep's replay: every configuration over one trace, with the configurations that are in the same state
for a notebook moved through it together.

It counts what kf_culler/replay/simulate.py `replay` counts for `SweptPolicy` rules (kf_culler/replay/sweep.py),
figure for figure (tests/test_replay_cohorts.py compares them), but does the work once where the policies
cannot differ:

- for one notebook, the configurations whose replays are in the same state (running or stopped since the same
  time, restarting at the same time, checked last at the same time, the same last action) form a cohort; a
  record is stepped once per cohort, not once per configuration. A cohort splits when its configurations'
  verdicts differ (some stop, others keep) and cohorts in the same state merge again (the same restart);
- what is counted while a cohort runs or stays stopped is counted once for it, and given to each of its
  configurations when it splits or merges;
- a cohort's configurations are given their GPU look-back windows once per distinct window, and
  kf_culler/replay/shared_decide.py gives them their verdicts with one `decide` call for every set of policies
  that decide alike.
"""

from __future__ import annotations

import time as wallclock
import zlib
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from kf_culler.config import Policy
from kf_culler.model import STOP_ANNOTATION, InputError
from kf_culler.policy import Selected, policy_of, selection
from kf_culler.replay.contenders import Check, ConfiguredPolicy
from kf_culler.replay.fleet import BEHAVIOUR_LABEL
from kf_culler.replay.shared_decide import Signatures, shared_verdicts
from kf_culler.replay.simulate import (
    GpuHistory,
    NotebookTotals,
    ReplayResult,
    Stop,
    Tally,
    _with_start,
    account_interval,
    note_truth,
)
from kf_culler.replay.sweep_policy import SweptPolicy, work_at_stop
from kf_culler.replay.trace import Record, read_trace
from kf_culler.session import SessionView, annotations_of, gpu_count, metadata_of, running_since


def shard_of(notebook_id: str, shards: int) -> int:
    """The shard a notebook's records are replayed in (the same in every process)."""
    return zlib.crc32(notebook_id.encode()) % shards if shards > 1 else 0


@dataclass
class _Cohort:
    members: list[int]
    running: bool = True
    stopped_at: datetime | None = None
    restart_at: datetime | None = None
    start_override: datetime | None = None
    last_check: datetime | None = None
    last_action: str = "keep"
    work_run_hit: int = -1
    acc: Tally = field(default_factory=Tally)  # counted for every member since the last flush

    def key(self) -> tuple[object, ...]:
        return (self.running, self.stopped_at, self.restart_at, self.start_override, self.last_check,
                self.last_action, self.work_run_hit)

    def like(self, members: list[int]) -> _Cohort:
        return _Cohort(members, self.running, self.stopped_at, self.restart_at, self.start_override,
                       self.last_check, self.last_action, self.work_run_hit)


@dataclass
class _Choice:
    """What every configuration makes of one notebook, pod and context (as SweptPolicy.check does)."""

    selected: list[Selected | None]
    early: list[Check | None]  # a verdict given before decide (namespace not selected, gpuOnly)
    thresholds: list[tuple[float, float]]
    views: list[int]  # index of each configuration's view among `distinct`
    distinct: list[SessionView]
    keep: tuple[object, ...]  # the objects whose ids key this choice, kept alive
    plans: dict[tuple[int, ...], _Plan]


@dataclass
class _Plan:
    lone: list[int]
    early: list[tuple[Check, list[int]]]
    classes: list[tuple[timedelta, tuple[float, float], int, list[int], tuple[Policy, ...]]]
    named: list[int]  # the members whose notebook's rule is noted (SweptPolicy.rules)


@dataclass
class _Outcome:
    """One check given to some members of a cohort."""

    check: Check
    members: list[int]
    decided: bool  # by decide (not before it)
    observations: dict[str, Any]
    selected: list[Selected | None]


class _Nb:
    def __init__(self, rec: Record, n: int, behaviour: str | None) -> None:
        self.totals = NotebookTotals(rec.id, behaviour)
        self.tallies = [Tally() for _ in range(n)]
        self.cohorts = [_Cohort(list(range(n)))]
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
        self.choices: dict[tuple[int, int, int], _Choice] = {}
        self.pods: dict[tuple[int, datetime], dict[str, Any]] = {}
        self.unrecorded = set(range(n))  # configurations that have not yet noted the notebook's rule

    def flush(self, c: _Cohort) -> None:
        for i in c.members:
            self.tallies[i].add(c.acc)
        c.acc = Tally()


class CohortReplay:
    """replay() of SweptPolicy rules (module docstring). `rules` get their `rules`, `work_stops` and `calls`."""

    def __init__(self, rules: list[SweptPolicy], *, restart_delay_minutes: float = 5,
                 oracle_idle_minutes: float | None = None, check_period_minutes: float | None = None,
                 gpu_resources: tuple[str, ...] = ("nvidia.com/gpu",)) -> None:
        self.rules = rules
        self.n = len(rules)
        self.delay = timedelta(minutes=restart_delay_minutes)
        self.restart_delay_minutes = restart_delay_minutes
        self.period = timedelta(minutes=check_period_minutes) if check_period_minutes else None
        self.oracle = timedelta(minutes=oracle_idle_minutes if oracle_idle_minutes is not None
                                else rules[0].idle_minutes)
        self.gpu_resources = gpu_resources
        self.lookbacks = [timedelta(minutes=r.gpu_lookback_minutes) for r in rules]
        self.keep_gpu = max(self.lookbacks, default=timedelta(0))
        self.slack = timedelta(seconds=1)
        self.signatures = Signatures()
        self.stops: list[list[Stop]] = [[] for _ in rules]
        self.calls = 0
        self.first_seen: dict[str, int] = {}

    def run(self, path: str | Path, *, shard: int = 0, shards: int = 1) -> ReplayResult:
        """Replay the notebooks of one shard (all of them by default); `first_seen` then says where each of them
        first appears in the trace."""
        started_at = wallclock.perf_counter()
        header, records = read_trace(path)
        nbs: dict[str, _Nb] = {}
        others: set[str] = set()
        truth_known, count, seen = True, 0, 0
        for rec in records:
            seen += 1
            nb = nbs.get(rec.id)
            if nb is None:
                if rec.id in others:
                    continue
                if shard_of(rec.id, shards) != shard:
                    others.add(rec.id)
                    continue
                self.first_seen[rec.id] = seen
                labels = metadata_of(rec.notebook).get("labels")
                behaviour = labels.get(BEHAVIOUR_LABEL) if isinstance(labels, dict) else None
                nb = nbs[rec.id] = _Nb(rec, self.n, behaviour if isinstance(behaviour, str) else None)
            count += 1
            now = rec.time
            self._close(nb, now)
            totals = nb.totals
            totals.records += 1
            if rec.notebook is not nb.nb_obj or rec.pod is not nb.pod_obj:
                nb.nb_obj, nb.pod_obj = rec.notebook, rec.pod
                start = running_since(rec.pod)
                nb.world_running = start is not None and STOP_ANNOTATION not in annotations_of(rec.notebook)
                nb.world_start = start
                totals.gpus = max(totals.gpus, gpu_count(rec.notebook, rec.pod, self.gpu_resources))
                nb.choices.clear()
                nb.pods.clear()
            truth = rec.truth
            if truth is None:
                truth_known = False
            note_truth(nb, truth, now)
            if self.keep_gpu and nb.world_running and any(self._may_decide(c, nb) for c in nb.cohorts) and \
                    "gpu" in (obs := rec.observations):
                nb.gpu.merge(obs["gpu"], now, self.keep_gpu)
            after: list[_Cohort] = []
            for c in nb.cohorts:
                after.extend(self._step(c, nb, rec, now))
            nb.cohorts = self._merged(nb, after) if len(after) > 1 else after
            nb.prev_time, nb.prev_truth, nb.prev_world = now, truth, nb.world_running

        period_end = timedelta(seconds=header.check_period_seconds)
        for nb in nbs.values():
            if nb.prev_time is not None:
                self._close(nb, nb.prev_time + period_end)
            for c in nb.cohorts:
                nb.flush(c)
        for s in self.stops:
            s.sort(key=lambda x: (x.time, x.id))
        for rule in self.rules:
            rule.calls = 0
        if self.rules:
            self.rules[0].calls = self.calls
        return ReplayResult(
            header=header, rule_names=[r.name for r in self.rules],
            oracle_idle_minutes=self.oracle.total_seconds() / 60, restart_delay_minutes=self.restart_delay_minutes,
            check_period_seconds=self.period.total_seconds() if self.period else None,
            notebooks={k: nb.totals for k, nb in nbs.items()},
            tallies=[{k: nb.tallies[i] for k, nb in nbs.items()} for i in range(self.n)],
            stops=self.stops, truth_known=truth_known, records=count,
            seconds=wallclock.perf_counter() - started_at, decide_calls=self.calls)

    def _merged(self, nb: _Nb, cohorts: list[_Cohort]) -> list[_Cohort]:
        by_key: dict[tuple[object, ...], _Cohort] = {}
        for c in cohorts:
            k = c.key()
            other = by_key.get(k)
            if other is None:
                by_key[k] = c
                continue
            nb.flush(other)
            nb.flush(c)
            other.members = sorted(other.members + c.members)
        return list(by_key.values())

    def _close(self, nb: _Nb, end: datetime) -> None:
        """Account [prev_time, end) with the situation after the previous record (as the plain replay does)."""
        account_interval(nb, end, self.oracle, ((c.running, c.acc) for c in nb.cohorts))

    @staticmethod
    def _may_decide(c: _Cohort, nb: _Nb) -> bool:
        return c.running or c.restart_at is not None or (
            c.stopped_at is not None and nb.world_start is not None and nb.world_start > c.stopped_at)

    def _step(self, c: _Cohort, nb: _Nb, rec: Record, now: datetime) -> list[_Cohort]:
        """simulate._step for every member of a cohort; the cohorts it becomes."""
        acc = c.acc
        if not c.running:
            if nb.world_start is not None and c.stopped_at is not None and nb.world_start > c.stopped_at:
                c.running, c.stopped_at, c.restart_at, c.start_override = True, None, None, None
            else:
                if c.restart_at is None and rec.truth == "working":
                    c.restart_at = now + self.delay
                    acc.restarts += 1
                if c.restart_at is None or now < c.restart_at:
                    return [c]
                c.running, c.stopped_at = True, None
                c.start_override, c.restart_at = c.restart_at, None
                c.last_check = None
        if not nb.world_running or nb.world_start is None:
            return [c]
        if self.period is not None and c.last_check is not None and now + self.slack < c.last_check + self.period:
            return [c]
        c.last_check = now
        pod = rec.pod
        started = nb.world_start
        if c.start_override is not None and c.start_override > started and pod is not None:
            started = c.start_override
            pk = (id(pod), started)
            shown = nb.pods.get(pk)
            if shown is None:
                shown = nb.pods[pk] = _with_start(pod, started)
            pod = shown
        acc.checks += 1
        outcomes = self._checks(c, nb, rec, pod, now, started)
        by_action: dict[str, list[_Outcome]] = {}
        for o in outcomes:
            by_action.setdefault(o.check.action, []).append(o)
        if len(by_action) == 1:
            parts = [(c, next(iter(by_action.values())))]
        else:
            nb.flush(c)
            parts = [(c.like(sorted(i for o in group for i in o.members)), group) for group in by_action.values()]
        for sub, group in parts:
            self._apply(sub, group, nb, rec, now)
        return [sub for sub, _ in parts]

    def _apply(self, c: _Cohort, outcomes: list[_Outcome], nb: _Nb, rec: Record, now: datetime) -> None:
        """simulate._step after the check, for a cohort whose members' checks all have one action."""
        acc = c.acc
        action = outcomes[0].check.action
        if action == "warn" and c.last_action != "warn":
            acc.warnings += 1
        c.last_action = action
        if action != "stop":
            return
        c.running, c.stopped_at, c.last_action = False, now, "keep"
        acc.stops += 1
        truth = rec.truth
        if truth == "working":
            acc.interruptions += 1
            if c.work_run_hit != nb.work_run:
                c.work_run_hit = nb.work_run
                acc.interrupted_intervals += 1
            c.restart_at = now + self.delay
            acc.restarts += 1
        elif truth == "present":
            acc.present_stops += 1
        elif truth == "absent":
            acc.absent_stops += 1
        idle = None if truth is None or nb.idle_start is None else (now - nb.idle_start).total_seconds()
        if truth == "working":
            idle = 0.0
        for o in outcomes:
            for i in o.members:
                self.stops[i].append(Stop(now, rec.id, truth, o.check.reason, idle))
                sel = o.selected[i] if o.decided else None
                if sel is not None and work_at_stop(o.observations, sel.policy):  # as SweptPolicy.check counts
                    key = "/".join(sel.key)
                    rule = self.rules[i]
                    rule.work_stops[key] = rule.work_stops.get(key, 0) + 1

    def _choice(self, nb: _Nb, notebook: dict[str, Any], pod: dict[str, Any] | None,
                context: dict[str, Any]) -> _Choice:
        k = (id(notebook), id(pod), id(context))
        found = nb.choices.get(k)
        if found is not None:
            return found
        if len(nb.choices) >= 64:  # contexts that changed while the notebook and pod did not
            nb.choices.clear()
        labels, node = context.get("namespaceLabels"), context.get("node")
        labels = labels if isinstance(labels, dict) else None
        node = node if isinstance(node, dict) else None
        selected: list[Selected | None] = []
        early: list[Check | None] = []
        thresholds: list[tuple[float, float]] = []
        views: list[int] = []
        distinct: list[SessionView] = []
        for rule in self.rules:
            settings = rule.settings
            try:
                chosen: Selected | None = selection(notebook, pod, settings, namespace_labels=labels, node=node)
            except InputError:
                chosen = None
            selected.append(chosen)
            gpu = policy_of(notebook, pod, settings, labels, node)[0].gpu  # ConfiguredPolicy.gpu_thresholds
            thresholds.append((gpu.util_percent, gpu.memory_mib))
            ops = settings.operations
            if chosen is None:
                early.append(None)
                views.append(-1)
                continue
            if not ops.namespaces.selects(chosen.key[0]):
                early.append(Check("keep", "exempt", "namespace not selected by this configuration"))
            elif ops.gpu_only and chosen.view.gpus == 0:
                early.append(Check("keep", "exempt", "gpuOnly: the notebook has no GPU"))
            else:
                early.append(None)
            for j, v in enumerate(distinct):
                if v is chosen.view or v == chosen.view:
                    views.append(j)
                    break
            else:
                views.append(len(distinct))
                distinct.append(chosen.view)
        found = nb.choices[k] = _Choice(selected, early, thresholds, views, distinct, (notebook, pod, context), {})
        return found

    def _plan(self, choice: _Choice, members: list[int]) -> _Plan:
        """The members sorted into what does not change from record to record: those that are not a notebook, those
        given a verdict before decide, and classes of the same look-back, GPU thresholds and view."""
        key = tuple(members)
        found = choice.plans.get(key)
        if found is not None:
            return found
        lone: list[int] = []
        early_of: dict[int, tuple[Check, list[int]]] = {}
        classes: dict[tuple[timedelta, tuple[float, float], int], list[int]] = {}
        for i in members:
            chosen = choice.selected[i]
            if chosen is None:
                lone.append(i)
                continue
            early = choice.early[i]
            if early is not None:
                early_of.setdefault(id(early), (early, []))[1].append(i)
                continue
            classes.setdefault((self.lookbacks[i], choice.thresholds[i], choice.views[i]), []).append(i)
        unrecorded = [i for i in members if choice.selected[i] is not None]
        found = choice.plans[key] = _Plan(lone, list(early_of.values()), [
            (lookback, thresholds, view, ms, tuple(p.policy for i in ms if (p := choice.selected[i]) is not None))
            for (lookback, thresholds, view), ms in classes.items()], unrecorded)
        return found

    def _checks(self, c: _Cohort, nb: _Nb, rec: Record, pod: dict[str, Any] | None, now: datetime,
                started: datetime) -> list[_Outcome]:
        """The members' checks (SweptPolicy.check on the observations simulate._step gives each), grouped."""
        choice = self._choice(nb, rec.notebook, pod, rec.context)
        plan = self._plan(choice, c.members)
        if nb.unrecorded:
            for i in plan.named:
                if i in nb.unrecorded:
                    nb.unrecorded.discard(i)
                    chosen = choice.selected[i]
                    assert chosen is not None
                    key, rule = "/".join(chosen.key), self.rules[i]
                    if key not in rule.rules:
                        rule.rules[key] = chosen.policy_rule
        obs = rec.observations
        out: list[_Outcome] = []
        windows: dict[tuple[timedelta, tuple[float, float]], tuple[tuple[int, ...], dict[str, Any]]] = {}

        def window(lookback: timedelta, thresholds: tuple[float, float]) -> tuple[tuple[int, ...], dict[str, Any]]:
            if not lookback or "gpu" not in obs:
                return (), obs
            w = windows.get((lookback, thresholds))
            if w is None:
                shown = nb.gpu.window(obs, now, max(now - lookback, started), thresholds)
                gpu = shown.get("gpu")
                ids = (id(shown),) if shown is obs or not isinstance(gpu, dict) else (
                    -1, *(id(s) for s in gpu["samples"]))
                w = windows[(lookback, thresholds)] = (ids, shown)
            return w

        for i in plan.lone:  # not a notebook at all: decide says what is wrong with it
            seen = window(self.lookbacks[i], choice.thresholds[i])[1]
            check = ConfiguredPolicy.check(self.rules[i], {}, rec.notebook, pod, seen, now, started, rec.context)
            out.append(_Outcome(check, [i], False, seen, choice.selected))
        for check, ms in plan.early:
            out.append(_Outcome(check, ms, False, obs, choice.selected))
        batches: dict[tuple[int, tuple[int, ...]], tuple[dict[str, Any], list[int], list[Policy]]] = {}
        for lookback, thresholds, view, ms, policies in plan.classes:
            ids, seen = window(lookback, thresholds)
            batch = batches.get((view, ids))
            if batch is None:
                batches[(view, ids)] = (seen, list(ms), list(policies))
            else:
                batch[1].extend(ms)
                batch[2].extend(policies)
        for (view, _), (seen, ms, batch_policies) in batches.items():
            verdicts, calls = shared_verdicts(choice.distinct[view], seen, batch_policies, now, self.signatures)
            self.calls += calls
            for v, positions in verdicts:
                out.append(_Outcome(Check(v.action, v.state, v.reason), [ms[p] for p in positions], True, seen,
                                    choice.selected))
        return out
