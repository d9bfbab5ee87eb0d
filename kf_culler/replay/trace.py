"""The trace format: JSON Lines, one header line, then one record per notebook per check time.

A record carries what the culler saw of one notebook at one check: its Notebook object and pod
(written only when they changed since that notebook's previous record), what chose its policy beyond
those two (`context`: the namespace's labels, the GPU model of the pod's Node; written when it
changed), the observations in the scenario shapes, and, in synthetic traces only, the ground truth.
See docs/replay.md.

Files whose name ends in `.gz` are read and written gzip-compressed.
"""

from __future__ import annotations

import gzip
import io
import json
import re
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import IO, Any, Literal, cast

from kf_culler.errors import TraceError as TraceError
from kf_culler.timeutil import format_time, parse_time

FORMAT_VERSION = 1
HEADER_KEY = "kfCullerTrace"
TRUTHS = ("working", "present", "absent")
Truth = Literal["working", "present", "absent"]


@dataclass(frozen=True)
class TraceHeader:
    """The first line of a trace."""

    start: datetime
    check_period_seconds: float
    synthetic: bool = False
    hashed: bool = False
    end: datetime | None = None
    generator: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            HEADER_KEY: FORMAT_VERSION,
            "start": format_time(self.start),
            "checkPeriodSeconds": self.check_period_seconds,
            "synthetic": self.synthetic,
            "hashed": self.hashed,
        }
        if self.end is not None:
            out["end"] = format_time(self.end)
        if self.generator:
            out["generator"] = self.generator
        return out

    @staticmethod
    def from_dict(doc: object, where: str) -> TraceHeader:
        if not isinstance(doc, dict) or HEADER_KEY not in doc:
            raise TraceError(f"{where}: the first line is not a kf-culler trace header "
                             f"(an object with {HEADER_KEY!r})")
        if doc[HEADER_KEY] != FORMAT_VERSION:
            raise TraceError(f"{where}: trace format version {doc[HEADER_KEY]!r} is not supported "
                             f"(this kf-culler reads version {FORMAT_VERSION})")
        start = parse_time(doc.get("start"))
        if start is None:
            raise TraceError(f"{where}: header 'start' is not an RFC 3339 time")
        period = doc.get("checkPeriodSeconds")
        if isinstance(period, bool) or not isinstance(period, int | float) or period <= 0:
            raise TraceError(f"{where}: header 'checkPeriodSeconds' must be a positive number")
        end = None
        if doc.get("end") is not None:
            end = parse_time(doc["end"])
            if end is None:
                raise TraceError(f"{where}: header 'end' is not an RFC 3339 time")
        generator = doc.get("generator") or {}
        if not isinstance(generator, dict):
            raise TraceError(f"{where}: header 'generator' must be an object")
        return TraceHeader(start=start, check_period_seconds=float(period),
                           synthetic=bool(doc.get("synthetic", False)), hashed=bool(doc.get("hashed", False)),
                           end=end, generator=generator)


class Record:
    """One notebook at one check time, with its objects resolved.

    `observations` is decoded on first use: a replay reads the observations only of the notebooks it
    evaluates (a stopped notebook's are never needed).
    """

    __slots__ = ("_obs", "_obs_text", "context", "id", "line", "notebook", "path", "pod", "time", "truth")

    def __init__(self, time: datetime, id: str, notebook: dict[str, Any], pod: dict[str, Any] | None,
                 observations: dict[str, Any] | None, truth: Truth | None = None, line: int = 0,
                 observations_text: str | None = None, path: str = "", context: dict[str, Any] | None = None
                 ) -> None:
        self.time = time
        # namespaceLabels, node: what the policy choice reads (kf_culler/policy.py); the reader gives a notebook's
        # records one object while it is unchanged, so a replay chooses the policy again only when it changes
        self.context = context if context is not None else {}
        self.id = id  # "namespace/name"
        self.notebook = notebook
        self.pod = pod
        self.truth = truth
        self.line = line
        self.path = path
        self._obs = observations
        self._obs_text = observations_text

    @property
    def observations(self) -> dict[str, Any]:
        if self._obs is None:
            try:
                obs = json.loads(self._obs_text or "{}")
            except ValueError as err:
                raise TraceError(f"{self.path} line {self.line}: 'observations' is not JSON: {err}") from None
            if not isinstance(obs, dict):
                raise TraceError(f"{self.path} line {self.line}: 'observations' must be an object")
            self._obs = obs
        return self._obs

    def __repr__(self) -> str:
        return f"Record({format_time(self.time)}, {self.id}, truth={self.truth})"


def notebook_id(notebook: dict[str, Any]) -> str:
    """`namespace/name` of a Notebook object; TraceError if it has neither."""
    meta = notebook.get("metadata")
    if isinstance(meta, dict):
        ns, name = meta.get("namespace"), meta.get("name")
        if isinstance(ns, str) and isinstance(name, str) and ns and name:
            return f"{ns}/{name}"
    raise TraceError("a notebook object without metadata.namespace and metadata.name")


def open_text(path: str | Path, mode: Literal["r", "w", "a"]) -> IO[str]:
    """A text stream on path, gzip-compressed when the name ends in .gz."""
    p = Path(path)
    if p.suffix == ".gz":
        raw = gzip.open(p, mode + "b", compresslevel=3) if mode != "r" else gzip.open(p, "rb")  # noqa: SIM115
        return io.TextIOWrapper(cast(IO[bytes], raw), encoding="utf-8", newline="\n")
    return open(p, mode, encoding="utf-8", newline="\n")


def _dumps(doc: object) -> str:
    return json.dumps(doc, separators=(",", ":"), ensure_ascii=False)


class TraceWriter:
    """Writes a trace line by line; a notebook's objects are written only when they changed.

    Not thread-safe by itself (TraceRecorder adds a lock).
    """

    def __init__(self, stream: IO[str], header: TraceHeader | None) -> None:
        self._out = stream
        self._notebooks: dict[str, dict[str, Any]] = {}
        self._pods: dict[str, dict[str, Any] | None] = {}
        self._contexts: dict[str, dict[str, Any]] = {}
        self.records = 0
        self._time: datetime | None = None
        self._stamp = ""
        if header is not None:
            self._out.write(_dumps(header.to_dict()) + "\n")

    def write(self, now: datetime, notebook: dict[str, Any], pod: dict[str, Any] | None,
              observations: dict[str, Any], truth: Truth | None = None,
              context: dict[str, Any] | None = None) -> None:
        key = notebook_id(notebook)
        if now != self._time:
            self._time, self._stamp = now, format_time(now)
        rec: dict[str, Any] = {"time": self._stamp, "id": key}
        if truth is not None:
            rec["truth"] = truth
        last_nb = self._notebooks.get(key)
        if last_nb is not notebook and last_nb != notebook:
            rec["notebook"] = notebook
            self._notebooks[key] = notebook
        if key not in self._pods or (self._pods[key] is not pod and self._pods[key] != pod):
            rec["pod"] = pod
            self._pods[key] = pod
        if context is not None and self._contexts.get(key, {}) != context:
            rec["context"] = context
            self._contexts[key] = context
        rec["observations"] = observations  # last: a reader may leave it undecoded until needed
        self._out.write(_dumps(rec) + "\n")
        self.records += 1

    def forget(self, key: str) -> None:
        """Forget a notebook (deleted): its next record writes its objects again."""
        self._notebooks.pop(key, None)
        self._pods.pop(key, None)
        self._contexts.pop(key, None)

    def flush(self) -> None:
        self._out.flush()


SEGMENT_GLOB = "trace-*.jsonl.gz"


def segment_paths(directory: str | Path) -> list[Path]:
    """The segments of a recorded directory (kf_culler/replay/segments.py), oldest first."""
    return sorted(p for p in Path(directory).glob(SEGMENT_GLOB) if p.is_file())


def _segments(path: str | Path) -> list[Path]:
    found = segment_paths(path)
    if not found:
        raise TraceError(f"{path}: a directory without trace segments ({SEGMENT_GLOB})")
    return found


def read_header(path: str | Path) -> TraceHeader:
    """The header of a trace file, or of a directory of segments (its oldest segment's)."""
    if Path(path).is_dir():
        path = _segments(path)[0]
    with open_text(path, "r") as stream:
        first = stream.readline()
    return _parse_header(first, f"{path} line 1")


def _parse_header(line: str, where: str) -> TraceHeader:
    if not line.strip():
        raise TraceError(f"{where}: the trace is empty (no header line)")
    try:
        doc = json.loads(line)
    except ValueError as err:
        raise TraceError(f"{where}: not JSON: {err}") from None
    return TraceHeader.from_dict(doc, where)


def read_trace(path: str | Path) -> tuple[TraceHeader, Iterator[Record]]:
    """The header (read at once) and an iterator over the records (read lazily).

    Raises TraceError naming the file and line for anything that is not a valid trace.
    """
    header = read_header(path)
    if Path(path).is_dir():
        return header, _chained(_segments(path))
    return header, _records(path)


def _chained(segments: list[Path]) -> Iterator[Record]:
    """The records of a directory's segments, one after the other; each segment stops at a cut (a culler killed
    while writing it: an unfinished gzip stream, a last line without its newline)."""
    for segment in segments:
        yield from _records(segment, to_cut=True)


# A record written by TraceWriter with no objects in it: time, id, truth, then the observations last.
_PLAIN = re.compile(r'\{"time":"([^"\\]{1,64})","id":"([^"\\]{1,400})",'
                    r'(?:"truth":"(working|present|absent)",)?"observations":')


def _lines(stream: IO[str], to_cut: bool) -> Iterator[str]:
    """The stream's lines; with to_cut, up to a cut: the end of an unfinished gzip stream, or a last line
    without its newline."""
    if not to_cut:
        yield from stream
        return
    try:
        for line in stream:
            if not line.endswith("\n"):
                return
            yield line
    except (EOFError, gzip.BadGzipFile, zlib.error):
        return


def _records(path: str | Path, to_cut: bool = False) -> Iterator[Record]:
    notebooks: dict[str, dict[str, Any]] = {}
    pods: dict[str, dict[str, Any] | None] = {}
    contexts: dict[str, dict[str, Any]] = {}
    last_time: dict[str, datetime] = {}
    times: dict[str, datetime | None] = {}
    loads = json.loads
    plain = _PLAIN.match
    name = str(path)
    truth: Any
    with open_text(path, "r") as stream:
        stream.readline()
        for n, line in enumerate(_lines(stream, to_cut), start=2):
            m = plain(line)
            if m is not None and line.rstrip().endswith("}") and m.group(2) in notebooks:
                stamp, key, truth = m.group(1), m.group(2), m.group(3)
                obs_text: str | None = line.rstrip()[m.end():-1]
                obs: dict[str, Any] | None = None
            else:
                if not line.strip():
                    continue
                where = f"{path} line {n}"
                try:
                    doc = loads(line)
                except ValueError as err:
                    raise TraceError(f"{where}: not JSON: {err}") from None
                if not isinstance(doc, dict):
                    raise TraceError(f"{where}: a record must be a JSON object")
                stamp, key, truth = doc.get("time"), doc.get("id"), doc.get("truth")
                if not isinstance(key, str) or "/" not in key:
                    raise TraceError(f"{where}: 'id' must be 'namespace/name'")
                if "notebook" in doc:
                    nb = doc["notebook"]
                    if not isinstance(nb, dict):
                        raise TraceError(f"{where}: 'notebook' must be an object")
                    notebooks[key] = nb
                elif key not in notebooks:
                    raise TraceError(f"{where}: the first record of {key} has no 'notebook'")
                if "pod" in doc:
                    pod = doc["pod"]
                    if pod is not None and not isinstance(pod, dict):
                        raise TraceError(f"{where}: 'pod' must be an object or null")
                    pods[key] = pod
                if "context" in doc:
                    context = doc["context"]
                    if not isinstance(context, dict):
                        raise TraceError(f"{where}: 'context' must be an object")
                    contexts[key] = context
                raw_obs = doc.get("observations", {})
                if not isinstance(raw_obs, dict):
                    raise TraceError(f"{where}: 'observations' must be an object")
                obs, obs_text = raw_obs, None
                if truth is not None and truth not in TRUTHS:
                    raise TraceError(f"{where}: 'truth' must be one of {', '.join(TRUTHS)}")
            if isinstance(stamp, str) and stamp in times:
                now = times[stamp]
            else:
                now = parse_time(stamp)
                if isinstance(stamp, str):
                    if len(times) > 4096:
                        times.clear()
                    times[stamp] = now
            if now is None:
                raise TraceError(f"{path} line {n}: 'time' is not an RFC 3339 time: {str(stamp)[:40]!r}")
            previous = last_time.get(key)
            if previous is not None and now < previous:
                raise TraceError(f"{path} line {n}: {key} goes back in time ({format_time(now)} after "
                                 f"{format_time(previous)})")
            last_time[key] = now
            context = contexts.get(key)
            if context is None:
                context = contexts[key] = {}
            yield Record(now, key, notebooks[key], pods.get(key), obs, truth, n, obs_text, name, context)
