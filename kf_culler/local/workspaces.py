"""Kubeflow Notebooks 2.0's Workspace controller on a LocalCluster: binary, CRDs, process.

    with LocalCluster(mode="full") as cluster:
        start_workspace_controller(cluster)      # applies the Workspace/WorkspaceKind CRDs first
        custom.create_cluster_custom_object(GROUP, VERSION, KINDS, workspace_kind_body("jupyterlab"))
        custom.create_namespaced_custom_object(GROUP, VERSION, ns, WORKSPACES,
                                               workspace_body(ns, "ws1", "jupyterlab"))

The controller (v2.0.0-beta.0) is built from the unmodified upstream copy in
../shared/vendor/kubeflow-workspaces-v2.0.0-beta.0 by `hack/controlplane/build.sh workspaces`, which also
copies its CRDs beside the binary (`workspace-crds/`). It runs with the cluster's admin kubeconfig,
ENABLE_WEBHOOKS=false (no cert-manager), leader election off, metrics and health probes on loopback
ports. Istio is off by default; then the controller neither watches nor needs VirtualServices. With
use_istio=True the VirtualService CRD is applied first, taken from the Go module cache
(istio.io/api, the version the controller's go.mod requires: kubernetes/customresourcedefinitions.gen.yaml).

What the controller makes of a Workspace <name> in <namespace> (read from its source):
StatefulSet and Service `ws-<name>-<5 random>` (metadata.generateName `ws-<name>-`), ServiceAccount
`ws-<name>`, all labelled `notebooks.kubeflow.org/workspace-name=<name>` and controlled by the Workspace;
the pod `<statefulset>-0`, labelled as well with `statefulset=<name>`; each port's HTTP path
`/workspace/connect/<namespace>/<name>/<portId>/`. `spec.paused: true` sets the StatefulSet to 0 replicas,
`status.state` to Paused and `status.pauseTime` (ms since the epoch).

The v2 backend (the REST API the v2 web app reads; same release) is built by `build.sh workspaces-backend`
into the same directory and started by `start_workspace_backend`. It is configured by environment only
(PORT, KUBECONFIG, ...: its flags are declared but never parsed) and listens on every interface, `:<PORT>`,
with no setting for the address. So it runs in a network namespace of its own, which has only a loopback
interface: `python -m kf_culler.local.workspaces netns-run` (below) makes it, publishes the backend's port on
the host's 127.0.0.1 and lets the backend reach the API server at the same loopback address it has in
the kubeconfig. Nothing of the backend listens on the host but that one 127.0.0.1 port.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import fcntl
import os
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import threading
import urllib.parse
import urllib.request
from pathlib import Path
from types import FrameType
from typing import Any

import yaml

from kf_culler.local import procs
from kf_culler.local.cluster import REPO_MARKER, ClusterError, LocalCluster, bin_dir, source_root, wait_established

GROUP = "kubeflow.org"
VERSION = "v1beta1"
WORKSPACES = "workspaces"
KINDS = "workspacekinds"
CONTROLLER = "workspace-controller"
CONTROLLER_VERSION = "v2.0.0-beta.0"
BINARY_ENV = "KF_CULLER_WORKSPACE_CONTROLLER"
BACKEND = "workspace-backend"
BACKEND_BINARY_ENV = "KF_CULLER_WORKSPACE_BACKEND"
HEALTHCHECK = "/api/v1/healthcheck"
SOURCE_ENV = "KF_CULLER_WORKSPACE_CONTROLLER_SRC"
WORKSPACES_SOURCE_ENV = "KF_CULLER_WORKSPACES_SRC"
CRD_NAMES = ("workspaces.kubeflow.org", "workspacekinds.kubeflow.org")
CRD_FILES = ("kubeflow.org_workspaces.yaml", "kubeflow.org_workspacekinds.yaml")
VIRTUALSERVICE_CRD = "virtualservices.networking.istio.io"
WORKSPACE_NAME_LABEL = "notebooks.kubeflow.org/workspace-name"
SELECTOR_LABEL = "statefulset"
KIND_FINALIZER = "notebooks.kubeflow.org/workspacekind-protection"
CONNECT_PATH = "/workspace/connect/{namespace}/{name}/{port_id}/"
IMAGE = "ghcr.io/kubeflow/kubeflow/notebook-servers/jupyter-scipy:v1.10.0"  # never pulled: kwok plays the kubelet


class WorkspaceControllerUnavailable(ClusterError):
    """Kubeflow's Workspace controller cannot be had or started here; the message says why."""


def vendored_source() -> Path:
    """The Workspace controller's source: $KF_CULLER_WORKSPACE_CONTROLLER_SRC, else the vendored copy."""
    env = os.environ.get(SOURCE_ENV)
    if env:
        return Path(env)
    root = source_root() or Path.cwd()
    return (root.parent / "shared" / "vendor" / "kubeflow-workspaces-v2.0.0-beta.0" / "workspaces"
            / "controller")


def workspaces_source() -> Path:
    """The whole workspaces/ folder (backend/ beside controller/), what the backend is built from:
    $KF_CULLER_WORKSPACES_SRC, else the vendored copy."""
    env = os.environ.get(WORKSPACES_SOURCE_ENV)
    if env:
        return Path(env)
    root = source_root() or Path.cwd()
    return root.parent / "shared" / "vendor" / "kubeflow-workspaces-v2.0.0-beta.0" / "workspaces"


def workspace_controller_binary(build: bool = True, quiet: bool = True) -> Path:
    """The Workspace controller: $KF_CULLER_WORKSPACE_CONTROLLER, else the build cache (built by
    `build.sh workspaces` on first use). Raises WorkspaceControllerUnavailable with the build's error."""
    return _binary(CONTROLLER, BINARY_ENV, "workspaces", "Kubeflow's Workspace controller",
                   vendored_source(), SOURCE_ENV, build, quiet)


def workspace_backend_binary(build: bool = True, quiet: bool = True) -> Path:
    """The v2 backend: $KF_CULLER_WORKSPACE_BACKEND, else the build cache (built by
    `build.sh workspaces-backend` on first use, from the whole workspaces/ folder: its go.mod replaces the
    controller module with ../controller). Raises WorkspaceControllerUnavailable with the build's error."""
    return _binary(BACKEND, BACKEND_BINARY_ENV, "workspaces-backend", "Kubeflow's Workspaces backend",
                   workspaces_source() / "backend", WORKSPACES_SOURCE_ENV, build, quiet)


def _binary(name: str, binary_env: str, set_name: str, what: str, source: Path, source_env: str,
            build: bool, quiet: bool) -> Path:
    env = os.environ.get(binary_env)
    if env:
        path = Path(env)
        if not (path.is_file() and os.access(path, os.X_OK)):
            raise WorkspaceControllerUnavailable(f"{binary_env}={env} is not an executable file")
        return path
    path = bin_dir() / name
    stamp = bin_dir() / f"{name}.version"
    if path.is_file() and stamp.is_file() and stamp.read_text().strip() == CONTROLLER_VERSION:
        return path
    if not build:
        raise WorkspaceControllerUnavailable(f"{path} ({CONTROLLER_VERSION}) does not exist; run "
                                             f"hack/controlplane/build.sh {set_name}")
    if shutil.which("go") is None:
        raise WorkspaceControllerUnavailable(f"{path} does not exist and Go is not installed to build it")
    if not (source / "go.mod").is_file():
        raise WorkspaceControllerUnavailable(f"{path} does not exist and there is no source to build it from "
                                             f"at {source} (set {source_env})")
    if not quiet:
        print(f"Building {what} into {path.parent} (about 3 minutes) ...", file=sys.stderr)
    root = source_root()
    if root is None:
        raise WorkspaceControllerUnavailable(f"{path} does not exist and no kf-culler checkout "
                                             "(hack/controlplane/build.sh) was found; set KF_CULLER_SOURCE")
    # build.sh is idempotent (a binary with a matching .version stamp is kept) and prints its own errors.
    result = subprocess.run(["bash", str(root / REPO_MARKER), set_name], capture_output=True, text=True,
                            check=False)
    if result.returncode != 0:
        lines = [ln for ln in result.stderr.splitlines() if not ln.endswith(": cached")]
        raise WorkspaceControllerUnavailable(
            f"{what} could not be built (hack/controlplane/build.sh {set_name}, exit "
            f"{result.returncode}):\n" + "\n".join(lines[-40:]))
    if not path.is_file():
        raise WorkspaceControllerUnavailable(f"hack/controlplane/build.sh {set_name} left no {path}")
    return path


def crd_paths() -> list[Path]:
    """The Workspace and WorkspaceKind CRDs: beside the built binary, else in the controller's source."""
    for directory in (bin_dir() / "workspace-crds",
                      vendored_source() / "manifests" / "kustomize" / "base" / "crd"):
        paths = [directory / f for f in CRD_FILES]
        if all(p.is_file() for p in paths):
            return paths
    raise WorkspaceControllerUnavailable(
        f"the Workspace CRDs ({', '.join(CRD_FILES)}) are neither in {bin_dir() / 'workspace-crds'} nor in "
        f"{vendored_source()}; run hack/controlplane/build.sh workspaces")


def virtualservice_crd_path() -> Path:
    """Istio's CRD bundle from the Go module cache, at the istio.io/api version the controller requires."""
    gomod = vendored_source() / "go.mod"
    match = re.search(r"^\s*istio\.io/api\s+(\S+)", gomod.read_text(), re.M) if gomod.is_file() else None
    if match is None:
        raise WorkspaceControllerUnavailable(f"cannot read the istio.io/api version from {gomod}")
    if shutil.which("go") is None:
        raise WorkspaceControllerUnavailable("Go is not installed: the VirtualService CRD is read from "
                                             "the Go module cache")
    cache = subprocess.run(["go", "env", "GOMODCACHE"], capture_output=True, text=True, check=False).stdout
    path = Path(cache.strip()) / f"istio.io/api@{match.group(1)}" / "kubernetes" / \
        "customresourcedefinitions.gen.yaml"
    if not path.is_file():
        raise WorkspaceControllerUnavailable(f"{path} is missing (it is downloaded with the controller's "
                                             "modules by hack/controlplane/build.sh workspaces)")
    return path


def _apply_crds(cluster: LocalCluster, bodies: list[dict[str, Any]], timeout: float) -> None:
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    ext: Any = client.ApiextensionsV1Api(cluster.api_client())
    for body in bodies:
        try:
            ext.create_custom_resource_definition(body)
        except ApiException as err:
            if err.status != 409:
                raise WorkspaceControllerUnavailable(
                    f"creating CRD {body['metadata']['name']}: {err.status} {err.reason}: {err.body}") from None

    names = [b["metadata"]["name"] for b in bodies]
    try:
        wait_established(ext, names, timeout, f"CRDs {', '.join(names)}")
    except TimeoutError as err:
        raise WorkspaceControllerUnavailable(str(err)) from None


def apply_workspace_crds(cluster: LocalCluster, timeout: float = 60) -> None:
    """Create the Workspace and WorkspaceKind CRDs (kubeflow.org/v1beta1); wait until Established."""
    _apply_crds(cluster, [yaml.safe_load(p.read_text()) for p in crd_paths()], timeout)


def apply_virtualservice_crd(cluster: LocalCluster, timeout: float = 60) -> None:
    """Create Istio's VirtualService CRD (networking.istio.io), what the controller needs with use_istio."""
    docs = [d for d in yaml.safe_load_all(virtualservice_crd_path().read_text())
            if d and d.get("metadata", {}).get("name") == VIRTUALSERVICE_CRD]
    if not docs:
        raise WorkspaceControllerUnavailable(f"{virtualservice_crd_path()} has no {VIRTUALSERVICE_CRD}")
    _apply_crds(cluster, docs[:1], timeout)


def start_workspace_controller(cluster: LocalCluster, binary: Path | None = None, timeout: float = 60,
                               env: dict[str, str] | None = None, use_istio: bool = False,
                               name: str = CONTROLLER) -> subprocess.Popen[bytes]:
    """Run Kubeflow's Workspace controller against the cluster as the process `name`, ready when /readyz
    answers and its caches are in sync (a WorkspaceKind list through it would otherwise race).

    ENABLE_WEBHOOKS=false; leader election off; metrics and health probes on free loopback ports;
    USE_ISTIO from use_istio (then the VirtualService CRD is applied too, and the VirtualServices it
    creates name the gateway `kubeflow/kubeflow-gateway` unless env sets ISTIO_GATEWAY).
    Raises WorkspaceControllerUnavailable when it cannot be built or does not come up.
    """
    if cluster.mode != "full":
        raise WorkspaceControllerUnavailable("the Workspace controller needs LocalCluster(mode='full'): "
                                             "without the controller-manager its StatefulSets never get pods")
    if name in cluster.procs and cluster.procs[name].poll() is None:
        return cluster.procs[name]
    path = binary or workspace_controller_binary(quiet=cluster.quiet)
    apply_workspace_crds(cluster)
    if use_istio:
        apply_virtualservice_crd(cluster)
    metrics_port, probe_port = procs.free_port(), procs.free_port()
    run_env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(cluster.dir),
        "KUBECONFIG": str(cluster.kubeconfig),
        "ENABLE_WEBHOOKS": "false",
        "USE_ISTIO": "true" if use_istio else "false",
        "ISTIO_GATEWAY": "kubeflow/kubeflow-gateway", "CLUSTER_DOMAIN": "cluster.local",
        **(env or {}),
    }
    cluster.add_process(name, [
        str(path), "--kubeconfig", str(cluster.kubeconfig),
        "--metrics-bind-address", f"127.0.0.1:{metrics_port}",
        "--health-probe-bind-address", f"127.0.0.1:{probe_port}",
        "--leader-elect=false", "--zap-devel=false", "--zap-log-level=info",
    ], env=run_env)
    try:
        _wait_ready(cluster, name, f"http://127.0.0.1:{probe_port}/readyz", timeout)
    except ClusterError as err:
        proc = cluster.procs.get(name)
        if proc is not None:
            procs.stop(proc, grace=2)
        raise WorkspaceControllerUnavailable(f"Kubeflow's Workspace controller did not start: {err}") from None
    return cluster.procs[name]


def _wait_ready(cluster: LocalCluster, name: str, url: str, timeout: float) -> None:
    """Wait until /readyz answers 200 and both controllers (Workspace, WorkspaceKind) run their workers:
    controller-runtime logs "Starting workers" once per controller, after its caches have synced."""
    log = cluster.logs[name]

    def ready() -> bool:
        proc = cluster.procs[name]
        if proc.poll() is not None:
            raise ClusterError(f"{name} exited with status {proc.returncode}; last lines of its log:\n"
                               f"{procs.tail(log)}")
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                if resp.status != 200:
                    return False
        except OSError:
            return False
        return log.read_text(errors="replace").count("Starting workers") >= 2

    try:
        procs.wait_until(ready, timeout, interval=0.2, what=f"{name} to be ready and its controllers started")
    except TimeoutError as err:
        raise ClusterError(f"{err}; last lines of its log:\n{procs.tail(log)}") from None


# -- the v2 backend, in a network namespace of its own ------------------------------------------

_BACKENDS: dict[tuple[str, str], str] = {}  # (cluster dir, process name) -> base URL


def start_workspace_backend(cluster: LocalCluster, binary: Path | None = None, timeout: float = 60,
                            env: dict[str, str] | None = None, name: str = BACKEND) -> str:
    """Run Kubeflow's Workspaces backend (the v2 REST API) against the cluster as the process `name`; return
    its base URL (`http://127.0.0.1:<port>`), once GET /api/v1/healthcheck answers 200.

    The backend binds `:<PORT>` on every interface and has no setting for the address, so it runs inside a
    network namespace made for it (only a loopback interface; see `netns_run`), with its port published on
    the host's 127.0.0.1 alone and the API server's loopback port reachable from inside. Configured through
    the environment (KUBECONFIG, PORT, and `env`: USERID_HEADER, GROUPS_HEADER, ...). Requests need the
    header kubeflow-userid, and that user's RBAC or `kubeflow-groups: system:masters`.
    Raises WorkspaceControllerUnavailable with the reason when it cannot be built, isolated or started.
    """
    key = (str(cluster.dir), name)
    if key in _BACKENDS and name in cluster.procs and cluster.procs[name].poll() is None:
        return _BACKENDS[key]
    path = binary or workspace_backend_binary(quiet=cluster.quiet)
    api = urllib.parse.urlsplit(cluster.server)
    if api.hostname != "127.0.0.1" or api.port is None:
        raise WorkspaceControllerUnavailable(f"the API server {cluster.server} is not on a 127.0.0.1 port: "
                                             "the backend's network namespace forwards only loopback ports")
    port = procs.free_port()
    run_env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(cluster.dir),
        "KUBECONFIG": str(cluster.kubeconfig), "PORT": str(port),
        "PYTHONPATH": str(Path(__file__).resolve().parents[2]),  # for `python -m kf_culler.local.workspaces`
        **(env or {}),
    }
    cluster.add_process(name, [
        sys.executable, "-m", "kf_culler.local.workspaces", "netns-run",
        "--publish", f"{port}:{port}", "--reach", str(api.port), "--", str(path),
    ], env=run_env)
    base = f"http://127.0.0.1:{port}"
    log = cluster.logs[name]

    def healthy() -> bool:
        proc = cluster.procs[name]
        if proc.poll() is not None:
            raise ClusterError(f"{name} exited with status {proc.returncode}; last lines of its log:\n"
                               f"{procs.tail(log)}")
        try:
            with urllib.request.urlopen(base + HEALTHCHECK, timeout=2) as resp:
                return bool(resp.status == 200)
        except OSError:
            return False

    try:
        procs.wait_until(healthy, timeout, interval=0.2, what=f"{name} to answer {HEALTHCHECK} with 200")
    except (ClusterError, TimeoutError) as err:
        proc = cluster.procs.get(name)
        if proc is not None:
            procs.stop(proc, grace=2)
        tail = "" if isinstance(err, ClusterError) else f"; last lines of its log:\n{procs.tail(log)}"
        raise WorkspaceControllerUnavailable(f"Kubeflow's Workspaces backend did not start: {err}{tail}") from None
    _BACKENDS[key] = base
    return base


_CLONE_NEWNET = 0x40000000
_SIOCSIFFLAGS = 0x8914
_IFF_UP, _IFF_LOOPBACK, _IFF_RUNNING = 0x1, 0x8, 0x40


def _libc_call(fn: str, *args: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if getattr(libc, fn)(*args) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{fn}: {os.strerror(err)}")


def _pump(src: socket.socket, dst: socket.socket) -> None:
    try:
        while data := src.recv(65536):
            dst.sendall(data)
    except OSError:
        pass
    finally:
        for sock, how in ((dst, socket.SHUT_WR), (src, socket.SHUT_RD)):
            with contextlib.suppress(OSError):
                sock.shutdown(how)


def _forward(conn: socket.socket, port: int, host_ns: int | None) -> None:
    """Join conn to 127.0.0.1:port; the outgoing socket is made in host_ns (a netns fd) when given:
    setns(2) moves only the calling thread, and a socket lives in the namespace it was made in."""
    try:
        if host_ns is not None:
            _libc_call("setns", host_ns, _CLONE_NEWNET)
        out = socket.create_connection(("127.0.0.1", port), timeout=10)
        out.settimeout(None)
    except OSError:
        conn.close()
        return
    back = threading.Thread(target=_pump, args=(out, conn), daemon=True)
    back.start()
    _pump(conn, out)
    back.join()
    conn.close()
    out.close()


def _serve(listener: socket.socket, port: int, host_ns: int | None) -> None:
    while True:
        conn, _ = listener.accept()
        threading.Thread(target=_forward, args=(conn, port, host_ns), daemon=True).start()


def _listen(port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    sock.listen(128)
    return sock


def netns_run(cmd: list[str], publish: list[tuple[int, int]], reach: list[int]) -> int:
    """Run cmd in a new network namespace whose only interface is its loopback (root, or CAP_SYS_ADMIN).

    publish (host, inner): the host's 127.0.0.1:host forwards to 127.0.0.1:inner inside; reach (port):
    127.0.0.1:port inside forwards to the host's 127.0.0.1:port. The listeners on the host are made before
    leaving its namespace; connections to the host are made from threads that setns(2) back into it.
    Returns cmd's exit status; SIGTERM is passed on to it."""
    host_ns = os.open("/proc/self/ns/net", os.O_RDONLY)
    published = [(_listen(host), inner) for host, inner in publish]
    _libc_call("unshare", _CLONE_NEWNET)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:  # the new namespace's lo starts down
        fcntl.ioctl(s, _SIOCSIFFLAGS, struct.pack("16sH22x", b"lo", _IFF_UP | _IFF_LOOPBACK | _IFF_RUNNING))
    reached = [(_listen(port), port) for port in reach]
    child = subprocess.Popen(cmd)

    def on_term(signum: int, frame: FrameType | None) -> None:
        child.send_signal(signal.SIGTERM)

    signal.signal(signal.SIGTERM, on_term)
    for listener, inner in published:
        threading.Thread(target=_serve, args=(listener, inner, None), daemon=True).start()
    for listener, port in reached:
        threading.Thread(target=_serve, args=(listener, port, host_ns), daemon=True).start()
    return child.wait()


def _main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m kf_culler.local.workspaces")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("netns-run", help="run a command in a network namespace of its own (see netns_run)")
    run.add_argument("--publish", action="append", default=[], metavar="HOST:INNER",
                     help="forward the host's 127.0.0.1:HOST to 127.0.0.1:INNER inside")
    run.add_argument("--reach", action="append", default=[], type=int, metavar="PORT",
                     help="forward 127.0.0.1:PORT inside to the host's 127.0.0.1:PORT")
    run.add_argument("cmd", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not cmd:
        parser.error("netns-run: no command")
    publish = [(int(h), int(i)) for h, _, i in (p.partition(":") for p in args.publish)]
    try:
        return netns_run(cmd, publish, args.reach)
    except OSError as err:
        print(f"netns-run: cannot make the network namespace: {err} (needs root or CAP_SYS_ADMIN)",
              file=sys.stderr)
        return 2


# -- objects -------------------------------------------------------------------------------------

def connect_path(namespace: str, name: str, port_id: str) -> str:
    """The HTTP path the controller (VirtualService), the backend and NB_PREFIX give a workspace's port."""
    return CONNECT_PATH.format(namespace=namespace, name=name, port_id=port_id)


def workspace_kind_body(name: str, port_id: str = "jupyterlab", port: int = 8888, image: str = IMAGE,
                        gpus: int = 0, jupyter_probe: bool = False,
                        activity_rules: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """A WorkspaceKind like the upstream jupyterlab sample, cut down: one HTTP port, NB_PREFIX set to its
    connect path, one imageConfig ("default") and one podConfig ("default", with `gpus` nvidia.com/gpu).

    jupyter_probe adds the kind's activityProbe (Jupyter's /api/status on the port); activity_rules
    are the kind's spec.activityRules (none by default, so the controller's own culling is off)."""
    resources: dict[str, dict[str, str]] = {"requests": {"cpu": "100m", "memory": "256Mi"},
                                            "limits": {"cpu": "1", "memory": "1Gi"}}
    if gpus:
        resources["requests"]["nvidia.com/gpu"] = str(gpus)
        resources["limits"]["nvidia.com/gpu"] = str(gpus)
    template: dict[str, Any] = {
        "volumeMounts": {"home": "/home/jovyan"},
        "ports": [{"id": port_id, "defaultDisplayName": "JupyterLab", "protocol": "HTTP",
                   "httpProxy": {"removePathPrefix": False}}],
        "extraEnv": [{"name": "NB_PREFIX", "value": f'{{{{ httpPathPrefix "{port_id}" }}}}'}],
        "securityContext": {"fsGroup": 100},
        "options": {
            "imageConfig": {"spawner": {"default": "default"}, "values": [{
                "id": "default", "spawner": {"displayName": "JupyterLab"},
                "spec": {"image": image, "imagePullPolicy": "IfNotPresent",
                         "ports": [{"id": port_id, "port": port}]}}]},
            "podConfig": {"spawner": {"default": "default"}, "values": [{
                "id": "default", "spawner": {"displayName": "Default"},
                "spec": {"resources": resources}}]},
        },
    }
    if jupyter_probe:
        template["activityProbe"] = {"minProbeIntervalSeconds": 1, "probeIntervalSeconds": 1,
                                     "jupyter": {"lastActivity": True, "portId": port_id}}
    spec: dict[str, Any] = {
        "spawner": {"displayName": "JupyterLab Notebook", "description": "A Workspace which runs JupyterLab",
                    "icon": {"url": "https://jupyter.org/favicon.ico"},
                    "logo": {"url": "https://jupyter.org/favicon.ico"}},
        "podTemplate": template,
    }
    if activity_rules:
        spec["activityRules"] = activity_rules
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "WorkspaceKind", "metadata": {"name": name},
            "spec": spec}


def workspace_body(namespace: str, name: str, kind: str, paused: bool = False,
                   home: str | None = None) -> dict[str, Any]:
    """A Workspace of `kind` with the kind's "default" image and pod options (no PVC unless home)."""
    volumes: dict[str, Any] = {"home": home} if home else {}
    return {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "Workspace",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"paused": paused, "kind": kind, "podTemplate": {
            "volumes": volumes, "options": {"imageConfig": "default", "podConfig": "default"}}},
    }


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
