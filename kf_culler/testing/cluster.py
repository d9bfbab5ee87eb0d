"""A real local control plane: etcd and kube-apiserver built from upstream Go modules, on loopback.

    with LocalCluster() as cluster:
        api = cluster.api_client()          # admin (system:masters) client
        sa_kubeconfig = cluster.service_account_kubeconfig("kubeflow", "kf-culler")

Binaries come from the build cache (hack/controlplane/build.sh); they are built on first use.
"""

from __future__ import annotations

import base64
import os
import shutil
import ssl
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from kf_culler.testing import procs
from kf_culler.testing.pki import Authority, Pair, service_account_keys

REPO_MARKER = Path("hack") / "controlplane" / "build.sh"


class ClusterError(RuntimeError):
    """The local control plane could not be built or started; the message carries the log tail."""


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
                           f"(hack/controlplane/build.sh) was found; set KF_CULLER_SOURCE or KF_CULLER_BIN_DIR")
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


def kubeconfig_dict(server: str, ca: Path, user: dict[str, str], name: str = "kf-culler-local") -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "Config", "current-context": name,
        "clusters": [{"name": name, "cluster": {
            "server": server, "certificate-authority-data": base64.b64encode(ca.read_bytes()).decode()}}],
        "users": [{"name": name, "user": user}],
        "contexts": [{"name": name, "context": {"cluster": name, "user": name}}],
    }


class LocalCluster:
    """etcd + kube-apiserver on free loopback ports, RBAC on, torn down completely by stop()."""

    def __init__(self, workdir: Path | None = None, quiet: bool = True, keep_serviceaccount_admission: bool = False):
        self.quiet = quiet
        self._own_dir = workdir is None
        self.dir = Path(tempfile.mkdtemp(prefix="kf-culler-cluster-")) if workdir is None else workdir
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.logs: dict[str, Path] = {}
        self.server = ""
        self.kubeconfig = self.dir / "admin.kubeconfig"
        self._keep_sa_admission = keep_serviceaccount_admission
        self.ca: Pair | None = None
        self.admin: Pair | None = None

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
        bins = ensure_binaries(quiet=self.quiet)
        pki = self.dir / "pki"
        pki.mkdir(parents=True, exist_ok=True)
        authority = Authority(pki)
        self.ca = authority.pair
        serving = authority.issue("apiserver", "kube-apiserver", server=True)
        self.admin = authority.issue("admin", "kf-culler-admin", ("system:masters",), client=True)
        sa = service_account_keys(pki)

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
            "--service-cluster-ip-range", "10.96.0.0/16",
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

    def stop(self) -> None:
        for name in reversed(list(self.procs)):
            procs.stop(self.procs[name])
        self.procs.clear()
        if self._own_dir:
            shutil.rmtree(self.dir, ignore_errors=True)

    # -- helpers ---------------------------------------------------------------------------------
    def _launch(self, name: str, cmd: list[str]) -> None:
        log = self.dir / f"{name}.log"
        self.logs[name] = log
        self.procs[name] = procs.start(cmd, log)

    def add_process(self, name: str, cmd: list[str], env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        """Run another component (a controller, kwok, ...) that is stopped with the cluster."""
        log = self.dir / f"{name}.log"
        self.logs[name] = log
        self.procs[name] = procs.start(cmd, log, env=env)
        return self.procs[name]

    def _wait_http(self, name: str, url: str, timeout: float, tls: bool = False) -> None:
        ctx: ssl.SSLContext | None = None
        if tls:
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

        return config.new_client_from_config(config_file=str(kubeconfig or self.kubeconfig))

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
    from kubernetes.client.rest import ApiException

    core = client.CoreV1Api(api)
    for body, create in (
        ({"metadata": {"name": namespace}}, lambda b: core.create_namespace(b)),
        ({"metadata": {"name": name}}, lambda b: core.create_namespaced_service_account(namespace, b)),
    ):
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
