"""Open Data Hub / OpenShift AI's own notebook controllers (built from the vendored odh-kubeflow tree) on the local
control plane in "full" mode: the harness in kf_culler.local.odh starts ODH's fork of the notebook-controller and
odh-notebook-controller with its webhooks, and they do to a Notebook what the culler's OpenShift AI overlay will
count on.

- On create, the mutating webhook sets `kubeflow-resource-stopped: odh-notebook-controller-lock`; the fork makes
  the StatefulSet with 0 replicas while it is there; odh-notebook-controller removes it after its first full
  reconcile, and the StatefulSet goes to 1.
- Every Notebook gets `<name>-ctrl-np` (port 8888, only from the controller's namespace) and
  `<name>-kube-rbac-proxy-np` (port 8443, from anywhere), controlled by the Notebook.
- `notebooks.opendatahub.io/inject-auth: "true"` gets the kube-rbac-proxy sidecar on 8443 (SubjectAccessReview:
  `get` on that notebook), its ConfigMap, Service, ServiceAccount and auth-delegator ClusterRoleBinding.
- A stop annotation (a timestamp) scales the StatefulSet to 0 and is left alone; removing it starts it again.
- A stop written while the controller is removing the lock is erased with the lock (a culler's hazard).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from need import missing

from kf_culler.kube.labels import CREATED
from kf_culler.local import procs
from kf_culler.local.cluster import GPU_NODE, LocalCluster
from kf_culler.local.odh import (
    CONTROLLER_NAMESPACE,
    CTRL_NETWORK_POLICY_SUFFIX,
    FINALIZERS,
    FORK,
    INJECT_AUTH_ANNOTATION,
    LOCK_VALUE,
    NOTEBOOK_PORT,
    ODH,
    PROXY_CONFIG_SUFFIX,
    PROXY_CONTAINER,
    PROXY_FINALIZER,
    PROXY_NETWORK_POLICY_SUFFIX,
    PROXY_PORT,
    PROXY_SUFFIX,
    PROXY_TLS_SECRET_SUFFIX,
    UPDATE_PENDING_ANNOTATION,
    WEBHOOK_NAMESPACE_LABEL,
    OdhControllers,
    OdhUnavailable,
    odh_binaries,
    odh_notebook_body,
)
from kf_culler.model import STOP_ANNOTATION

pytestmark = [pytest.mark.cluster]
ROOT = Path(__file__).resolve().parents[1]
TIMEOUT = 90.0
# RemoveReconciliationLock's wait for a pull secret (1 s, then 5 s) and its patch, with a margin.
LOCK_REMOVAL_SECONDS = 9.0
GROUP, VERSION, PLURAL = "kubeflow.org", "v1", "notebooks"


@pytest.fixture(scope="module")
def odh(full_cluster: LocalCluster) -> Iterator[OdhControllers]:
    """ODH's two controllers and their webhooks on the session's full cluster, for this module. Binaries that
    cannot be built are "missing"; controllers that are built but do not come up fail the test."""
    try:
        odh_binaries(quiet=full_cluster.quiet)
    except OdhUnavailable as why:
        missing("ODH's notebook controllers", why)
    controllers = OdhControllers(full_cluster)
    controllers.start()
    try:
        yield controllers
    finally:
        controllers.stop()


@dataclass
class Env:
    odh: OdhControllers
    namespace: str
    api: Any

    @property
    def cluster(self) -> LocalCluster:
        return self.odh.cluster

    def _api(self, name: str) -> Any:
        from kubernetes import client

        return getattr(client, name)(self.api)

    def core(self) -> Any:
        return self._api("CoreV1Api")

    def apps(self) -> Any:
        return self._api("AppsV1Api")

    def custom(self) -> Any:
        return self._api("CustomObjectsApi")

    def net(self) -> Any:
        return self._api("NetworkingV1Api")

    def rbac(self) -> Any:
        return self._api("RbacAuthorizationV1Api")

    def plain(self, obj: Any) -> dict[str, Any]:
        result: dict[str, Any] = self.api.sanitize_for_serialization(obj)
        return result

    def create(self, body: dict[str, Any]) -> dict[str, Any]:
        created: dict[str, Any] = self.custom().create_namespaced_custom_object(GROUP, VERSION, self.namespace,
                                                                                PLURAL, body)
        return created

    def notebook(self, name: str) -> dict[str, Any]:
        nb: dict[str, Any] = self.custom().get_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL,
                                                                        name)
        return nb

    def annotations(self, name: str) -> dict[str, str]:
        return dict(self.notebook(name)["metadata"].get("annotations") or {})

    def annotate(self, name: str, key: str, value: str | None) -> None:
        self.custom().patch_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL, name,
                                                     {"metadata": {"annotations": {key: value}}})

    def statefulset(self, name: str) -> dict[str, Any] | None:
        from kubernetes.client.exceptions import ApiException

        try:
            return self.plain(self.apps().read_namespaced_stateful_set(name, self.namespace))
        except ApiException as err:
            if err.status == 404:
                return None
            raise

    def replicas(self, name: str) -> int | None:
        sts = self.statefulset(name)
        return None if sts is None else int(sts["spec"]["replicas"])

    def pods(self, name: str) -> list[dict[str, Any]]:
        return self.plain(self.core().list_namespaced_pod(self.namespace,
                                                          label_selector=f"statefulset={name}"))["items"]

    def wait(self, what: str, pred: Callable[[], bool], seen: Callable[[], object] | None = None,
             timeout: float = TIMEOUT) -> None:
        try:
            procs.wait_until(pred, timeout, 0.2, what)
        except TimeoutError as err:
            detail = f"; seen: {seen()!r}" if seen is not None else ""
            logs = "\n".join(f"--- {n} ---\n{self.cluster.log_tail(n, 15)}" for n in (FORK, ODH))
            raise AssertionError(f"{err}{detail}\n{logs}") from None

    def running(self, name: str) -> dict[str, Any]:
        """Wait for the lock to be gone, one replica and its pod Running on the kwok node; the StatefulSet."""
        self.wait(f"the lock on {name} removed", lambda: STOP_ANNOTATION not in self.annotations(name),
                  seen=lambda: self.annotations(name))
        self.wait(f"{name}'s StatefulSet at 1 replica", lambda: self.replicas(name) == 1,
                  seen=lambda: self.replicas(name))
        self.wait(f"{name}'s pod Running", lambda: [p["status"].get("phase") for p in self.pods(name)] == ["Running"],
                  seen=lambda: [(p["metadata"]["name"], p["status"].get("phase")) for p in self.pods(name)])
        sts = self.statefulset(name)
        assert sts is not None
        return sts

    def lock_settled(self, name: str) -> None:
        """Wait until no removal of `name`'s lock has started for LOCK_REMOVAL_SECONDS. odh-notebook-controller's
        RemoveReconciliationLock can run a second time, from a reconcile that read its cache before the first
        removal landed; it waits (1 s, then 5 s, for an image pull secret) and then merge-patches the stop
        annotation to null whatever it holds by then (test_stop_written_while_the_lock_is_removed_is_erased), so a
        stop written in between is erased. A test that writes a stop right after the lock is gone waits for this;
        the culler's own start-up grace (10 minutes in the openshift-ai overlay) covers it on a cluster."""
        def removals() -> int:
            return self.odh.log_count("Removing reconciliation lock", notebook=name, namespace=self.namespace)

        seen, quiet_since, deadline = removals(), time.monotonic(), time.monotonic() + TIMEOUT
        while time.monotonic() - quiet_since < LOCK_REMOVAL_SECONDS:
            assert time.monotonic() < deadline, f"{name}'s lock removals never settled ({seen} so far)"
            time.sleep(0.5)
            if (now := removals()) != seen:
                seen, quiet_since = now, time.monotonic()


def controlled_by(obj: dict[str, Any], notebook: dict[str, Any]) -> bool:
    return any(r.get("controller") and r["uid"] == notebook["metadata"]["uid"] and r["kind"] == "Notebook"
               for r in obj["metadata"].get("ownerReferences") or [])


@pytest.fixture()
def env(odh: OdhControllers) -> Iterator[Env]:
    """A fresh namespace the webhooks apply to; on the way out its Notebooks are deleted while the controllers
    run (their finalizers are ODH's), then the namespace, and its pods awaited (the kwok node is shared)."""
    with fresh_namespace(odh) as e:
        yield e


@pytest.fixture()
def env2(odh: OdhControllers) -> Iterator[Env]:
    """A second namespace like `env`'s (another team's)."""
    with fresh_namespace(odh) as e:
        yield e


@contextlib.contextmanager
def fresh_namespace(odh: OdhControllers) -> Iterator[Env]:
    api = odh.cluster.api_client()
    e = Env(odh, f"odh-{uuid.uuid4().hex[:8]}", api)
    e.core().create_namespace({"metadata": {"name": e.namespace, "labels": {WEBHOOK_NAMESPACE_LABEL: "true"}}})
    try:
        yield e
    finally:
        with contextlib.suppress(Exception):
            for nb in e.custom().list_namespaced_custom_object(GROUP, VERSION, e.namespace, PLURAL)["items"]:
                e.custom().delete_namespaced_custom_object(GROUP, VERSION, e.namespace, PLURAL,
                                                           nb["metadata"]["name"])
            procs.wait_until(lambda: not e.custom().list_namespaced_custom_object(
                GROUP, VERSION, e.namespace, PLURAL)["items"], TIMEOUT, 0.2, "the notebooks to be deleted")
        with contextlib.suppress(Exception):
            e.core().delete_namespace(e.namespace)
        procs.wait_until(lambda: not e.core().list_namespaced_pod(e.namespace).items, TIMEOUT, 0.2,
                         f"the pods of namespace {e.namespace} to be deleted")


def test_notebook_gets_lock_statefulset_service_and_network_policies(env: Env) -> None:
    e = env
    created = e.create(odh_notebook_body(e.namespace, "wb1"))
    # The mutating webhook locked it on create: the fork holds the StatefulSet at 0 until the lock goes.
    assert created["metadata"]["annotations"][STOP_ANNOTATION] == LOCK_VALUE
    e.wait("wb1's StatefulSet", lambda: e.statefulset("wb1") is not None)
    if e.annotations("wb1").get(STOP_ANNOTATION) == LOCK_VALUE:
        assert e.replicas("wb1") == 0
    sts = e.running("wb1")
    nb = e.notebook("wb1")
    assert e.odh.logged("Removing reconciliation lock", notebook="wb1", namespace=e.namespace)
    assert set(FINALIZERS) <= set(nb["metadata"].get("finalizers") or [])
    assert UPDATE_PENDING_ANNOTATION not in e.annotations("wb1")

    # The fork's StatefulSet and Service, as upstream Kubeflow's: port 80 -> 8888, selector statefulset=<name>.
    assert controlled_by(sts, nb)
    assert sts["spec"]["template"]["metadata"]["labels"]["notebook-name"] == "wb1"
    [main] = sts["spec"]["template"]["spec"]["containers"]  # no sidecar without inject-auth
    assert main["name"] == "wb1"
    svc = e.plain(e.core().read_namespaced_service("wb1", e.namespace))
    assert controlled_by(svc, nb)
    assert [(p["name"], p["port"], p["targetPort"]) for p in svc["spec"]["ports"]] == \
        [("http-notebook", 80, NOTEBOOK_PORT)]
    assert svc["spec"]["selector"] == {"statefulset": "wb1"}
    [pod] = e.pods("wb1")
    assert pod["spec"]["nodeName"] == GPU_NODE

    # <name>-ctrl-np: the notebook's pod takes TCP 8888 only from pods of the controller's namespace.
    ctrl = e.plain(e.net().read_namespaced_network_policy(f"wb1{CTRL_NETWORK_POLICY_SUFFIX}", e.namespace))
    assert controlled_by(ctrl, nb)
    assert ctrl["spec"] == {
        "podSelector": {"matchLabels": {"notebook-name": "wb1"}},
        "policyTypes": ["Ingress"],
        "ingress": [{"ports": [{"protocol": "TCP", "port": NOTEBOOK_PORT}],
                     "from": [{"namespaceSelector": {"matchLabels": {
                         "kubernetes.io/metadata.name": CONTROLLER_NAMESPACE}}}]}],
    }
    # <name>-kube-rbac-proxy-np: TCP 8443 from anywhere (made for every notebook, with or without the sidecar).
    proxy_np = e.plain(e.net().read_namespaced_network_policy(f"wb1{PROXY_NETWORK_POLICY_SUFFIX}", e.namespace))
    assert controlled_by(proxy_np, nb)
    assert proxy_np["spec"] == {
        "podSelector": {"matchLabels": {"notebook-name": "wb1"}},
        "policyTypes": ["Ingress"],
        "ingress": [{"ports": [{"protocol": "TCP", "port": PROXY_PORT}]}],
    }
    # The HTTPRoute lives in the controller's namespace: /notebook/<ns>/<name> -> Service <name>:8888.
    route = e.custom().get_namespaced_custom_object("gateway.networking.k8s.io", "v1", CONTROLLER_NAMESPACE,
                                                    "httproutes", f"nb-{e.namespace}-wb1")
    [rule] = route["spec"]["rules"]
    assert rule["matches"][0]["path"]["value"] == f"/notebook/{e.namespace}/wb1"
    assert [(b["name"], b["namespace"], b["port"]) for b in rule["backendRefs"]] == [("wb1", e.namespace, 8888)]


def test_inject_auth_adds_kube_rbac_proxy_sidecar_and_its_objects(env: Env) -> None:
    e = env
    created = e.create(odh_notebook_body(e.namespace, "wb2", inject_auth=True))
    assert created["metadata"]["annotations"][INJECT_AUTH_ANNOTATION] == "true"
    sts = e.running("wb2")
    nb = e.notebook("wb2")
    assert PROXY_FINALIZER in nb["metadata"]["finalizers"]

    # The webhook wrote the sidecar into the Notebook; the fork copied it into the StatefulSet.
    spec = sts["spec"]["template"]["spec"]
    assert [c["name"] for c in spec["containers"]] == ["wb2", PROXY_CONTAINER]
    proxy = spec["containers"][1]
    assert proxy["image"] == e.odh.proxy_image
    assert proxy["ports"] == [{"name": "kube-rbac-proxy", "containerPort": PROXY_PORT, "protocol": "TCP"}]
    for arg in (f"--secure-listen-address=0.0.0.0:{PROXY_PORT}", f"--upstream=http://127.0.0.1:{NOTEBOOK_PORT}/",
                "--config-file=/etc/kube-rbac-proxy/config-file.yaml", "--tls-cert-file=/etc/tls/private/tls.crt",
                "--tls-private-key-file=/etc/tls/private/tls.key", "--proxy-endpoints-port=8444",
                "--auth-header-fields-enabled=true", "--auth-header-user-field-name=X-Auth-Request-User"):
        assert arg in proxy["args"]
    assert proxy["readinessProbe"]["httpGet"] == {"path": "/healthz", "port": 8444, "scheme": "HTTPS"}
    assert spec["serviceAccountName"] == "wb2"
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes["kube-rbac-proxy-config"]["configMap"]["name"] == f"wb2{PROXY_CONFIG_SUFFIX}"
    assert volumes["kube-rbac-proxy-tls-certificates"]["secret"]["secretName"] == f"wb2{PROXY_TLS_SECRET_SUFFIX}"

    # What the proxy authorises: a SubjectAccessReview for `get` on this notebook.
    cm = e.plain(e.core().read_namespaced_config_map(f"wb2{PROXY_CONFIG_SUFFIX}", e.namespace))
    assert controlled_by(cm, nb)
    assert yaml.safe_load(cm["data"]["config-file.yaml"]) == {"authorization": {"resourceAttributes": {
        "verb": "get", "resource": "notebooks", "apiGroup": "kubeflow.org", "name": "wb2",
        "namespace": e.namespace}}}
    # Its Service, 8443 -> the container port by name; the serving certificate is OpenShift's service CA's.
    svc = e.plain(e.core().read_namespaced_service(f"wb2{PROXY_SUFFIX}", e.namespace))
    assert [(p["name"], p["port"], p["targetPort"]) for p in svc["spec"]["ports"]] == \
        [("kube-rbac-proxy", PROXY_PORT, "kube-rbac-proxy")]
    assert svc["spec"]["selector"] == {"statefulset": "wb2"}
    assert svc["metadata"]["annotations"]["service.beta.openshift.io/serving-cert-secret-name"] == \
        f"wb2{PROXY_TLS_SECRET_SUFFIX}"
    # The notebook's own ServiceAccount may review tokens and access (system:auth-delegator), cluster-wide.
    sa = e.plain(e.core().read_namespaced_service_account("wb2", e.namespace))
    assert controlled_by(sa, nb)
    crb = e.plain(e.rbac().read_cluster_role_binding(f"wb2-rbac-{e.namespace}-auth-delegator"))
    assert crb["roleRef"]["name"] == "system:auth-delegator"
    assert crb["subjects"] == [{"kind": "ServiceAccount", "name": "wb2", "namespace": e.namespace}]
    # The route goes to the proxy instead of the notebook.
    route = e.custom().get_namespaced_custom_object("gateway.networking.k8s.io", "v1", CONTROLLER_NAMESPACE,
                                                    "httproutes", f"nb-{e.namespace}-wb2")
    assert [(b["name"], b["port"]) for b in route["spec"]["rules"][0]["backendRefs"]] == \
        [(f"wb2{PROXY_SUFFIX}", PROXY_PORT)]


def test_stop_annotation_scales_to_zero_and_is_left_alone(env: Env) -> None:
    e = env
    e.create(odh_notebook_body(e.namespace, "wb3"))
    e.running("wb3")
    e.lock_settled("wb3")
    stopped_at = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    e.annotate("wb3", STOP_ANNOTATION, stopped_at)
    e.wait("wb3 scaled to 0", lambda: e.replicas("wb3") == 0, seen=lambda: e.replicas("wb3"))
    e.wait("wb3's pod deleted", lambda: not e.pods("wb3"))
    # Neither controller touches a stop that is not the lock, and nothing is pending.
    time.sleep(2)
    notes = e.annotations("wb3")
    assert notes[STOP_ANNOTATION] == stopped_at
    assert UPDATE_PENDING_ANNOTATION not in notes
    assert e.replicas("wb3") == 0
    # Removing it (the dashboard's start) brings it back.
    e.annotate("wb3", STOP_ANNOTATION, None)
    e.running("wb3")


def test_stop_written_while_the_lock_is_removed_is_erased(env: Env) -> None:
    """RemoveReconciliationLock waits (up to ~6 s, for an image pull secret OpenShift would add to the notebook's
    ServiceAccount) and then merge-patches the stop annotation to null whatever its value is by then."""
    e = env
    e.create(odh_notebook_body(e.namespace, "wb4"))
    e.wait("odh-notebook-controller to start removing wb4's lock",
           lambda: e.odh.logged("Removing reconciliation lock", notebook="wb4", namespace=e.namespace))
    assert e.annotations("wb4")[STOP_ANNOTATION] == LOCK_VALUE
    e.annotate("wb4", STOP_ANNOTATION, dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"))
    e.wait("the stop annotation erased with the lock", lambda: STOP_ANNOTATION not in e.annotations("wb4"),
           seen=lambda: e.annotations("wb4"), timeout=30)
    e.running("wb4")


class Upstream:
    """A stand-in for the notebook's port 8888 on loopback: answers `[]` and records what reached it."""

    def __init__(self) -> None:
        import http.server
        import threading

        seen: list[tuple[str, str, dict[str, str]]] = []
        self.seen = seen

        class Handler(http.server.BaseHTTPRequestHandler):
            def _answer(self) -> None:
                seen.append((self.command, self.path, dict(self.headers.items())))
                body = b"[]"
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = _answer

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> Upstream:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


def call(url: str, ca: Any, token: str | None, method: str = "GET") -> tuple[int, str]:
    import ssl
    import urllib.error
    import urllib.request

    ctx = ssl.create_default_context(cafile=str(ca))
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    req = urllib.request.Request(url, method=method, headers=headers, data=b"{}" if method == "POST" else None)
    try:
        with urllib.request.urlopen(req, timeout=10, context=ctx) as resp:
            return int(resp.status), resp.read().decode()
    except urllib.error.HTTPError as err:
        return int(err.code), err.read().decode()


def sa_token(e: Env, name: str) -> str:
    from kubernetes.client.exceptions import ApiException

    with contextlib.suppress(ApiException):
        e.core().create_namespaced_service_account(e.namespace, {"metadata": {"name": name}})
    token: str = e.core().create_namespaced_service_account_token(
        name, e.namespace, {"spec": {"expirationSeconds": 3600}}).status.token
    return token


def test_kube_rbac_proxy_admits_a_token_with_get_on_the_notebook_only(env: Env) -> None:
    """The sidecar as injected (its args, its ConfigMap, the notebook's ServiceAccount for TokenReview and
    SubjectAccessReview), built from github.com/brancz/kube-rbac-proxy, in front of a stand-in for port 8888."""
    e = env
    e.create(odh_notebook_body(e.namespace, "wb5", inject_auth=True))
    e.running("wb5")
    e.rbac().create_namespaced_role(e.namespace, {
        "metadata": {"name": "get-wb5"},
        "rules": [{"apiGroups": ["kubeflow.org"], "resources": ["notebooks"], "resourceNames": ["wb5"],
                   "verbs": ["get"]}]})
    e.rbac().create_namespaced_role_binding(e.namespace, {
        "metadata": {"name": "culler-get-wb5"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "get-wb5"},
        "subjects": [{"kind": "ServiceAccount", "name": "culler", "namespace": e.namespace}]})
    outsider, culler = sa_token(e, "outsider"), sa_token(e, "culler")
    path = f"/notebook/{e.namespace}/wb5/api/kernels"
    with Upstream() as upstream:
        sidecar = e.odh.start_sidecar(e.namespace, "wb5", f"http://127.0.0.1:{upstream.port}/")
        try:
            url = sidecar.url + path
            assert call(url, sidecar.ca, None)[0] == 401
            status, text = call(url, sidecar.ca, outsider)
            assert status == 403
            assert f"user=system:serviceaccount:{e.namespace}:outsider, verb=get, resource=notebooks" in text
            assert upstream.seen == []
            assert call(url, sidecar.ca, culler) == (200, "[]")
            [(method, seen_path, headers)] = upstream.seen
            assert (method, seen_path) == ("GET", path)
            assert headers["X-Auth-Request-User"] == f"system:serviceaccount:{e.namespace}:culler"
            assert "Authorization" not in headers  # the bearer token stops at the proxy
            # The verb is the request's method (the ConfigMap's `verb: get` is not a kube-rbac-proxy field).
            status, text = call(url, sidecar.ca, culler, method="POST")
            assert status == 403 and "verb=create" in text
        finally:
            sidecar.stop()


def test_the_culler_stops_an_idle_workbench_and_never_touches_the_lock(env: Env) -> None:
    """kf-culler with the openshift-ai overlay's configuration on workbenches made by ODH's real controllers: while
    `odh-notebook-controller-lock` stands the workbench counts as stopped and nothing is written (a stop written
    then would be erased with the lock); once the controller removed it, an idle workbench is stopped with a
    timestamp, the fork scales it to 0, and the lock's removal is never taken for a restart."""
    from support.passes import Passes

    from kf_culler.config import load_mapping
    from kf_culler.config_layers import load_layered
    from kf_culler.local.jupyter import JupyterServer
    from kf_culler.local.router import Router
    from kf_culler.runner import build_runner

    overlay = load_layered(ROOT / "kustomize" / "overlays" / "openshift-ai" / "config.yaml")
    env.create(odh_notebook_body(env.namespace, "wb"))
    with Router() as router, JupyterServer(env.namespace, "wb") as server:
        router.add("notebook", env.namespace, "wb", f"http://127.0.0.1:{server.port}", strip=False)
        raw = yaml.safe_load((ROOT / "kustomize" / "overlays" / "openshift-ai" / "config.yaml").read_text())
        raw.update(yaml.safe_load((ROOT / "kustomize" / "overlays" / "openshift-ai" / "openshift-ai.fragment.yaml")
                                  .read_text()))
        raw.update({"namespaces": {"include": [env.namespace]}, "idleMinutes": 0.05, "warnMinutes": 0,
                    "startupGraceMinutes": 0.05, "urls": {**raw.get("urls", {}), "jupyter": router.template()}})
        settings = load_mapping(raw, "test")
        assert settings.policy.server_type_by_image == overlay.policy.server_type_by_image
        with Passes(build_runner(settings, env.api, records_namespace=env.namespace)) as runner:
            locked = [r for r in runner.once().results if r.name == "wb"]
            if env.annotations("wb").get(STOP_ANNOTATION) == LOCK_VALUE and locked:
                assert locked[0].verdict.rule_id == "1-stopped" and locked[0].write is None  # the lock: nothing written
            env.running("wb")
            env.lock_settled("wb")
            time.sleep(1)  # the cache sees the lock gone
            deadline = time.monotonic() + 60
            while (r := next(x for x in runner.once().results if x.name == "wb")).verdict.action != "stop":
                assert r.verdict.rule_id != "3-restarted", r.verdict  # the lock's removal is no restart
                assert time.monotonic() < deadline, r.verdict
                time.sleep(1)
    assert r.write is not None and r.write.outcome == "patched", r.write
    stamp = env.annotations("wb")[STOP_ANNOTATION]
    assert stamp != LOCK_VALUE and dt.datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    env.wait("the fork to scale wb to 0", lambda: env.replicas("wb") == 0, seen=lambda: env.replicas("wb"))
    assert env.annotations("wb")[STOP_ANNOTATION] == stamp  # ODH left the culler's stop as it is


# --- probe.authProxy: the culler through the workbench's kube-rbac-proxy ---------------------------------------

PROXY_COMPONENT = ROOT / "kustomize" / "components" / "openshift-ai-proxy-probes"
PROM_TOKEN = "prometheus-token-not-the-probers"


def _apply_rbac(e: Env, objs: list[dict[str, Any]]) -> None:
    from kubernetes import utils

    for o in objs:
        try:
            utils.create_from_dict(e.api, o)
        except utils.FailToCreateError as err:
            if not all(getattr(x, "status", None) == 409 for x in err.api_exceptions):
                raise


@contextlib.contextmanager
def culler_identity(e: Env, tmp_path: Path) -> Iterator[Any]:
    """The base's RBAC with components/openshift-ai-proxy-probes (the prober ClusterRole with only `get notebooks`,
    the culler's rights to make a prober per namespace and mint its tokens) bound in the test's namespace, and the
    component's ValidatingAdmissionPolicy; an API client acting exactly as the culler's ServiceAccount. The
    prober ClusterRole keeps its shipped name (the policy names it; its content is the same for every test)."""
    from kubernetes import client
    from support.kustomize import component_rbac, delete_cluster_rbac, render

    work = tmp_path / "rbac"
    work.mkdir()
    objs = component_rbac("openshift-ai-proxy-probes", e.namespace, work)
    assert {o["metadata"]["name"] for o in objs if o["kind"] == "ServiceAccount"} == {"kf-culler"}
    for o in objs:
        if o["kind"] == "ClusterRole" and o["metadata"]["name"] == f"{PROBER_ROLE}-{e.namespace}":
            o["metadata"]["name"] = PROBER_ROLE
    policies = [o for o in render(work) if o["kind"].startswith("ValidatingAdmissionPolicy")
                and o["metadata"]["name"] == "kf-culler-prober-identities"]  # kf-culler-writes: in objs
    assert len(policies) == 2
    _apply_rbac(e, objs + policies)
    try:
        sa_api = e.cluster.api_client(e.cluster.service_account_kubeconfig(e.namespace, "kf-culler"))
        # The policy is in force once the culler's token request for itself is refused.
        core = client.CoreV1Api(sa_api)
        e.wait("the prober policy in force", lambda: refused(lambda: core.create_namespaced_service_account_token(
            "kf-culler", e.namespace, {"spec": {"expirationSeconds": 600}})) == 403)
        yield sa_api
    finally:
        delete_cluster_rbac(e.api, objs)
        reg = client.AdmissionregistrationV1Api(e.api)
        with contextlib.suppress(Exception):
            reg.delete_validating_admission_policy_binding("kf-culler-prober-identities")
        with contextlib.suppress(Exception):
            reg.delete_validating_admission_policy("kf-culler-prober-identities")


PROBER_ROLE = "kf-culler-prober"


def refused(call_: Callable[[], object]) -> int:
    """The HTTP status an API call was refused with, 200 when it went through."""
    from kubernetes.client.exceptions import ApiException

    try:
        call_()
    except ApiException as err:
        return int(err.status)
    return 200


def may_get_notebook(e: Env, user: str, namespace: str, name: str) -> bool:
    """What the API server's RBAC answers the proxy's SubjectAccessReview for `user` now."""
    from kubernetes import client

    attributes = {"group": GROUP, "resource": PLURAL, "verb": "get", "namespace": namespace, "name": name}
    review = client.AuthorizationV1Api(e.api).create_subject_access_review(
        {"spec": {"user": user, "resourceAttributes": attributes}})
    return bool(review.status.allowed)


def rbac_refuses(e: Env, user: str) -> None:
    """Wait until the API server's RBAC refuses `user` the workbench `wb` (its authorizer follows RoleBinding changes
    through a watch of its own, a moment after the change is written); TimeoutError when it never does."""
    procs.wait_until(lambda: not may_get_notebook(e, user, e.namespace, "wb"), 10, 0.05,
                     f"the API server's RBAC to refuse {user} the workbench in {e.namespace}")


def proxy_config() -> dict[str, Any]:
    """The configuration the overlay with the component runs with: the overlay's config.yaml and the component's
    fragment, merged by the culler's own loader (kf_culler/config_layers.py)."""
    from kf_culler.config_layers import merge

    overlay = ROOT / "kustomize" / "overlays" / "openshift-ai" / "config.yaml"
    fragment = PROXY_COMPONENT / "openshift-ai.fragment.yaml"
    raw, _ = merge((str(overlay), yaml.safe_load(overlay.read_text())),
                   [(str(fragment), yaml.safe_load(fragment.read_text()))])
    return raw


def proxy_settings(e: Env, sidecar: Any, **changes: Any) -> Any:
    """The component's configuration, with the proxy's URL on loopback (its certificate names 127.0.0.1 too) and
    the CA that signed it, for this namespace."""
    from kf_culler.config import load_mapping

    raw = proxy_config()
    base = f"{sidecar.url}/notebook/{{namespace}}/{{name}}/"
    raw["urls"] = {"jupyter": base, "codeServer": base + "codeserver/"}
    raw["probe"]["authProxy"]["caFile"] = str(sidecar.ca)
    raw["namespaces"] = {"include": [e.namespace]}
    for key, value in changes.items():
        if isinstance(value, dict) and isinstance(raw.get(key), dict):
            raw[key] = {**raw[key], **value}
        else:
            raw[key] = value
    return load_mapping(raw, "test")


def one_pass(settings: Any, api: Any, namespace: str, prober: Any = None) -> Any:
    from support.passes import Passes

    from kf_culler.runner import build_runner

    with Passes(build_runner(settings, api, records_namespace=namespace, prober=prober)) as runner:
        [r] = [x for x in runner.once().results if x.name == "wb"]
    return r


def test_the_culler_reads_kernels_through_the_proxy_with_the_probers_token_only(env: Env, tmp_path: Path) -> None:
    """(a) kf-culler, as its own ServiceAccount, makes the namespace's prober (ServiceAccount, RoleBinding), mints
    its token (TokenRequest) and reads the workbench's kernels through the real kube-rbac-proxy; Jupyter's
    last_activity does not move (no_track_activity survives the proxy). (d) The GPU source (a stand-in Prometheus)
    gets its own token, never the prober's."""
    from kf_culler.kube.prober import SERVES_ANNOTATION, ProberTokens, prober_name
    from kf_culler.local.jupyter import JupyterServer
    from kf_culler.local.prometheus import StubServer, json_reply

    e = env
    body = odh_notebook_body(e.namespace, "wb", inject_auth=True)
    body["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = "1"
    prom_token = tmp_path / "prom-token"
    prom_token.write_text(PROM_TOKEN)
    empty = json_reply({"status": "success", "data": {"resultType": "matrix", "result": []}})
    with culler_identity(e, tmp_path) as sa_api, JupyterServer(e.namespace, "wb") as server, \
            StubServer(lambda _: empty) as prom:
        e.create(body)
        e.running("wb")
        kid = server.start_kernel()
        sidecar = e.odh.start_sidecar(e.namespace, "wb", f"http://127.0.0.1:{server.port}/")
        try:
            time.sleep(1.5)
            before = server.get("api/status")["last_activity"]
            settings = proxy_settings(e, sidecar, idleMinutes=600, startupGraceMinutes=0,
                                      prometheus={"url": prom.url, "bearerTokenFile": str(prom_token)})
            prober = ProberTokens(settings.operations.probe.auth_proxy, sa_api, e.namespace)
            r = one_pass(settings, sa_api, e.namespace, prober)
            assert (prober.requests, prober.repairs) == (1, 1), r.verdict
            name = prober_name(PROBER_ROLE, e.namespace)
            sa = e.plain(e.core().read_namespaced_service_account(name, e.namespace))
            assert sa["metadata"]["labels"] == {**CREATED, "app.kubernetes.io/component": "culler-prober"}
            assert sa["metadata"]["annotations"] == {SERVES_ANNOTATION: e.namespace}
            assert sa["automountServiceAccountToken"] is False
            rb = e.plain(e.rbac().read_namespaced_role_binding(PROBER_ROLE, e.namespace))
            assert rb["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                                     "name": PROBER_ROLE}
            assert rb["subjects"] == [{"kind": "ServiceAccount", "name": name, "namespace": e.namespace}]
            jupyter = r.observations["jupyter"]
            assert "error" not in jupyter, jupyter
            assert [k["id"] for k in jupyter["kernels"]] == [kid]
            assert [c.status for c in r.calls] == [200, 200, 200]
            assert all(c.url.startswith(sidecar.url) and c.url.endswith("?no_track_activity=1") for c in r.calls)
            assert server.get("api/status")["last_activity"] == before  # looking did not keep it alive
            asked = prom.requests()
            assert asked, "the GPU source was never asked"
            assert {s.headers.get("authorization") for s in asked} == {f"Bearer {PROM_TOKEN}"}
        finally:
            sidecar.stop()


def test_the_proxy_refuses_other_tokens_and_the_culler_stops_an_idle_workbench_through_it(
        env: Env, tmp_path: Path) -> None:
    """(b) A token of a ServiceAccount without `get notebooks` is refused by the proxy (403): no signal, not idle;
    the culler may not mint a token of any other ServiceAccount, and the prober's token can only get notebooks.
    (c) A CA that did not sign the proxy's certificate: no signal, the handshake fails before a request is sent.
    Then, through the proxy with the prober's token, the idle workbench is stopped and the fork scales it to 0."""
    from kubernetes import client

    from kf_culler.config import AuthProxySettings
    from kf_culler.kube.prober import ProberTokens, prober_name
    from kf_culler.local.jupyter import JupyterServer
    from kf_culler.local.pki import Authority

    e = env
    with culler_identity(e, tmp_path) as sa_api, JupyterServer(e.namespace, "wb") as server:
        e.create(odh_notebook_body(e.namespace, "wb", inject_auth=True))
        e.running("wb")
        e.lock_settled("wb")
        sidecar = e.odh.start_sidecar(e.namespace, "wb", f"http://127.0.0.1:{server.port}/")
        try:
            quick = {"idleMinutes": 0.05, "warnMinutes": 0, "startupGraceMinutes": 0.05}
            time.sleep(3.5)  # past the start-up grace
            # (b) the proxy refuses a token without the right: no signal, nothing reached Jupyter's kernels.
            outsider = tmp_path / "outsider-token"
            outsider.write_text(sa_token(e, "outsider"))
            outsiders = proxy_settings(e, sidecar, probe={"authProxy": {"enabled": True, "tokenFile": str(outsider),
                                                                        "caFile": str(sidecar.ca)}}, **quick)
            r = one_pass(outsiders, sa_api, e.namespace)
            assert r.verdict.state == "no-signal" and r.verdict.action != "stop", r.verdict
            assert "HTTP 403" in r.observations["jupyter"]["error"]
            assert [c.status for c in r.calls] == [403]
            # The culler makes and mints probers named kf-culler-prober.<namespace> only (the component's policy).
            other = ProberTokens(AuthProxySettings(enabled=True, service_account="outsider"), sa_api, e.namespace)
            assert "HTTP 403" in (other.get([e.namespace])[e.namespace].error or "")

            # (c) a CA that did not sign the proxy's certificate.
            (tmp_path / "other-ca").mkdir()
            wrong = Authority(tmp_path / "other-ca", name="not-the-service-ca")
            r = one_pass(proxy_settings(e, sidecar, **quick,
                                        probe={"authProxy": {"enabled": True, "serviceAccount": "kf-culler-prober",
                                                             "caFile": str(wrong.pair.cert)}}),
                         sa_api, e.namespace, ProberTokens(AuthProxySettings(
                             enabled=True, service_account="kf-culler-prober", ca_file=str(wrong.pair.cert)),
                             sa_api, e.namespace))
            assert r.verdict.state == "no-signal", r.verdict
            assert "CERTIFICATE_VERIFY_FAILED" in r.observations["jupyter"]["error"]
            assert [c.status for c in r.calls] == [None]  # no HTTP answer: no request went out

            # Through the proxy with the prober's token: idle, stopped, scaled to 0 by ODH's fork.
            settings = proxy_settings(e, sidecar, **quick)
            prober = ProberTokens(settings.operations.probe.auth_proxy, sa_api, e.namespace)
            deadline = time.monotonic() + 60
            while (r := one_pass(settings, sa_api, e.namespace, prober)).verdict.action != "stop":
                assert "error" not in r.observations.get("jupyter", {}), r.observations
                assert time.monotonic() < deadline, r.verdict
                time.sleep(1)
            assert prober.requests == 1  # one token for every pass within its half-life
            # The namespace's prober may get notebooks there and do nothing else.
            prober_api = e.cluster.api_client(e.cluster.service_account_kubeconfig(
                e.namespace, prober_name(PROBER_ROLE, e.namespace)))
            custom, core = client.CustomObjectsApi(prober_api), client.CoreV1Api(prober_api)
            assert custom.get_namespaced_custom_object(GROUP, VERSION, e.namespace, PLURAL, "wb")
            for call_ in (lambda: custom.list_namespaced_custom_object(GROUP, VERSION, e.namespace, PLURAL),
                          lambda: custom.patch_namespaced_custom_object(
                              GROUP, VERSION, e.namespace, PLURAL, "wb", {"metadata": {"annotations": {"x": "y"}}}),
                          lambda: custom.list_cluster_custom_object(GROUP, VERSION, PLURAL),
                          lambda: core.list_namespaced_secret(e.namespace),
                          lambda: core.list_namespaced_pod(e.namespace)):
                assert refused(call_) == 403
        finally:
            sidecar.stop()
    assert r.write is not None and r.write.outcome == "patched", r.write
    stamp = e.annotations("wb")[STOP_ANNOTATION]
    assert stamp != LOCK_VALUE
    e.wait("the fork to scale wb to 0", lambda: e.replicas("wb") == 0, seen=lambda: e.replicas("wb"))


@contextlib.contextmanager
def svc_names_on_loopback(monkeypatch: pytest.MonkeyPatch, ports: dict[str, int]) -> Iterator[None]:
    """The component's own URL templates, https://<name>-kube-rbac-proxy.<namespace>.svc:8443, reach each sidecar on
    loopback: those host names resolve to 127.0.0.1 and the sidecar's port (asyncio's loop for the pass instead of
    uvloop, whose resolver is its own). TLS still checks the certificate against the host name."""
    import asyncio
    import socket

    real = socket.getaddrinfo

    def resolve(host: Any, port: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(host, str) and host in ports:
            return [(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", ("127.0.0.1", ports[host]))]
        return real(host, port, *args, **kwargs)

    monkeypatch.setattr("kf_culler.cycle.uvloop.new_event_loop", asyncio.new_event_loop)
    monkeypatch.setattr(socket, "getaddrinfo", resolve)
    yield


def test_each_namespace_has_its_own_prober_whose_token_opens_only_that_namespace(
        env: Env, env2: Env, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two teams' workbenches, each behind its real kube-rbac-proxy in front of a real Jupyter, probed by one culler
    (as its ServiceAccount) through the component's own URLs:
    (1) namespace A's prober token passes A's proxy and is refused (403) by B's, and B's the other way round;
    (2) one pass probes both, with two tokens (two probers, two RoleBindings), each token to its own namespace;
    (3) a RoleBinding the user changed reads no signal (never idle) until they delete it, and a deleted one is made
        again by the next pass;
    (4) the culler can make exactly these objects and nothing more."""
    from kubernetes import client
    from support.passes import Passes

    from kf_culler.config import load_mapping
    from kf_culler.kube.prober import ProberTokens, prober_name
    from kf_culler.local.jupyter import JupyterServer
    from kf_culler.runner import build_runner

    a, b = env, env2
    culler_ns = a.namespace  # the culler runs in A's namespace; its probers live there too
    with culler_identity(a, tmp_path) as sa_api, JupyterServer(a.namespace, "wb", remote=True) as jup_a, \
            JupyterServer(b.namespace, "wb", remote=True) as jup_b:
        for e in (a, b):
            e.create(odh_notebook_body(e.namespace, "wb", inject_auth=True))
        for e in (a, b):
            e.running("wb")
        side_a = a.odh.start_sidecar(a.namespace, "wb", f"http://127.0.0.1:{jup_a.port}/")
        side_b = b.odh.start_sidecar(b.namespace, "wb", f"http://127.0.0.1:{jup_b.port}/")
        try:
            bundle = tmp_path / "service-ca.crt"  # OpenShift's service CA signs every proxy; here each has its own
            bundle.write_text(Path(side_a.ca).read_text() + Path(side_b.ca).read_text())
            hosts = {f"wb{PROXY_SUFFIX}.{e.namespace}.svc": int(s.url.rsplit(":", 1)[1])
                     for e, s in ((a, side_a), (b, side_b))}
            raw = proxy_config()
            raw["probe"]["authProxy"]["caFile"] = str(bundle)
            raw.update({"namespaces": {"include": [a.namespace, b.namespace]}, "idleMinutes": 600,
                        "startupGraceMinutes": 0, "warnMinutes": 0})
            settings = load_mapping(raw, "test")
            prober = ProberTokens(settings.operations.probe.auth_proxy, sa_api, culler_ns)

            def one(runner: Passes) -> dict[str, Any]:
                return {r.namespace: r for r in runner.once().results if r.name == "wb"}

            with svc_names_on_loopback(monkeypatch, hosts), \
                    Passes(build_runner(settings, sa_api, records_namespace=culler_ns, prober=prober)) as runner:
                # (2) one pass, both namespaces, each through its own proxy with its own prober's token.
                got = one(runner)
                for e in (a, b):
                    r = got[e.namespace]
                    assert "error" not in r.observations["jupyter"], r.observations
                    assert [c.status for c in r.calls] == [200, 200, 200]
                    assert all(c.url.startswith(f"https://wb{PROXY_SUFFIX}.{e.namespace}.svc:8443/notebook/"
                                                f"{e.namespace}/wb/") for c in r.calls)
                assert (prober.requests, prober.repairs) == (2, 2)
                tokens = {ns: auth.header.removeprefix("Bearer ") for ns, auth in
                          prober.get([a.namespace, b.namespace]).items() if auth.header}
                assert len(tokens) == 2 and tokens[a.namespace] != tokens[b.namespace]
                probers = {e.namespace: prober_name(PROBER_ROLE, e.namespace) for e in (a, b)}
                assert probers[a.namespace] != probers[b.namespace]
                for e in (a, b):
                    rb = e.plain(e.rbac().read_namespaced_role_binding(PROBER_ROLE, e.namespace))
                    assert rb["subjects"] == [{"kind": "ServiceAccount", "name": probers[e.namespace],
                                               "namespace": culler_ns}]
                assert not [x for x in a.plain(a.rbac().list_cluster_role_binding())["items"]
                            if x["roleRef"]["name"] == PROBER_ROLE]  # never bound cluster-wide

                # (1) each token passes its own namespace's proxy and is refused by the other's.
                path = "/notebook/{ns}/wb/api/kernels"
                for ns, side in ((a.namespace, side_a), (b.namespace, side_b)):
                    for token_ns, token in tokens.items():
                        status, text = call(side.url + path.format(ns=ns), side.ca, token)
                        if token_ns == ns:
                            assert status == 200, text
                        else:
                            assert status == 403, text
                            assert f"user=system:serviceaccount:{culler_ns}:{probers[token_ns]}, verb=get, " \
                                   "resource=notebooks" in text

                # (3) B's user replaces the RoleBinding with one of another role: the culler cannot change a
                # roleRef (nor delete), so B reads no signal, nothing is sent to B's proxy; A is unaffected.
                b.rbac().delete_namespaced_role_binding(PROBER_ROLE, b.namespace)
                b.rbac().create_namespaced_role_binding(b.namespace, {
                    "metadata": {"name": PROBER_ROLE},
                    "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "view"},
                    "subjects": [{"kind": "ServiceAccount", "name": "someone", "namespace": b.namespace}]})
                got = one(runner)
                rb_ = got[b.namespace]
                assert rb_.verdict.state == "no-signal" and rb_.verdict.action != "stop", rb_.verdict
                assert rb_.calls == [] and f"RoleBinding {b.namespace}/{PROBER_ROLE} binds ClusterRole view" in \
                    rb_.observations["jupyter"]["error"]
                assert "error" not in got[a.namespace].observations["jupyter"]
                # Deleted (by the user here): the next pass makes it again and B reads its kernels.
                b.rbac().delete_namespaced_role_binding(PROBER_ROLE, b.namespace)
                user_b = f"system:serviceaccount:{culler_ns}:{probers[b.namespace]}"
                rbac_refuses(b, user_b)
                got = one(runner)
                assert "error" not in got[b.namespace].observations["jupyter"], got[b.namespace].observations
                assert prober.repairs == 3 and may_get_notebook(b, user_b, b.namespace, "wb")
                # An edited one (subjects replaced) is restored the same way.
                b.rbac().patch_namespaced_role_binding(PROBER_ROLE, b.namespace, {"subjects": [
                    {"kind": "ServiceAccount", "name": "someone", "namespace": b.namespace}]})
                rbac_refuses(b, user_b)
                got = one(runner)
                assert prober.repairs == 4 and may_get_notebook(b, user_b, b.namespace, "wb")
                assert not may_get_notebook(b, f"system:serviceaccount:{b.namespace}:someone", b.namespace, "wb")
                assert not may_get_notebook(a, user_b, a.namespace, "wb")
        finally:
            side_a.stop()
            side_b.stop()

        # (4) As the culler's ServiceAccount: what it needs, and nothing more.
        core, rbac = client.CoreV1Api(sa_api), client.RbacAuthorizationV1Api(sa_api)
        token = {"spec": {"expirationSeconds": 600}}
        prober_b = probers[b.namespace]
        assert core.create_namespaced_service_account_token(prober_b, culler_ns, token).status.token
        for who, ns in (("kf-culler", culler_ns), ("default", culler_ns), ("wb", b.namespace),
                        (prober_b, b.namespace)):
            assert refused(lambda w=who, n=ns: core.create_namespaced_service_account_token(w, n, token)) == 403, \
                (who, ns)
        labels = {"app.kubernetes.io/component": "culler-prober"}
        for body in ({"metadata": {"name": "not-a-prober", "labels": labels}, "automountServiceAccountToken": False},
                     {"metadata": {"name": prober_name(PROBER_ROLE, "x"), "labels": labels}},  # automounted
                     {"metadata": {"name": prober_name(PROBER_ROLE, "x")}, "automountServiceAccountToken": False}):
            assert refused(lambda x=body: core.create_namespaced_service_account(culler_ns, x)) == 403, body
        assert refused(lambda: core.create_namespaced_service_account(b.namespace, {
            "metadata": {"name": prober_name(PROBER_ROLE, "x"), "labels": labels},
            "automountServiceAccountToken": False})) == 403
        subject = [{"kind": "ServiceAccount", "name": prober_b, "namespace": culler_ns}]
        culler_role = f"kf-culler-{culler_ns}"  # the base's ClusterRole (its rights the culler holds)
        for name, role, subjects in (("kf-culler-prober", "admin", subject), ("kf-culler-prober", "edit", subject),
                                     ("kf-culler-prober", culler_role, subject),
                                     ("kf-culler-prober", PROBER_ROLE,
                                      [{"kind": "ServiceAccount", "name": "someone", "namespace": b.namespace}]),
                                     ("kf-culler-prober", PROBER_ROLE,  # A's prober bound in B
                                      [{"kind": "ServiceAccount", "name": probers[a.namespace],
                                        "namespace": culler_ns}]),
                                     ("other", PROBER_ROLE, subject)):
            body = {"metadata": {"name": name}, "subjects": subjects,
                    "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role}}
            assert refused(lambda x=body: rbac.create_namespaced_role_binding(b.namespace, x)) == 403, (name, role)
        b.rbac().create_namespaced_role_binding(b.namespace, {
            "metadata": {"name": "theirs"}, "subjects": subject,
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": PROBER_ROLE}})
        for call_ in (lambda: rbac.read_namespaced_role_binding("theirs", b.namespace),
                      lambda: rbac.patch_namespaced_role_binding("theirs", b.namespace, {"subjects": subject}),
                      lambda: rbac.delete_namespaced_role_binding(PROBER_ROLE, b.namespace),
                      lambda: rbac.list_namespaced_role_binding(b.namespace),
                      lambda: rbac.create_namespaced_role(b.namespace, {"metadata": {"name": "r"}, "rules": []}),
                      lambda: core.list_namespaced_service_account(culler_ns),
                      lambda: core.delete_namespaced_service_account(prober_b, culler_ns),
                      lambda: core.patch_namespaced_service_account(prober_b, culler_ns, {"metadata": {"labels": {}}})):
            assert refused(call_) == 403
