"""A probe's time limits (kf_culler/sources/http.py): the whole call is bounded by `probe.timeoutSeconds`
(`timeout after Ns`), a connect alone by `probe.connectTimeoutSeconds` (a transient failure that is tried again
within the budget), and an answer that never ends by the budget, however its bytes trickle in.

The hanging connects are real: a loopback listener whose accept queue is full drops every new SYN, so the
client's connect waits as it would for a Service whose pods are gone behind a dropped route."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Iterator

import pytest

from kf_culler.config import ProbeSettings
from kf_culler.sources.http import Call, Fetcher


@pytest.fixture
def full_listener() -> Iterator[int]:
    """A port whose connects hang: its listener's accept queue (backlog 0) is filled and never accepted."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(0)
    port = server.getsockname()[1]
    fillers: list[socket.socket] = []
    for _ in range(4):  # Linux admits backlog + 1 connections; the rest of these wait in SYN_SENT
        s = socket.socket()
        s.setblocking(False)
        s.connect_ex(("127.0.0.1", port))
        fillers.append(s)
    time.sleep(0.2)
    probe = socket.socket()
    probe.settimeout(0.5)
    try:
        with pytest.raises(TimeoutError):  # the listener now drops new connects (or the test proves nothing)
            probe.connect(("127.0.0.1", port))
    finally:
        probe.close()
    try:
        yield port
    finally:
        for s in fillers:
            s.close()
        server.close()


def get(url: str, **settings: float) -> tuple[object, Call, float]:
    async def go() -> tuple[object, Call, float]:
        fetcher = Fetcher.open(ProbeSettings.model_validate(settings), 4)
        start = time.monotonic()
        try:
            body, call = await fetcher.get_json(url)
        finally:
            await fetcher.close()
        return body, call, time.monotonic() - start

    return asyncio.run(go())


def test_a_connect_that_hangs_past_its_own_limit_is_tried_again_within_the_budget(full_listener: int) -> None:
    body, call, took = get(f"http://127.0.0.1:{full_listener}/api/status",
                           connectTimeoutSeconds=0.3, timeoutSeconds=5, retries=1)
    assert body == {"error": f"cannot connect to 127.0.0.1:{full_listener}: no answer within 0.3s"}, body
    assert call.attempts == 2  # a transient failure: tried once more, 0.2 s later
    assert took < 5  # both connects gave up on their own limit, well before the budget


def test_a_connect_that_outlasts_the_budget_ends_the_call_as_a_timeout(full_listener: int) -> None:
    body, call, took = get(f"http://127.0.0.1:{full_listener}/api/status",
                           connectTimeoutSeconds=2, timeoutSeconds=0.5, retries=3)
    assert body == {"error": "timeout after 0.5s"}, body
    assert call.attempts == 1
    assert took >= 0.5


def test_an_answer_that_trickles_forever_ends_at_the_budget() -> None:
    """The server answers a byte every 0.1 s: each read comes in time, the whole answer never does."""

    async def go() -> tuple[object, Call, int]:
        sent = 0

        async def drip(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            nonlocal sent
            await reader.readuntil(b"\r\n\r\n")
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n")
            try:
                while True:
                    writer.write(b" ")
                    sent += 1
                    await writer.drain()
                    await asyncio.sleep(0.1)
            except (ConnectionError, OSError):
                pass

        server = await asyncio.start_server(drip, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        fetcher = Fetcher.open(ProbeSettings.model_validate({"timeoutSeconds": 1, "retries": 2}), 4)
        try:
            body, call = await fetcher.get_json(f"http://127.0.0.1:{port}/api/status")
        finally:
            await fetcher.close()
            server.close()
        return body, call, sent

    body, call, sent = asyncio.run(go())
    assert body == {"error": "timeout after 1s"}, body
    assert call.attempts == 1 and call.status is None
    assert sent >= 3  # the bytes did come, each in time
