"""Events the culler records outside a notebook's write (a failed notice), and reading them back."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from kf_culler.kube import core
from kf_culler.timeutil import parse_time

REQUEST_TIMEOUT = (5.0, 10.0)


class EventRecorder:
    """Creates Events in a notebook's namespace."""

    def __init__(self, api_client: Any) -> None:
        self.api_client = api_client

    def create(self, namespace: str, body: dict[str, Any]) -> None:
        core.create_event(self.api_client, namespace, body, timeout=REQUEST_TIMEOUT)


def newest_message(api_client: Any, namespace: str, name: str, reason: str) -> str | None:
    """The message of the newest Event with this reason about the object `name`, or None."""
    events = core.list_events(api_client, namespace, f"involvedObject.name={name},reason={reason}",
                              timeout=REQUEST_TIMEOUT)

    def order(e: dict[str, Any]) -> tuple[datetime, int]:
        meta = e.get("metadata") or {}
        rv = str(meta.get("resourceVersion") or "")
        when = parse_time(e.get("lastTimestamp")) or parse_time(meta.get("creationTimestamp"))
        return (when or datetime.min.replace(tzinfo=UTC), int(rv) if rv.isdigit() else 0)

    items = sorted(events, key=order)
    return str(items[-1].get("message")) if items else None
