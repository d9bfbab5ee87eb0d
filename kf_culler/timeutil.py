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


def add_minutes(moment: datetime, minutes: float) -> datetime:
    """moment + minutes, saturating at the ends of the calendar instead of overflowing."""
    try:
        return moment + timedelta(minutes=minutes)
    except OverflowError:
        return MAX_TIME if minutes > 0 else MIN_TIME


def format_time(moment: datetime) -> str:
    """UTC, second precision, `Z` suffix: the form Kubeflow's web app writes."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
