"""Events the culler records outside a notebook's write (a failed notice), and reading them back."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

REQUEST_TIMEOUT = (5.0, 10.0)


class EventRecorder:
    """Creates Events in a notebook's namespace through one CoreV1 client."""

    def __init__(self, api_client: Any) -> None:
        from kubernetes import client

        self.core: Any = client.CoreV1Api(api_client)

    def create(self, namespace: str, body: dict[str, Any]) -> None:
        self.core.create_namespaced_event(namespace, body, _request_timeout=REQUEST_TIMEOUT)


def newest_message(api_client: Any, namespace: str, name: str, reason: str) -> str | None:
    """The message of the newest Event with this reason about the object `name`, or None."""
    from kubernetes import client

    events = client.CoreV1Api(api_client).list_namespaced_event(
        namespace, field_selector=f"involvedObject.name={name},reason={reason}", _request_timeout=REQUEST_TIMEOUT)

    def order(e: Any) -> tuple[datetime, int]:
        rv = str(e.metadata.resource_version or "")
        return (e.last_timestamp or e.metadata.creation_timestamp or datetime.min.replace(tzinfo=UTC),
                int(rv) if rv.isdigit() else 0)

    items = sorted(events.items or [], key=order)
    return str(items[-1].message) if items else None
