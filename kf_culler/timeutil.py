"""Parsing and formatting of the timestamps the culler reads and writes (always UTC)."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta

MAX_TIME = datetime.max.replace(tzinfo=UTC) - timedelta(days=2)
MIN_TIME = datetime.min.replace(tzinfo=UTC) + timedelta(days=2)


def parse_time(value: object) -> datetime | None:
    """An RFC 3339 / ISO 8601 timestamp with a time zone, as an aware UTC datetime; None if unreadable."""
    if not isinstance(value, str) or "T" not in value.upper() or len(value) > 64:
        return None
    try:
        parsed = datetime.fromisoformat(value.strip())
    except ValueError:
        return None
    if parsed.tzinfo is None:
        return None
    try:
        return parsed.astimezone(UTC)
    except (OverflowError, ValueError):
        return None


def from_epoch_ms(value: object) -> datetime | None:
    """Milliseconds since the epoch (code-server's lastHeartbeat) as UTC; None if not a sane number."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        ms = float(value)  # a JSON integer may be too large for a float
    except OverflowError:
        return None
    if not math.isfinite(ms) or ms < 0:
        return None
    try:
        return datetime.fromtimestamp(ms / 1000.0, tz=UTC)
    except (OverflowError, OSError, ValueError):
        return None


_DELTAS: dict[float, timedelta] = {}  # add_minutes' timedeltas: a few policy values, each built once


def add_minutes(moment: datetime, minutes: float) -> datetime:
    """moment + minutes, saturating at the ends of the calendar instead of overflowing."""
    delta = _DELTAS.get(minutes)
    try:
        if delta is None:
            delta = timedelta(minutes=minutes)  # most of this function's cost, were it built at every call
            if len(_DELTAS) < 1024:
                _DELTAS[minutes] = delta
        return moment + delta
    except OverflowError:
        return MAX_TIME if minutes > 0 else MIN_TIME


def format_time(moment: datetime, micro: bool = False) -> str:
    """UTC with a `Z` suffix: to the second (the form Kubeflow's web app writes) or, with `micro`, to the
    microsecond (Jupyter's form, and a Lease's MicroTime)."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ" if micro else "%Y-%m-%dT%H:%M:%SZ")


def format_epoch(ts: float) -> str:
    """Unix seconds as RFC 3339 UTC with a `Z` (fractions only when there are some)."""
    moment = datetime.fromtimestamp(ts, tz=UTC)
    return format_time(moment, micro=bool(moment.microsecond))


def duration_text(seconds: float) -> str:
    """A duration as a reason shows it to a notebook's user: `45 s`, `12 min`, `3 h 5 min`, `2 days 1 h`."""
    if seconds < 120:
        return f"{max(0, int(seconds))} s"
    m = int(seconds // 60)
    if m < 60:
        return f"{m} min"
    h, m = divmod(m, 60)
    if h >= 48:
        return f"{h // 24} days {h % 24} h"
    return f"{h} h {m} min" if m else f"{h} h"


def clock_text(t: datetime, now: datetime) -> str:
    """A time as a reason shows it: `09:00 UTC` on the day of `now`, the full timestamp on another day."""
    if t.date() != now.date():
        return format_time(t)
    # %H:%M(:%S) written out: strftime is most of this function's cost, and reasons show a time twice
    return f"{t.hour:02d}:{t.minute:02d} UTC" if t.second == 0 else f"{t.hour:02d}:{t.minute:02d}:{t.second:02d} UTC"
