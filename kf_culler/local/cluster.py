"""A real local control plane: etcd and kube-apiserver built from upstream Go modules, on loopback.

    with LocalCluster() as cluster:
        api = cluster.api_client()          # admin (system:masters) client
        sa_kubeconfig = cluster.service_account_kubeconfig("kubeflow", "kf-culler")

    with LocalCluster(mode="full") as cluster:   # + controller-manager, scheduler, kwok, Node gpu-node
        cluster.start_notebook_controller()      # Kubeflow's notebook-controller, ENABLE_CULLING=false

"apiserver" (the default) is etcd and kube-apiserver only: objects are stored and watched, but
nothing acts on them. "full" adds kube-controller-manager (StatefulSets, garbage collection, service
accounts, namespaces, ...), kube-scheduler and kwok, which plays the kubelet of fake nodes: it marks
pods scheduled to them Running and finishes their deletion at once (no termination grace period).

Binaries come from the build cache (hack/controlplane/build.sh); they are built on first use.
"""

from __future__ import annotations

import base64
import contextlib
import os
import shutil
import signal
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import yaml

from kf_culler.local import procs
from kf_culler.local.pki import Authority, Pair, service_account_keys

REPO_MARKER = Path("hack") / "controlplane" / "build.sh"
CRD_PATH = Path("kustomize") / "crd" / "notebooks.kubeflow.org.yaml"
Mode = Literal["apiserver", "full"]
APISERVER_BINARIES = ("etcd", "kube-apiserver")
CLUSTER_BINARIES = (*APISERVER_BINARIES, "kube-controller-manager", "kube-scheduler", "kwok",
                    "kwok-stages.yaml")
NOTEBOOK_CONTROLLER_ENV = "KF_CULLER_NOTEBOOK_CONTROLLER"
KWOK_NODE_ANNOTATION = "kwok.x-k8s.io/node"
GPU_NODE = "gpu-node"
POD_CIDR = "127.77.0.0/16"  # kwok's pod IPs
GPU_RESOURCE = "nvidia.com/gpu"


class ClusterError(RuntimeError):
    """The local control plane could not be built or started; the message carries the log tail."""


class NotebookControllerUnavailable(ClusterError):
    """No notebook-controller binary can be had here (not built, and the build failed); says why."""


def source_root() -> Path | None:
    """The kf-culler checkout holding hack/controlplane (KF_CULLER_SOURCE, else above this file)."""
    env = os.environ.get("KF_CULLER_SOURCE")
    candidates = [Path(env)] if env else []
    candidates += list(Path(__file__).resolve().parents)
    for c in candidates:
        if (c / REPO_MARKER).is_file():
            return c
    return None


def versions() -> dict[str, str]:
    """The pinned component versions (hack/controlplane/versions.env), overridden by the environment."""
    found: dict[str, str] = {}
    root = source_root()
    if root is not None:
        for line in (root / "hack/controlplane/versions.env").read_text().splitlines():
            key, sep, value = line.partition("=")
            if sep and key.startswith("KF_CULLER_"):
                found[key] = value.strip()
    for key in list(found):
        found[key] = os.environ.get(key, found[key])
    return found


def bin_dir() -> Path:
    if os.environ.get("KF_CULLER_BIN_DIR"):
        return Path(os.environ["KF_CULLER_BIN_DIR"])
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    return cache / "kf-culler" / "bin" / versions().get("KF_CULLER_K8S_VERSION", "unknown")


def ensure_binaries(component_set: str = "apiserver", names: tuple[str, ...] = ("etcd", "kube-apiserver"),
                    quiet: bool = False) -> Path:
    """Build (or reuse) the binaries; progress goes to stderr unless quiet."""
    directory = bin_dir()
    if all((directory / n).is_file() for n in names):
        return directory
    root = source_root()
    if root is None:
        raise ClusterError(f"control-plane binaries are missing from {directory} and no kf-culler checkout "
                           "(hack/controlplane/build.sh) was found; set KF_CULLER_SOURCE or "
                           "KF_CULLER_BIN_DIR")
    if shutil.which("go") is None:
        raise ClusterError("control-plane binaries are missing and Go is not installed: install Go >= 1.26 "
                           "to build kube-apiserver and etcd")
    if not quiet:
        print(f"Building the local control plane into {directory} (first use only) ...", file=sys.stderr)
    result = subprocess.run(["bash", str(root / REPO_MARKER), component_set],
                            stdout=subprocess.PIPE, stderr=None if not quiet else subprocess.PIPE, text=True)
    if result.returncode != 0:
        raise ClusterError(f"hack/controlplane/build.sh {component_set} failed (exit {result.returncode})"
                           + (f":\n{result.stderr[-3000:]}" if quiet and result.stderr else ""))
    return directory


def notebook_controller_binary(build: bool = True, quiet: bool = True) -> Path:
    """Kubeflow's notebook-controller: $KF_CULLER_NOTEBOOK_CONTROLLER, else the build cache (built by
    `build.sh all` on first use). Raises NotebookControllerUnavailable with the build's own error."""
    env = os.environ.get(NOTEBOOK_CONTROLLER_ENV)
    if env:
        path = Path(env)
        if not (path.is_file() and os.access(path, os.X_OK)):
            raise NotebookControllerUnavailable(f"{NOTEBOOK_CONTROLLER_ENV}={env} is not an executable file")
        return path
    path = bin_dir() / "notebook-controller"
    if path.is_file():
        return path
    if not build:
        raise NotebookControllerUnavailable(f"{path} does not exist; run hack/controlplane/build.sh all")
    if not quiet:
        print(f"Building Kubeflow's notebook-controller into {path.parent} ...", file=sys.stderr)
    try:
        ensure_binaries("all", ("notebook-controller",), quiet=True)
    except ClusterError as err:
        lines = [ln for ln in str(err).splitlines() if not ln.endswith(": cached")]
        raise NotebookControllerUnavailable(
            "Kubeflow's notebook-controller could not be built: " + "\n".join(lines)) from None
    return path


def wait_established(ext: Any, names: list[str], timeout: float, what: str) -> None:
    """Wait until every named CRD is Established (TimeoutError otherwise); `ext` an ApiextensionsV1Api."""
    def established() -> bool:
        for name in names:
            crd = ext.read_custom_resource_definition(name)
            if not any(c.type == "Established" and c.status == "True"
                       for c in (crd.status.conditions if crd.status else None) or []):
                return False
        return True

    procs.wait_until(established, timeout, interval=0.2, what=f"{what} to be Established")


def kubeconfig_dict(server: str, ca: Path, user: dict[str, str],
                    name: str = "kf-culler-local") -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "Config", "current-context": name,
        "clusters": [{"name": name, "cluster": {
            "server": server, "certificate-authority-data": base64.b64encode(ca.read_bytes()).decode()}}],
        "users": [{"name": name, "user": user}],
        "contexts": [{"name": name, "context": {"cluster": name, "user": name}}],
    }


class LocalCluster:
    """etcd + kube-apiserver on free loopback ports, RBAC on, torn down completely by stop().

    mode="full" also runs kube-controller-manager, kube-scheduler and kwok, and registers the fake
    Node `gpu-node` (nvidia.com/gpu: 1) that kwok plays. The ServiceAccount admission plugin is on in
    "full" mode (the controller-manager creates the default service accounts) and off otherwise,
    unless keep_serviceaccount_admission says.
    """

    def __init__(self, workdir: Path | None = None, quiet: bool = True,
                 keep_serviceaccount_admission: bool | None = None, mode: Mode = "apiserver",
                 gpu_node: bool = True):
        if mode not in ("apiserver", "full"):
            raise ValueError(f"unknown LocalCluster mode {mode!r} (expected 'apiserver' or 'full')")
        self.quiet = quiet
        self.mode: Mode = mode
        self._own_dir = workdir is None
        self.dir = Path(tempfile.mkdtemp(prefix="kf-culler-cluster-")) if workdir is None else workdir
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.logs: dict[str, Path] = {}
        self.server = ""
        self.kubeconfig = self.dir / "admin.kubeconfig"
        self._keep_sa_admission = (mode == "full") if keep_serviceaccount_admission is None \
            else keep_serviceaccount_admission
        self._gpu_node = gpu_node
        self.ca: Pair | None = None
        self.admin: Pair | None = None
        self._authority: Authority | None = None
        self._sa: Pair | None = None

    # -- lifecycle -------------------------------------------------------------------------------
    def __enter__(self) -> LocalCluster:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        try:
            self._start()
        except BaseException:
            self.stop()
            raise

    def _start(self) -> None:
        if self.mode == "full":
            bins = ensure_binaries("cluster", CLUSTER_BINARIES, quiet=self.quiet)
        else:
            bins = ensure_binaries(quiet=self.quiet)
        pki = self.dir / "pki"
        pki.mkdir(parents=True, exist_ok=True)
        authority = Authority(pki)
        self._authority = authority
        self.ca = authority.pair
        serving = authority.issue("apiserver", "kube-apiserver", server=True)
        self.admin = authority.issue("admin", "kf-culler-admin", ("system:masters",), client=True)
        sa = service_account_keys(pki)
        self._sa = sa

        etcd_port, peer_port, api_port = procs.free_port(), procs.free_port(), procs.free_port()
        etcd_url = f"http://127.0.0.1:{etcd_port}"
        self._launch("etcd", [
            str(bins / "etcd"), "--name", "local", "--data-dir", str(self.dir / "etcd"),
            "--listen-client-urls", etcd_url, "--advertise-client-urls", etcd_url,
            "--listen-peer-urls", f"http://127.0.0.1:{peer_port}",
            "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer_port}",
            "--initial-cluster", f"local=http://127.0.0.1:{peer_port}",
            "--listen-metrics-urls", f"http://127.0.0.1:{procs.free_port()}",
            "--unsafe-no-fsync", "--log-level", "warn",
        ])
        self._wait_http("etcd", f"{etcd_url}/health", timeout=30)

        self.server = f"https://127.0.0.1:{api_port}"
        disabled = [] if self._keep_sa_admission else ["--disable-admission-plugins", "ServiceAccount"]
        self._launch("kube-apiserver", [
            str(bins / "kube-apiserver"),
            "--etcd-servers", etcd_url,
            "--bind-address", "127.0.0.1", "--advertise-address", "127.0.0.1",
            "--secure-port", str(api_port),
            "--tls-cert-file", str(serving.cert), "--tls-private-key-file", str(serving.key),
            "--client-ca-file", str(authority.pair.cert),
            "--authorization-mode", "RBAC",
            "--service-account-issuer", "https://kubernetes.default.svc.cluster.local",
            "--service-account-key-file", str(sa.cert),
            "--service-account-signing-key-file", str(sa.key),
            # Loopback: a Service's ClusterIP is an address of this machine's (nothing answers there unless a test or
            # bench listens on it, as kube-proxy would lead to a pod), so a probe to one never leaves the machine.
            "--service-cluster-ip-range", "127.96.0.0/16",
            "--api-audiences", "https://kubernetes.default.svc.cluster.local",
            "--cert-dir", str(pki / "generated"),
            "--endpoint-reconciler-type", "none",
            "--profiling=false", "--v", "1",
            *disabled,
        ])
        self.kubeconfig.write_text(yaml.safe_dump(kubeconfig_dict(self.server, authority.pair.cert, {
            "client-certificate-data": base64.b64encode(self.admin.cert.read_bytes()).decode(),
            "client-key-data": base64.b64encode(self.admin.key.read_bytes()).decode(),
        })))
        self._wait_http("kube-apiserver", f"{self.server}/readyz", timeout=120, tls=True)
        if self.mode == "full":
            self._start_full(bins)

    # -- "full" mode -----------------------------------------------------------------------------
    def _client_kubeconfig(self, stem: str, user: str, groups: tuple[str, ...] = ()) -> Path:
        """A kubeconfig with a fresh client certificate for `user` (e.g. system:kube-scheduler)."""
        assert self._authority is not None
        pair = self._authority.issue(stem, user, groups, client=True)
        path = self.dir / f"{stem}.kubeconfig"
        path.write_text(yaml.safe_dump(kubeconfig_dict(self.server, self._authority.pair.cert, {
            "client-certificate-data": base64.b64encode(pair.cert.read_bytes()).decode(),
            "client-key-data": base64.b64encode(pair.key.read_bytes()).decode(),
        })))
        path.chmod(0o600)
        return path

    def user_kubeconfig(self, user: str, groups: tuple[str, ...] = ()) -> Path:
        """A kubeconfig for a person (a client certificate for `user` in `groups`), e.g. a profile user."""
        stem = "user-" + "".join(ch if ch.isalnum() else "-" for ch in user)
        return self._client_kubeconfig(stem, user, groups)

    def _start_full(self, bins: Path) -> None:
        assert self.ca is not None and self._sa is not None
        kcm = self._client_kubeconfig("kube-controller-manager", "system:kube-controller-manager")
        kcm_port = procs.free_port()
        self._launch("kube-controller-manager", [
            str(bins / "kube-controller-manager"),
            "--kubeconfig", str(kcm),
            "--authentication-kubeconfig", str(kcm), "--authorization-kubeconfig", str(kcm),
            "--bind-address", "127.0.0.1", "--secure-port", str(kcm_port),
            "--cert-dir", str(self.dir / "pki" / "kcm"),
            "--controllers", "*",
            "--use-service-account-credentials",
            "--service-account-private-key-file", str(self._sa.key),
            "--root-ca-file", str(self.ca.cert),
            "--cluster-name", "kf-culler-local",
            "--leader-elect=false", "--profiling=false", "--v", "1",
        ])
        sched = self._client_kubeconfig("kube-scheduler", "system:kube-scheduler")
        sched_port = procs.free_port()
        self._launch("kube-scheduler", [
            str(bins / "kube-scheduler"),
            "--kubeconfig", str(sched),
            "--authentication-kubeconfig", str(sched), "--authorization-kubeconfig", str(sched),
            "--bind-address", "127.0.0.1", "--secure-port", str(sched_port),
            "--cert-dir", str(self.dir / "pki" / "scheduler"),
            "--leader-elect=false", "--profiling=false", "--v", "1",
        ])
        # kwok plays the kubelet of the nodes annotated kwok.x-k8s.io/node=fake (and only those).
        # Without --server-address or --node-port it serves nothing.
        self._launch("kwok", [
            str(bins / "kwok"),
            "--kubeconfig", str(self.kubeconfig),
            "--config", str(bins / "kwok-stages.yaml"),
            "--manage-all-nodes=false",
            f"--manage-nodes-with-annotation-selector={KWOK_NODE_ANNOTATION}=fake",
            "--node-lease-duration-seconds", "40",
            "--node-ip", "127.0.0.1",
            # Pod IPs on loopback (127.0.0.0/8): what a controller that calls a pod's IP reaches is then a server
            # a test binds there (the Workspace controller's own Jupyter probe), and nothing else.
            "--cidr", POD_CIDR,
        ])
        self._wait_http("kube-controller-manager", f"https://127.0.0.1:{kcm_port}/healthz", timeout=60,
                        tls=True, verify=False)
        self._wait_http("kube-scheduler", f"https://127.0.0.1:{sched_port}/healthz", timeout=60,
                        tls=True, verify=False)
        if self._gpu_node:
            self.add_fake_node(GPU_NODE, gpus=1)

    def add_fake_node(self, name: str, gpus: int = 0, cpu: str = "32", memory: str = "256Gi",
                      pods: str = "110", timeout: float = 60) -> dict[str, Any]:
        """Register a Node that kwok plays ("full" mode) and wait until pods can be scheduled to it."""
        if self.mode != "full" or "kwok" not in self.procs:
            raise ClusterError("fake nodes need LocalCluster(mode='full') (kwok plays their kubelet)")
        from kubernetes import client
        from kubernetes.client.exceptions import ApiException

        core: Any = client.CoreV1Api(self.api_client())
        resources = {"cpu": cpu, "memory": memory, "pods": pods}
        if gpus:
            resources[GPU_RESOURCE] = str(gpus)
        body = {
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "annotations": {KWOK_NODE_ANNOTATION: "fake"},
                         "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
                                    "type": "kwok"}},
            "status": {"capacity": resources, "allocatable": resources},
        }
        try:
            core.create_node(body)
        except ApiException as err:
            if err.status != 409:
                raise
        # Some API server versions drop status on create: make sure capacity is there.
        core.patch_node_status(name, {"status": {"capacity": resources, "allocatable": resources}})

        def ready() -> bool:
            if self.procs["kwok"].poll() is not None:
                raise ClusterError(f"kwok exited with status {self.procs['kwok'].returncode}; last lines "
                                   f"of its log:\n{procs.tail(self.logs['kwok'])}")
            node = core.read_node(name)
            conds = node.status.conditions or []
            alloc = node.status.allocatable or {}
            # Ready, with its capacity, and the controller-manager has lifted the not-ready taint.
            return any(c.type == "Ready" and c.status == "True" for c in conds) and \
                all(alloc.get(k) == v for k, v in resources.items()) and \
                not any(t.key.startswith("node.kubernetes.io/") for t in node.spec.taints or [])

        try:
            procs.wait_until(ready, timeout, interval=0.2, what=f"node {name} to be Ready")
        except TimeoutError as err:
            raise ClusterError(f"{err}; last lines of kwok's log:\n{procs.tail(self.logs['kwok'])}") from None
        result: dict[str, Any] = self.api_client().sanitize_for_serialization(core.read_node(name))
        return result

    def apply_notebook_crd(self, timeout: float = 60) -> None:
        """Create the Notebook CRD (kustomize/crd) and wait until it is Established."""
        from kubernetes import client
        from kubernetes.client.exceptions import ApiException

        root = source_root() or Path.cwd()
        body = yaml.safe_load((root / CRD_PATH).read_text())
        ext: Any = client.ApiextensionsV1Api(self.api_client())
        try:
            ext.create_custom_resource_definition(body)
        except ApiException as err:
            if err.status != 409:
                raise

        wait_established(ext, [body["metadata"]["name"]], timeout, "the Notebook CRD")

    def start_notebook_controller(self, binary: Path | None = None, timeout: float = 60,
                                  env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        """Run Kubeflow's notebook-controller against this cluster with built-in culling off.

        Applies the Notebook CRD first. Metrics and health probes bind to loopback ports; leader
        election is off; no Istio. Raises NotebookControllerUnavailable when no binary can be had.
        """
        if self.mode != "full":
            raise ClusterError("the notebook-controller needs LocalCluster(mode='full'): without the "
                               "controller-manager its StatefulSets never get pods")
        path = binary or notebook_controller_binary(quiet=self.quiet)
        self.apply_notebook_crd()
        metrics_port, probe_port = procs.free_port(), procs.free_port()
        run_env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(self.dir),
            "KUBECONFIG": str(self.kubeconfig),
            "ENABLE_CULLING": "false", "USE_ISTIO": "false", "CLUSTER_DOMAIN": "cluster.local",
            **(env or {}),
        }
        self.add_process("notebook-controller", [
            str(path), "--kubeconfig", str(self.kubeconfig),
            "--metrics-addr", f"127.0.0.1:{metrics_port}", "--probe-addr", f"127.0.0.1:{probe_port}",
            "--enable-leader-election=false", "--zap-log-level=info",
        ], env=run_env)
        self._wait_http("notebook-controller", f"http://127.0.0.1:{probe_port}/readyz", timeout=timeout)
        return self.procs["notebook-controller"]

    def stop_apiserver(self, kill: bool = True) -> None:
        """Take kube-apiserver down (SIGKILL, as a crash, or SIGTERM); etcd and the rest keep running."""
        proc = self.procs["kube-apiserver"]
        if kill:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)
        else:
            procs.stop(proc)

    def start_apiserver(self, timeout: float = 120) -> None:
        """Start kube-apiserver again with its first command line: same port, certificates and etcd."""
        proc = self.procs["kube-apiserver"]
        if proc.poll() is None:
            return
        self._launch("kube-apiserver", [str(a) for a in proc.args])  # type: ignore[union-attr]
        self._wait_http("kube-apiserver", f"{self.server}/readyz", timeout=timeout, tls=True)

    def restart_apiserver(self, down_seconds: float = 0.0, kill: bool = True) -> None:
        """Stop kube-apiserver, leave it down for `down_seconds`, and start it again on the same port."""
        self.stop_apiserver(kill)
        time.sleep(down_seconds)
        self.start_apiserver()

    def stop(self, grace: float = 1.0) -> None:
        """Stop every component at once and remove the cluster's directory. A throw-away cluster needs
        no orderly shutdown, and kube-apiserver, told to stop, was measured still running 30 s later
        (`procs.stop_all` on it and etcd): what is left after `grace` seconds is killed."""
        procs.stop_all(list(reversed(self.procs.values())), grace)
        self.procs.clear()
        if self._own_dir:
            shutil.rmtree(self.dir, ignore_errors=True)

    # -- helpers ---------------------------------------------------------------------------------
    def _launch(self, name: str, cmd: list[str]) -> None:
        log = self.dir / f"{name}.log"
        self.logs[name] = log
        self.procs[name] = procs.start(cmd, log)

    def add_process(self, name: str, cmd: list[str],
                    env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        """Run another component (a controller, kwok, ...) that is stopped with the cluster."""
        log = self.dir / f"{name}.log"
        self.logs[name] = log
        self.procs[name] = procs.start(cmd, log, env=env)
        return self.procs[name]

    def _wait_http(self, name: str, url: str, timeout: float, tls: bool = False, verify: bool = True) -> None:
        ctx: ssl.SSLContext | None = None
        if tls and not verify:
            # A component's self-signed serving certificate on loopback; only /healthz is read.
            ctx = ssl.create_default_context()
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        elif tls:
            assert self.ca is not None and self.admin is not None
            ctx = ssl.create_default_context(cafile=str(self.ca.cert))
            ctx.load_cert_chain(str(self.admin.cert), str(self.admin.key))

        def ready() -> bool:
            proc = self.procs[name]
            if proc.poll() is not None:
                raise ClusterError(f"{name} exited with status {proc.returncode} during start-up; "
                                   f"last lines of its log:\n{procs.tail(self.logs[name])}")
            try:
                with urllib.request.urlopen(url, timeout=2, context=ctx) as resp:
                    return bool(resp.status == 200)
            except OSError:
                return False

        try:
            procs.wait_until(ready, timeout, interval=0.2, what=f"{name} to be ready")
        except TimeoutError as err:
            raise ClusterError(f"{err}; last lines of its log:\n{procs.tail(self.logs[name])}") from None

    def log_tail(self, name: str, lines: int = 40) -> str:
        return procs.tail(self.logs[name], lines)

    def api_client(self, kubeconfig: Path | None = None) -> Any:
        from kubernetes import config

        new_client: Any = config.new_client_from_config
        return new_client(config_file=str(kubeconfig or self.kubeconfig))

    def service_account_kubeconfig(self, namespace: str, name: str, path: Path | None = None,
                                   seconds: int = 3600) -> Path:
        """Create the ServiceAccount if needed, mint a TokenRequest token, write a kubeconfig for it."""
        return service_account_kubeconfig(self.api_client(), self.server, self._ca_path(), namespace, name,
                                          path or self.dir / f"sa-{namespace}-{name}.kubeconfig", seconds)

    def _ca_path(self) -> Path:
        assert self.ca is not None
        return self.ca.cert


def service_account_kubeconfig(api: Any, server: str, ca: Path, namespace: str, name: str, path: Path,
                               seconds: int = 3600) -> Path:
    """A kubeconfig that acts exactly as ServiceAccount namespace/name (token from the TokenRequest API)."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    core: Any = client.CoreV1Api(api)
    creates: list[tuple[dict[str, Any], Callable[[dict[str, Any]], object]]] = [
        ({"metadata": {"name": namespace}}, lambda b: core.create_namespace(b)),
        ({"metadata": {"name": name}}, lambda b: core.create_namespaced_service_account(namespace, b)),
    ]
    for body, create in creates:
        try:
            create(body)
        except ApiException as err:
            if err.status != 409:
                raise
    token = core.create_namespaced_service_account_token(
        name, namespace, {"spec": {"expirationSeconds": seconds}}).status.token
    path.write_text(yaml.safe_dump(kubeconfig_dict(server, ca, {"token": token}, name=f"{namespace}-{name}")))
    path.chmod(0o600)
    return path
