"""The verdict API's connection slots under one tenant's many pods (kf_culler/slots.py), with real sockets on
loopback: each address 127.0.x.y stands for a pod. Connections that send nothing share a pool of their own, in
which a newcomer takes the slot of the address holding most; a request's headers must come within their
deadline; once a token names its namespace, the namespace has MAX_PER_NAMESPACE slots and no more.

The reviewer here trusts the token "ns:<namespace>" (a stand-in for the TokenReview, which
tests/test_verdict_api.py runs on the real API server): these tests are about slots, not tokens."""

from __future__ import annotations

import json
import socket
import threading
import time
from datetime import UTC, datetime

import pytest

from kf_culler import metrics as metrics_module
from kf_culler import slots as slots_module
from kf_culler.cycle import CycleResult, NotebookResult
from kf_culler.kube.tokens import Identity, identity_from
from kf_culler.metrics import ApiServer
from kf_culler.model import Verdict
from kf_culler.slots import Peer, Slots
from kf_culler.verdict_api import VerdictApi
from kf_culler.verdicts import VerdictStore


class Trusting:
    """Accepts the token "ns:<namespace>" as a ServiceAccount of that namespace."""

    reviews = 0

    def review(self, token: str, client: str = "") -> Identity:
        if token.startswith("ns:"):
            return identity_from(f"system:serviceaccount:{token[3:]}:default-editor")
        return Identity(False)


def store() -> VerdictStore:
    now = datetime.now(UTC)
    found = VerdictStore()
    found.update(CycleResult(now, now, 1.0, [
        NotebookResult(ns, "nb", "jupyter", 0, Verdict("keep", "active", f"{ns} works", "9-active"), {})
        for ns in ("team", "other")]))
    return found


def ask(port: int, source: str, namespace: str) -> int:
    """GET namespace/nb from `source` with that namespace's token: the status, or 0 when the server closed the
    connection without an answer."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=10, source_address=(source, 0)) as s:
            s.sendall(f"GET /api/v1/namespaces/{namespace}/notebooks/nb HTTP/1.0\r\n"
                      f"Authorization: Bearer ns:{namespace}\r\n\r\n".encode())
            answer = b""
            while chunk := s.recv(65536):
                answer += chunk
    except OSError:
        return 0
    if not answer.startswith(b"HTTP/1.0 "):
        return 0
    code = int(answer[9:12])
    if code == 200:
        assert json.loads(answer.split(b"\r\n\r\n", 1)[1])["verdict"]["reason"] == f"{namespace} works"
    return code


def test_forty_pods_holding_connections_leave_another_namespace_answered(monkeypatch: pytest.MonkeyPatch) -> None:
    """40 pods of one tenant (127.0.1.1-40) open 8 connections each that send nothing, again before every
    request of another namespace's pod (127.0.2.x): with every deadline far away (so only the sharing of
    slots can make room), each of those requests is answered 200, and the flood holds a bounded number of
    threads."""
    monkeypatch.setattr(slots_module, "HEADER_DEADLINE_SECONDS", 120.0)
    monkeypatch.setattr(slots_module, "CONNECTION_DEADLINE_SECONDS", 120.0)
    monkeypatch.setattr(metrics_module, "CONNECTION_TIMEOUT_SECONDS", 120.0)
    before = threading.active_count()
    server = ApiServer("0.0.0.0:0", VerdictApi(store(), Trusting()))  # type: ignore[arg-type]
    server.start()
    held: list[socket.socket] = []
    codes = []
    try:
        for attempt in range(5):
            for pod in range(40):
                for _ in range(8):
                    s = socket.socket()
                    s.bind((f"127.0.1.{1 + pod}", 0))
                    s.settimeout(5)
                    try:
                        s.connect(("127.0.0.1", server.port))
                    except OSError:
                        s.close()
                        continue
                    held.append(s)
            time.sleep(0.2)
            codes.append(ask(server.port, f"127.0.2.{1 + attempt}", "other"))
        threads = threading.active_count() - before
        assert codes == [200] * 5, codes
        assert server.server.slots.evicted > 0  # the flood's connections were cut for the newcomers
        # The flood's threads: at most the reading pool (and the server's own two).
        assert threads <= slots_module.MAX_READING + 3, threads
        assert ask(server.port, "127.0.1.1", "team") == 200  # a flooding pod's own request is answered too
    finally:
        for s in held:
            s.close()
        server.stop()


def test_a_namespace_holding_all_its_slots_leaves_another_namespace_answered() -> None:
    """MAX_PER_NAMESPACE connections answering namespace team (from as many pods): a further team caller is
    answered 429, a caller of namespace other 200; once one of team's connections ends, team is answered."""
    table = Slots()
    api = VerdictApi(store(), Trusting())  # type: ignore[arg-type]
    pairs: list[tuple[socket.socket, socket.socket]] = []

    def peer(client: str) -> Peer:
        pair = socket.socketpair()
        pairs.append(pair)
        admitted, cut = table.open(pair[0], client)
        assert admitted and not cut
        table.read(pair[0])
        return Peer(client, lambda ns, sock=pair[0]: table.claim(sock, ns))

    auth = {"Authorization": "Bearer ns:team"}
    try:
        for i in range(slots_module.MAX_PER_NAMESPACE):
            assert api.handle("GET", "/api/v1/namespaces/team/notebooks/nb", auth, peer(f"10.1.0.{i}")).code == 200
        refused = api.handle("GET", "/api/v1/namespaces/team/notebooks/nb", auth, peer("10.1.1.1"))
        assert refused.code == 429 and refused.headers["Retry-After"] == "1"
        other = api.handle("GET", "/api/v1/namespaces/other/notebooks/nb", {"Authorization": "Bearer ns:other"},
                           peer("10.2.0.1"))
        assert other.code == 200
        # A caller refused for its token or its namespace takes no namespace slot.
        assert api.handle("GET", "/api/v1/namespaces/other/notebooks/nb", auth, peer("10.1.1.2")).code == 403
        assert table.held()["namespaced"] == slots_module.MAX_PER_NAMESPACE + 1
        table.close(pairs[0][0])
        assert api.handle("GET", "/api/v1/namespaces/team/notebooks/nb", auth, peer("10.1.1.3")).code == 200
    finally:
        for a, b in pairs:
            a.close()
            b.close()


def test_headers_that_trickle_are_cut_at_their_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    """A caller that sends its request line and then one header line every 0.3 s (each read well within the
    read timeout, the whole connection's deadline far away) is cut at the header deadline."""
    monkeypatch.setattr(slots_module, "HEADER_DEADLINE_SECONDS", 1.0)
    monkeypatch.setattr(slots_module, "CONNECTION_DEADLINE_SECONDS", 120.0)
    monkeypatch.setattr(metrics_module, "CONNECTION_TIMEOUT_SECONDS", 120.0)
    server = ApiServer("127.0.0.1:0", VerdictApi(store(), Trusting()))  # type: ignore[arg-type]
    server.start()
    s = socket.create_connection(("127.0.0.1", server.port), timeout=5)
    cut = False
    try:
        s.sendall(b"GET /api/v1/namespaces/team/notebooks/nb HTTP/1.0\r\n")
        for i in range(40):  # 12 s at most
            try:
                s.sendall(f"X-Trickle-{i}: x\r\n".encode())
                s.settimeout(0.3)
                if s.recv(1) == b"":  # the server closed it
                    cut = True
                    break
            except TimeoutError:
                pass
            except OSError:
                cut = True
                break
        assert cut
    finally:
        s.close()
        server.stop()
