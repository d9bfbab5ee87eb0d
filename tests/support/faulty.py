"""A loopback HTTP server that misbehaves on purpose, for fault tests of the probes.

The behaviour is chosen per request by the first path segment: `/<anything>-<behaviour>[-...]/...`
(so a notebook named `jup-hang` whose URL template is `http://127.0.0.1:PORT/{name}/` reaches the
`hang` behaviour). Every request is recorded (path, query, headers), and the server counts the
connections and body bytes it sent per behaviour, so tests can check how many attempts a probe made
and how much of a huge body it actually pulled.

Behaviours:
  ok           a valid, idle answer for the path (Jupyter api/status, api/kernels, api/terminals;
               code-server /healthz)
  hang         reads the request, then sends nothing until the client goes away
  reset        accepts, reads the request, then resets the connection (RST)
  eNNN         answers HTTP NNN (401, 403, 404, 500, 503, ...) with a small JSON body
  rbac         answers 403 with Istio's sidecar body `RBAC: access denied` (text/plain), as a sidecar does
               when no AuthorizationPolicy lets the caller in
  badjson      200 with a body that is not JSON
  huge         200 with Content-Length: 50 MB, then streams it
  hugechunked  200 with a chunked 50 MB body and no Content-Length
  slow         200 with the valid body for the path, one byte every `slow_delay` seconds

Hostile servers (a notebook's user runs its server), for tests/test_hostile_endpoints.py:
  endlesshead  a status line, then header lines of 1 KiB, forever (as fast as the client reads)
  longline     a status line, then one header line that never ends
  slowhead     a status line, then a 64-byte header line every `slow_delay` seconds, forever
  manyheaders  1,000 short header lines (about 10 KB), then the valid body
  flat         api/status valid; every other path 200 with 1 MiB (just under the default cap) of
               `[{},{},...]`, as Content-Length
  deep         api/status valid; every other path 200 with a JSON list nested 25 deep
  many         the valid body, except api/kernels: 2,000 valid idle kernels (about 330 KB)
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import struct
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import parse_qs, urlsplit

from kf_culler.local.procs import free_port

HUGE_BYTES = 50 * 1000 * 1000
CHUNK = b"0," * 32768  # 64 KiB, reused: the server itself never holds the huge body
FLAT_BODY = b"[" + b"{}," * ((1 << 20) // 3 - 2) + b"{}]"  # 1 MiB less one byte of `[{},{},...]`
DEEP_BODY = b"[" * 25 + b"]" * 25
HEADER_LINE = b"X-Padding: " + b"a" * 51 + b"\r\n"  # 64 bytes
LONG_HEADER_LINE = b"X-Padding: " + b"a" * 1011 + b"\r\n"  # 1 KiB


@dataclass
class Seen:
    """One request as the server received it."""

    behaviour: str
    method: str
    target: str  # the request target exactly as sent (path and query)
    path: str
    query: dict[str, list[str]]
    headers: dict[str, str]


@dataclass
class FaultyServer:
    idle_since: datetime = field(default_factory=lambda: datetime.now(UTC) - timedelta(hours=1))
    slow_delay: float = 0.25
    port: int = field(default_factory=free_port)
    seen: list[Seen] = field(default_factory=list)
    connections: Counter[str] = field(default_factory=Counter)
    body_bytes: Counter[str] = field(default_factory=Counter)

    def __post_init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="faulty-server", daemon=True)
        self._server: asyncio.AbstractServer | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self.lock = threading.Lock()

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def url(self, segment: str) -> str:
        return f"{self.base}/{segment}/"

    def start(self) -> FaultyServer:
        self.thread.start()

        async def up() -> None:
            self._server = await asyncio.start_server(self._serve, "127.0.0.1", self.port)

        asyncio.run_coroutine_threadsafe(up(), self.loop).result(10)
        return self

    def stop(self) -> None:
        async def down() -> None:
            if self._server is not None:
                self._server.close()
            for task in list(self._tasks):
                task.cancel()
            await asyncio.sleep(0)

        if self.thread.is_alive():
            asyncio.run_coroutine_threadsafe(down(), self.loop).result(10)
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(10)

    def __enter__(self) -> FaultyServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def requests_for(self, behaviour: str) -> list[Seen]:
        with self.lock:
            return [s for s in self.seen if s.behaviour == behaviour]

    # -- answers --------------------------------------------------------------------------------
    def valid_body(self, path: str) -> bytes:
        """An idle answer for the path: what a quiet Jupyter or code-server says."""
        idle = self.idle_since.astimezone(UTC)
        stamp = idle.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        if path.endswith("/api/status"):
            doc: Any = {"started": stamp, "last_activity": stamp, "connections": 0, "kernels": 0}
        elif path.endswith("/api/kernels") or path.endswith("/api/terminals"):
            doc = []
        elif path.endswith("/healthz"):
            doc = {"status": "expired", "lastHeartbeat": int(idle.timestamp() * 1000)}
        else:
            doc = {"path": path}
        return json.dumps(doc).encode()

    # -- the connection handler -----------------------------------------------------------------
    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
        try:
            await self._one(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, OSError):
            pass
        except asyncio.CancelledError:
            pass
        finally:
            if task is not None:
                self._tasks.discard(task)
            with contextlib.suppress(Exception):
                writer.close()

    async def _one(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        method, target, _ = ([*lines[0].split(" ", 2), "", ""])[:3]
        headers = {}
        for line in lines[1:]:
            if ":" in line:
                k, v = line.split(":", 1)
                headers[k.strip().lower()] = v.strip()
        parts = urlsplit(target)
        segment = parts.path.lstrip("/").split("/", 1)[0]
        behaviour = segment.split("-")[1] if segment.count("-") >= 1 else segment
        with self.lock:
            self.seen.append(Seen(behaviour, method, target, parts.path, parse_qs(parts.query), headers))
            self.connections[behaviour] += 1

        if behaviour == "hang":
            await reader.read()  # until the client gives up and closes
            return
        if behaviour == "reset":
            sock = writer.get_extra_info("socket")
            if sock is not None:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            writer.transport.abort()
            return
        if behaviour.startswith("e") and behaviour[1:].isdigit():
            status = int(behaviour[1:])
            await self._respond(writer, behaviour, status, json.dumps({"message": f"HTTP {status}"}).encode())
            return
        if behaviour == "rbac":
            await self._respond(writer, behaviour, 403, b"RBAC: access denied", "text/plain")
            return
        if behaviour == "badjson":
            await self._respond(writer, behaviour, 200, b'{"status": "alive", "lastHeartbeat": 17')
            return
        if behaviour in ("huge", "hugechunked"):
            await self._huge(writer, behaviour, chunked=behaviour == "hugechunked")
            return
        if behaviour in ("endlesshead", "longline", "slowhead"):
            await self._endless_head(writer, behaviour)
            return
        if behaviour == "manyheaders":
            body = self.valid_body(parts.path)
            head = self._head(200, len(body))
            writer.write(head[:-2] + b"X-Many: y\r\n" * 1000 + b"\r\n" + body)
            await writer.drain()
            self._sent(behaviour, len(body))
            return
        if behaviour in ("flat", "deep") and not parts.path.endswith("/api/status"):
            await self._respond(writer, behaviour, 200, FLAT_BODY if behaviour == "flat" else DEEP_BODY)
            return
        if behaviour == "many" and parts.path.endswith("/api/kernels"):
            stamp = self.idle_since.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
            kernels = [{"id": f"{i:08d}-81da-4321-af31-7a772f5139b0", "name": "python3", "last_activity": stamp,
                        "execution_state": "idle", "connections": 0} for i in range(2000)]
            await self._respond(writer, behaviour, 200, json.dumps(kernels).encode())
            return
        body = self.valid_body(parts.path)
        if behaviour == "slow":
            writer.write(self._head(200, len(body)))
            await writer.drain()
            for i in range(len(body)):
                await asyncio.sleep(self.slow_delay)
                writer.write(body[i:i + 1])
                await writer.drain()
                self._sent(behaviour, 1)
            return
        await self._respond(writer, behaviour, 200, body)

    @staticmethod
    def _head(status: int, length: int | None, chunked: bool = False,
              content_type: str = "application/json") -> bytes:
        lines = [f"HTTP/1.1 {status} X", f"Content-Type: {content_type}", "Connection: close"]
        if chunked:
            lines.append("Transfer-Encoding: chunked")
        elif length is not None:
            lines.append(f"Content-Length: {length}")
        return ("\r\n".join(lines) + "\r\n\r\n").encode()

    def _sent(self, behaviour: str, n: int) -> None:
        with self.lock:
            self.body_bytes[behaviour] += n

    async def _respond(self, writer: asyncio.StreamWriter, behaviour: str, status: int, body: bytes,
                       content_type: str = "application/json") -> None:
        writer.write(self._head(status, len(body), content_type=content_type) + body)
        await writer.drain()
        self._sent(behaviour, len(body))

    async def _endless_head(self, writer: asyncio.StreamWriter, behaviour: str) -> None:
        """A status line, then header bytes that never end, until the client hangs up (or 120 s)."""
        sock = writer.get_extra_info("socket")
        if sock is not None:  # a small send buffer: what was pushed is close to what the client took
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 16)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n")
        if behaviour == "longline":
            writer.write(b"X-Long: ")
        piece = b"a" * 65536 if behaviour == "longline" else LONG_HEADER_LINE * 64
        started = time.monotonic()
        while time.monotonic() - started < 120:
            if behaviour == "slowhead":
                await asyncio.sleep(self.slow_delay)
                writer.write(HEADER_LINE)
                self._sent(behaviour, len(HEADER_LINE))
            else:
                writer.write(piece)
                self._sent(behaviour, len(piece))
            await writer.drain()  # raises once the client has closed the connection

    async def _huge(self, writer: asyncio.StreamWriter, behaviour: str, chunked: bool) -> None:
        sock = writer.get_extra_info("socket")
        if sock is not None:  # a small send buffer: what was pushed is close to what the client took
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 16)
        writer.write(self._head(200, HUGE_BYTES, chunked))
        sent = 0
        started = time.monotonic()
        while sent < HUGE_BYTES and time.monotonic() - started < 120:
            piece = CHUNK[:HUGE_BYTES - sent]
            if chunked:
                writer.write(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
            else:
                writer.write(piece)
            await writer.drain()  # bounded buffer: waits while the client is not reading
            sent += len(piece)
            self._sent(behaviour, len(piece))
        if chunked:
            writer.write(b"0\r\n\r\n")
            await writer.drain()
