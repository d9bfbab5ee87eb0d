"""The culler's HTTP port under a hostile tenant: half-open connections cost bounded threads and end by
themselves; many pods holding connections leave another namespace's caller answered; garbage bearer tokens
cost no TokenReview; TokenReviews at once are bounded."""

from __future__ import annotations

import base64
import json
import socket
import threading
import time
import urllib.error
import urllib.request
from typing import Any

import pytest

from kf_culler import metrics as metrics_module
from kf_culler import slots as slots_module
from kf_culler.kube import tokens
from kf_culler.kube.tokens import ReviewUnavailable, TokenReviewer
from kf_culler.metrics import ApiServer, HealthServer, Metrics
from kf_culler.verdict_api import VerdictApi
from kf_culler.verdicts import VerdictStore


def test_tokens_that_are_not_jwts_cost_no_token_review() -> None:
    reviewer = TokenReviewer(api_client=None)  # any TokenReview would fail: there is no API client
    for garbage in ("x", "Bearer", "a" * 5000, "a.b.c", "<script>.x.y", "aaaaaaaa.bbbbbbbb", "é" * 40,
                    "aaaaaaaa.bbbbbbbb.cccccccc" + "d" * tokens.MAX_TOKEN_BYTES):
        assert not reviewer.review(garbage).authenticated
    assert reviewer.reviews == 0 and reviewer.refused_unasked == 8


def _b64(doc: dict[str, Any]) -> str:
    return base64.urlsafe_b64encode(json.dumps(doc).encode()).rstrip(b"=").decode()


def forged(i: int, aud: Any = (tokens.AUDIENCE,), exp: float | None = None, alg: str = "RS256",
           sub: str = "system:serviceaccount:team:default-editor") -> str:
    """A token shaped and claimed like a ServiceAccount token for kf-culler, signed by nobody."""
    claims = {"aud": list(aud) if isinstance(aud, tuple) else aud, "sub": sub, "jti": f"{i:08d}",
              "exp": int(time.time() + 3600) if exp is None else exp, "iss": "https://kubernetes.default.svc"}
    return f"{_b64({'alg': alg, 'kid': 'k1'})}.{_b64(claims)}.{'s' * 86}"


def test_tokens_whose_claims_cannot_be_ours_cost_no_token_review() -> None:
    """Read without its signature, a token for another audience, expired, unsigned (`alg: none`), without an
    expiry or not a ServiceAccount's is refused without asking the API server (there is none here: any
    TokenReview would fail)."""
    reviewer = TokenReviewer(api_client=None)
    bad = [forged(1, aud=("https://kubernetes.default.svc",)), forged(2, aud="other"), forged(3, aud=[]),
           forged(4, exp=time.time() - 3600), forged(5, alg="none"), forged(6, exp="never"),  # type: ignore[arg-type]
           forged(7, sub="alice@example.com"), forged(8, aud=None),
           "eyJhbGciOiJSUzI1NiJ9." + "A" * 40 + "." + "s" * 40]  # a payload that is not JSON
    for token in bad:
        ident = reviewer.review(token, "10.0.0.1")
        assert not ident.authenticated and ident.error, token
    assert reviewer.reviews == 0 and reviewer.refused_unasked == len(bad)
    assert tokens.unverified_problem(forged(9), tokens.AUDIENCE, time.time()) is None  # only a review may accept


def test_token_reviews_at_once_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tokens, "REVIEW_WAIT_SECONDS", 0.2)
    gate = threading.Event()
    in_flight, peak = [0], [0]
    lock = threading.Lock()

    class Slow(TokenReviewer):
        def _ask(self, token: str) -> Any:
            with lock:
                in_flight[0] += 1
                peak[0] = max(peak[0], in_flight[0])
            gate.wait(5)
            with lock:
                in_flight[0] -= 1
            return tokens.Identity(False, error="no")

    reviewer = Slow(api_client=None)
    outcomes: list[str] = []

    def call(i: int) -> None:
        try:
            reviewer.review(forged(i), f"10.0.0.{i}")
            outcomes.append("answered")
        except ReviewUnavailable:
            outcomes.append("busy")

    threads = [threading.Thread(target=call, args=(i,)) for i in range(20)]
    for t in threads:
        t.start()
    time.sleep(0.5)
    gate.set()
    for t in threads:
        t.join(10)
    assert peak[0] == tokens.MAX_REVIEWS_IN_FLIGHT
    assert outcomes.count("answered") == tokens.MAX_REVIEWS_IN_FLIGHT and outcomes.count("busy") == 16


def test_half_open_connections_from_one_pod_leave_the_probes_their_slots(monkeypatch: pytest.MonkeyPatch) -> None:
    """400 connections from one address that send nothing (127.0.0.2, a tenant's pod) hold at most
    MAX_CONNECTIONS_PER_CLIENT threads; /healthz from another address (127.0.0.1, the kubelet) answers
    meanwhile; every held connection ends by itself."""
    monkeypatch.setattr(metrics_module, "CONNECTION_TIMEOUT_SECONDS", 1.0)
    server = HealthServer("0.0.0.0:0", Metrics(), lambda: (True, "ready"))
    server.start()
    before = threading.active_count()
    held = []
    try:
        for _ in range(400):  # connect, send nothing
            s = socket.socket()
            s.bind(("127.0.0.2", 0))
            s.settimeout(5)
            s.connect(("127.0.0.1", server.port))
            held.append(s)
        time.sleep(0.3)
        threads = threading.active_count() - before
        assert threads <= 2 * metrics_module.MAX_CONNECTIONS_PER_CLIENT, threads  # (and their deadline timers)
        assert server.server.refused > 0  # past the cap: closed at once, no thread
        with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/healthz", timeout=5) as r:
            assert r.status == 200 and r.read() == b"ok\n"
        time.sleep(2.0)  # every held connection timed out: its thread is gone
        assert threading.active_count() - before <= 2
    finally:
        for s in held:
            s.close()
        server.stop()


def test_a_trickling_connection_ends_at_its_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    """A slow client that sends a byte before every read timeout is cut at the connection's deadline."""
    monkeypatch.setattr(metrics_module, "CONNECTION_TIMEOUT_SECONDS", 1.0)
    monkeypatch.setattr(slots_module, "CONNECTION_DEADLINE_SECONDS", 2.0)
    server = HealthServer("127.0.0.1:0", Metrics(), lambda: (True, "ready"))
    server.start()
    s = socket.create_connection(("127.0.0.1", server.port), timeout=5)
    try:
        t0 = time.monotonic()
        cut = False
        while time.monotonic() - t0 < 8:
            try:
                s.sendall(b"G")
                time.sleep(0.5)
            except OSError:
                cut = True
                break
            try:
                s.settimeout(0.01)
                if s.recv(1) == b"":  # the server closed it
                    cut = True
                    break
            except TimeoutError:
                pass
            finally:
                s.settimeout(5)
        assert cut and time.monotonic() - t0 < 6
    finally:
        s.close()
        server.stop()


def test_thousands_of_idle_connections_on_both_ports_leave_liveness_and_metrics_answering(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """2,000 connections that send nothing, from 40 tenant addresses, on the verdict API's port (which every
    pod may reach), and 400 more from two addresses on the health port (which the NetworkPolicy keeps for
    the kubelet and Prometheus): the threads they hold stay under the caps, and /healthz, /readyz and
    /metrics answer all along; once the flood is gone the verdict API's port answers again."""
    monkeypatch.setattr(metrics_module, "CONNECTION_TIMEOUT_SECONDS", 3.0)
    health = HealthServer("0.0.0.0:0", Metrics(), lambda: (True, "ready"))
    verdicts = ApiServer("0.0.0.0:0", VerdictApi(VerdictStore(), TokenReviewer(api_client=None)))
    before = threading.active_count()
    health.start()
    verdicts.start()
    held: list[socket.socket] = []
    try:
        for i in range(2400):
            s = socket.socket()
            s.bind((f"127.0.0.{2 + i % 40}" if i < 2000 else f"127.0.0.{100 + i % 2}", 0))
            s.settimeout(5)
            s.connect(("127.0.0.1", verdicts.port if i < 2000 else health.port))
            held.append(s)
        deadline = time.monotonic() + 10
        turned_away = [lambda: verdicts.server.refused + verdicts.server.slots.evicted,
                       lambda: health.server.refused + health.server.slots.evicted]
        while time.monotonic() < deadline and not all(n() for n in turned_away):
            time.sleep(0.05)
        # Each server's thread count is capped (a connection's thread; the servers' reapers).
        assert threading.active_count() - before <= 4 + 2 * metrics_module.MAX_CONNECTIONS
        assert all(n() > 0 for n in turned_away)  # closed at once, or cut for a newcomer
        for who, path in (("127.0.0.1", "/healthz"), ("127.0.0.1", "/readyz"), ("127.0.0.1", "/metrics")):
            s = socket.create_connection(("127.0.0.1", health.port), timeout=5, source_address=(who, 0))
            s.sendall(f"GET {path} HTTP/1.0\r\n\r\n".encode())
            assert s.recv(64).startswith(b"HTTP/1.0 200"), path
            s.close()
        with pytest.raises(urllib.error.HTTPError) as err:  # the verdict API is not on the health port
            urllib.request.urlopen(f"http://127.0.0.1:{health.port}/api/v1/namespaces/a/notebooks", timeout=5)
        assert err.value.code == 404
        for s in held:
            s.close()
        held.clear()
        deadline = time.monotonic() + 10  # the flood gone, the verdict API's port answers again
        code = 0
        while code != 401 and time.monotonic() < deadline:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{verdicts.port}/api/v1/namespaces/a/notebooks", timeout=5)
            except urllib.error.HTTPError as refused:
                code = refused.code
            except OSError:
                time.sleep(0.1)
        assert code == 401  # answered: no token
    finally:
        for s in held:
            s.close()
        health.stop()
        verdicts.stop()
