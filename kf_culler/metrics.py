"""Prometheus metrics, the /metrics, /healthz, /readyz endpoints, and the bounded server of the verdict API."""

from __future__ import annotations

import contextlib
import socket
import sys
import threading
import time
from collections.abc import Callable
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, get_args

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from kf_culler import slots
from kf_culler.brakes import Outcome
from kf_culler.cycle import CycleResult, NotebookResult
from kf_culler.decide import gpu_count
from kf_culler.model import (
    SERVER_SOURCES,
    STOP_ANNOTATION,
    STOPPED_AT_ANNOTATION,
    STOPPED_BY_ANNOTATION,
    STOPPED_BY_VALUE,
    State,
)
from kf_culler.stopped import LongStopped
from kf_culler.targets import KINDS, SessionKey, target_of
from kf_culler.timeutil import parse_time

STATES: tuple[str, ...] = get_args(State)


def not_taken_keys(result: CycleResult) -> frozenset[tuple[str, str]]:
    """The sessions of a pass whose stop did not take (rule 1), by session key: their GPU is not reclaimed."""
    return frozenset((r.namespace, r.name) for r in result.results if r.verdict.rule_id == "1-stop-not-taken")


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.notebooks = Gauge("kf_culler_notebooks", "Notebooks by state in the last pass", ["state"], registry=r)
        self.stops = Counter("kf_culler_stops", "Notebooks stopped, by deciding rule", ["reason_rule"], registry=r)
        self.warnings = Counter("kf_culler_warnings", "Stop warnings given, by rule", ["reason_rule"], registry=r)
        self.probe_seconds = Histogram("kf_culler_probe_seconds", "Probe latency", ["source"], registry=r,
                                       buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10))
        self.probe_errors = Counter("kf_culler_probe_errors", "Probes that gave no answer", ["source"], registry=r)
        self.cycle_seconds = Histogram("kf_culler_cycle_seconds", "Duration of a full pass", registry=r,
                                       buckets=(0.1, 0.5, 1, 2, 5, 10, 15, 30, 60, 120, 300))
        self.api_writes = Counter("kf_culler_api_writes", "Writes to the API server", ["kind"], registry=r)
        self.gpu_hours = Counter("kf_culler_gpu_hours_reclaimed",
                                 "GPU-hours reclaimed: GPUs x time from a stop until a restart or now", registry=r)
        self.notifications = Counter("kf_culler_notifications", "Notices of warnings and stops, by channel, kind "
                                     "and outcome (sent, failed, dropped, no-recipient)",
                                     ["channel", "kind", "outcome"], registry=r)
        self._orphan_namespaces: set[str] = set()
        self.orphaned = Gauge("kf_culler_orphaned_gpu_pods", "Pods named like a notebook's pod, holding a GPU, "
                              "that the StatefulSet a stop scales does not control (docs/observability.md)",
                              ["namespace"], registry=r)
        self.contested = Gauge("kf_culler_gpu_contested_pods", "Pods whose GPU series contradict each other (a "
                               "series not from dcgm-exporter claims their GPU): their GPU reads no-signal",
                               registry=r)
        self.coder_unjudged = Gauge("kf_culler_coder_workspaces_unjudged", "Coder workspaces listed beyond "
                                    "coder.maxWorkspaces in the last listing: not judged, left as they are",
                                    registry=r)
        self.not_taken = Gauge("kf_culler_stops_not_taken", "Sessions whose stop by the culler did not free their GPU "
                               "pod within stopDeadlineMinutes, in the last pass, by kind (rule 1-stop-not-taken)",
                               ["kind"], registry=r)
        self.reclaims = Counter("kf_culler_stop_next_steps", "Next steps taken for stops that did not take (a "
                                "Workspace's own StatefulSet scaled to 0), by outcome", ["outcome"], registry=r)
        self.leader = Gauge("kf_culler_leader", "1 while this replica holds the lease", registry=r)
        self.long_stopped = Gauge("kf_culler_long_stopped_notebooks", "Notebooks stopped longer than "
                                  "longStoppedDays, by whether they request a GPU", ["gpu"], registry=r)
        self.shards_held = Gauge("kf_culler_shards_held", "With shards: 1 for each shard this replica holds "
                                 "(probes and writes), 0 for the others", ["shard"], registry=r)
        self.brakes_held = Gauge("kf_culler_brakes_held", "1 while the brakes hold every stop (an unusual share "
                                 "of the fleet changed verdict at once: docs/faults.md)", registry=r)
        self.brake_trips = Counter("kf_culler_brake_trips", "Passes in which a brake signal tripped, by signal",
                                   ["signal"], registry=r)
        self.brake_share = Gauge("kf_culler_brake_share", "Each brake signal's namespace-weighted share in the "
                                 "last pass (0-1)", ["signal"], registry=r)
        self.brake_deferred = Counter("kf_culler_brake_deferred", "Stops and warnings left for the next pass by "
                                      "the per-pass caps, or held by the brakes", ["kind"], registry=r)
        self._accounted: dict[tuple[str, str], datetime] = {}
        self._started = time.time()

    def observe_brakes(self, outcome: Outcome | None) -> None:
        if outcome is None:
            return
        self.brakes_held.set(1 if outcome.held else 0)
        for signal in outcome.trips:
            self.brake_trips.labels(signal).inc()
        for signal, share in outcome.shares.items():
            self.brake_share.labels(signal).set(share)
        for kind, keys in (("held-stop", outcome.held_stops), ("deferred-stop", outcome.deferred_stops),
                           ("deferred-warning", outcome.deferred_warnings)):
            if keys:
                self.brake_deferred.labels(kind).inc(len(keys))

    def observe_result(self, r: NotebookResult) -> None:
        if r.reclaim is not None:
            self.reclaims.labels(r.reclaim.partition(":")[0]).inc()
        source = SERVER_SOURCES.get(r.server_type, r.server_type)
        for call in r.calls:
            self.probe_seconds.labels(source).observe(call.seconds)
            if call.error:
                self.probe_errors.labels(source).inc()
        w = r.write
        if w is None or w.outcome != "patched":
            return
        self.api_writes.labels("patch").inc(w.attempts)
        if r.verdict.action == "stop":
            self.stops.labels(r.verdict.rule_id).inc()
        if w.event is not None and w.event != "queued":  # sent with the patch
            self.observe_event(r)

    def observe_event(self, r: NotebookResult) -> None:
        """A result's Event, once sent (after the pass's patches: kf_culler/kube/event_tail.py)."""
        w = r.write
        if w is None or w.event != "created":
            return
        self.api_writes.labels("event").inc()
        if r.verdict.action == "warn":
            self.warnings.labels(r.verdict.rule_id).inc()

    def observe_cycle(self, result: CycleResult) -> None:
        self.cycle_seconds.observe(result.seconds)
        counts = dict.fromkeys(STATES, 0)
        for r in result.results:
            counts[r.verdict.state] = counts.get(r.verdict.state, 0) + 1
        for state, n in counts.items():
            self.notebooks.labels(state).set(n)
        not_taken = {kind: 0 for kind in KINDS}
        for key in not_taken_keys(result):
            kind = SessionKey(*key).kind
            not_taken[kind] = not_taken.get(kind, 0) + 1
        for kind, n in not_taken.items():
            self.not_taken.labels(kind).set(n)

    def observe_long_stopped(self, found: list[LongStopped]) -> None:
        gpu = sum(1 for s in found if s.gpus > 0)
        self.long_stopped.labels("true").set(gpu)
        self.long_stopped.labels("false").set(len(found) - gpu)

    def observe_orphans(self, gpu_orphans_by_namespace: dict[str, int]) -> None:
        for ns in list(self._orphan_namespaces - set(gpu_orphans_by_namespace)):
            self.orphaned.remove(ns)
        for ns, n in gpu_orphans_by_namespace.items():
            self.orphaned.labels(ns).set(n)
        self._orphan_namespaces = set(gpu_orphans_by_namespace)

    def account_reclaimed(self, items: list[tuple[dict[str, Any], dict[str, Any] | None]], now: datetime,
                          gpu_resources: Callable[[dict[str, Any]], tuple[str, ...]],
                          stopped_by_culler: Callable[[dict[str, Any]], bool] | None = None,
                          orphaned: frozenset[tuple[str, str]] = frozenset(),
                          not_taken: frozenset[tuple[str, str]] = frozenset()) -> None:
        """Add GPUs x elapsed time for every notebook this culler stopped and nobody restarted yet (its GPUs
        counted with `gpu_resources(notebook)`, its policy's): stopped, and
        by the culler's own record when one is given (`stopped_by_culler`; else its stopped-by mark), and not
        one whose pod was taken from its StatefulSet (`orphaned`) or whose stop did not take (`not_taken`, rule 1):
        that GPU is still held."""
        seen = set()
        for nb, _pod in items:
            meta = nb.get("metadata") or {}
            ann = meta.get("annotations") or {}
            held = (str(meta.get("namespace")), str(meta.get("name")))
            if STOP_ANNOTATION not in ann or held in orphaned or held in not_taken \
                    or not target_of(nb).stop_is_annotation:  # other targets' stops are not it (docs/targets.md)
                continue
            ours = stopped_by_culler(nb) if stopped_by_culler is not None else (
                ann.get(STOPPED_BY_ANNOTATION) == STOPPED_BY_VALUE)
            if not ours:
                continue
            gpus = gpu_count(nb, None, gpu_resources(nb))
            if gpus <= 0:
                continue
            meta = nb.get("metadata") or {}
            key = (str(meta.get("namespace")), str(meta.get("name")))
            seen.add(key)
            stopped = parse_time(ann.get(STOPPED_AT_ANNOTATION)) or parse_time(ann.get(STOP_ANNOTATION)) or now
            since = self._accounted.get(key, max(stopped, datetime.fromtimestamp(self._started, now.tzinfo)))
            if now > since:
                self.gpu_hours.inc(gpus * (now - since).total_seconds() / 3600)
            self._accounted[key] = now
        for key in list(self._accounted):
            if key not in seen:
                del self._accounted[key]

    def observe_shards(self, held: list[int], count: int) -> None:
        for i in range(count):
            self.shards_held.labels(str(i)).set(1 if i in held else 0)

    def render(self) -> bytes:
        return generate_latest(self.registry)


CONNECTION_TIMEOUT_SECONDS = 10.0  # each read and write of a connection
# The caps and deadlines of connections (kf_culler/slots.py), named here too for the servers' readers.
MAX_CONNECTIONS = slots.MAX_CONNECTIONS
MAX_CONNECTIONS_PER_CLIENT = slots.MAX_PER_CLIENT
REAP_EVERY_SECONDS = 0.2  # how often connections past a deadline are looked for


class BoundedHTTPServer(ThreadingHTTPServer):
    """A thread per connection, within the caps of kf_culler/slots.py: a flood of half-open or slow connections
    from pods costs a bounded number of threads, each ended by its CONNECTION_TIMEOUT_SECONDS per read, its
    header deadline and its whole deadline (one reaper thread per server cuts them), and leaves other
    addresses (the kubelet's liveness probe, Prometheus, another namespace's pods) their slots."""

    request_queue_size = 128  # the listen backlog: a burst of connects is refused by us, not dropped as SYNs

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.slots = slots.Slots()
        self._closed = threading.Event()
        self._reaper = threading.Thread(target=self._reap, name="connection-deadlines", daemon=True)
        self._reaper.start()

    @property
    def refused(self) -> int:
        return self.slots.refused

    def _client(self, client_address: Any) -> str:
        return str(client_address[0]) if isinstance(client_address, tuple) and client_address else "?"

    def process_request(self, request: Any, client_address: Any) -> None:
        admitted, cut = self.slots.open(request, self._client(client_address))
        for sock in cut:
            _cut(sock)
        if not admitted:
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except Exception:
            self.slots.close(request)
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.slots.close(request)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A connection that went away (or was cut) while being answered is no error of the server's."""
        if not isinstance(sys.exc_info()[1], OSError):
            super().handle_error(request, client_address)

    def _reap(self) -> None:
        while not self._closed.wait(REAP_EVERY_SECONDS):
            for sock in self.slots.overdue():
                _cut(sock)

    def server_close(self) -> None:
        self._closed.set()
        super().server_close()


def _cut(sock: Any) -> None:
    """End a connection (its thread then sees the socket closed)."""
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)


Answer = tuple[int, bytes, str, dict[str, str]]  # status, body, Content-Type, extra headers
TEXT = "text/plain; charset=utf-8"


MAX_POST_BYTES = 1024  # a POST's body (a request to extend: {"minutes": N})


class BoundedServer:
    """An HTTP server on a BoundedHTTPServer: `answer(method, target, headers, peer, body)` gives each GET or
    HEAD its response, and each POST to a path `posts` accepts (a body of at most MAX_POST_BYTES); every other
    method gets 405."""

    def __init__(self, address: str, answer: Callable[[str, str, Any, slots.Peer, bytes], Answer], name: str,
                 posts: Callable[[str], bool] = lambda _path: False) -> None:
        host, _, port = address.rpartition(":")

        class Handler(BaseHTTPRequestHandler):
            timeout = CONNECTION_TIMEOUT_SECONDS  # a connection that sends nothing is closed after this
            server: BoundedHTTPServer

            def parse_request(self) -> bool:
                ok = super().parse_request()
                whole = self.server.slots.read(self.request)  # its headers are in: its reading slot is free
                if not whole:  # cut before the end of its headers: no answer
                    self.close_connection = True
                return ok and whole

            def do_HEAD(self) -> None:
                self._answer("HEAD")

            def do_GET(self) -> None:
                self._answer("GET")

            def _refuse(self) -> None:  # read-only: every other method
                self._send(405, b"method not allowed: read-only\n", TEXT, {"Allow": "GET, HEAD", "Connection": "close"})
                self.close_connection = True

            do_PUT = do_PATCH = do_DELETE = do_OPTIONS = _refuse

            def do_POST(self) -> None:
                if not posts(self.path.split("?", 1)[0]):
                    self._refuse()
                    return
                length = self.headers.get("Content-Length")
                if length is None or not length.isdigit():
                    self.close_connection = True
                    self._send(411, b"a POST needs a Content-Length\n", TEXT, {"Connection": "close"})
                    return
                if int(length) > MAX_POST_BYTES:
                    self.close_connection = True
                    self._send(413, b"body too large\n", TEXT, {"Connection": "close"})
                    return
                self._answer("POST", self.rfile.read(int(length)))

            def _answer(self, method: str, sent: bytes = b"") -> None:
                table, sock = self.server.slots, self.request
                peer = slots.Peer(self.server._client(self.client_address), lambda ns: table.claim(sock, ns))
                code, body, ctype, headers = answer(method, self.path, self.headers, peer, sent)
                self._send(code, body, ctype, headers, head=method == "HEAD")

            def _send(self, code: int, body: bytes, ctype: str, headers: dict[str, str], head: bool = False) -> None:
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                for k, v in headers.items():
                    self.send_header(k, v)
                self.end_headers()
                if not head:
                    self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = BoundedHTTPServer((host or "127.0.0.1", int(port)), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, name=name, daemon=True)

    @property
    def port(self) -> int:
        return int(self.server.server_address[1])

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class HealthServer(BoundedServer):
    """Serves /metrics, /healthz (the process answers) and /readyz (caches synced, last pass recent): the
    port the kubelet and Prometheus reach. The verdict API has a port of its own (ApiServer)."""

    def __init__(self, address: str, metrics: Metrics, ready: Callable[[], tuple[bool, str]]) -> None:
        self.metrics = metrics
        self.ready = ready
        self.notes: list[str] = []  # lines /readyz adds to its answer (e.g. "warning: no GPU metrics source ...")
        super().__init__(address, self._answer, "health")

    def _answer(self, method: str, target: str, headers: Any, peer: slots.Peer, body: bytes = b"") -> Answer:
        path = target.split("?", 1)[0]
        if path == "/metrics":
            return 200, self.metrics.render(), CONTENT_TYPE_LATEST, {}
        if path == "/healthz":
            return 200, b"ok\n", TEXT, {}
        if path == "/readyz":
            ok, why = self.ready()
            return 200 if ok else 503, "".join(line + "\n" for line in (why, *self.notes)).encode(), TEXT, {}
        return 404, b"not found\n", TEXT, {}


class ApiServer(BoundedServer):
    """Serves the verdict API under /api/ (docs/verdict-api.md), on a port apart from the health and metrics
    port: every notebook pod may reach this one, only the kubelet and Prometheus the other. Its one POST is a
    request to extend, when the API has an Extender."""

    def __init__(self, address: str, api: Any) -> None:
        """`api`: a kf_culler.verdict_api.VerdictApi."""
        self.api = api
        super().__init__(address, self._answer, "verdict-api", posts=getattr(api, "accepts_post", lambda _p: False))

    def _answer(self, method: str, target: str, headers: Any, peer: slots.Peer, body: bytes = b"") -> Answer:
        if not target.split("?", 1)[0].startswith("/api/"):
            return 404, b"not found\n", TEXT, {}
        r = self.api.handle(method, target, headers, peer, body)
        return r.code, r.body, r.content_type, r.headers
