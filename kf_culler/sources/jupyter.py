"""Jupyter Server: api/status and api/kernels (and api/terminals), without moving last_activity."""

from __future__ import annotations

from typing import Any

from kf_culler.sources.http import Call, Fetcher

# With auth disabled every API call but api/status moves the server's last_activity; this flag stops
# that, so looking at a notebook never keeps it alive.
NO_TRACK = "?no_track_activity=1"


async def probe(fetcher: Fetcher, base_url: str, terminals: bool = True) -> tuple[dict[str, Any], list[Call]]:
    """The Jupyter observation for one server at base_url (ending in '/').

    The requests go one after another, so they share one kept-alive connection (one connect and one
    name lookup per notebook instead of one per request), and a server whose api/status or api/kernels
    fails is not asked further: without both the answer is an error anyway.
    """
    base = base_url if base_url.endswith("/") else base_url + "/"
    parts = ["status", "kernels"] + (["terminals"] if terminals else [])
    answer: dict[str, Any] = {}
    calls: list[Call] = []
    for p in parts:
        body, call = await fetcher.get_json(f"{base}api/{p}{NO_TRACK}")
        calls.append(call)
        answer[p] = body
        if p in ("status", "kernels") and isinstance(body, dict) and "error" in body:
            return {"error": f"api/{p}: {body['error']}"}, calls
    return answer, calls
