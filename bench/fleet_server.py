"""The benchmark's fleet, and the one HTTP server that answers for every notebook in it.

    python bench/fleet_server.py SPEC.json HOST:PORT [HOST:PORT ...]

Which notebook is which is a pure function of the spec and the notebook's name (stable hashes), so
the benchmark, the culler child and this server agree without sharing state. The server (aiohttp, one
process of its own so its CPU is not the culler's) answers:

- `GET /notebook/<ns>/<name>/api/status|kernels|terminals` (Jupyter, base_url as Kubeflow sets it);
- `GET /healthz` with `Host: <name>.<ns>.svc.<domain>` (code-server at the root of its Service), and
  `GET /codeserver/<ns>/<name>/healthz` for a URL template on loopback;
- `GET /metrics`: dcgm-exporter's text for the GPU pods (a stand-in exporter for Prometheus to scrape);
- `POST /control?cross0=<epoch>&span=<s>`: when the crossing notebooks cross the idle limit;
- `GET /stats`: request counts by client (kf-culler, Go's http client) and path.

Every answer waits `latency` seconds first; a hanging notebook's answer waits `hangSeconds` (longer
than any probe timeout), so its client gives up first.

With `hostile` > 0 the fleet has, in namespace bench-hostile, `hostile` more notebooks of each kind in
`hostileKinds` (named `hx-<kind>-<i>`), whose servers answer as a user's hostile server can (the kinds of
tests/support/faulty.py):

- `endlesshead`: a status line, then 1 KiB header lines without end (until the client hangs up, or 120 s);
- `longline`: a status line, then one header line that never ends;
- `slowhead`: a status line, then a 64-byte header line every 0.25 s, without end;
- `manyheaders`: 1,000 short header lines, then the valid idle answer;
- `flat`: api/status valid; api/kernels and api/terminals 1 MiB (less one byte) of `[{},{},...]`;
- `deep`: api/status valid; api/kernels and api/terminals a JSON list nested 25 deep;
- `many`: api/kernels 2,000 valid idle kernels (about 330 KB), the rest valid;
- `bigstopped`: a stopped Notebook (`kubeflow-resource-stopped` set, no pod) of about 1.4 MiB of spec
  (env vars in its container, and in its StatefulSet's template as the notebook-controller copies it);
  the server has nothing to answer for it.

The valid answers of hostile notebooks are idle since `idle_since`, like the ordinary idle ones.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import socket
import sys
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(1, str(Path(__file__).resolve().parent.parent))  # kf_culler, without an install

CROSS_NAMESPACE = "bench-cross"
HOSTILE_NAMESPACE = "bench-hostile"
BUSY_GPU = (85.0, 6000.0)  # utilisation %, memory MiB of a working GPU

HOSTILE_KINDS = ("endlesshead", "longline", "slowhead", "manyheaders", "flat", "deep", "many", "bigstopped")
DEFAULT_HOSTILE_KINDS = "endlesshead,flat,deep,many,bigstopped"
# The hostile bodies and header lines of tests/support/faulty.py.
FLAT_BODY = b"[" + b"{}," * ((1 << 20) // 3 - 2) + b"{}]"  # 1 MiB less one byte of `[{},{},...]`
DEEP_BODY = b"[" * 25 + b"]" * 25
HEADER_LINE = b"X-Padding: " + b"a" * 51 + b"\r\n"  # 64 bytes
LONG_HEADER_LINE = b"X-Padding: " + b"a" * 1011 + b"\r\n"  # 1 KiB
SLOW_HEADER_SECONDS = 0.25
ENDLESS_SECONDS = 120.0


@dataclass(frozen=True)
class FleetSpec:
    notebooks: int
    crossing: int = 0
    hang_share: float = 0.05
    active_share: float = 0.25
    gpu_share: float = 0.20
    codeserver_share: float = 0.20
    latency: float = 0.05
    hang_seconds: float = 60.0
    idle_minutes: float = 120.0
    t0: float = 0.0  # epoch seconds: pods started 2 h before, idle notebooks idle since 20 min before
    hostile: int = 0  # notebooks of each kind of `hostile_kinds`, in bench-hostile
    hostile_kinds: str = DEFAULT_HOSTILE_KINDS  # comma-separated, from HOSTILE_KINDS

    @classmethod
    def load(cls, path: str | Path) -> FleetSpec:
        return cls(**json.loads(Path(path).read_text()))

    def dump(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(asdict(self)))

    @property
    def namespaces(self) -> int:
        return max(1, self.notebooks // 100)

    @property
    def pod_started(self) -> float:
        return self.t0 - 7200.0

    @property
    def idle_since(self) -> float:
        return self.t0 - 1200.0

    @property
    def kinds(self) -> list[str]:
        return [k for k in self.hostile_kinds.split(",") if k] if self.hostile else []

    @property
    def size(self) -> int:
        """Every notebook of the fleet: ordinary, crossing and hostile."""
        return self.notebooks + self.crossing + self.hostile * len(self.kinds)


@dataclass(frozen=True)
class Member:
    index: int
    namespace: str
    name: str
    kind: str  # "jupyter" | "codeserver"
    gpu: bool
    hang: bool
    active: bool
    crossing: bool
    hostile: str = ""  # the hostile kind, for the notebooks of bench-hostile

    @property
    def cls(self) -> str:
        if self.hostile:
            return "hostile"
        if self.crossing:
            return "crossing"
        return "hang" if self.hang else "active" if self.active else "idle"

    @property
    def stopped(self) -> bool:
        """A stopped Notebook (no pod): the big stopped hostile kind."""
        return self.hostile == "bigstopped"


def _frac(name: str, salt: str) -> float:
    return int.from_bytes(hashlib.blake2b(f"{salt}:{name}".encode(), digest_size=8).digest(), "big") / 2**64


def member(spec: FleetSpec, index: int) -> Member:
    """The index-th notebook: the first `notebooks` in bench-<k>, then the crossing ones, then the hostile ones
    (`hostile` of each kind in turn)."""
    if index >= spec.notebooks + spec.crossing:
        j = index - spec.notebooks - spec.crossing
        kind = spec.kinds[j // spec.hostile]
        return Member(index, HOSTILE_NAMESPACE, f"hx-{kind}-{j % spec.hostile:04d}", "jupyter", False, False,
                      False, False, kind)
    if index >= spec.notebooks:
        j = index - spec.notebooks
        return Member(index, CROSS_NAMESPACE, f"cx-{j:04d}", "jupyter", False, False, False, True)
    name = f"nb-{index:05d}"
    hang = _frac(name, "hang") < spec.hang_share
    return Member(index, f"bench-{index % spec.namespaces}", name,
                  "codeserver" if _frac(name, "kind") < spec.codeserver_share else "jupyter",
                  _frac(name, "gpu") < spec.gpu_share, hang,
                  not hang and _frac(name, "active") < spec.active_share, False)


def members(spec: FleetSpec) -> Iterator[Member]:
    for i in range(spec.size):
        yield member(spec, i)


def lookup(spec: FleetSpec, namespace: str, name: str) -> Member | None:
    index = index_of(spec, namespace, name)
    if index is None:
        return None
    m = member(spec, index)
    return m if m.namespace == namespace else None


class Classes:
    """Each notebook's (class, hostile kind, crossing) as the bench's culler reports them, worked out once per
    notebook (`member` hashes its name four times) and then kept as one byte per notebook: the bench's own
    bookkeeping runs in the culler's process, whose CPU and memory it measures."""

    def __init__(self, spec: FleetSpec) -> None:
        self.spec = spec
        self.codes = bytearray(spec.size)  # 0: not worked out yet, else 1 + the index in `kinds`
        self.kinds: list[tuple[str, str | None, bool]] = []

    def of(self, namespace: str, name: str) -> tuple[str, str | None, bool] | None:
        index = index_of(self.spec, namespace, name)
        if index is None:
            return None
        code = self.codes[index]
        if code:
            return self.kinds[code - 1] if namespace == namespace_of(self.spec, index) else None
        m = lookup(self.spec, namespace, name)
        if m is None:
            return None
        kind = (m.cls, m.hostile, m.crossing)
        if kind not in self.kinds:
            self.kinds.append(kind)
        self.codes[index] = self.kinds.index(kind) + 1
        return kind


def namespace_of(spec: FleetSpec, index: int) -> str:
    """The namespace of the index-th notebook (`member`'s, without the rest of it)."""
    if index >= spec.notebooks + spec.crossing:
        return HOSTILE_NAMESPACE
    if index >= spec.notebooks:
        return CROSS_NAMESPACE
    return f"bench-{index % spec.namespaces}"


def index_of(spec: FleetSpec, namespace: str, name: str) -> int | None:
    """The index of the notebook named so (`member`), when the name is one of the fleet's; its namespace is
    checked by `lookup`."""
    try:
        if namespace == HOSTILE_NAMESPACE and name.startswith("hx-"):
            kind, _, i = name[3:].rpartition("-")
            if kind not in spec.kinds or not 0 <= int(i) < spec.hostile:
                return None
            index = spec.notebooks + spec.crossing + spec.kinds.index(kind) * spec.hostile + int(i)
        elif namespace == CROSS_NAMESPACE and name.startswith("cx-"):
            index = spec.notebooks + int(name[3:])
        elif name.startswith("nb-"):
            index = int(name[3:])
        else:
            return None
    except ValueError:
        return None
    return index if 0 <= index < spec.size else None


def cross_time(spec: FleetSpec, m: Member, cross0: float, span: float) -> float:
    """When crossing notebook m crosses the idle limit (spread evenly over [cross0, cross0 + span])."""
    j = m.index - spec.notebooks
    return cross0 + (j + 0.5) / max(1, spec.crossing) * span


def iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, tz=UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def dcgm_text(spec: FleetSpec) -> str:
    from kf_culler.local.prometheus import FakeGpu, dcgm_exposition

    gpus: list[FakeGpu] = []
    for m in members(spec):
        if m.gpu:
            util, mem = BUSY_GPU if m.active else (0.0, 0.0)
            gpus.append(FakeGpu(index=len(gpus) % 8, uuid=f"GPU-{m.index:08d}", util=util, used_mib=mem,
                                engine_active=util / 100.0, namespace=m.namespace, pod=f"{m.name}-0",
                                container=m.name, hostname=f"gpu-node-{len(gpus) // 8}"))
    return dcgm_exposition(gpus)


# -- the server --------------------------------------------------------------------------------------

class FleetServer:
    def __init__(self, spec: FleetSpec) -> None:
        self.spec = spec
        self.metrics = dcgm_text(spec).encode()
        self.cross0: float | None = None
        self.span = 0.0
        self.counts: Counter[str] = Counter()
        self.go_probed: dict[tuple[str, str], int] = {}
        self.go_first = 0.0
        self.go_all_at: float | None = None
        self.in_flight = 0

    def last_activity(self, m: Member, now: float) -> float:
        if m.active:
            return now
        if m.crossing and self.cross0 is not None:
            return cross_time(self.spec, m, self.cross0, self.span) - self.spec.idle_minutes * 60
        return self.spec.idle_since

    async def _wait(self, m: Member) -> None:
        self.in_flight += 1
        try:
            await asyncio.sleep(self.spec.hang_seconds if m.hang else self.spec.latency)
        finally:
            self.in_flight -= 1

    def _count(self, agent: str, what: str) -> str:
        who = "kf-culler" if agent.startswith("kf-culler") else "go" if agent.startswith("Go-http") else "other"
        self.counts[f"{who}:{what}"] += 1
        return who

    async def jupyter(self, request: Any) -> Any:
        from aiohttp import web

        ns, name, what = request.match_info["ns"], request.match_info["name"], request.match_info["what"]
        who = self._count(request.headers.get("User-Agent", ""), what)
        m = lookup(self.spec, ns, name)
        if m is None:
            return web.Response(status=404, text="no such notebook")
        if who == "go" and what == "kernels" and not m.crossing and not m.hostile:
            now = time.time()
            if not self.go_probed:
                self.go_first = now
            self.go_probed[(ns, name)] = self.go_probed.get((ns, name), 0) + 1
            if self.go_all_at is None and len(self.go_probed) >= self.spec.notebooks:
                self.go_all_at = now
        await self._wait(m)
        if m.kind != "jupyter" or what not in ("status", "kernels", "terminals"):
            return web.Response(status=404, text="not found")  # code-server has no Jupyter API
        if m.hostile:
            self.counts[f"hostile:{m.hostile}:{what}"] += 1
            return await self.hostile_answer(request, m, what)
        now = time.time()
        la = iso(self.last_activity(m, now))
        body: Any
        if what == "status":
            body = {"started": iso(self.spec.pod_started), "last_activity": la, "connections": 0, "kernels": 1}
        elif what == "kernels":
            body = [{"id": f"k-{m.index}", "name": "python3", "last_activity": la,
                     "execution_state": "busy" if m.active else "idle", "connections": 0}]
        else:
            body = []
        return web.Response(body=json.dumps(body).encode(), content_type="application/json")

    def idle_body(self, what: str) -> bytes:
        """A quiet Jupyter's answer, idle since `idle_since` (what the hostile kinds send when they are valid)."""
        la = iso(self.spec.idle_since)
        body: Any = [] if what != "status" else {"started": iso(self.spec.pod_started), "last_activity": la,
                                                 "connections": 0, "kernels": 0}
        return json.dumps(body).encode()

    async def hostile_answer(self, request: Any, m: Member, what: str) -> Any:
        from aiohttp import web

        kind = m.hostile
        if kind in ("endlesshead", "longline", "slowhead"):
            return await self._endless_head(request, kind)
        if kind == "manyheaders":
            resp = web.Response(body=self.idle_body(what), content_type="application/json")
            for _ in range(1000):
                resp.headers.add("X-Many", "y")
            return resp
        body = self.idle_body(what)
        if kind in ("flat", "deep") and what != "status":
            body = FLAT_BODY if kind == "flat" else DEEP_BODY
        elif kind == "many" and what == "kernels":
            la = iso(self.spec.idle_since)
            body = json.dumps([{"id": f"{i:08d}-81da-4321-af31-7a772f5139b0", "name": "python3", "last_activity": la,
                                "execution_state": "idle", "connections": 0} for i in range(2000)]).encode()
        return web.Response(body=body, content_type="application/json")

    async def _endless_head(self, request: Any, kind: str) -> Any:
        """A status line, then header bytes that never end, written on the connection itself (aiohttp would
        frame a response), until the client hangs up (handler cancellation) or ENDLESS_SECONDS."""
        transport = request.transport
        if transport is None:
            raise asyncio.CancelledError
        sock = transport.get_extra_info("socket")
        if sock is not None:  # a small send buffer: what was pushed is close to what the client took
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 16)
        transport.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n" + (b"X-Long: " if kind == "longline"
                                                                                    else b""))
        piece = b"a" * 65536 if kind == "longline" else LONG_HEADER_LINE * 64
        sent = 0
        started = time.monotonic()
        try:
            while time.monotonic() - started < ENDLESS_SECONDS and not transport.is_closing():
                if kind == "slowhead":
                    await asyncio.sleep(SLOW_HEADER_SECONDS)
                    transport.write(HEADER_LINE)
                    sent += len(HEADER_LINE)
                elif transport.get_write_buffer_size() > 1 << 16:
                    await asyncio.sleep(0.005)  # the client is not reading: wait (as a drain would)
                else:
                    transport.write(piece)
                    sent += len(piece)
        finally:
            self.counts[f"hostileBytes:{kind}"] += sent
        transport.close()
        raise asyncio.CancelledError  # nothing more to send: the connection is closed

    async def _healthz(self, request: Any, ns: str, name: str) -> Any:
        from aiohttp import web

        self._count(request.headers.get("User-Agent", ""), "healthz")
        m = lookup(self.spec, ns, name)
        if m is None:
            return web.Response(status=404, text="no such notebook")
        await self._wait(m)
        if m.kind != "codeserver":
            return web.Response(status=404, text="not found")
        now = time.time()
        body = {"status": "alive" if m.active else "expired",
                "lastHeartbeat": int(self.last_activity(m, now) * 1000)}
        return web.Response(body=json.dumps(body).encode(), content_type="application/json")

    async def healthz_by_host(self, request: Any) -> Any:
        from aiohttp import web

        labels = (request.host or "").split(":")[0].split(".")
        if len(labels) < 3 or labels[2] != "svc":
            return web.Response(status=404, text="unknown host")
        return await self._healthz(request, labels[1], labels[0])

    async def healthz_by_path(self, request: Any) -> Any:
        return await self._healthz(request, request.match_info["ns"], request.match_info["name"])

    async def dcgm(self, request: Any) -> Any:
        from aiohttp import web

        self.counts["metrics"] += 1
        return web.Response(body=self.metrics, content_type="text/plain")

    async def control(self, request: Any) -> Any:
        from aiohttp import web

        self.cross0 = float(request.query["cross0"])
        self.span = float(request.query["span"])
        return web.json_response({"cross0": self.cross0, "span": self.span})

    async def stats(self, request: Any) -> Any:
        from aiohttp import web

        return web.json_response({
            "counts": dict(self.counts), "inFlight": self.in_flight,
            "goDistinct": len(self.go_probed), "goFirst": self.go_first, "goAllAt": self.go_all_at,
            "goRepeats": sum(v - 1 for v in self.go_probed.values()),
            "time": time.time(), "cpuSeconds": time.process_time(),
        })

    async def serve(self, binds: list[tuple[str, int]]) -> None:
        from aiohttp import web

        app = web.Application()
        app.router.add_get("/notebook/{ns}/{name}/api/{what}", self.jupyter)
        app.router.add_get("/codeserver/{ns}/{name}/healthz", self.healthz_by_path)
        app.router.add_get("/healthz", self.healthz_by_host)
        app.router.add_get("/metrics", self.dcgm)
        app.router.add_post("/control", self.control)
        app.router.add_get("/stats", self.stats)
        runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
        await runner.setup()
        for host, port in binds:
            await web.TCPSite(runner, host, port, backlog=4096).start()
        print("ready", flush=True)
        try:
            await asyncio.Event().wait()  # until the benchmark stops this process
        finally:
            await runner.cleanup()


def main(argv: list[str]) -> int:
    spec = FleetSpec.load(argv[0])
    binds = [(b.rsplit(":", 1)[0], int(b.rsplit(":", 1)[1])) for b in argv[1:]]
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(FleetServer(spec).serve(binds))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
