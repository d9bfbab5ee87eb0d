"""The culler's own record of a notebook: what it did and saw, kept where profile users cannot write.

Rule 15 (docs/decisions.md): the `notebook-culler.io/*` marks on a Notebook are for people to read; a
user can write them. What the culler itself did (stopped this uid at T, saw it started again at T',
saw it running since R) is a `CullerRecord`, stored by kf_culler/kube/records.py in ConfigMaps in the
culler's own namespace and given to `decide` as `cullerRecord`. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from kf_culler.errors import InputError
from kf_culler.model import STOP_ANNOTATION, STOPPED_AT_ANNOTATION, STOPPED_BY_ANNOTATION, STOPPED_BY_VALUE
from kf_culler.timeutil import format_time, parse_time

# The record's keys, as the scenario format and the stored JSON spell them.
STOPPED_AT = "stoppedAt"
RESTARTED_AT = "restartedAt"
RUNNING_SINCE = "runningSince"
WARNED_AT = "warnedAt"
NOT_TAKEN_AT = "stopNotTakenAt"
KEYS = (STOPPED_AT, RESTARTED_AT, RUNNING_SINCE, WARNED_AT, NOT_TAKEN_AT)


@dataclass(frozen=True)
class CullerRecord:
    """What the culler recorded about one notebook uid; every field optional."""

    stopped_at: datetime | None = None  # the culler stopped it (recorded before the stop's patch)
    restarted_at: datetime | None = None  # the culler saw it started again after that stop
    running_since: datetime | None = None  # the culler first saw it running since its last stop
    warned_at: datetime | None = None  # the culler's last stop warning (one per idle period: kf_culler/plan.py)
    # The culler told an admin that its last stop did not free the session's pod (kf_culler/rules/untaken.py).
    not_taken_at: datetime | None = None

    @property
    def empty(self) -> bool:
        return (self.stopped_at is None and self.restarted_at is None and self.running_since is None
                and self.warned_at is None and self.not_taken_at is None)

    def awaiting_restart(self) -> bool:
        """The culler stopped it and has not yet seen it started again (rule 15)."""
        return self.stopped_at is not None and (self.restarted_at is None or self.restarted_at < self.stopped_at)

    def not_taken_told(self) -> bool:
        """The culler already reported that its last stop did not take (one report per stop)."""
        return self.stopped_at is not None and self.not_taken_at is not None and self.not_taken_at >= self.stopped_at

    def current_running_since(self) -> datetime | None:
        """`running_since` when it is about the run after the last stop; None when it is older."""
        if self.running_since is None:
            return None
        if self.stopped_at is not None and self.running_since < self.stopped_at:
            return None
        return self.running_since

    def to_dict(self) -> dict[str, str]:
        out: dict[str, str] = {}
        for key, value in ((STOPPED_AT, self.stopped_at), (RESTARTED_AT, self.restarted_at),
                           (RUNNING_SINCE, self.running_since), (WARNED_AT, self.warned_at),
                           (NOT_TAKEN_AT, self.not_taken_at)):
            if value is not None:
                out[key] = format_time(value)
        return out


def parse_record(raw: object, what: str = "cullerRecord") -> CullerRecord | None:
    """A record from its JSON form; None for null. InputError names the bad key (a scenario's input error)."""
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise InputError(f"'{what}' must be an object with {', '.join(KEYS)}")
    unknown = sorted(str(k) for k in raw if k not in KEYS)
    if unknown:
        raise InputError(f"'{what}.{unknown[0]}' is not a key of the culler's record ({', '.join(KEYS)})")
    times: dict[str, datetime | None] = {}
    for key in KEYS:
        value = raw.get(key)
        if value is None:
            times[key] = None
            continue
        t = parse_time(value)
        if t is None:
            raise InputError(f"'{what}.{key}' is not an RFC 3339 time with a zone: {str(value)[:60]!r}")
        times[key] = t
    return CullerRecord(times[STOPPED_AT], times[RESTARTED_AT], times[RUNNING_SINCE], times[WARNED_AT],
                        times[NOT_TAKEN_AT])


@dataclass(frozen=True)
class RecordChange:
    """What a pass learnt that the record must keep (kf_culler/plan.py decides it, the writer stores it)."""

    record: CullerRecord  # the whole record after the change
    before_patch: bool  # stored before the notebook's patch (a stop, a restart) or at the end of the pass


def next_record(record: CullerRecord | None, action: str, rule: str, pod_start: datetime | None,
                now: datetime, warned: bool = False, not_taken: bool = False) -> RecordChange | None:
    """The record after a verdict, or None when nothing changes.

    A stop records `stoppedAt`, a new warning `warnedAt` (`warned`: the plan gives one), the restart rule
    `restartedAt` = now: each before the patch it records. A running pod the record does not yet know about
    since the last stop records `runningSince` (its start, never before the stop it follows), with the pass's
    deferred writes; a report that the last stop did not take (`not_taken`) `stopNotTakenAt`, likewise."""
    current = record or CullerRecord()
    if not_taken:
        return RecordChange(replace(current, not_taken_at=now), before_patch=False)
    if action == "stop":
        return RecordChange(replace(current, stopped_at=now), before_patch=True)
    if rule == "3-restarted":
        return RecordChange(replace(current, restarted_at=now), before_patch=True)
    after = replace(current, warned_at=now) if warned else current
    if pod_start is not None and not after.awaiting_restart() and after.current_running_since() is None:
        since = min(pod_start, now)
        if after.stopped_at is not None and since < after.stopped_at:
            since = after.restarted_at or now  # the pod from before the stop still runs: count from the restart
        after = replace(after, running_since=since)
    if after == current:
        return None
    return RecordChange(after, before_patch=warned)


def warned_this_period(record: CullerRecord | None, idle_since: datetime | None) -> bool:
    """Whether the culler already warned about this idle period (one that began at `idle_since`): its own
    record, not the notebook's `warned-at` mark, which a user may remove to be warned, mailed and paged again."""
    if record is None or record.warned_at is None:
        return False
    return idle_since is None or record.warned_at >= idle_since


def record_json(record: CullerRecord, namespace: str) -> dict[str, Any]:
    """The stored form: the record plus the notebook's namespace (whose share of a bucket it counts in, and which
    replica sweeps it). Not the notebook's name: a string of the user's choosing, up to 253 characters, that
    nothing reads back (the key is its uid)."""
    return {"namespace": namespace, **record.to_dict()}


def imported(annotations: Mapping[str, Any], now: datetime) -> CullerRecord | None:
    """The one-time import of the old marks (docs/annotations.md, "Upgrading"; once per shard of namespaces,
    remembered in the culler's namespace by kf_culler/kube/records.py): only a notebook that is still
    stopped (`kubeflow-resource-stopped`) with `stopped-by: kf-culler` gets a record, `stoppedAt` from its
    `stopped-at` (or now). On any other notebook the marks are what a user may have written, and mean nothing."""
    if STOP_ANNOTATION not in annotations or annotations.get(STOPPED_BY_ANNOTATION) != STOPPED_BY_VALUE:
        return None
    at = parse_time(annotations.get(STOPPED_AT_ANNOTATION))
    return CullerRecord(stopped_at=min(at, now) if at is not None else now)
