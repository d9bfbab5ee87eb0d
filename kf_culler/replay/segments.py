"""`kf-culler run --record DIR`: a trace as a directory of gzip segments, bounded on disk and safe to restart.

Each segment `trace-<sequence>-<time of its first record>.jsonl.gz` is a complete trace of its own: a header,
then records whose first record of each notebook carries its objects (a new TraceWriter per segment). A new
segment is begun when the current one holds `segment_seconds` of records or reaches `max_segment_bytes` on
disk, and at every start of the culler: a segment the culler was killed while writing is never appended to
(its gzip stream may be cut), and a reader stops at the cut (`kf_culler.replay.trace.read_trace`). After
each new segment, the oldest ones are deleted while the directory holds more than `max_total_bytes`.

A replay reads the directory as one trace (segments in sequence order). docs/replay.md, "Recording a
real fleet".
"""

from __future__ import annotations

import re
from datetime import datetime
from pathlib import Path
from typing import Any

from kf_culler.replay.recorder import TraceRecorder
from kf_culler.replay.trace import TraceHeader, TraceWriter, open_text, read_header, segment_paths

_SEQ = re.compile(r"^trace-(\d{6})-")


class SegmentedRecorder(TraceRecorder):
    """TraceRecorder over a directory of segments (module docstring). Same record() as TraceRecorder."""

    def __init__(self, directory: str | Path, *, hash_key: bytes | str | None = None, minimize: bool = True,
                 check_period_seconds: float = 60, flush_every: int = 1000,
                 label_keys: frozenset[str] = frozenset(), segment_seconds: float = 86400,
                 max_segment_bytes: int = 64 << 20, max_total_bytes: int = 1 << 30) -> None:
        super().__init__(Path(directory), hash_key=hash_key, minimize=minimize,
                         check_period_seconds=check_period_seconds, flush_every=flush_every, label_keys=label_keys)
        if segment_seconds <= 0 or max_segment_bytes <= 0 or max_total_bytes <= 0:
            raise ValueError("segment length and sizes must be positive")
        self.segment_seconds = segment_seconds
        self.max_segment_bytes = max_segment_bytes
        self.max_total_bytes = max_total_bytes
        self.segment: Path | None = None
        self._segment_start: datetime | None = None
        self._checked = False
        self._last_sample: dict[str, str] = {}  # notebook key -> time of the latest GPU sample written (this segment)

    def _check_directory(self) -> int:
        """The next sequence number; refuses a directory of another hashing setting."""
        self.path.mkdir(parents=True, exist_ok=True)
        existing = segment_paths(self.path)
        if existing and not self._checked:
            header = read_header(existing[-1])
            if header.hashed != (self._hasher is not None):
                raise ValueError(f"{self.path}: the trace was recorded with hashed={header.hashed}; "
                                 "record with the same setting")
        self._checked = True
        seqs = [int(m.group(1)) for p in existing if (m := _SEQ.match(p.name))]
        return max(seqs, default=0) + 1

    def _open(self, now: datetime) -> TraceWriter:
        seq = self._check_directory()
        self.segment = self.path / f"trace-{seq:06d}-{now.strftime('%Y%m%dT%H%M%SZ')}.jsonl.gz"
        self._segment_start = now
        self._stream = open_text(self.segment, "w")
        writer = TraceWriter(self._stream, TraceHeader(start=now, check_period_seconds=self._check_period,
                                                       synthetic=False, hashed=self._hasher is not None))
        self._stream.flush()
        self._prune()
        return writer

    def _prune(self) -> None:
        """Delete the oldest segments (never the current one) while the directory holds more than the bound."""
        paths = segment_paths(self.path)
        sizes = {p: p.stat().st_size for p in paths}
        total = sum(sizes.values())
        for p in paths:
            if total <= self.max_total_bytes or p == self.segment:
                break
            p.unlink()
            total -= sizes[p]

    def _rotate_due(self, now: datetime) -> bool:
        if self._segment_start is None or self.segment is None:
            return False
        if (now - self._segment_start).total_seconds() >= self.segment_seconds:
            return True
        return self.segment.stat().st_size >= self.max_segment_bytes

    def _new_samples(self, key: str, obs: dict[str, Any]) -> dict[str, Any]:
        """obs with only the GPU samples after those this segment already holds for the notebook: a replay keeps
        each notebook's samples from record to record (docs/replay.md, "How a replay counts"), while the culler's
        GPU query returns its whole look-back at every pass. Samples that are not all readable go as they are."""
        raw = obs.get("gpu")
        samples = raw.get("samples") if isinstance(raw, dict) else None
        if not isinstance(samples, list) or not samples or not all(
                isinstance(s, dict) and isinstance(s.get("time"), str) and len(s["time"]) == 20
                and s["time"].endswith("Z") for s in samples):
            return obs
        assert isinstance(raw, dict)
        last = self._last_sample.get(key)
        newest = max(s["time"] for s in samples)
        if last is not None and newest >= last:
            kept = [s for s in samples if s["time"] > last]
            obs = {**obs, "gpu": {**raw, "samples": kept or [max(samples, key=lambda s: str(s["time"]))]}}
        self._last_sample[key] = newest
        return obs

    def record(self, now: datetime, notebook: dict[str, Any], pod: dict[str, Any] | None,
               observations: dict[str, Any], context: dict[str, Any] | None = None) -> None:
        nb, p, obs, ctx = self._prepare(notebook, pod, observations, context or {})
        with self._lock:
            if self._writer is not None and self._rotate_due(now):
                self._close_segment()
            if self._writer is None:
                self._writer = self._open(now)
                self._last_sample.clear()  # a segment stands alone: its first records carry the whole window
            meta = nb.get("metadata") or {}
            obs = self._new_samples(f"{meta.get('namespace')}/{meta.get('name')}", obs)
            self._writer.write(now, nb, p, obs, context=ctx)
            if self._writer.records % self._flush_every == 0:
                self._writer.flush()

    def _close_segment(self) -> None:
        if self._stream is not None:
            self._stream.close()
        self._stream, self._writer = None, None

    def close(self) -> None:
        with self._lock:
            self._close_segment()
