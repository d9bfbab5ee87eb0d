"""code-server: GET /healthz at the server root, without keeping the server alive.

code-server answers `{"status": "alive"|"expired", "lastHeartbeat": <epoch ms>}`. It counts a request
to /healthz as no activity, but its heartbeat timer counts every TCP connection still open to the
server when it fires, an idle keep-alive connection included. The probe therefore asks for the
connection to be closed after the answer, so that looking at a notebook never keeps it alive.
See docs/signals.md.
"""

from __future__ import annotations

from typing import Any

from kf_culler.sources.http import Call, Fetcher
from kf_culler.sources.jupyter import slim_count

# Closing the connection after each answer keeps the probe out of code-server's connection count.
CLOSE = {"Connection": "close"}


def healthz_url(base_url: str) -> str:
    """The /healthz URL under base_url (the server root, with or without a trailing '/')."""
    return (base_url if base_url.endswith("/") else base_url + "/") + "healthz"


HEALTHZ = ("status", "lastHeartbeat")


def slim(body: object) -> object:
    """The /healthz body with only what `readings.parse_code_server` reads, each field bounded in size:
    numbers as they are, strings cut to 60 characters, anything else the first 60 characters of it as
    a string (the reading is the same: it refuses those naming at most their first 60 characters).
    A body that is not an object is refused by its type alone: a list keeps its first 10 items."""
    if isinstance(body, list):
        return [slim_count(item) for item in body[:10]]
    if not isinstance(body, dict):
        return slim_count(body)
    return {k: slim_count(body[k]) for k in HEALTHZ if k in body}


async def probe(fetcher: Fetcher, base_url: str) -> tuple[dict[str, Any], list[Call]]:
    """The code-server observation: `{"healthz": <GET /healthz body, slimmed>}` or `{"error": "..."}`.

    Only gathers: a body of an unexpected shape is passed through (slimmed: `slim`) for decide to judge.
    """
    body, call = await fetcher.get_json(healthz_url(base_url), headers=CLOSE)
    if call.error is not None:  # set exactly when the GET failed (even a 200 body may say "error")
        return {"error": f"/healthz: {call.error}"}, [call]
    return {"healthz": slim(body)}, [call]
