"""probe.authProxy: the prober token goes to the workbench's kube-rbac-proxy URLs only (built from the admin's
urls.jupyter / urls.codeServer templates), over TLS verified against the configured CA, never over plain HTTP,
never after a redirect, never to a Workspace's or workload's URL, and a namespace's token only to that namespace's
URLs; the token file is re-read when it changes (and allowed for one namespace only) and each namespace's
TokenRequest token is renewed at half its life. The real proxy and API server: tests/test_odh_controllers.py."""

from __future__ import annotations

import asyncio
import http.server
import os
import socket
import ssl
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from kf_culler.config import AuthProxySettings, ConfigError, ProbeSettings, load_mapping
from kf_culler.gather import Request, gather
from kf_culler.kube.prober import ProberTokens, ProxyAuth, prober_name
from kf_culler.local.pki import Authority
from kf_culler.local.prometheus import StubServer, json_reply
from kf_culler.sources.http import Fetcher

TOKEN = "prober.token.value"


class TlsServer:
    """HTTPS on 127.0.0.1 with a certificate of `authority`: answers `[]` (or a 302 to `redirect`) and records
    each request's path and headers."""

    def __init__(self, authority: Authority, stem: str, redirect: str | None = None) -> None:
        seen: list[tuple[str, dict[str, str]]] = []
        self.seen = seen

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                seen.append((self.path, {k.lower(): v for k, v in self.headers.items()}))
                if redirect is not None:
                    self.send_response(302)
                    self.send_header("Location", redirect)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                body = b"{}" if "/api/status" in self.path else b"[]"
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        pair = authority.issue(stem, "proxy", server=True)
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(str(pair.cert), str(pair.key))
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.socket = ctx.wrap_socket(self.server.socket, server_side=True)
        self.port = int(self.server.server_address[1])
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def base(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def __enter__(self) -> TlsServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture()
def ca(tmp_path: Path) -> Authority:
    (tmp_path / "ca").mkdir()
    return Authority(tmp_path / "ca", name="service-ca")


def ops_for(template: str, **auth: Any) -> Any:
    return load_mapping({"urls": {"jupyter": template, "codeServer": template},
                         "probe": {"retries": 0, "authProxy": {"enabled": True, "serviceAccount": "kf-culler-prober",
                                                               **auth}}},
                        "test").operations


def tls_for(authority: Authority) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(authority.pair.cert))


def test_the_mode_is_off_by_default_and_its_keys_name_themselves() -> None:
    assert load_mapping({}, "t").operations.probe.auth_proxy.enabled is False
    with pytest.raises(ConfigError, match=r"probe\.authProxy\.tokenFil'"):
        load_mapping({"probe": {"authProxy": {"tokenFil": "/x"}}}, "t")
    with pytest.raises(ConfigError, match=r"exactly one of probe\.authProxy\.serviceAccount and probe\.authProxy\.t"):
        load_mapping({"probe": {"authProxy": {"enabled": True}}}, "t")
    with pytest.raises(ConfigError, match="exactly one"):
        load_mapping({"probe": {"authProxy": {"enabled": True, "tokenFile": "/x", "serviceAccount": "p"}}}, "t")
    with pytest.raises(ConfigError, match=r"urls.jupyter: probe.authProxy sends a token .* must start with https://"):
        load_mapping({"probe": {"authProxy": {"enabled": True, "serviceAccount": "kf-culler-prober"}}}, "t")
    with pytest.raises(ConfigError, match="expirationSeconds"):
        load_mapping({"probe": {"authProxy": {"expirationSeconds": 60}}}, "t")
    # One token file is one identity: refused unless exactly one namespace is probed.
    https = {"jupyter": "https://{name}.{namespace}.svc/", "codeServer": "https://{name}.{namespace}.svc/c/"}
    for include in ([], ["a", "b"]):
        with pytest.raises(ConfigError, match=r"tokenFile is one token for every namespace probed: it needs "
                                              r"namespaces.include to name exactly one namespace"):
            load_mapping({"urls": https, "namespaces": {"include": include},
                          "probe": {"authProxy": {"enabled": True, "tokenFile": "/x"}}}, "t")
    assert load_mapping({"urls": https, "namespaces": {"include": ["a"]},
                         "probe": {"authProxy": {"enabled": True, "tokenFile": "/x"}}}, "t")
    with pytest.raises(ConfigError, match="serviceAccount"):  # a name prefix: a DNS label with room for the hash
        load_mapping({"probe": {"authProxy": {"serviceAccount": "p" * 53}}}, "t")


def test_each_namespace_has_its_own_prober_named_from_it() -> None:
    names = {prober_name("kf-culler-prober", ns) for ns in ("team-a", "team-b", "team-a-b", "a")}
    assert len(names) == 4 and prober_name("kf-culler-prober", "team-a") == prober_name("kf-culler-prober", "team-a")
    assert all(len(n) == len("kf-culler-prober-") + 10 and n.startswith("kf-culler-prober-") for n in names)


def test_a_fetcher_holding_the_token_never_sends_it_over_plain_http() -> None:
    with StubServer(lambda _: json_reply([])) as stub:
        async def go() -> Any:
            f = Fetcher.open(ProbeSettings(), 4, authorization=f"Bearer {TOKEN}")
            try:
                return await f.get_json(stub.url + "/x")
            finally:
                await f.close()

        body, call = asyncio.run(go())
        assert stub.requests() == []
    assert "https only" in body["error"] and call.status is None


def test_a_redirect_is_not_followed_so_the_token_goes_nowhere_else(ca: Authority) -> None:
    with StubServer(lambda _: json_reply([])) as elsewhere, \
            TlsServer(ca, "proxy", redirect=elsewhere.url + "/steal") as proxy:
        async def go() -> Any:
            f = Fetcher.open(ProbeSettings(retries=0), 4, authorization=f"Bearer {TOKEN}", tls=tls_for(ca))
            try:
                return await f.get_json(proxy.base + "/api/kernels")
            finally:
                await f.close()

        body, call = asyncio.run(go())
        assert call.status == 302 and body == {"error": "HTTP 302"}
        assert [h["authorization"] for _, h in proxy.seen] == [f"Bearer {TOKEN}"]
        assert elsewhere.requests() == []


def test_gather_sends_the_token_to_the_template_urls_only(ca: Authority) -> None:
    with TlsServer(ca, "proxy") as proxy, StubServer(lambda _: json_reply({})) as workspace:
        ops = ops_for(proxy.base + "/notebook/{namespace}/{name}/")
        reqs = [Request("ns", "wb", "wb-0", "jupyter", False),  # a Notebook: the admin's template
                Request("ns", "Workspace/ws", "ws-0", "jupyter", False, url=workspace.url + "/ws/")]
        auth = {"ns": ProxyAuth(header=f"Bearer {TOKEN}", tls=tls_for(ca))}
        got = asyncio.run(gather(reqs, ops, datetime.now(UTC), auth=auth))
        assert "kernels" in got.observations[("ns", "wb")]["jupyter"]
        assert [(p, h.get("authorization")) for p, h in proxy.seen] == [
            (f"/notebook/ns/wb/api/{p}?no_track_activity=1", f"Bearer {TOKEN}") for p in ("status", "kernels",
                                                                                            "terminals")]
        # the Workspace's own URL (its template, not the proxy's) is probed without the token
        assert workspace.requests() and all("authorization" not in r.headers for r in workspace.requests())

        # No token this pass (the TokenRequest failed): the proxy is not asked at all, the reading says why.
        proxy.seen.clear()
        failed = ProxyAuth(error="TokenRequest for ServiceAccount ns/p failed: HTTP 403 Forbidden")
        for given in (None, {}, {"ns": failed},
                      {"other": ProxyAuth(header=f"Bearer {TOKEN}", tls=tls_for(ca))}):  # another namespace's
            got = asyncio.run(gather(reqs[:1], ops, datetime.now(UTC), auth=given))
            error = got.observations[("ns", "wb")]["jupyter"]["error"]
            assert error.startswith("probe.authProxy: ") and error.endswith("; not probed")
        assert proxy.seen == []


def test_a_namespaces_token_goes_to_that_namespaces_urls_only(ca: Authority) -> None:
    """Two namespaces behind one server (so one connection pool could mix them): every request of namespace a
    carries a's token, every request of b carries b's; c has no token this pass and its proxy is not asked."""
    with TlsServer(ca, "proxy") as proxy:
        ops = load_mapping({"concurrency": 1, "urls": {"jupyter": proxy.base + "/notebook/{namespace}/{name}/",
                                                       "codeServer": proxy.base + "/notebook/{namespace}/{name}/c/"},
                            "probe": {"retries": 0, "authProxy": {"enabled": True,
                                                                  "serviceAccount": "kf-culler-prober"}}},
                           "test").operations
        reqs = [Request(ns, wb, f"{wb}-0", "jupyter", False) for ns in ("a", "b", "c") for wb in ("wb1", "wb2")]
        auth = {"a": ProxyAuth(header="Bearer token-of-a", tls=tls_for(ca)),
                "b": ProxyAuth(header="Bearer token-of-b", tls=tls_for(ca)),
                "c": ProxyAuth(error="cannot create RoleBinding c/kf-culler-prober: HTTP 403 Forbidden")}
        got = asyncio.run(gather(reqs, ops, datetime.now(UTC), auth=auth))
        seen = [(p.split("/")[2], h.get("authorization")) for p, h in proxy.seen]
        assert len(seen) == 12 and {ns for ns, _ in seen} == {"a", "b"}
        assert all(header == f"Bearer token-of-{ns}" for ns, header in seen), seen
        for wb in ("wb1", "wb2"):
            assert "kernels" in got.observations[("a", wb)]["jupyter"]
            assert "kernels" in got.observations[("b", wb)]["jupyter"]
            assert got.observations[("c", wb)]["jupyter"]["error"] == \
                "probe.authProxy: cannot create RoleBinding c/kf-culler-prober: HTTP 403 Forbidden; not probed"


def test_a_proxy_whose_certificate_the_ca_does_not_sign_gets_no_byte_of_the_request(ca: Authority,
                                                                                     tmp_path: Path) -> None:
    """The TLS handshake fails on the culler's side before a request is written: a server with a certificate of
    another CA reads nothing decrypted."""
    (tmp_path / "other").mkdir()
    other = Authority(tmp_path / "other", name="not-the-service-ca")
    pair = other.issue("rogue", "rogue", server=True)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(str(pair.cert), str(pair.key))
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    received: list[bytes] = []
    outcome: list[str] = []

    def serve() -> None:
        conn, _ = listener.accept()
        try:
            with ctx.wrap_socket(conn, server_side=True) as tls:
                tls.settimeout(5)
                while chunk := tls.recv(65536):
                    received.append(chunk)
        except (OSError, ssl.SSLError) as err:
            outcome.append(type(err).__name__)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    ops = ops_for(f"https://127.0.0.1:{port}/notebook/{{namespace}}/{{name}}/")
    got = asyncio.run(gather([Request("ns", "wb", "wb-0", "jupyter", False)], ops, datetime.now(UTC),
                             auth={"ns": ProxyAuth(header=f"Bearer {TOKEN}", tls=tls_for(ca))}))
    thread.join(10)
    listener.close()
    assert "CERTIFICATE_VERIFY_FAILED" in got.observations[("ns", "wb")]["jupyter"]["error"]
    assert received == [] and outcome  # the server's handshake failed too: nothing was sent after it


def test_the_token_file_is_read_again_when_it_changes(tmp_path: Path, ca: Authority) -> None:
    path = tmp_path / "token"
    path.write_text("first\n")
    prober = ProberTokens(AuthProxySettings(enabled=True, token_file=str(path), ca_file=str(ca.pair.cert)))
    assert prober.get(["ns"])["ns"].header == "Bearer first"
    path.write_text("second")
    os.utime(path, ns=(1, 1))  # a new modification time whatever the clock's resolution
    assert prober.get(["ns"])["ns"].header == "Bearer second"
    path.unlink()
    error = prober.get(["ns"])["ns"].error
    assert error is not None and error.startswith(f"cannot read probe.authProxy.tokenFile {path}")
    bad_ca = ProberTokens(AuthProxySettings(enabled=True, token_file=str(path), ca_file=str(tmp_path / "none")))
    assert (bad_ca.get(["ns"])["ns"].error or "").startswith("probe.authProxy.caFile")


def test_a_requested_token_is_renewed_at_half_its_life_and_kept_through_a_failed_renewal() -> None:
    """Per namespace: each its own token, renewed on its own schedule; the RoleBinding is checked every pass and a
    namespace whose RoleBinding cannot be made gets no token (the others still do)."""
    now = [0.0]
    answers: dict[str, Iterator[str | Exception]] = {
        "a": iter(["a1", "a2", RuntimeError("down"), RuntimeError("down")]), "b": iter(["b1", "b2"])}
    asked: list[str] = []
    broken: set[str] = set()

    class Fake(ProberTokens):
        def _request(self, namespace: str) -> str:
            self.requests += 1
            got = next(answers[namespace])
            if isinstance(got, Exception):
                raise got
            return got

        def _ensure_binding(self, namespace: str) -> str | None:
            asked.append(namespace)
            return f"cannot create RoleBinding {namespace}/kf-culler-prober: HTTP 403" if namespace in broken else None

    prober = Fake(AuthProxySettings(enabled=True, service_account="kf-culler-prober", expiration_seconds=600),
                  namespace="culler", clock=lambda: now[0])
    assert {ns: a.header for ns, a in prober.get(["a"]).items()} == {"a": "Bearer a1"}
    now[0] = 100
    assert {ns: a.header for ns, a in prober.get(["a", "b"]).items()} == {"a": "Bearer a1", "b": "Bearer b1"}
    now[0] = 299
    assert prober.get(["a"])["a"].header == "Bearer a1" and prober.requests == 2
    now[0] = 301
    got = prober.get({"a", "b"})
    assert (got["a"].header, got["b"].header, prober.requests) == ("Bearer a2", "Bearer b1", 3)
    now[0] = 401
    assert prober.get(["b"])["b"].header == "Bearer b2" and prober.requests == 4
    now[0] = 301 + 400  # renewal fails, a2 has 200 s left: kept
    assert prober.get(["a"])["a"].header == "Bearer a2" and prober.requests == 5
    now[0] = 301 + 560  # fails again with 40 s left: no token, the error names the namespace's ServiceAccount
    auth = prober.get(["a"])["a"]
    assert auth.header is None and auth.error == \
        f"TokenRequest for ServiceAccount culler/{prober_name('kf-culler-prober', 'a')} failed: RuntimeError"
    assert asked == ["a", "a", "b", "a", "a", "b", "b", "a", "a"]  # every namespace's binding, every pass
    broken.add("b")  # its RoleBinding cannot be restored: b's held token is dropped, not sent
    auth = prober.get(["b"])["b"]
    assert auth.header is None and auth.error == "cannot create RoleBinding b/kf-culler-prober: HTTP 403"
