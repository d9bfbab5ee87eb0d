"""The Jupyter probe against real jupyter_server + ipykernel processes on loopback, and against
broken endpoints served by a small local server."""

from __future__ import annotations

import asyncio
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from aiohttp import web

from kf_culler.config import ProbeSettings
from kf_culler.local.jupyter import JupyterServer
from kf_culler.local.procs import free_port
from kf_culler.readings import parse_jupyter
from kf_culler.sources import jupyter
from kf_culler.sources.http import Fetcher


def probe(url: str, **settings: Any) -> dict[str, Any]:
    async def go() -> dict[str, Any]:
        fetcher = Fetcher.open(ProbeSettings(**settings), 4)
        try:
            answer, _ = await jupyter.probe(fetcher, url)
            return answer
        finally:
            await fetcher.close()

    return asyncio.run(go())


@pytest.fixture(scope="module")
def server() -> Iterator[JupyterServer]:
    with JupyterServer("team-a", "nb-probe") as s:
        yield s


def test_idle_kernel(server: JupyterServer) -> None:
    kid = server.start_kernel()
    answer = probe(server.url)
    kernels = {k["id"]: k for k in answer["kernels"]}
    assert kernels[kid]["execution_state"] == "idle"
    reading = parse_jupyter(answer)
    assert not reading.busy and reading.summary["kernels"] >= 1


def test_busy_kernel_seen_through_the_kernel_protocol(server: JupyterServer) -> None:
    kid = server.start_kernel()
    server.execute(kid, "import time; time.sleep(120)")
    try:
        answer = probe(server.url)
        assert {k["id"]: k for k in answer["kernels"]}[kid]["execution_state"] == "busy"
        assert parse_jupyter(answer).busy
    finally:
        server.interrupt(kid)


def test_terminal_is_seen(server: JupyterServer) -> None:
    name = server.new_terminal()
    answer = probe(server.url)
    assert name in [t["name"] for t in answer["terminals"]]
    assert parse_jupyter(answer).summary["terminals"] >= 1


def test_probing_does_not_move_last_activity() -> None:
    with JupyterServer("team-a", "nb-quiet") as s:
        s.start_kernel()
        s.new_terminal()
        time.sleep(1.0)
        before = s.get("api/status")["last_activity"]
        for _ in range(3):
            assert "error" not in probe(s.url)
            time.sleep(0.2)
        assert s.get("api/status")["last_activity"] == before
        # The same request without the flag does move it: the check above can fail.
        time.sleep(0.2)
        with urllib.request.urlopen(s.url + "api/kernels", timeout=10) as resp:
            resp.read()
        assert s.get("api/status")["last_activity"] != before


# -- broken endpoints ---------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def broken() -> Iterator[str]:
    """A loopback server whose api/status misbehaves in the ways named by the path prefix."""
    import threading

    async def handler(request: web.Request) -> web.StreamResponse:
        kind = request.match_info["kind"]
        if kind == "e500":
            return web.Response(status=500, text="boom")
        if kind == "html":
            return web.Response(text="<html>login</html>", content_type="text/html")
        if kind == "huge":
            return web.Response(body=b"[" + b"0," * (3 << 20) + b"0]", content_type="application/json")
        if kind == "hang":
            await asyncio.sleep(4)
        return web.json_response([])

    port = free_port()
    loop = asyncio.new_event_loop()
    runner_holder: dict[str, web.AppRunner] = {}

    async def start() -> None:
        app = web.Application()
        app.router.add_get("/{kind}/api/{what}", handler)
        runner = web.AppRunner(app)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        runner_holder["r"] = runner

    t = threading.Thread(target=loop.run_forever, daemon=True)
    t.start()
    asyncio.run_coroutine_threadsafe(start(), loop).result(10)
    yield f"http://127.0.0.1:{port}"
    asyncio.run_coroutine_threadsafe(runner_holder["r"].cleanup(), loop).result(30)
    loop.call_soon_threadsafe(loop.stop)


@pytest.mark.parametrize("kind,needle", [("e500", "HTTP 500"), ("html", "not JSON"), ("huge", "cap"),
                                         ("hang", "timeout")])
def test_broken_endpoint_gives_an_error(broken: str, kind: str, needle: str) -> None:
    answer = probe(f"{broken}/{kind}/", timeout_seconds=1.0, max_response_bytes=1 << 20)
    assert set(answer) == {"error"} and needle in answer["error"]


def test_unreachable_port_gives_an_error() -> None:
    answer = probe(f"http://127.0.0.1:{free_port()}/notebook/x/y/", timeout_seconds=2.0)
    assert set(answer) == {"error"} and "api/status" in answer["error"]
