"""Jupyter Server: api/status and api/kernels (and api/terminals), without moving last_activity.

The answer kept for the pass (in the observations, the trace and `explain`) is slimmed to what
`readings.parse_jupyter` reads: the server is its user's, and a kernel list of 1,000 kernels of
arbitrary fields must not stay in memory until the pass ends. Slimming never changes the reading:
`parse_jupyter(slim(answer))` is the reading of the full answer, or the same `Unreadable` message
(tests/test_hostile_endpoints.py checks this with hypothesis). What is kept per notebook is bounded
whatever the server sent: at most `probe.maxListItems` kernels and as many terminals, each of a few
fields of at most 65 characters: a real notebook with 100 kernels and 100 terminals keeps about 78 KiB,
an idle one with none about 1 KiB, and the worst answer that passes the default caps 1.4 MiB (1,000
kernels and 1,000 terminals of long distinct fields; docs/faults.md).
"""

from __future__ import annotations

from typing import Any

from kf_culler.sources.http import Call, Fetcher

# With auth disabled every API call but api/status moves the server's last_activity; this flag stops
# that, so looking at a notebook never keeps it alive.
NO_TRACK = "?no_track_activity=1"
API_PARTS = ("status", "kernels", "terminals")  # what `probe` asks, in this order (kf_culler/kube/istio.py admits it)


def api_url(base: str, part: str) -> str:
    """The URL of one of the server's API_PARTS under base (ending in '/')."""
    return f"{base}api/{part}{NO_TRACK}"

TEXT = 64  # characters kept of a string field (ids, names, states); a readable timestamp is no longer
ERROR_TEXT = 300  # as much of an error as a reading ever shows (readings._error_of)
# Kept as they are: numbers (a JSON integer has at most 4,300 digits, json.loads refuses longer ones,
# and costs less memory than its digits did in the body), booleans and null.
_SCALAR = (type(None), bool, int, float)


def _stand_in(value: object) -> str:
    """A string for a value not kept: the same first 60 characters, so the reason a reading gives for
    refusing it (`str(value)[:60]`) is unchanged; 65 characters when cut, so it is never a timestamp."""
    text = str(value)
    return text[:60] + "\u2026" * 5 if len(text) > 60 else text


def _time(value: object) -> object:
    """A timestamp field: `parse_time` reads only strings of at most 64 characters."""
    if isinstance(value, str):
        return value if len(value) <= TEXT else _stand_in(value)
    return value if isinstance(value, _SCALAR) else _stand_in(value)  # a container: not a time either


def slim_count(value: object) -> object:
    """A count (or code-server's status and lastHeartbeat): a number is read as it is; anything else is
    refused, naming its first 60 (status: 40) characters."""
    if isinstance(value, str):
        return value[:60]
    return value if isinstance(value, _SCALAR) else _stand_in(value)


def _text(value: object) -> object:
    """A string field read by equality (`execution_state == "busy"`) or only shown (ids, names)."""
    if isinstance(value, str):
        return value[:TEXT]
    return None  # not a string: the reading refuses any, by type alone


def _scalar(value: object) -> object:
    """A field only shown (`started`, status `kernels`)."""
    if isinstance(value, str):
        return value[:TEXT]
    return value if isinstance(value, _SCALAR) else None


def same_type(value: object) -> object:
    """A small value of the same JSON type: a reading refusing a non-object names only its type."""
    return type(value)()  # [], {}, "", 0, 0.0, False; None stays None


KERNEL = {"id": _text, "name": _text, "last_activity": _time, "execution_state": _text, "connections": slim_count}
TERMINAL = {"name": _text, "last_activity": _time}
STATUS = {"started": _scalar, "last_activity": _time, "connections": slim_count, "kernels": _scalar}


def _slim_error(err: object) -> dict[str, Any]:
    """`{"error": ...}` as a reading shows it: its first 300 characters, or "error" when it is empty."""
    return {"error": str(err)[:ERROR_TEXT] if err else err}


def _slim_object(raw: object, fields: dict[str, Any]) -> object:
    if not isinstance(raw, dict):
        return same_type(raw)
    return {k: slim(raw[k]) for k, slim in fields.items() if k in raw}


def _slim_list(raw: object, fields: dict[str, Any]) -> object:
    if isinstance(raw, dict) and "error" in raw:
        return _slim_error(raw["error"])
    if not isinstance(raw, list):
        return same_type(raw)
    # Equal items share one object: `[{}, {}, ...]` costs a pointer an item. The key is the repr, which
    # tells 1 from True and 1.0 and 0.0 from -0.0 (equality does not, and the reading does).
    shared: dict[str, object] = {}
    return [shared.setdefault(repr(small), small) for small in (_slim_object(item, fields) for item in raw)]


def slim(answer: dict[str, Any]) -> dict[str, Any]:
    """The Jupyter answer with only what `parse_jupyter` reads, each field bounded in size."""
    if "error" in answer:
        return _slim_error(answer["error"])
    out: dict[str, Any] = {}
    for part, raw in answer.items():
        if part == "status":
            if isinstance(raw, dict) and "error" in raw:
                out[part] = _slim_error(raw["error"])
            else:
                out[part] = _slim_object(raw, STATUS)
        elif part in ("kernels", "terminals"):
            out[part] = _slim_list(raw, KERNEL if part == "kernels" else TERMINAL)
    return out


async def probe(fetcher: Fetcher, base_url: str, terminals: bool = True) -> tuple[dict[str, Any], list[Call]]:
    """The Jupyter observation for one server at base_url (ending in '/'), slimmed (`slim`).

    The requests go one after another, so they share one kept-alive connection (one connect and one
    name lookup per notebook instead of one per request), and a server whose api/status or api/kernels
    fails is not asked further: without both the answer is an error anyway. A kernel or terminal list
    longer than `probe.maxListItems` is an error of its own (a real server has a few; 100 is extreme).
    """
    base = base_url if base_url.endswith("/") else base_url + "/"
    parts = list(API_PARTS if terminals else API_PARTS[:2])
    most = fetcher.settings.max_list_items
    answer: dict[str, Any] = {}
    calls: list[Call] = []
    for p in parts:
        body, call = await fetcher.get_json(api_url(base, p))
        calls.append(call)
        if isinstance(body, list) and len(body) > most:
            body = {"error": f"{len(body)} items, over the cap of {most} (probe.maxListItems)"}
        body = slim({p: body})[p]  # the full answer is garbage from here on
        answer[p] = body
        if p in ("status", "kernels") and isinstance(body, dict) and "error" in body:
            return {"error": f"api/{p}: {body['error']}"}, calls
    return answer, calls
