"""The latest verdict of every notebook, from the runner's passes, for the read-only verdict API.

A complete pass replaces the whole set (a notebook that is gone, or no longer selected, disappears); a
pass cut short by SIGTERM only updates the notebooks it reached. Each entry is trimmed when stored, so
its JSON stays under `MAX_ENTRY_BYTES` whatever the evidence held.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from kf_culler.cycle import CycleResult, NotebookResult
from kf_culler.timeutil import format_time

MAX_REASON_CHARS = 1000
MAX_TEXT_CHARS = 200
MAX_EVIDENCE_SOURCES = 8
MAX_EVIDENCE_FIELDS = 16
MAX_ENTRY_BYTES = 4096


def _scalar(value: Any) -> Any:
    if value is None or isinstance(value, bool | int | float):
        return value
    if isinstance(value, datetime):
        return format_time(value)
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return text if len(text) <= MAX_TEXT_CHARS else text[:MAX_TEXT_CHARS - 1] + "…"


def evidence_summary(evidence: dict[str, Any]) -> dict[str, Any]:
    """Per source: its scalar fields (texts and nested values cut to 200 characters), at most 16 each."""
    out: dict[str, Any] = {}
    for source in sorted(evidence)[:MAX_EVIDENCE_SOURCES]:
        value = evidence[source]
        if isinstance(value, dict):
            out[str(source)[:64]] = {str(k)[:64]: _scalar(v) for k, v in list(value.items())[:MAX_EVIDENCE_FIELDS]}
        else:
            out[str(source)[:64]] = _scalar(value)
    return out


def entry(r: NotebookResult, pass_time: datetime) -> dict[str, Any]:
    """The API's view of one notebook's verdict (Verdict.to_dict, trimmed)."""
    v = r.verdict.to_dict()
    v["reason"] = (v.get("reason") or "")[:MAX_REASON_CHARS]
    v["evidence"] = evidence_summary(v.get("evidence") or {})
    out = {"namespace": r.namespace, "name": r.name, "serverType": r.server_type, "gpus": r.gpus,
           "passTime": format_time(pass_time), "traceId": r.trace_id, "verdict": v}
    if len(json.dumps(out)) > MAX_ENTRY_BYTES:  # only pathological evidence gets here
        v["evidence"] = {"truncated": True}
    return out


@dataclass(frozen=True)
class Session:
    """What a request to extend needs beyond the verdict (not served): the pod the pass paired with the session,
    and the matched policy's maxExtendMinutes."""

    pod_uid: str | None
    max_extend_minutes: float


class VerdictStore:
    """Thread-safe: the runner's thread updates, the HTTP server's threads read."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._entries: dict[tuple[str, str], dict[str, Any]] = {}
        self._sessions: dict[tuple[str, str], Session] = {}
        self._by_ns: dict[str, list[str]] = {}
        self.pass_time: datetime | None = None
        self.passes = 0

    def update(self, result: CycleResult) -> None:
        fresh = {(r.namespace, r.name): entry(r, result.now) for r in result.results}
        sessions = {(r.namespace, r.name): Session(r.pod_uid, r.policy.max_extend_minutes if r.policy else 0.0)
                    for r in result.results}
        with self._lock:
            entries = {**self._entries, **fresh} if result.interrupted else fresh
            self._sessions = {**self._sessions, **sessions} if result.interrupted else sessions
            by_ns: dict[str, list[str]] = {}
            for ns, name in entries:
                by_ns.setdefault(ns, []).append(name)
            for names in by_ns.values():
                names.sort()
            self._entries, self._by_ns = entries, by_ns
            self.pass_time = result.now
            self.passes += 1

    def get(self, namespace: str, name: str) -> dict[str, Any] | None:
        with self._lock:
            return self._entries.get((namespace, name))

    def session(self, namespace: str, name: str) -> tuple[dict[str, Any], Session] | None:
        """A session's verdict entry and what a request to extend it needs, from the same pass."""
        with self._lock:
            found = self._entries.get((namespace, name))
            return None if found is None else (found, self._sessions[(namespace, name)])

    def names(self, namespace: str) -> list[str]:
        with self._lock:
            return list(self._by_ns.get(namespace, ()))

    def page(self, namespace: str, after: str = "", limit: int = 500) -> tuple[list[dict[str, Any]], bool]:
        """Entries of a namespace sorted by name, after `after`, at most `limit`; and whether more follow."""
        with self._lock:
            names = [n for n in self._by_ns.get(namespace, ()) if n > after]
            return [self._entries[(namespace, n)] for n in names[:limit]], len(names) > limit
