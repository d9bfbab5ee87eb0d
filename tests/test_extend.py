"""Asking for more time through the verdict API (docs/verdict-api.md, "Asking for more time"), on the real API
server: the culler runs as its own ServiceAccount with the shipped RBAC, a notebook pod's own token (TokenRequest
bound to the pod, for the audience kf-culler) asks to extend its own notebook, and the culler writes keep-until
itself, bounded by the matched policy's maxExtendMinutes, under the base's bound on its own writes
(kustomize/base/writes-policy.yaml, in force in the test's namespaces); its next pass keeps the notebook until
then."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from datetime import timedelta
from typing import Any

import pytest
from kubernetes import client
from support.passes import Passes
from support.target import KubeTarget
from test_rbac import apply, bounded_writes, rbac_objects, writes_bounded
from test_verdict_api import CULLER_NS, EDITOR, ensure, notebook_pod, pod_token

from kf_culler.config import load_mapping
from kf_culler.extend import EVENT_REASON, EXTEND_EVERY_SECONDS, Extender
from kf_culler.kube.tokens import TokenReviewer
from kf_culler.kube.writer import Writer
from kf_culler.local import objects as obj
from kf_culler.local.jupyter import JupyterServer
from kf_culler.local.router import Router
from kf_culler.metrics import ApiServer, Metrics
from kf_culler.model import KEEP_UNTIL_ANNOTATION
from kf_culler.runner import build_runner
from kf_culler.service import instrument
from kf_culler.timeutil import parse_time
from kf_culler.verdict_api import VerdictApi
from kf_culler.verdicts import VerdictStore


def post(port: int, path: str, token: str | None, body: Any) -> tuple[int, dict[str, str], dict[str, Any]]:
    headers = {"Content-Type": "application/json"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", method="POST", headers=headers, data=data)
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, dict(r.headers), json.loads(r.read())
    except urllib.error.HTTPError as err:
        raw = err.read()
        return err.code, dict(err.headers), json.loads(raw) if raw.startswith(b"{") else {"raw": raw.decode()}


def get(port: int, path: str, token: str) -> dict[str, Any]:
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(req, timeout=30) as r:
        doc: dict[str, Any] = json.loads(r.read())
        return doc


@pytest.mark.cluster
def test_a_notebook_asks_for_more_time_within_the_admins_bound(kube: KubeTarget, api: Any, namespace: str) -> None:
    core = client.CoreV1Api(api)
    strict = f"{namespace}-z"  # a namespace whose policy allows no extension
    ensure(lambda: core.create_namespace({"metadata": {"name": CULLER_NS}}))
    core.create_namespace({"metadata": {"name": strict}})
    objs = rbac_objects(CULLER_NS, cluster_wide=True, writes_in=[namespace, strict])
    apply(api, objs)
    culler_api = kube.api_client(kube.service_account_kubeconfig(CULLER_NS, "kf-culler"))
    for ns in (namespace, strict):
        ensure(lambda ns=ns: core.create_namespaced_service_account(ns, {"metadata": {"name": EDITOR}}))

    with bounded_writes(api, objs), Router() as router, JupyterServer(namespace, "nb-a") as server_a, \
            JupyterServer(namespace, "nb-c") as server_c, JupyterServer(strict, "nb-z") as server_z:
        for ns, name, srv in ((namespace, "nb-a", server_a), (namespace, "nb-c", server_c), (strict, "nb-z", server_z)):
            router.add("notebook", ns, name, f"http://127.0.0.1:{srv.port}", strip=False)
            obj.create_notebook(api, ns, obj.notebook(name))
        pods = {name: notebook_pod(api, ns, name) for ns, name in ((namespace, "nb-a"), (namespace, "nb-c"),
                                                                  (strict, "nb-z"))}
        writes_bounded(culler_api, namespace, "nb-c")
        settings = load_mapping({"idleMinutes": 30, "warnMinutes": 10, "maxExtendMinutes": 60,
                                 "urls": {"jupyter": router.template()},
                                 "namespaces": {"include": [namespace, strict]},
                                 "namespaceOverrides": {strict: {"maxExtendMinutes": 0}}}, "test")
        store = VerdictStore()
        # it writes, as its own identity
        runner = Passes(build_runner(settings, culler_api, records_namespace=CULLER_NS))
        runner.runner = instrument(runner.runner, Metrics(), None, store)
        tick = [1000.0]
        extender = Extender(store, Writer(culler_api), clock=lambda: tick[0])
        http = ApiServer("127.0.0.1:0", VerdictApi(store, TokenReviewer(culler_api), extender))
        http.start()
        try:
            tokens = {name: pod_token(api, pod) for name, pod in pods.items()}
            base = f"/api/v1/namespaces/{namespace}/notebooks"
            def settled(name: str, token: str, done: Any) -> dict[str, Any]:
                """The verdict of the first pass for which done(verdict) holds (up to a minute of passes): a pass
                reads the cache, which sees a write once its watch does."""
                deadline = time.monotonic() + 60
                while True:
                    runner.once()
                    verdict: dict[str, Any] = get(http.port, f"{base}/{name}", token)["verdict"]
                    if done(verdict) or time.monotonic() > deadline:
                        return verdict

            with runner:
                runner.once()
                first = get(http.port, f"{base}/nb-a", tokens["nb-a"])["verdict"]
                stop_a, latest_a = parse_time(first["stopAt"]), parse_time(first["extendUntil"])
                assert stop_a is not None and latest_a == stop_a + timedelta(minutes=60), first

                # Within the bound: the planned stop plus 30 minutes, written by the culler, with an Event.
                code, _, doc = post(http.port, f"{base}/nb-a/extend", tokens["nb-a"], {"minutes": 30})
                print("EXTENDED", json.dumps(doc, indent=2))
                assert code == 200, doc
                until = stop_a + timedelta(minutes=30)
                assert parse_time(doc["keepUntil"]) == until and doc["clamped"] is False
                written = obj.get_notebook(api, namespace, "nb-a")["metadata"]["annotations"]
                assert parse_time(written[KEEP_UNTIL_ANNOTATION]) == until
                events = [e for e in core.list_namespaced_event(namespace).items if e.reason == EVENT_REASON]
                assert len(events) == 1 and events[0].involved_object.name == "nb-a", events
                assert f"system:serviceaccount:{namespace}:{EDITOR}" in events[0].message
                assert doc["keepUntil"] in events[0].message and "pod nb-a-0" in events[0].message

                # Once per EXTEND_EVERY_SECONDS per session: 429 with Retry-After.
                code, headers, doc = post(http.port, f"{base}/nb-a/extend", tokens["nb-a"], {"minutes": 30})
                assert code == 429 and 0 < int(headers["Retry-After"]) <= EXTEND_EVERY_SECONDS, doc

                # Another session's token (same namespace, same ServiceAccount, another pod): refused.
                code, _, doc = post(http.port, f"{base}/nb-c/extend", tokens["nb-a"], {"minutes": 30})
                assert code == 403 and doc["reason"] == "Forbidden", doc
                assert KEEP_UNTIL_ANNOTATION not in obj.get_notebook(api, namespace, "nb-c")["metadata"]["annotations"]

                # More than the bound: clamped to the planned stop plus maxExtendMinutes.
                code, _, doc = post(http.port, f"{base}/nb-c/extend", tokens["nb-c"], {"minutes": 600})
                latest_c = parse_time(get(http.port, f"{base}/nb-c", tokens["nb-c"])["verdict"]["extendUntil"])
                assert code == 200 and doc["clamped"] is True and parse_time(doc["keepUntil"]) == latest_c, doc

                # The admin allows no extension (maxExtendMinutes 0): refused, nothing written.
                code, _, doc = post(http.port, f"/api/v1/namespaces/{strict}/notebooks/nb-z/extend", tokens["nb-z"],
                                    {"minutes": 30})
                assert code == 403 and doc["reason"] == "ExtensionNotAllowed", doc
                assert KEEP_UNTIL_ANNOTATION not in obj.get_notebook(api, strict, "nb-z")["metadata"]["annotations"]

                # Malformed requests; the pod's default token; GET on the route.
                for body in ({"minutes": 0}, {"minutes": "60"}, {"minutes": 1.5}, b"not json", []):
                    assert post(http.port, f"{base}/nb-c/extend", tokens["nb-c"], body)[0] == 400, body
                plain = pod_token(api, pods["nb-c"], audience=None)
                assert post(http.port, f"{base}/nb-c/extend", plain, {"minutes": 5})[0] == 401
                assert post(http.port, f"{base}/nb-c/extend", None, {"minutes": 5})[0] == 401
                assert post(http.port, f"{base}/nb-c", tokens["nb-c"], {"minutes": 5})[0] == 405

                # The culler's next pass keeps nb-a until the time it answered, and says why.
                after = settled("nb-a", tokens["nb-a"], lambda v: parse_time(v["stopAt"]) == until)
                assert parse_time(after["stopAt"]) == until, after
                assert "at the user's request" in after["reason"], after
                assert parse_time(get(http.port, f"{base}/nb-c", tokens["nb-c"])["verdict"]["stopAt"]) == latest_c

                # Past the rate limit, asking again moves the stop on, within the same bound.
                tick[0] += EXTEND_EVERY_SECONDS
                code, _, doc = post(http.port, f"{base}/nb-a/extend", tokens["nb-a"], {"minutes": 45})
                assert code == 200 and doc["clamped"] is True and parse_time(doc["keepUntil"]) == latest_a, doc
                after = settled("nb-a", tokens["nb-a"], lambda v: parse_time(v["stopAt"]) == latest_a)
                assert parse_time(after["stopAt"]) == latest_a and after["action"] == "keep", after
                tick[0] += EXTEND_EVERY_SECONDS
                code, _, doc = post(http.port, f"{base}/nb-a/extend", tokens["nb-a"], {"minutes": 5})
                assert code == 409 and doc["reason"] == "AtLongestExtension", doc

                # The user-writable annotation keeps working: an earlier keep-until of the user's own is honoured.
                mine = (stop_a + timedelta(minutes=10)).strftime("%Y-%m-%dT%H:%M:%SZ")
                obj.patch_annotations(api, namespace, "nb-a", {KEEP_UNTIL_ANNOTATION: mine})
                assert settled("nb-a", tokens["nb-a"], lambda v: v["stopAt"] == mine)["stopAt"] == mine
        finally:
            http.stop()
            runner.close()



def test_what_a_request_is_granted() -> None:
    """`grant` over a verdict entry: the planned stop plus the minutes asked, clamped to extendUntil; refused
    when the policy allows none, nothing is planned, the session is stopping, or it is at its longest."""
    from kf_culler.extend import Granted, Refusal, grant, minutes_asked

    def entry(**verdict: Any) -> dict[str, Any]:
        return {"verdict": {"action": "warn", "state": "idle", "stopAt": "2026-12-02T13:00:00Z",
                            "extendUntil": "2026-12-02T14:00:00Z", **verdict}}

    ok = grant(entry(), 60, 30, "nb")
    assert isinstance(ok, Granted) and ok.keep_until == parse_time("2026-12-02T13:30:00Z") and not ok.clamped
    capped = grant(entry(), 60, 600, "nb")
    assert isinstance(capped, Granted) and capped.keep_until == parse_time("2026-12-02T14:00:00Z") and capped.clamped
    for e, max_extend, reason in ((entry(), 0, "ExtensionNotAllowed"),
                                  (entry(extendUntil=None), 60, "NoStopPlanned"),
                                  (entry(stopAt=None, action="keep"), 60, "NoStopPlanned"),
                                  (entry(action="stop"), 60, "Stopped"),
                                  (entry(stopAt="2026-12-02T14:00:00Z"), 60, "AtLongestExtension")):
        refused = grant(e, max_extend, 30, "nb")
        assert isinstance(refused, Refusal) and refused.reason == reason, (e, refused)
    assert minutes_asked(b'{"minutes": 90}') == 90
    for bad in (b"", b"{}", b'{"minutes": true}', b'{"minutes": -1}', b'{"minutes": 1e9}', b"[1]", b"\xff"):
        assert isinstance(minutes_asked(bad), Refusal), bad
