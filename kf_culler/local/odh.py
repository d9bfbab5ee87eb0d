"""Open Data Hub / OpenShift AI's notebook controllers on a LocalCluster: binaries, CRDs, webhook, processes.

    with LocalCluster(mode="full") as cluster:
        with OdhControllers(cluster) as odh:        # CRDs, the fork, odh-notebook-controller, its webhooks
            custom.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, odh_notebook_body(ns, "wb"))

What runs, built by hack/odh/build.sh from the unmodified trees in ../shared/vendor (odh-kubeflow-b85f66a):
- `kf-notebook-controller`, ODH's fork of Kubeflow's notebook-controller: Notebook -> StatefulSet + Service,
  `kubeflow-resource-stopped` -> 0 replicas. ENABLE_CULLING=false (its own culler off: what the
  `notebook-controller-culler-config` ConfigMap sets on a cluster), USE_ISTIO=false, ADD_FSGROUP=false (the
  values of ODH's openshift overlay).
- `odh-notebook-controller` with K8S_NAMESPACE=CONTROLLER_NAMESPACE (on a cluster it reads its pod's
  namespace): per-notebook NetworkPolicies, kube-rbac-proxy objects, HTTPRoutes in its namespace, and its
  mutating webhook (lock annotation on create, kube-rbac-proxy sidecar) and validating webhook, served on a
  loopback port with a serving certificate from a CA made here (kf_culler.local.pki); the kube-apiserver
  calls them at https://127.0.0.1:<port>. Without the webhook the controller still runs, but no sidecar
  is injected and no lock is set, so the webhook is always registered. (The validating one refuses
  hostNetwork/hostPID/hostIPC, hostPath volumes, privileged containers and a serviceAccountName other than
  the notebook's name.)
- `kube-rbac-proxy` (github.com/brancz/kube-rbac-proxy, v0.19.1 here: the Go module proxy refuses v0.20.0,
  the version ODH's own tests inject): never run by the controllers (kwok plays the pods), but
  OdhControllers.start_sidecar runs a notebook's sidecar on loopback with the injected arguments.

CRDs applied (all at start-up: the controller's caches watch HTTPRoute and ReferenceGrant and would never
sync without them; every reconcile lists ImageStreams in the controller's namespace and fails without that
CRD): the fork's Notebook CRD, ImageStream, HTTPRoute, ReferenceGrant, Gateway and DSPA from ODH's
config/crd/external, and Route from github.com/openshift/api (the version odh-notebook-controller's go.mod
names). No OAuthClient CRD exists (openshift-apiserver serves that API) and none is needed: the controller
only deletes legacy OAuthClients of notebooks carrying the RHOAI 2.x finalizer. config.openshift.io is
absent, which the controller takes as "not OpenShift" (hardened TLS defaults, no TLS-profile watcher).

On a shared session cluster the webhooks only apply to namespaces labelled WEBHOOK_NAMESPACE_LABEL=true (on
ODH they apply to every namespace), and an upstream Kubeflow notebook-controller running on the cluster is
stopped first (two controllers would fight over the StatefulSets); stop() removes the webhook
configurations and puts the Notebook CRD back as it was.
"""

from __future__ import annotations

import base64
import contextlib
import os
import re
import shutil
import socket
import ssl
import subprocess
import sys
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from kf_culler.local import procs
from kf_culler.local.cluster import ClusterError, LocalCluster, source_root, wait_established
from kf_culler.local.pki import Authority

BUILD_SCRIPT = Path("hack") / "odh" / "build.sh"
BIN_DIR_ENV = "KF_CULLER_ODH_BIN_DIR"
FORK = "kf-notebook-controller"  # ODH's component name for its fork (component.opendatahub.io/name)
ODH = "odh-notebook-controller"
PROXY = "kube-rbac-proxy"
BINARIES = (FORK, ODH, PROXY)
UPSTREAM_CONTROLLER = "notebook-controller"  # the process name LocalCluster.start_notebook_controller uses
CONTROLLER_NAMESPACE = "opendatahub"  # ODH's applications namespace (redhat-ods-applications on RHOAI)
WEBHOOK_NAMESPACE_LABEL = "kf-culler.local/odh-webhook"
MUTATING_WEBHOOK = "odh-notebook-controller-mutating-webhook-configuration"
VALIDATING_WEBHOOK = "odh-notebook-controller-validating-webhook-configuration"
NOTEBOOK_CRD = "notebooks.kubeflow.org"
CRD_FILES = (
    "kubeflow.org_notebooks.yaml", "image.openshift.io_imagestream.yaml",
    "gateway.networking.k8s.io_httproutes.yaml", "gateway.networking.k8s.io_referencegrants.yaml",
    "gateway.networking.k8s.io_gateways.yaml", "opendatahub.io_dspa.yaml", "route.openshift.io_routes.yaml",
)

# What the controllers read and write (odh-notebook-controller/controllers/*.go).
INJECT_AUTH_ANNOTATION = "notebooks.opendatahub.io/inject-auth"
LOCK_VALUE = "odh-notebook-controller-lock"
UPDATE_PENDING_ANNOTATION = "notebooks.opendatahub.io/update-pending"
RESTART_ANNOTATION = "notebooks.opendatahub.io/notebook-restart"
CTRL_NETWORK_POLICY_SUFFIX = "-ctrl-np"
PROXY_NETWORK_POLICY_SUFFIX = "-kube-rbac-proxy-np"
PROXY_SUFFIX = "-kube-rbac-proxy"  # its Service; the ConfigMap is <name>-kube-rbac-proxy-config
PROXY_CONFIG_SUFFIX = "-kube-rbac-proxy-config"
PROXY_TLS_SECRET_SUFFIX = "-kube-rbac-proxy-tls"
PROXY_CONTAINER = "kube-rbac-proxy"
PROXY_PORT = 8443
PROXY_HEALTH_PORT = 8444
NOTEBOOK_PORT = 8888
FINALIZERS = ("notebook.opendatahub.io/httproute-cleanup", "notebook.opendatahub.io/referencegrant-cleanup")
PROXY_FINALIZER = "notebook.opendatahub.io/kube-rbac-proxy-cleanup"
IMAGE = "quay.io/opendatahub/odh-workbench-jupyter-minimal-cpu-py312-ubi9:3.4-v1.43"  # never pulled (kwok)


class OdhUnavailable(ClusterError):
    """ODH's notebook controllers (or what they need) cannot be had or started here; the message says why."""


def odh_bin_dir() -> Path:
    """Where hack/odh/build.sh puts the binaries and CRDs: $KF_CULLER_ODH_BIN_DIR, else the build cache."""
    if os.environ.get(BIN_DIR_ENV):
        return Path(os.environ[BIN_DIR_ENV])
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    return cache / "kf-culler" / "bin" / "odh"


def _built(directory: Path) -> bool:
    return all((directory / n).is_file() and (directory / f"{n}.version").is_file() for n in BINARIES) and \
        all((directory / "crds" / f).is_file() for f in CRD_FILES)


def odh_binaries(build: bool = True, quiet: bool = True) -> Path:
    """The directory holding the three binaries and crds/. With Go and a kf-culler checkout, hack/odh/build.sh
    all is run first (idempotent: a binary whose .version stamp matches is kept, so a warm cache costs well
    under a second; a cold build took 12 minutes here); without them, what is in the cache is used. Raises
    OdhUnavailable with the build's own error."""
    directory = odh_bin_dir()
    root = source_root()
    script = root / BUILD_SCRIPT if root is not None else None
    if not build or shutil.which("go") is None or script is None or not script.is_file():
        if _built(directory):
            return directory
        why = ("building is off" if not build else "Go is not installed" if shutil.which("go") is None
               else f"no kf-culler checkout ({BUILD_SCRIPT}) was found; set KF_CULLER_SOURCE")
        raise OdhUnavailable(f"{directory} lacks {', '.join(BINARIES)} or crds/ and {why}")
    if not quiet and not _built(directory):
        print(f"Building ODH's notebook controllers and kube-rbac-proxy into {directory} ...", file=sys.stderr)
    result = subprocess.run(["bash", str(script), "all"], capture_output=True, text=True, check=False)
    if result.returncode != 0:
        lines = [ln for ln in result.stderr.splitlines()
                 if not ln.endswith(": cached") and not ln.startswith("go: downloading")]
        raise OdhUnavailable(f"ODH's controllers could not be built ({BUILD_SCRIPT} all, exit "
                             f"{result.returncode}):\n" + "\n".join(lines[-40:]))
    if not _built(directory):
        raise OdhUnavailable(f"{BUILD_SCRIPT} all left {directory} incomplete")
    return directory


def proxy_version(directory: Path | None = None) -> str:
    """The kube-rbac-proxy version built (v0.20.0, what ODH's tests inject, unless the proxy refused it)."""
    return ((directory or odh_bin_dir()) / f"{PROXY}.version").read_text().strip()


def crd_bodies(directory: Path | None = None) -> list[dict[str, Any]]:
    base = (directory or odh_bin_dir()) / "crds"
    bodies: list[dict[str, Any]] = []
    for name in CRD_FILES:
        path = base / name
        if not path.is_file():
            raise OdhUnavailable(f"{path} is missing; run {BUILD_SCRIPT} crds")
        bodies.extend(d for d in yaml.safe_load_all(path.read_text()) if d)
    return bodies


def _ext(cluster: LocalCluster) -> Any:
    from kubernetes import client

    return client.ApiextensionsV1Api(cluster.api_client())


def apply_crds(cluster: LocalCluster, bodies: list[dict[str, Any]], timeout: float = 60) -> dict[str, Any]:
    """Create the CRDs, replacing a Notebook CRD that differs (the fork's is the full schema); wait until all
    are Established. Returns the Notebook CRD found before, as a body to put back (empty when there was none)."""
    from kubernetes.client.exceptions import ApiException

    ext = _ext(cluster)
    previous: dict[str, Any] = {}
    for body in bodies:
        name = body["metadata"]["name"]
        try:
            ext.create_custom_resource_definition(body)
            continue
        except ApiException as err:
            if err.status != 409:
                raise OdhUnavailable(f"creating CRD {name}: {err.status} {err.reason}: {err.body}") from None
        if name != NOTEBOOK_CRD:
            continue
        found = cluster.api_client().sanitize_for_serialization(ext.read_custom_resource_definition(name))
        if found.get("spec") == body.get("spec"):
            continue
        previous = {"apiVersion": found["apiVersion"], "kind": found["kind"],
                    "metadata": {"name": name}, "spec": found["spec"]}
        _replace_crd(cluster, body)

    try:
        wait_established(ext, [b["metadata"]["name"] for b in bodies], timeout, "the ODH CRDs")
    except TimeoutError as err:
        raise OdhUnavailable(str(err)) from None
    return previous


def _replace_crd(cluster: LocalCluster, body: dict[str, Any]) -> None:
    ext = _ext(cluster)
    found = ext.read_custom_resource_definition(body["metadata"]["name"])
    new = {**body, "metadata": {**body["metadata"], "resourceVersion": found.metadata.resource_version}}
    ext.replace_custom_resource_definition(body["metadata"]["name"], new)


class OdhControllers:
    """The two ODH controllers and their webhooks on one LocalCluster("full"); stop() undoes start()."""

    def __init__(self, cluster: LocalCluster, namespace: str = CONTROLLER_NAMESPACE, timeout: float = 90,
                 env: dict[str, str] | None = None, fork_env: dict[str, str] | None = None,
                 scoped_webhook: bool = True) -> None:
        self.cluster = cluster
        self.namespace = namespace
        self.timeout = timeout
        self.env = env or {}  # extra environment of odh-notebook-controller
        self.fork_env = fork_env or {}  # extra environment of the fork (e.g. ENABLE_CULLING)
        self.scoped_webhook = scoped_webhook
        self.webhook_port = 0
        self.proxy_image = ""
        self.webhook_ca: Path | None = None
        self.proxy_binary: Path | None = None
        self._previous_crd: dict[str, Any] = {}
        self._started = False

    def __enter__(self) -> OdhControllers:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- start -----------------------------------------------------------------------------------
    def start(self) -> None:
        if self.cluster.mode != "full":
            raise OdhUnavailable("ODH's controllers need LocalCluster(mode='full'): without the "
                                 "controller-manager their StatefulSets never get pods")
        directory = odh_binaries(quiet=self.cluster.quiet)
        self.proxy_binary = directory / PROXY
        self.proxy_image = f"quay.io/brancz/kube-rbac-proxy:{proxy_version(directory)}"
        self._started = True
        try:
            self._stop_upstream_controller()
            self._previous_crd = apply_crds(self.cluster, crd_bodies(directory), min(self.timeout, 60))
            self._ensure_namespace(self.namespace)
            self._start_fork(directory / FORK)
            self._start_odh(directory / ODH)
            self._register_webhooks()
        except BaseException:
            self.stop()
            raise

    def _stop_upstream_controller(self) -> None:
        proc = self.cluster.procs.pop(UPSTREAM_CONTROLLER, None)
        if proc is not None:
            procs.stop(proc, grace=2)

    def _ensure_namespace(self, name: str) -> None:
        from kubernetes import client
        from kubernetes.client.exceptions import ApiException

        with contextlib.suppress(ApiException):
            client.CoreV1Api(self.cluster.api_client()).create_namespace({"metadata": {"name": name}})

    def _base_env(self) -> dict[str, str]:
        return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(self.cluster.dir),
                "KUBECONFIG": str(self.cluster.kubeconfig)}

    def _start_fork(self, binary: Path) -> None:
        metrics_port, probe_port = procs.free_port(), procs.free_port()
        env = {**self._base_env(), "ENABLE_CULLING": "false", "USE_ISTIO": "false", "ADD_FSGROUP": "false",
               "CLUSTER_DOMAIN": "cluster.local", **self.fork_env}
        self.cluster.add_process(FORK, [
            str(binary), "--metrics-addr", f"127.0.0.1:{metrics_port}", "--probe-addr", f"127.0.0.1:{probe_port}",
            "--enable-leader-election=false", "--zap-log-level=info", "--zap-devel=false",
        ], env=env)
        self._wait_ready(FORK, f"http://127.0.0.1:{probe_port}/readyz", workers=1)

    def _start_odh(self, binary: Path) -> None:
        certs = self.cluster.dir / "odh-webhook"
        certs.mkdir(parents=True, exist_ok=True)
        authority = Authority(certs, name="odh-webhook-ca")
        authority.issue("tls", "odh-notebook-controller-webhook", server=True)  # tls.crt, tls.key
        self.webhook_ca = authority.pair.cert
        metrics_port, probe_port = procs.free_port(), procs.free_port()
        self.webhook_port = procs.free_port()
        env = {**self._base_env(), "K8S_NAMESPACE": self.namespace, **self.env}
        self.cluster.add_process(ODH, [
            str(binary), "--kube-rbac-proxy-image", self.proxy_image,
            "--metrics-bind-address", f"127.0.0.1:{metrics_port}",
            "--health-probe-bind-address", f"127.0.0.1:{probe_port}",
            "--webhook-cert-dir", str(certs), "--webhook-port", str(self.webhook_port),
            "--leader-elect=false",
        ], env=env)
        self._wait_ready(ODH, f"http://127.0.0.1:{probe_port}/readyz", workers=1)
        try:
            procs.wait_until(lambda: self._webhook_answers(), self.timeout, 0.2,
                             f"{ODH}'s webhook server on 127.0.0.1:{self.webhook_port}")
        except TimeoutError as err:
            raise OdhUnavailable(f"{err}; last lines of its log:\n{self.cluster.log_tail(ODH)}") from None

    def _webhook_answers(self) -> bool:
        """The webhook server completes a TLS handshake with a certificate from our CA."""
        self._check_alive(ODH)
        assert self.webhook_ca is not None
        ctx = ssl.create_default_context(cafile=str(self.webhook_ca))
        try:
            with socket.create_connection(("127.0.0.1", self.webhook_port), timeout=2) as sock, \
                    ctx.wrap_socket(sock, server_hostname="127.0.0.1"):
                return True
        except (OSError, ssl.SSLError):
            return False

    def _check_alive(self, name: str) -> None:
        proc = self.cluster.procs[name]
        if proc.poll() is not None:
            raise OdhUnavailable(f"{name} exited with status {proc.returncode}; last lines of its log:\n"
                                 f"{procs.tail(self.cluster.logs[name])}")

    def _wait_ready(self, name: str, url: str, workers: int) -> None:
        """/readyz answers 200 and each controller logged "Starting workers" (its caches are in sync)."""
        log = self.cluster.logs[name]

        def ready() -> bool:
            self._check_alive(name)
            try:
                with urllib.request.urlopen(url, timeout=2) as resp:
                    if resp.status != 200:
                        return False
            except OSError:
                return False
            return log.read_text(errors="replace").count("Starting workers") >= workers

        try:
            procs.wait_until(ready, self.timeout, interval=0.2, what=f"{name} to be ready")
        except TimeoutError as err:
            raise OdhUnavailable(f"{err}; last lines of its log:\n{procs.tail(log)}") from None

    def _register_webhooks(self) -> None:
        """ODH's config/webhook/manifests.yaml, pointed at the loopback server (a url instead of a Service)."""
        from kubernetes import client
        from kubernetes.client.exceptions import ApiException

        assert self.webhook_ca is not None
        ca = base64.b64encode(self.webhook_ca.read_bytes()).decode()
        selector = {"matchLabels": {WEBHOOK_NAMESPACE_LABEL: "true"}} if self.scoped_webhook else {}
        rules = [{"apiGroups": ["kubeflow.org"], "apiVersions": ["v1"], "operations": ["CREATE", "UPDATE"],
                  "resources": ["notebooks"]}]

        def hook(name: str, path: str) -> dict[str, Any]:
            return {"name": name, "admissionReviewVersions": ["v1"], "sideEffects": "None",
                    "failurePolicy": "Fail", "timeoutSeconds": 10, "rules": rules, "namespaceSelector": selector,
                    "clientConfig": {"url": f"https://127.0.0.1:{self.webhook_port}{path}", "caBundle": ca}}

        adm: Any = client.AdmissionregistrationV1Api(self.cluster.api_client())
        bodies: list[tuple[Any, Any, dict[str, Any]]] = [
            (adm.create_mutating_webhook_configuration, adm.delete_mutating_webhook_configuration,
             {"metadata": {"name": MUTATING_WEBHOOK}, "webhooks": [hook("notebooks.opendatahub.io",
                                                                        "/mutate-notebook-v1")]}),
            (adm.create_validating_webhook_configuration, adm.delete_validating_webhook_configuration,
             {"metadata": {"name": VALIDATING_WEBHOOK},
              "webhooks": [hook("notebooks-validation.opendatahub.io", "/validate-notebook-v1")]}),
        ]
        for create, delete, body in bodies:
            with contextlib.suppress(ApiException):
                delete(body["metadata"]["name"])
            try:
                create(body)
            except ApiException as err:
                raise OdhUnavailable(f"registering {body['metadata']['name']}: {err.status} {err.reason}: "
                                     f"{err.body}") from None

    # -- stop ------------------------------------------------------------------------------------
    def stop(self) -> None:
        if not self._started:
            return
        self._started = False
        from kubernetes import client
        from kubernetes.client.exceptions import ApiException

        with contextlib.suppress(Exception):
            adm: Any = client.AdmissionregistrationV1Api(self.cluster.api_client())
            for delete, name in ((adm.delete_mutating_webhook_configuration, MUTATING_WEBHOOK),
                                 (adm.delete_validating_webhook_configuration, VALIDATING_WEBHOOK)):
                with contextlib.suppress(ApiException):
                    delete(name)
        for name in (ODH, FORK):
            proc = self.cluster.procs.pop(name, None)
            if proc is not None:
                procs.stop(proc, grace=2)
        if self._previous_crd:
            with contextlib.suppress(Exception):
                _replace_crd(self.cluster, self._previous_crd)
            self._previous_crd = {}

    # -- a notebook's kube-rbac-proxy sidecar, run here -------------------------------------------
    def start_sidecar(self, namespace: str, name: str, upstream: str, timeout: float = 30) -> Sidecar:
        """Run the kube-rbac-proxy sidecar the webhook injected into Notebook namespace/name on loopback, with
        the arguments of the StatefulSet's container and the controller's ConfigMap; what a pod would mount is
        made here: a serving certificate from a fresh CA (OpenShift's service CA would sign it there) and a
        token of the notebook's own ServiceAccount (which the controller bound to system:auth-delegator).
        `upstream` replaces --upstream (the notebook's port 8888 in the pod)."""
        from kubernetes import client

        api = self.cluster.api_client()
        sts = client.AppsV1Api(api).read_namespaced_stateful_set(name, namespace)
        found = [c for c in sts.spec.template.spec.containers if c.name == PROXY_CONTAINER]
        if not found:
            raise OdhUnavailable(f"StatefulSet {namespace}/{name} has no {PROXY_CONTAINER} container")
        cm = client.CoreV1Api(api).read_namespaced_config_map(f"{name}{PROXY_CONFIG_SUFFIX}", namespace)
        work = self.cluster.dir / f"sidecar-{namespace}-{name}"
        work.mkdir(parents=True, exist_ok=True)
        config = work / "config-file.yaml"
        config.write_text(cm.data["config-file.yaml"])
        authority = Authority(work, name=f"service-ca {namespace}/{name}")  # one CA each: distinct in a bundle
        service = f"{name}{PROXY_SUFFIX}.{namespace}.svc"  # what OpenShift's service CA would name
        serving = authority.issue("tls", service, server=True, dns_names=(service, f"{service}.cluster.local"))
        kubeconfig = self.cluster.service_account_kubeconfig(namespace, name, work / "token.kubeconfig")
        port, health = procs.free_port(), procs.free_port()
        replaced = {"--secure-listen-address": f"127.0.0.1:{port}", "--upstream": upstream,
                    "--proxy-endpoints-port": str(health), "--config-file": str(config),
                    "--tls-cert-file": str(serving.cert), "--tls-private-key-file": str(serving.key)}
        args = []
        for arg in found[0].args or []:
            flag, sep, _ = arg.partition("=")
            args.append(f"{flag}={replaced[flag]}" if sep and flag in replaced else arg)
        assert self.proxy_binary is not None
        process = f"{PROXY}-{namespace}-{name}"
        self.cluster.add_process(process, [str(self.proxy_binary), *args, "--kubeconfig", str(kubeconfig)],
                                 env=self._base_env())
        sidecar = Sidecar(self.cluster, process, f"https://127.0.0.1:{port}", authority.pair.cert, args)
        ctx = ssl.create_default_context(cafile=str(authority.pair.cert))

        def ready() -> bool:
            self._check_alive(process)
            try:
                with urllib.request.urlopen(f"https://127.0.0.1:{health}/healthz", timeout=2, context=ctx) as r:
                    return bool(r.status == 200)
            except OSError:
                return False

        try:
            procs.wait_until(ready, timeout, 0.2, f"{process} to answer /healthz")
        except TimeoutError as err:
            sidecar.stop()
            raise OdhUnavailable(f"{err}; last lines of its log:\n{self.cluster.log_tail(process)}") from None
        return sidecar

    # -- reading what the controllers did --------------------------------------------------------
    def logged(self, message: str, process: str = ODH, **fields: str) -> bool:
        """Whether the JSON log of `process` has a line with msg `message` and these field values."""
        return self.log_count(message, process, **fields) > 0

    def log_count(self, message: str, process: str = ODH, **fields: str) -> int:
        """How many lines of the JSON log of `process` have msg `message` and these field values."""
        pattern = [f'"msg":"{re.escape(message)}"'] + [f'"{k}":"{re.escape(v)}"' for k, v in fields.items()]
        return sum(all(re.search(p, line) for p in pattern)
                   for line in self.cluster.logs[process].read_text(errors="replace").splitlines())


@dataclass
class Sidecar:
    """A notebook's kube-rbac-proxy running on loopback: `url` is its 8443, TLS verified against `ca`."""

    cluster: LocalCluster
    process: str
    url: str
    ca: Path
    args: list[str]

    def stop(self) -> None:
        proc = self.cluster.procs.pop(self.process, None)
        if proc is not None:
            procs.stop(proc, grace=2)


def odh_notebook_body(namespace: str, name: str, inject_auth: bool = False, image: str = IMAGE,
                      annotations: dict[str, str] | None = None) -> dict[str, Any]:
    """A Notebook the way ODH's dashboard makes a workbench, cut down: the container named as the notebook
    (the webhook and the controller find it by that name), port 8888 `notebook-port`, NB_PREFIX
    /notebook/<namespace>/<name>, and `notebooks.opendatahub.io/inject-auth` when inject_auth."""
    notes = {"notebooks.kubeflow.org/server-type": "jupyter", **(annotations or {})}
    if inject_auth:
        notes[INJECT_AUTH_ANNOTATION] = "true"
    prefix = f"/notebook/{namespace}/{name}"
    return {
        "apiVersion": "kubeflow.org/v1", "kind": "Notebook",
        "metadata": {"name": name, "namespace": namespace, "labels": {"app": name}, "annotations": notes},
        "spec": {"template": {"spec": {"containers": [{
            "name": name, "image": image, "imagePullPolicy": "IfNotPresent",
            "workingDir": "/opt/app-root/src",
            "env": [{"name": "NB_PREFIX", "value": prefix},
                    {"name": "NOTEBOOK_ARGS", "value": f"--ServerApp.port=8888 --ServerApp.base_url={prefix}"}],
            "ports": [{"name": "notebook-port", "containerPort": NOTEBOOK_PORT, "protocol": "TCP"}],
            "resources": {"requests": {"cpu": "100m", "memory": "256Mi"},
                          "limits": {"cpu": "1", "memory": "1Gi"}},
        }]}}},
    }
