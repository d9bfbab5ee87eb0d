"""The read-only verdict API (docs/verdict-api.md) on the real API server.

The culler runs as its own ServiceAccount with the shipped RBAC (a dry-run pass fills the verdict store
through service.instrument), checks callers' tokens with TokenReviews as that ServiceAccount, and a
notebook pod's own token (TokenRequest bound to the pod, ServiceAccount default-editor, as Kubeflow's
profiles run notebooks, for the audience kf-culler) reads its own namespace only; the same pod's token
for the API server's own audience reads nothing.
"""

from __future__ import annotations

import base64
import json
import os
import urllib.error
import urllib.request
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException
from support.passes import Passes
from support.target import KubeTarget
from test_hardened_port import forged
from test_rbac import apply, rbac_objects

from kf_culler.config import load_mapping
from kf_culler.cycle import CycleResult, NotebookResult
from kf_culler.kube import POD_LABEL
from kf_culler.kube.tokens import AUDIENCE, REFUSED_REVIEWS_BURST, ReviewUnavailable, TokenReviewer
from kf_culler.local import objects as obj
from kf_culler.local.jupyter import JupyterServer
from kf_culler.local.router import Router
from kf_culler.metrics import ApiServer, Metrics
from kf_culler.model import Verdict
from kf_culler.runner import build_runner
from kf_culler.service import instrument
from kf_culler.slots import Peer
from kf_culler.verdict_api import MAX_LIST_BYTES, MAX_LIST_ITEMS, VerdictApi
from kf_culler.verdicts import MAX_ENTRY_BYTES, VerdictStore

CULLER_NS = "kf-culler-api"
EDITOR = "default-editor"


def call(port: int, path: str, token: str | None = None, method: str = "GET") -> tuple[int, dict[str, str], bytes]:
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", method=method, headers=headers,
                                 data=b"{}" if method in ("POST", "PUT", "PATCH") else None)
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as err:
        return err.code, dict(err.headers), err.read()


def notebook_pod(api: Any, namespace: str, name: str) -> Any:
    """`<name>-0`, run by ServiceAccount default-editor (as Kubeflow's notebook pods are), Running an hour."""
    core = client.CoreV1Api(api)
    owner = obj.pod_owner(obj.notebook_statefulset(api, namespace, name))
    pod = core.create_namespaced_pod(namespace, {
        "metadata": {"name": f"{name}-0", "labels": {POD_LABEL: name, "statefulset": name}, "ownerReferences": owner},
        "spec": {"serviceAccountName": EDITOR, "automountServiceAccountToken": False,
                 "containers": [{"name": name, "image": "notebook:local"}]}})
    started = (datetime.now(UTC) - timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
    core.patch_namespaced_pod_status(pod.metadata.name, namespace, {"status": {
        "phase": "Running", "startTime": started, "conditions": [{"type": "Ready", "status": "True"}]}})
    return pod


def pod_token(api: Any, pod: Any, audience: str | None = AUDIENCE) -> str:
    """The token the kubelet would project into the pod: TokenRequest for its ServiceAccount, bound to it, for
    `audience` (the projected volume of docs/ide-extension.md's PodDefault), or for the API server's own
    audience when None (the pod's default token)."""
    spec: dict[str, Any] = {"expirationSeconds": 3600, "boundObjectRef": {
        "kind": "Pod", "apiVersion": "v1", "name": pod.metadata.name, "uid": pod.metadata.uid}}
    if audience is not None:
        spec["audiences"] = [audience]
    return str(client.CoreV1Api(api).create_namespaced_service_account_token(
        EDITOR, pod.metadata.namespace, {"spec": spec}).status.token)


def ensure(create: Any) -> None:
    try:
        create()
    except ApiException as err:
        if err.status != 409:
            raise


@pytest.mark.cluster
def test_verdicts_readable_by_own_namespace_only(kube: KubeTarget, api: Any, namespace: str) -> None:
    core = client.CoreV1Api(api)
    other = f"{namespace}-b"
    ensure(lambda: core.create_namespace({"metadata": {"name": CULLER_NS}}))
    core.create_namespace({"metadata": {"name": other}})
    apply(api, rbac_objects(CULLER_NS, cluster_wide=True))
    culler_api = kube.api_client(kube.service_account_kubeconfig(CULLER_NS, "kf-culler"))
    for ns in (namespace, other):
        ensure(lambda ns=ns: core.create_namespaced_service_account(ns, {"metadata": {"name": EDITOR}}))

    extra = [f"nb-{i:02d}" for i in range(12)]
    with Router() as router, JupyterServer(namespace, "nb-a") as server:
        router.add("notebook", namespace, "nb-a", f"http://127.0.0.1:{server.port}", strip=False)
        obj.create_notebook(api, namespace, obj.notebook("nb-a"))
        pod_a = notebook_pod(api, namespace, "nb-a")
        for name in extra:
            obj.create_notebook(api, namespace, obj.notebook(name))
        obj.create_notebook(api, other, obj.notebook("nb-b"))
        pod_b = notebook_pod(api, other, "nb-b")
        settings = load_mapping({"idleMinutes": 30, "warnMinutes": 10, "urls": {"jupyter": router.template()},
                                 "namespaces": {"include": [namespace, other]}}, "test")
        store = VerdictStore()
        # the culler's own identity, writing nothing
        runner = Passes(build_runner(settings, culler_api, dry_run=True, records_namespace=CULLER_NS))
        runner.runner = instrument(runner.runner, Metrics(), None, store)
        reviewer = TokenReviewer(culler_api)
        http = ApiServer("127.0.0.1:0", VerdictApi(store, reviewer))
        http.start()
        try:
            token_a, token_b = pod_token(api, pod_a), pod_token(api, pod_b)
            # Before any pass: nothing to show yet.
            code, _, body = call(http.port, f"/api/v1/namespaces/{namespace}/notebooks/nb-a", token_a)
            assert code == 503 and json.loads(body)["reason"] == "ServiceUnavailable"
            with runner:
                result = runner.once()
            assert {r.name for r in result.results} == {"nb-a", "nb-b", *extra}
            assert store.passes == 1

            code, headers, body = call(http.port, f"/api/v1/namespaces/{namespace}/notebooks/nb-a", token_a)
            assert code == 200, body
            assert headers["Content-Type"] == "application/json"
            doc = json.loads(body)
            print("EXAMPLE", json.dumps(doc, indent=2))
            assert doc["kind"] == "NotebookVerdict" and (doc["namespace"], doc["name"]) == (namespace, "nb-a")
            v = doc["verdict"]
            assert {"state", "action", "reason", "rule", "idleSince", "warnAt", "stopAt", "evidence"} <= set(v)
            # A Jupyter server with no kernel and no use: idle since its start, warned at 20 min, stopped at 30.
            assert (v["state"], v["action"]) == ("idle", "keep"), v
            assert v["idleSince"] and v["warnAt"] and v["stopAt"] and v["rule"]
            assert v["evidence"]["jupyter"]["read"] is True
            assert doc["passTime"] == result.now.strftime("%Y-%m-%dT%H:%M:%SZ")
            assert len(body) <= MAX_ENTRY_BYTES + 64

            # HEAD: the same answer without a body.
            code, headers, body = call(http.port, f"/api/v1/namespaces/{namespace}/notebooks/nb-a", token_a, "HEAD")
            assert code == 200 and body == b"" and int(headers["Content-Length"]) > 0

            # The namespace's list, sorted by name, and paged with ?limit= and ?continue=.
            code, _, body = call(http.port, f"/api/v1/namespaces/{namespace}/notebooks", token_a)
            listed = json.loads(body)
            assert code == 200 and listed["kind"] == "NotebookVerdictList"
            names = [i["name"] for i in listed["items"]]
            assert names == sorted(["nb-a", *extra]) and listed["continue"] is None
            assert all(i["namespace"] == namespace for i in listed["items"])
            seen, cont = [], ""
            while True:
                code, _, body = call(http.port, f"/api/v1/namespaces/{namespace}/notebooks?limit=5&continue={cont}",
                                     token_a)
                page = json.loads(body)
                assert code == 200 and len(page["items"]) <= 5
                seen += [i["name"] for i in page["items"]]
                if not page["continue"]:
                    break
                cont = page["continue"]
            assert seen == names

            # Another namespace: 403, for the notebook and for the list; B's own token reads B.
            for path in (f"/api/v1/namespaces/{other}/notebooks/nb-b", f"/api/v1/namespaces/{other}/notebooks"):
                code, _, body = call(http.port, path, token_a)
                assert code == 403 and json.loads(body)["reason"] == "Forbidden", body
            assert call(http.port, f"/api/v1/namespaces/{other}/notebooks/nb-b", token_b)[0] == 200
            assert call(http.port, f"/api/v1/namespaces/{namespace}/notebooks/nb-a", token_b)[0] == 403

            # The pod's default token (the API server's audience, not kf-culler's): 401, after a TokenReview
            # that asked for the audience kf-culler.
            plain = pod_token(api, pod_a, audience=None)
            code, headers, body = call(http.port, f"/api/v1/namespaces/{namespace}/notebooks/nb-a", plain)
            assert code == 401 and "invalid_token" in headers["WWW-Authenticate"], body
            assert not reviewer.review(plain).authenticated

            # The verdict API has a port of its own: /metrics and /healthz are not on it.
            for path in ("/metrics", "/healthz", "/readyz"):
                assert call(http.port, path, token_a)[0] == 404, path

            # No token, a garbage token, another scheme: 401.
            for token in (None, "garbage", "eyJhbGciOiJSUzI1NiJ9.e30.c2ln"):
                code, headers, _ = call(http.port, f"/api/v1/namespaces/{namespace}/notebooks/nb-a", token)
                assert code == 401 and headers["WWW-Authenticate"].startswith("Bearer"), token
            basic = urllib.request.Request(f"http://127.0.0.1:{http.port}/api/v1/namespaces/{namespace}/notebooks",
                                           headers={"Authorization": "Basic dTpw"})
            with pytest.raises(urllib.error.HTTPError) as err:
                urllib.request.urlopen(basic, timeout=30)
            assert err.value.code == 401

            # Unknown notebook in one's own namespace: 404. Writes: 405 whoever asks.
            code, _, body = call(http.port, f"/api/v1/namespaces/{namespace}/notebooks/nope", token_a)
            assert code == 404 and json.loads(body)["reason"] == "NotFound"
            for method in ("POST", "PUT", "PATCH", "DELETE"):
                code, headers, _ = call(http.port, f"/api/v1/namespaces/{namespace}/notebooks/nb-a", token_a, method)
                assert code == 405 and headers["Allow"] == "GET, HEAD", method
            assert obj.get_notebook(api, namespace, "nb-a")["metadata"]["annotations"].keys() == \
                obj.notebook("nb-a")["metadata"]["annotations"].keys()  # a dry-run pass and reads wrote nothing

            # A token is asked about once, then cached briefly.
            before = reviewer.reviews
            for _ in range(3):
                assert call(http.port, f"/api/v1/namespaces/{namespace}/notebooks/nb-a", token_a)[0] == 200
            assert reviewer.reviews == before
        finally:
            http.stop()
            runner.close()

    # The pod's token dies with the pod: a fresh reviewer (no cache) gets 401 from the API server.
    core.delete_namespaced_pod(pod_a.metadata.name, namespace, grace_period_seconds=0)
    fresh = TokenReviewer(culler_api)
    deadline = datetime.now(UTC) + timedelta(seconds=30)
    while fresh.review(token_a).authenticated and datetime.now(UTC) < deadline:
        fresh = TokenReviewer(culler_api)
    assert not fresh.review(token_a).authenticated


@pytest.mark.cluster
def test_token_review_needs_the_shipped_rule(kube: KubeTarget, api: Any, namespace: str) -> None:
    """Without the ClusterRole's tokenreviews rule the API server refuses the review: the API answers 503."""
    nobody = kube.api_client(kube.service_account_kubeconfig(namespace, "nobody"))
    token = str(client.CoreV1Api(api).create_namespaced_service_account_token(
        "nobody", namespace, {"spec": {"audiences": [AUDIENCE], "expirationSeconds": 600}}).status.token)
    with pytest.raises(ReviewUnavailable, match="HTTP 403"):
        TokenReviewer(nobody).review(token)
    store = VerdictStore()
    store.update(CycleResult(datetime.now(UTC), datetime.now(UTC), 0.0, []))
    r = VerdictApi(store, TokenReviewer(nobody)).handle("GET", f"/api/v1/namespaces/{namespace}/notebooks",
                                                        {"Authorization": f"Bearer {token}"})
    assert r.code == 503


@pytest.mark.cluster
def test_garbage_tokens_cost_a_bounded_number_of_token_reviews(api: Any, namespace: str) -> None:
    """1,000 bad tokens through the verdict API from 10 addresses, on the real API server: 500 JWT-shaped
    garbage, 500 forged with kf-culler's claims (audience, expiry, a ServiceAccount) but signed by nobody. The
    API server is asked at most REFUSED_REVIEWS_BURST times per address (the clock stands still: no budget
    refills), each bad token is answered 401 or 429, and a good token reviewed before stays cached (it is not
    reviewed again), though each cache holds only 256 entries."""
    core = client.CoreV1Api(api)
    core.create_namespaced_service_account(namespace, {"metadata": {"name": EDITOR}})
    good = str(core.create_namespaced_service_account_token(EDITOR, namespace, {"spec": {
        "audiences": [AUDIENCE], "expirationSeconds": 3600}}).status.token)
    now = datetime.now(UTC)
    store = VerdictStore()
    store.update(CycleResult(now, now, 0.0, [NotebookResult(namespace, "nb", "jupyter", 0,
                                                            Verdict("keep", "active", "works", "9-active"), {})]))
    reviewer = TokenReviewer(api, max_entries=256, clock=lambda: 1000.0)
    verdicts = VerdictApi(store, reviewer)
    path = f"/api/v1/namespaces/{namespace}/notebooks/nb"

    def get(token: str, source: str) -> int:
        return verdicts.handle("GET", path, {"Authorization": f"Bearer {token}"}, Peer(source)).code

    assert get(good, "10.9.0.1") == 200 and reviewer.reviews == 1
    codes: dict[int, int] = {}
    for i in range(1000):
        if i % 2:
            token = forged(i, sub=f"system:serviceaccount:{namespace}:{EDITOR}")
        else:
            token = ".".join(base64.urlsafe_b64encode(os.urandom(n)).rstrip(b"=").decode() for n in (30, 200, 256))
        code = get(token, f"10.9.1.{i % 10}")
        codes[code] = codes.get(code, 0) + 1
    assert set(codes) <= {401, 429} and codes.get(429), codes
    assert 1 <= reviewer.reviews - 1 <= 10 * REFUSED_REVIEWS_BURST, reviewer.reviews
    seen = reviewer.reviews
    assert get(good, "10.9.0.1") == 200 and reviewer.reviews == seen  # still cached
    assert get(good, "10.9.1.0") == 200  # an address out of budget still reads with a good, cached token


class Trusting:
    """A reviewer that accepts the token "ns:<namespace>" (for the size tests, which need no cluster)."""

    reviews = 0

    def review(self, token: str, client: str = "") -> Any:
        from kf_culler.kube.tokens import Identity, identity_from

        if token.startswith("ns:"):
            return identity_from(f"system:serviceaccount:{token[3:]}:{EDITOR}")
        return Identity(False)


def test_response_size_is_bounded_with_many_notebooks() -> None:
    """1,200 notebooks with oversized reasons and evidence: every entry ≤ 4 KiB, a page ≤ 500 items and
    ≤ 1 MiB, and following `continue` visits every notebook exactly once."""
    now = datetime.now(UTC)
    huge = {"jupyter": {"read": True, "kernels": ["k" * 300] * 50, **{f"f{i}": "x" * 5000 for i in range(40)}},
            **{f"src{i}": {"read": False, "error": "e" * 9000} for i in range(20)}}
    results = [NotebookResult("team", f"nb-{i:04d}", "jupyter", 0,
                              Verdict("keep", "no-signal", "why " * 2000, "8-no-signal", evidence=huge), {})
               for i in range(1200)]
    store = VerdictStore()
    store.update(CycleResult(now, now, 1.0, results))
    api = VerdictApi(store, Trusting())  # type: ignore[arg-type]
    auth = {"Authorization": "Bearer ns:team"}
    one = api.handle("GET", "/api/v1/namespaces/team/notebooks/nb-0007", auth)
    assert one.code == 200 and len(one.body) <= MAX_ENTRY_BYTES + 64
    assert len(json.loads(one.body)["verdict"]["reason"]) == 1000
    seen: list[str] = []
    cont = ""
    pages = 0
    while True:
        r = api.handle("GET", f"/api/v1/namespaces/team/notebooks?continue={cont}", auth)
        assert r.code == 200 and len(r.body) <= MAX_LIST_BYTES
        page = json.loads(r.body)
        assert len(page["items"]) <= MAX_LIST_ITEMS
        seen += [i["name"] for i in page["items"]]
        pages += 1
        if not page["continue"]:
            break
        cont = page["continue"]
    assert seen == [f"nb-{i:04d}" for i in range(1200)] and pages >= 3
    assert api.handle("GET", "/api/v1/namespaces/team/notebooks?limit=100000", auth).code == 200
    assert api.handle("GET", "/api/v1/namespaces/team/notebooks?limit=x", auth).code == 400
    assert api.handle("GET", "/api/v1/namespaces/Team/notebooks", auth).code == 404  # not a namespace name
    assert api.handle("GET", "/api/v1/namespaces/other/notebooks", auth).code == 403


def test_other_targets_sessions_are_read_by_their_resource() -> None:
    """A Workspace's and a workload's verdicts (named `Workspace/<name>`, `Deployment/<name>` in a pass) are read at
    .../workspaces/<name>, .../deployments/<name>; a Notebook of the same name stays apart."""
    now = datetime.now(UTC)
    results = [NotebookResult("team", name, "jupyter", 0, Verdict("keep", "active", f"{name} works", "9-active"), {})
               for name in ("same", "Workspace/same", "Deployment/same")]
    store = VerdictStore()
    store.update(CycleResult(now, now, 1.0, results))
    api = VerdictApi(store, Trusting())  # type: ignore[arg-type]
    auth = {"Authorization": "Bearer ns:team"}
    for route, name in (("notebooks", "same"), ("workspaces", "Workspace/same"), ("deployments", "Deployment/same")):
        r = api.handle("GET", f"/api/v1/namespaces/team/{route}/same", auth)
        assert r.code == 200 and json.loads(r.body)["verdict"]["reason"] == f"{name} works", (route, r.body)
    assert api.handle("GET", "/api/v1/namespaces/team/statefulsets/same", auth).code == 404
    assert api.handle("GET", "/api/v1/namespaces/team/pods/same", auth).code == 404  # no such route
    assert api.handle("GET", "/api/v1/namespaces/other/workspaces/same", auth).code == 403
