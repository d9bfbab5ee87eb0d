"""Durations and times as a reason shows them to a notebook's user."""

from __future__ import annotations

from datetime import datetime

from kf_culler.timeutil import format_time


def minutes(seconds: float) -> str:
    """A duration: `45 s`, `12 min`, `3 h 5 min`, `2 days 1 h`."""
    if seconds < 120:
        return f"{max(0, int(seconds))} s"
    m = int(seconds // 60)
    if m < 60:
        return f"{m} min"
    h, m = divmod(m, 60)
    if h >= 48:
        return f"{h // 24} days {h % 24} h"
    return f"{h} h {m} min" if m else f"{h} h"


def hhmm(t: datetime, now: datetime) -> str:
    """A time: `09:00 UTC` today, the full timestamp on another day."""
    if t.date() != now.date():
        return format_time(t)
    return f"{t:%H:%M} UTC" if t.second == 0 else f"{t:%H:%M:%S} UTC"
