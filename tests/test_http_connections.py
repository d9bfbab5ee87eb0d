"""A pass's closed probe connections are freed as they close (kf_culler/sources/http.py `_Connection._let_go`), not
left for the cycle collector: a parser refers to its connection through its callbacks, and a pass closes thousands
of connections between two collections. Real loopback servers on uvloop, as a pass runs its probes; the cyclic
collector is off while the probes run, so whatever is still alive afterwards is what reference counting left."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Awaitable, Callable

import pytest
import uvloop

from kf_culler.config import ProbeSettings
from kf_culler.sources.http import Fetcher, _Connection

BODY = b'{"started": "2026-12-07T12:00:00Z", "last_activity": "2026-12-07T12:00:00Z"}'

# How each server answers (the answer, and whether it keeps the connection for the next request): framed and kept
# alive, framed then closed, or ended by closing the connection.
ANSWERS: dict[str, tuple[bytes, bool]] = {
    "kept-alive": (b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s", True),
    "close": (b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s", False),
    "unframed": (b"HTTP/1.0 200 OK\r\nX-Length: %d\r\n\r\n%s", False),
}


def _server(answer: bytes, keep: bool) -> Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]:
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while await reader.readuntil(b"\r\n\r\n"):
                writer.write(answer % (len(BODY), BODY))
                await writer.drain()
                if not keep:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    return serve


@pytest.mark.parametrize("how", sorted(ANSWERS))
def test_closed_connections_are_freed_without_the_cycle_collector(how: str) -> None:
    async def probes() -> int:
        server = await asyncio.start_server(_server(*ANSWERS[how]), "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        fetcher = Fetcher.open(ProbeSettings(), 4)
        answered = 0
        try:
            for _ in range(40):
                body, call = await fetcher.get_json(f"http://127.0.0.1:{port}/api/status")
                answered += call.error is None and body == {"started": "2026-12-07T12:00:00Z",
                                                            "last_activity": "2026-12-07T12:00:00Z"}
        finally:
            await fetcher.close()
            server.close()
            await server.wait_closed()
        for _ in range(20):  # the transports' connection_lost callbacks
            await asyncio.sleep(0.01)
        return answered

    gc.collect()
    gc.disable()
    try:
        loop = uvloop.new_event_loop()
        try:
            answered = loop.run_until_complete(probes())
        finally:
            loop.close()
        alive = sum(1 for o in gc.get_objects() if isinstance(o, _Connection))
    finally:
        gc.enable()
    assert answered == 40
    assert alive == 0, f"{alive} closed connections wait for the cycle collector"
