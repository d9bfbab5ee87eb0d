"""The code-server probe against a real code-server on loopback (Node 24 and code-server from the npm
registry, installed by hack/codeserver/install.sh), and against broken endpoints served by a small
local server.

code-server's heartbeat (src/node/heart.ts, src/node/routes/index.ts): every request except
`/healthz` beats; a beat marks the server alive for 60 s and arms a 60 s timer that beats again if the
HTTP server still has any open connection then. A websocket held open by an editor tab is such a
connection, and so is an idle keep-alive connection; a closed one is not.
"""

from __future__ import annotations

import asyncio
import time
import urllib.request
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from need import missing
from support.codeserver import CodeServer, Unavailable, executable

from kf_culler.config import ProbeSettings
from kf_culler.local.procs import free_port
from kf_culler.readings import Unreadable, parse_code_server
from kf_culler.sources import codeserver
from kf_culler.sources.http import Fetcher
from kf_culler.timeutil import from_epoch_ms

Answer = dict[str, Any]


@pytest.fixture(scope="session")
def code_server_exe() -> Path:
    """The installed code-server; installed now if missing (minutes, once per machine)."""
    try:
        return executable()
    except Unavailable as why:
        missing("code-server", why)


@pytest.fixture()
def server(code_server_exe: Path) -> Iterator[CodeServer]:
    """A fresh code-server that no client has talked to yet."""
    with CodeServer(code_server_exe) as cs:
        yield cs


@asynccontextmanager
async def fetcher(**settings: Any) -> AsyncIterator[Fetcher]:
    f = Fetcher.open(ProbeSettings(**settings), 4)
    try:
        yield f
    finally:
        await f.close()


def probe_once(url: str, **settings: Any) -> Answer:
    async def go() -> Answer:
        async with fetcher(**settings) as f:
            answer, calls = await codeserver.probe(f, url)
            assert len(calls) == 1
            return answer

    return asyncio.run(go())


async def poll(get: Callable[[], Awaitable[Answer]], until: Callable[[Answer], bool], timeout: float,
               interval: float = 1.0, wait: Callable[[Answer, float], float] | None = None) -> list[Answer]:
    """Call get() every interval seconds until until(answer); every answer seen, the last one matching.
    `wait(answer, interval)`: how long to wait after that answer instead (`around_the_timer`).

    The timeout only bounds the wait: it fails the test when the expected change never comes.
    """
    seen: list[Answer] = []
    deadline = time.monotonic() + timeout
    while True:
        answer = await get()
        seen.append(answer)
        if until(answer):
            return seen
        if time.monotonic() > deadline:
            raise AssertionError(f"no change within {timeout:g}s; last answers: {seen[-3:]}")
        await asyncio.sleep(interval if wait is None else wait(answer, interval))


HEART_SECONDS = 60.0  # code-server's heartbeat interval (src/node/heart.ts)


def around_the_timer(answer: Answer, interval: float) -> float:
    """The wait before the next probe that keeps it away from the moment code-server's timer looks for open
    connections: 60 s after the last beat it beats again if any connection is open then, a probe's as any
    other. The culler probes once a period, a connection of milliseconds; a test that probes every second
    would sooner or later be connected at that moment (a cold CI run on a loaded machine once was, 60.002 s
    after the last beat). So no probe from 2 s before that moment to 3 s after it; a beat then still shows in
    the answers after it."""
    timer = float(healthz(answer)["lastHeartbeat"]) / 1000 + HEART_SECONDS
    start = time.time() + interval
    if timer - 2.0 <= start <= timer + 3.0:
        return timer + 3.0 - time.time()
    return interval


def healthz(answer: Answer) -> dict[str, Any]:
    assert "error" not in answer, answer
    assert set(answer) == {"healthz"}, answer
    body = answer["healthz"]
    assert isinstance(body, dict), body
    return body


# -- a real code-server ------------------------------------------------------------------------------


def test_expired_with_no_heartbeat_before_any_client(server: CodeServer) -> None:
    body = healthz(probe_once(server.url))
    assert body == {"status": "expired", "lastHeartbeat": 0}
    reading = parse_code_server({"healthz": body})
    assert not reading.connected
    assert reading.connected_at is None
    assert reading.summary == {"status": "expired", "lastHeartbeat": "never"}


def test_probing_never_beats_the_heart(server: CodeServer) -> None:
    async def go() -> list[Answer]:
        async with fetcher() as f:
            answers = []
            for _ in range(20):  # one pooled client, as the culler uses
                answers.append((await codeserver.probe(f, server.url))[0])
                await asyncio.sleep(0.1)
            return answers

    for answer in asyncio.run(go()):
        assert healthz(answer) == {"status": "expired", "lastHeartbeat": 0}
    # The check above can fail: code-server exempts only the exact path /healthz, so the same request
    # with a query string is activity.
    with urllib.request.urlopen(server.url + "healthz?from=test", timeout=10) as resp:
        resp.read()
    body = healthz(probe_once(server.url))
    assert body["status"] == "alive"
    assert body["lastHeartbeat"] > 0


def test_alive_while_a_client_holds_a_websocket(server: CodeServer) -> None:
    async def go() -> tuple[Answer, bool]:
        async with server.client() as ws, fetcher() as f:
            answer = (await codeserver.probe(f, server.url))[0]
            return answer, ws.closed

    before_ms = time.time() * 1000
    answer, closed = asyncio.run(go())
    assert not closed, "code-server closed the client's websocket"
    body = healthz(answer)
    assert body["status"] == "alive"
    assert body["lastHeartbeat"] >= before_ms - 1000  # beaten by this client, not earlier
    reading = parse_code_server(answer)
    assert reading.connected
    assert reading.connected_at == from_epoch_ms(body["lastHeartbeat"])


@pytest.mark.slow
def test_a_held_connection_keeps_beating_and_expires_after_close_while_probed(server: CodeServer) -> None:
    """Alive across the minute timer while connected; expired about a minute after the client leaves,
    although the culler keeps probing every second through one pooled client (except around the moment the
    timer looks for open connections: `around_the_timer`)."""

    async def go() -> tuple[list[Answer], list[Answer], bool]:
        async with fetcher() as f:
            async def get() -> Answer:
                return (await codeserver.probe(f, server.url))[0]

            async with server.client() as ws:
                first = healthz(await get())["lastHeartbeat"]
                # Only code-server's timer can beat again here: it does because the websocket is open.
                connected = await poll(get, lambda a: healthz(a)["lastHeartbeat"] != first, timeout=150)
                still_open = not ws.closed
            after = await poll(get, lambda a: healthz(a)["status"] == "expired", timeout=150,
                               wait=around_the_timer)
            return connected, after, still_open

    connected, after, still_open = asyncio.run(go())
    assert still_open, "code-server closed the client's websocket"
    assert all(healthz(a)["status"] == "alive" for a in connected), connected
    last_beat = healthz(connected[-1])["lastHeartbeat"]
    assert last_beat > healthz(connected[0])["lastHeartbeat"]
    assert all(parse_code_server(a).connected for a in connected)

    # After the close: no beat at all (the probes are not activity), then expired.
    assert [healthz(a)["lastHeartbeat"] for a in after] == [last_beat] * len(after)
    assert healthz(after[-1])["status"] == "expired"
    reading = parse_code_server(after[-1])
    assert not reading.connected
    assert reading.connected_at == from_epoch_ms(last_beat)


@pytest.mark.slow
def test_an_idle_keep_alive_connection_keeps_it_alive(server: CodeServer) -> None:
    """Why the probe closes its connection: the same polling over a kept-alive connection is counted as
    a connected client by code-server's timer, so it beats after the real client has left."""

    async def go() -> tuple[int, list[Answer]]:
        async with server.client():
            pass  # one beat, then gone
        async with aiohttp.ClientSession() as session:  # keeps its connection open between requests
            async def get() -> Answer:
                async with session.get(server.url + "healthz") as resp:
                    return {"healthz": await resp.json()}

            first = healthz(await get())["lastHeartbeat"]
            return first, await poll(get, lambda a: healthz(a)["lastHeartbeat"] != first, timeout=150)

    first, seen = asyncio.run(go())
    assert first > 0
    assert healthz(seen[-1])["lastHeartbeat"] > first
    assert all(healthz(a)["status"] == "alive" for a in seen), seen


# -- broken endpoints --------------------------------------------------------------------------------


class FakeServer:
    """A tiny aiohttp server on loopback answering /healthz with whatever a test sets."""

    def __init__(self) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/"
        self.handler: Callable[[web.Request], Awaitable[web.StreamResponse]] = self._default
        self.requests: list[tuple[str, str | None]] = []  # (path with query, Connection header)

    async def _default(self, request: web.Request) -> web.StreamResponse:
        return web.json_response({"status": "alive", "lastHeartbeat": 1_700_000_000_000})

    async def _dispatch(self, request: web.Request) -> web.StreamResponse:
        self.requests.append((request.path_qs, request.headers.get("Connection")))
        return await self.handler(request)

    @asynccontextmanager
    async def running(self) -> AsyncIterator[FakeServer]:
        app = web.Application()
        app.router.add_get("/{tail:.*}", self._dispatch)
        runner = web.AppRunner(app)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", self.port).start()
        try:
            yield self
        finally:
            await runner.cleanup()


def against(handler: Callable[[web.Request], Awaitable[web.StreamResponse]] | None = None,
            base: str | None = None, **settings: Any) -> tuple[Answer, FakeServer]:
    fake = FakeServer()
    if handler is not None:
        fake.handler = handler

    async def go() -> Answer:
        async with fake.running(), fetcher(**settings) as f:
            answer, _ = await codeserver.probe(f, base if base is not None else fake.url)
            return answer

    return asyncio.run(go()), fake


def test_probe_asks_healthz_at_the_root_and_closes_its_connection() -> None:
    answer, fake = against()
    assert answer == {"healthz": {"status": "alive", "lastHeartbeat": 1_700_000_000_000}}
    assert fake.requests == [("/healthz", "close")]
    assert parse_code_server(answer).connected


def test_base_url_without_trailing_slash() -> None:
    fake = FakeServer()

    async def go() -> Answer:
        async with fake.running(), fetcher() as f:
            return (await codeserver.probe(f, fake.url.rstrip("/")))[0]

    assert "healthz" in asyncio.run(go())
    assert fake.requests == [("/healthz", "close")]
    assert codeserver.healthz_url("http://nb.ns.svc.cluster.local/") == \
        "http://nb.ns.svc.cluster.local/healthz"


async def _not_json(request: web.Request) -> web.StreamResponse:
    return web.Response(text="<html>code-server</html>", content_type="text/html")


async def _server_error(request: web.Request) -> web.StreamResponse:
    return web.json_response({"error": "boom"}, status=500)


async def _oversized(request: web.Request) -> web.StreamResponse:
    return web.json_response({"status": "alive", "lastHeartbeat": 1, "pad": "x" * 5000})


async def _oversized_streamed(request: web.Request) -> web.StreamResponse:
    resp = web.StreamResponse()  # chunked: no Content-Length to refuse it by
    await resp.prepare(request)
    for _ in range(8):
        await resp.write(b" " * 1024)
    await resp.write(b'{"status": "alive", "lastHeartbeat": 1}')
    await resp.write_eof()
    return resp


async def _slow(request: web.Request) -> web.StreamResponse:
    await asyncio.sleep(2)
    return web.json_response({"status": "alive", "lastHeartbeat": 1})


@pytest.mark.parametrize(("handler", "settings", "message"), [
    (_not_json, {}, "not JSON"),
    (_server_error, {}, "HTTP 500"),
    (_oversized, {"maxResponseBytes": 1024}, "exceeds the 1024-byte cap"),
    (_oversized_streamed, {"maxResponseBytes": 1024}, "exceeds the 1024-byte cap"),
    (_slow, {"timeoutSeconds": 0.5, "retries": 0}, "timeout"),
], ids=["not-json", "http-500", "oversized", "oversized-chunked", "timeout"])
def test_bad_answers_become_errors(handler: Callable[[web.Request], Awaitable[web.StreamResponse]],
                                   settings: dict[str, Any], message: str) -> None:
    answer, _ = against(handler, **settings)
    assert set(answer) == {"error"}, answer
    assert answer["error"].startswith("/healthz: ")
    assert message in answer["error"]
    with pytest.raises(Unreadable):
        parse_code_server(answer)


def test_nothing_listening_is_an_error() -> None:
    answer = probe_once(f"http://127.0.0.1:{free_port()}/", retries=0)
    assert set(answer) == {"error"}, answer
    with pytest.raises(Unreadable):
        parse_code_server(answer)


@pytest.mark.parametrize("body", [
    {"status": "unknown", "lastHeartbeat": 1_700_000_000_000},
    {"status": "alive", "lastHeartbeat": "yesterday"},
    {"status": "alive"},
    ["alive"],
    "alive",
    None,
], ids=["status-unknown", "heartbeat-string", "no-heartbeat", "list", "string", "null"])
def test_unexpected_bodies_are_passed_through_for_decide_to_judge(body: Any) -> None:
    async def handler(request: web.Request) -> web.StreamResponse:
        return web.json_response(body)

    answer, _ = against(handler)
    assert answer == {"healthz": body}
    with pytest.raises(Unreadable):
        parse_code_server(answer)
