"""A session's user asks for more time (docs/verdict-api.md, "Asking for more time"): the culler writes
`notebook-culler.io/keep-until` itself, bounded by the matched policy's maxExtendMinutes.

`POST /api/v1/namespaces/<ns>/<route>/<name>/extend` with `{"minutes": N}` and the session's pod's token for the
audience kf-culler. The verdict API (kf_culler/verdict_api.py) checks the token as for a read; here: the token is
bound to the very pod the latest pass paired with the session (TokenReview's pod uid), the session has a planned
stop an extension can move (the verdict's `extendUntil`), and the session was not extended in the last
EXTEND_EVERY_SECONDS. The new time is the planned stop plus N minutes, clamped to `extendUntil` (the stop without
extension plus maxExtendMinutes: what rule 12 honours). The write goes through the writer (kf_culler/kube/writer.py:
a patch guarded by resourceVersion, re-planned on 409, then a guarded JSON Patch), and an Event on the session
says which ServiceAccount asked and until when.
"""

from __future__ import annotations

import json
import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from kf_culler.kube.tokens import Identity
from kf_culler.model import KEEP_UNTIL_ANNOTATION
from kf_culler.plan import EventSpec, Plan
from kf_culler.targets import ROUTES, SessionKey
from kf_culler.timeutil import format_time, parse_time
from kf_culler.verdicts import VerdictStore

log = logging.getLogger("kf_culler.extend")
EXTEND_EVERY_SECONDS = 300.0  # one accepted extension per session per this many seconds (per replica)
MAX_MINUTES = 10 * 365 * 24 * 60  # what a request may ask (the answer is clamped far below anyway)
MAX_BODY_BYTES = 1024  # the request's JSON body
EVENT_REASON = "KeepUntilRequested"


@dataclass(frozen=True)
class Refusal:
    code: int
    reason: str
    message: str
    retry_after: int | None = None


@dataclass(frozen=True)
class Granted:
    keep_until: datetime
    asked: datetime  # the planned stop plus the minutes asked, before the clamp
    stop_was: datetime
    clamped: bool


def minutes_asked(body: bytes) -> int | Refusal:
    """The whole number of minutes in `{"minutes": N}` (1..MAX_MINUTES), or why not."""
    try:
        doc = json.loads(body or b"null")
    except ValueError:
        return Refusal(400, "BadRequest", 'the body must be JSON: {"minutes": N}')
    n = doc.get("minutes") if isinstance(doc, dict) else None
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_MINUTES:
        return Refusal(400, "BadRequest", f'"minutes" must be a whole number from 1 to {MAX_MINUTES}')
    return n


def grant(entry: dict[str, Any], max_extend_minutes: float, minutes: int, what: str) -> Granted | Refusal:
    """Pure: the keep-until a request of `minutes` gets on a session whose latest verdict is `entry`, or why not."""
    if max_extend_minutes <= 0:
        return Refusal(403, "ExtensionNotAllowed",
                       f"this cluster allows no extension for {what} (maxExtendMinutes is 0)")
    verdict = entry.get("verdict") or {}
    if verdict.get("action") == "stop" or verdict.get("state") == "stopped":
        return Refusal(409, "Stopped", f"{what} is stopped or being stopped: start it again instead")
    stop_at, latest = parse_time(verdict.get("stopAt")), parse_time(verdict.get("extendUntil"))
    if stop_at is None or latest is None:
        return Refusal(409, "NoStopPlanned", f"no stop is planned for {what} that an extension could move")
    if stop_at >= latest:
        return Refusal(409, "AtLongestExtension",
                       f"{what} is already kept until {format_time(stop_at)}, the longest extension allowed")
    asked = stop_at + timedelta(minutes=minutes)
    return Granted(min(asked, latest), asked, stop_at, asked > latest)


class Extender:
    """Answers requests to extend: checks who asks and how often, and writes keep-until through the writer."""

    def __init__(self, store: VerdictStore, writer: Any, every: float = EXTEND_EVERY_SECONDS,
                 clock: Callable[[], float] = time.monotonic, wall: Callable[[], datetime] = lambda: datetime.now(UTC),
                 may_write: Callable[[], bool] = lambda: True) -> None:
        """`writer`: a kf_culler.kube.writer.Writer (None: the culler writes nothing; every request is 503)."""
        self.store, self.writer, self.every, self.clock, self.wall = store, writer, every, clock, wall
        self.may_write = may_write
        self._lock = threading.Lock()
        self._last: dict[SessionKey, float] = {}  # accepted extensions, by session
        self.accepted = 0

    def extend(self, key: SessionKey, route: str, who: Identity, body: bytes) -> tuple[int, dict[str, Any]]:
        """(status, JSON document) of one request, the token already accepted for the session's namespace."""
        what = f"{ROUTES[route].kind} {key.namespace}/{key.object_name}"
        minutes = minutes_asked(body)
        if isinstance(minutes, Refusal):
            return _refused(minutes)
        found = self.store.session(*key)
        if found is None:
            return _refused(Refusal(404, "NotFound", f"no verdict for {what}"))
        entry, session = found
        if who.pod_uid is None or session.pod_uid is None or who.pod_uid != session.pod_uid:
            return _refused(Refusal(403, "Forbidden", f"only a token bound to the pod of {what} may extend it"))
        target = ROUTES[route]
        if target.keep_command(key.namespace, key.object_name, "T") is None:
            return _refused(Refusal(409, "ExtendedElsewhere", f"{what} is extended where it was made, not here"))
        granted = grant(entry, session.max_extend_minutes, minutes, what)
        if isinstance(granted, Refusal):
            return _refused(granted)
        if self.writer is None or not self.may_write():
            return _refused(Refusal(503, "ServiceUnavailable", "this culler writes nothing now (dry run)", 30))
        with self._lock:
            now = self.clock()
            last = self._last.get(key)
            if last is not None and now - last < self.every:
                wait = max(1, math.ceil(self.every - (now - last)))
                return _refused(Refusal(429, "TooManyRequests",
                                        f"{what} was extended less than {self.every / 60:g} min ago", wait))
            self._last[key] = now  # taken now, so that two requests at once make one write
        outcome, until = self._write(key, route, who, granted)
        if outcome is not None:
            with self._lock:
                self._last.pop(key, None)
            return _refused(outcome)
        self.accepted += 1
        doc = {"kind": "Extension", "namespace": key.namespace, "name": key.object_name,
               "keepUntil": format_time(until), "previousStopAt": format_time(granted.stop_was),
               "clamped": granted.clamped and until == granted.keep_until,
               "message": f"{what} is kept until {format_time(until)}"
                          + (" (the longest extension this cluster allows)" if granted.clamped else "") + "."}
        return 200, doc

    def _write(self, key: SessionKey, route: str, who: Identity, granted: Granted) -> tuple[Refusal | None, datetime]:
        """Write keep-until on the session (never earlier than one already there); the refusal, or the time kept."""
        target = ROUTES[route]
        until = granted.keep_until
        wanted = format_time(until)
        asker = f"{who.username}" + (f" (pod {who.pod_name})" if who.pod_name else "")
        event = EventSpec("Normal", EVENT_REASON, f"{asker} asked for more time: kept until {wanted} "
                          f"({KEEP_UNTIL_ANNOTATION}, at most the longest extension this cluster allows).")
        kept = [until]

        def replan(obj: dict[str, Any]) -> Plan:
            meta = obj.get("metadata") or {}
            current = parse_time((meta.get("annotations") or {}).get(KEEP_UNTIL_ANNOTATION))
            if current is not None and current >= until:  # a later keep-until already there: left as it is
                kept[0] = current
                return Plan({})
            kept[0] = until
            return Plan({KEEP_UNTIL_ANNOTATION: wanted}, event)

        obj, problem = self.writer.read(target.kind, key.namespace, key.object_name)
        if obj is None:
            if problem is None:
                return Refusal(404, "NotFound", f"no {target.kind} {key.namespace}/{key.object_name}"), until
            log.warning("extend %s: cannot read it: %s", key, problem)
            return Refusal(503, "ServiceUnavailable", "the session cannot be read now", 5), until
        result = self.writer.apply(obj, replan(obj), replan, self.wall(), may_write=self.may_write)
        if result.outcome in ("patched", "unchanged"):
            log.info("%s extended %s until %s", asker, key, format_time(kept[0]))
            return None, kept[0]
        if result.outcome == "gone":
            return Refusal(404, "NotFound", f"no {target.kind} {key.namespace}/{key.object_name}"), until
        log.warning("extend %s: %s %s", key, result.outcome, result.error or "")
        return Refusal(503, "ServiceUnavailable", f"keep-until could not be written ({result.outcome})", 5), until


def _refused(r: Refusal) -> tuple[int, dict[str, Any]]:
    doc: dict[str, Any] = {"kind": "Status", "code": r.code, "reason": r.reason, "message": r.message}
    if r.retry_after is not None:
        doc["retryAfter"] = r.retry_after
    return r.code, doc
