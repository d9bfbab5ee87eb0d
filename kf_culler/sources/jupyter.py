"""Jupyter Server: api/status and api/kernels (and api/terminals), without moving last_activity."""

from __future__ import annotations

import asyncio
from typing import Any

from kf_culler.sources.http import Call, Fetcher

# With auth disabled every API call but api/status moves the server's last_activity; this flag stops
# that, so looking at a notebook never keeps it alive.
NO_TRACK = "?no_track_activity=1"


async def probe(fetcher: Fetcher, base_url: str, terminals: bool = True) -> tuple[dict[str, Any], list[Call]]:
    """The Jupyter observation for one server at base_url (ending in '/')."""
    base = base_url if base_url.endswith("/") else base_url + "/"
    parts = ["status", "kernels"] + (["terminals"] if terminals else [])
    results = await asyncio.gather(*(fetcher.get_json(f"{base}api/{p}{NO_TRACK}") for p in parts))
    answer = {p: body for p, (body, _) in zip(parts, results, strict=True)}
    calls = [call for _, call in results]
    for p in ("status", "kernels"):
        body = answer[p]
        if isinstance(body, dict) and "error" in body:
            return {"error": f"api/{p}: {body['error']}"}, calls
    return answer, calls
