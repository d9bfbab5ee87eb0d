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

# Closing the connection after each answer keeps the probe out of code-server's connection count.
CLOSE = {"Connection": "close"}


def healthz_url(base_url: str) -> str:
    """The /healthz URL under base_url (the server root, with or without a trailing '/')."""
    return (base_url if base_url.endswith("/") else base_url + "/") + "healthz"


async def probe(fetcher: Fetcher, base_url: str) -> tuple[dict[str, Any], list[Call]]:
    """The code-server observation: `{"healthz": <GET /healthz body>}` or `{"error": "..."}`.

    Only gathers: a body of an unexpected shape is passed through for decide to judge.
    """
    body, call = await fetcher.get_json(healthz_url(base_url), headers=CLOSE)
    if call.error is not None:  # set exactly when the GET failed (even a 200 body may say "error")
        return {"error": f"/healthz: {call.error}"}, [call]
    return {"healthz": body}, [call]
