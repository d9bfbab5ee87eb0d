"""A loopback HTTP router standing in for the cluster's Service DNS + Istio routing in local runs.

The culler builds probe URLs from templates; locally every notebook lives on its own port, so the
template points at this router, which forwards `GET <prefix>/<namespace>/<name>/<rest>` to the
notebook's server, keeping the path (Jupyter's base_url) or stripping the prefix (code-server and
RStudio serve at `/`, as behind Istio's rewrite).
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import aiohttp
from aiohttp import web

from kf_culler.local.procs import free_port


class Router:
    def __init__(self) -> None:
        self.port = free_port()
        self.routes: dict[tuple[str, str, str], tuple[str, bool]] = {}
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="router", daemon=True)
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None
        self.requests = 0

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def template(self, kind: str = "notebook") -> str:
        """The URL template to put in the culler's `urls` settings for this kind of route."""
        return f"{self.base}/{kind}/{{namespace}}/{{name}}/"

    def add(self, kind: str, namespace: str, name: str, upstream: str, strip: bool) -> None:
        """Route /<kind>/<namespace>/<name>/... to upstream (keeping or stripping that prefix)."""
        self.routes[(kind, namespace, name)] = (upstream.rstrip("/"), strip)

    def remove(self, kind: str, namespace: str, name: str) -> None:
        self.routes.pop((kind, namespace, name), None)

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        self.requests += 1
        kind, ns, name = request.match_info["kind"], request.match_info["ns"], request.match_info["name"]
        route = self.routes.get((kind, ns, name))
        if route is None:
            return web.Response(status=503, text="no upstream")  # what a mesh answers for a scaled-down pod
        upstream, strip = route
        rest = request.match_info["rest"]
        path = f"/{rest}" if strip else f"/{kind}/{ns}/{name}/{rest}"
        assert self._session is not None
        try:
            async with self._session.get(upstream + path, params=request.query,
                                         timeout=aiohttp.ClientTimeout(total=30)) as up:
                body = await up.read()
                return web.Response(status=up.status, body=body,
                                    content_type=up.content_type or "application/octet-stream")
        except (aiohttp.ClientError, TimeoutError):
            return web.Response(status=503, text="upstream unreachable")

    def start(self) -> Router:
        self.thread.start()

        async def up() -> None:
            # A fresh upstream connection per request, closed after it: code-server counts any open
            # connection as a connected client, so a pooled one would keep it "alive".
            self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True))
            app = web.Application()
            app.router.add_get("/{kind}/{ns}/{name}/{rest:.*}", self._handle)
            self._runner = web.AppRunner(app)
            await self._runner.setup()
            await web.TCPSite(self._runner, "127.0.0.1", self.port).start()

        asyncio.run_coroutine_threadsafe(up(), self.loop).result(15)
        return self

    def stop(self) -> None:
        async def down() -> None:
            if self._session is not None:
                await self._session.close()
            if self._runner is not None:
                await self._runner.cleanup()

        if self.thread.is_alive():
            asyncio.run_coroutine_threadsafe(down(), self.loop).result(15)
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(5)

    def __enter__(self) -> Router:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()
