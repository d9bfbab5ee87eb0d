"""What a probe's connection and a session's span cost in CPU, each measured alone.

    python bench/probe_costs.py            # root: a network namespace with dnsmasq, as bench/cycle.py --netns

- connect: N uvloop connections to a loopback server, by a Service-like DNS name (dnsmasq answering every
  `*.svc.cluster.local`, in a network namespace made for the run) against by address — what
  `probe.serviceClusterIP` saves a notebook each pass (the CPU of both ends: the server is in this process);
- probes: N Jupyter probes (`kf_culler/sources/jupyter.py`: api/status, api/kernels, api/terminals)
  through the culler's own `Fetcher`, 256 at a time (`--in-flight`), against a loopback server in this
  process that answers each GET at once with a small JSON body as jupyter_server would (no DNS, no network
  namespace): what a notebook's three requests cost, its connection aside (every probe goes to one address,
  so the kept-alive connections are shared, as behind one gateway);
- spans: N sessions' spans as a pass makes them (`start_as_current_span` under the pass's span, with the
  pass's attributes), with OpenTelemetry's SDK as `run` sets it up against its no-op tracer.

Each figure is printed; docs/performance.md records them.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

NAME = "nb-00001.bench-1.svc.cluster.local"


def connections(host: str, n: int) -> float:
    """CPU µs a connection to `host` (connect, then close), 256 at a time."""
    import uvloop

    class Quiet(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            self.transport = transport

    async def main() -> float:
        loop = asyncio.get_running_loop()
        server = await loop.create_server(Quiet, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        gate = asyncio.Semaphore(256)

        async def one() -> None:
            async with gate:
                transport, _ = await loop.create_connection(Quiet, host, port)
                transport.close()

        cpu = time.process_time()
        await asyncio.gather(*(one() for _ in range(n)))
        spent = time.process_time() - cpu
        server.close()
        return spent / n * 1e6

    return uvloop.run(main())


_BODIES = {
    b"status": b'{"started": "2026-12-03T08:00:00.000000Z", "last_activity": "2026-12-03T09:00:00.000000Z", '
               b'"connections": 0, "kernels": 1}',
    b"kernels": b'[{"id": "0c7e5bd5-7f2c-4b8e-9a55-4d2f3c1a9e01", "name": "python3", "last_activity": '
                b'"2026-12-03T09:00:00.000000Z", "execution_state": "idle", "connections": 0}]',
    b"terminals": b"[]",
}


def probes(n: int, in_flight: int = 256) -> float:
    """CPU µs a Jupyter probe (its three GETs), both ends in this process, `in_flight` at a time."""
    import uvloop

    from kf_culler.config import ProbeSettings
    from kf_culler.sources.http import Fetcher
    from kf_culler.sources.jupyter import probe

    class Server(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            self.transport = transport
            self.buffer = b""

        def data_received(self, data: bytes) -> None:
            self.buffer += data
            while b"\r\n\r\n" in self.buffer:
                head, _, self.buffer = self.buffer.partition(b"\r\n\r\n")
                part = head.split(b" ", 2)[1].split(b"?")[0].rpartition(b"/")[2]
                body = _BODIES.get(part, b"{}")
                self.transport.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"  # type: ignore[attr-defined]
                                     b"Content-Length: %d\r\n\r\n%s" % (len(body), body))

    async def main() -> float:
        loop = asyncio.get_running_loop()
        server = await loop.create_server(Server, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        fetcher = Fetcher.open(ProbeSettings(), in_flight)
        gate = asyncio.Semaphore(in_flight)

        async def one(i: int) -> None:
            async with gate:
                answer, _ = await probe(fetcher, f"http://127.0.0.1:{port}/notebook/ns/nb-{i}/")
                assert "error" not in answer, answer

        cpu = time.process_time()
        await asyncio.gather(*(one(i) for i in range(n)))
        spent = time.process_time() - cpu
        await fetcher.close()
        server.close()
        return spent / n * 1e6

    return uvloop.run(main())


def spans(sdk: bool, n: int) -> float:
    """CPU s for n sessions' spans (in a child process: the tracer provider can be set once per process)."""
    code = f"""
import os, time
if not {sdk}:
    os.environ["OTEL_SDK_DISABLED"] = "true"
from opentelemetry import context, trace
from kf_culler.telemetry import setup_tracing
setup_tracing()
tracer = trace.get_tracer("kf_culler")
with tracer.start_as_current_span("kf_culler.cycle"):
    pass_context = context.get_current()
    cpu = time.process_time()
    for i in range({n}):
        token = context.attach(pass_context)
        with tracer.start_as_current_span("kf_culler.session") as span:
            span.set_attributes({{"k8s.namespace.name": "ns", "kf_culler.session": f"nb-{{i}}",
                                  "kf_culler.server_type": "jupyter"}})
            format(span.get_span_context().trace_id, "032x")
            span.set_attributes({{"kf_culler.action": "keep", "kf_culler.state": "idle", "kf_culler.rule": "10-idle",
                                  "kf_culler.reason": "idle since 08:00 UTC" * 10, "kf_culler.idle_seconds": 1.0,
                                  "kf_culler.gpus": 0}})
        context.detach(token)
    print(time.process_time() - cpu)
"""
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True,
                         cwd=Path(__file__).resolve().parents[1])
    return float(out.stdout.strip())


def inside(n: int) -> None:
    """In the run's network namespace: dnsmasq on its loopback, then the connection figures."""
    with tempfile.TemporaryDirectory(prefix="kfc-probe-costs-") as tmp:
        pid = Path(tmp) / "dnsmasq.pid"
        subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
        subprocess.run(["dnsmasq", "--conf-file=/dev/null", "--no-hosts", "--no-resolv", "--listen-address=127.0.0.1",
                        "--bind-interfaces", "--port=53", "--address=/svc.cluster.local/127.0.0.1", "--user=root",
                        f"--pid-file={pid}", "--cache-size=0"], check=True)
        try:
            for _ in range(2):
                by_address, by_name = connections("127.0.0.1", n), connections(NAME, n)
                print(f"connect: {by_address:.0f} µs of CPU a connection by address, {by_name:.0f} µs by name "
                      f"({n} connections)")
        finally:
            os.kill(int(pid.read_text()), 15)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--connections", type=int, default=3000)
    p.add_argument("--sessions", type=int, default=10000)
    p.add_argument("--probes", type=int, default=5000)
    p.add_argument("--in-flight", type=int, default=256, help="probes at once (1: the same instructions every run, "
                   "for callgrind)")
    p.add_argument("--only", choices=("connect", "probes", "spans"), help="one figure alone (probes and spans need "
                   "no root: `valgrind --tool=callgrind python3 bench/probe_costs.py --only probes --in-flight 1`)")
    p.add_argument("--inside", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.inside:
        inside(a.connections)
        return 0
    if a.only in ("probes", "spans"):
        if a.only == "probes":
            print(f"probes: {probes(a.probes, a.in_flight):.0f} µs of CPU a Jupyter probe, both ends ({a.probes} "
                  "probes)")
        else:
            sdk, noop = spans(True, a.sessions), spans(False, a.sessions)
            print(f"spans: {sdk:.2f} CPU s for {a.sessions} sessions' spans with the SDK, {noop:.2f} s with the no-op "
                  "tracer")
        return 0
    if os.geteuid() != 0 or not shutil.which("dnsmasq") or not shutil.which("unshare"):
        print("needs root, util-linux (unshare) and dnsmasq (apt-get install -y dnsmasq-base)", file=sys.stderr)
        return 2
    with tempfile.NamedTemporaryFile("w", prefix="kfc-resolv-", suffix=".conf") as resolv:
        resolv.write("nameserver 127.0.0.1\n")
        resolv.flush()
        # A mount namespace so that this process's /etc/resolv.conf points at the run's dnsmasq, and nobody else's.
        subprocess.run(["unshare", "--mount", "--net", "sh", "-c",
                        'mount --bind "$0" /etc/resolv.conf && exec "$1" "$2" --inside --connections "$3"',
                        resolv.name, sys.executable, str(Path(__file__).resolve()), str(a.connections)], check=True)
    if a.only == "connect":
        return 0
    for _ in range(3):
        print(f"probes: {probes(a.probes):.0f} µs of CPU a Jupyter probe, both ends ({a.probes} probes)")
    sdk, noop = spans(True, a.sessions), spans(False, a.sessions)
    print(f"spans: {sdk:.2f} CPU s for {a.sessions} sessions' spans with the SDK, {noop:.2f} s with the no-op tracer")
    return 0


if __name__ == "__main__":
    sys.exit(main())
