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
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from kf_culler.local import procs
from kf_culler.local.cluster import REPO_MARKER, ClusterError, LocalCluster, bin_dir, source_root

GROUP = "kubeflow.org"
VERSION = "v1beta1"
WORKSPACES = "workspaces"
KINDS = "workspacekinds"
CONTROLLER = "workspace-controller"
CONTROLLER_VERSION = "v2.0.0-beta.0"
BINARY_ENV = "KF_CULLER_WORKSPACE_CONTROLLER"
SOURCE_ENV = "KF_CULLER_WORKSPACE_CONTROLLER_SRC"
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


def workspace_controller_binary(build: bool = True, quiet: bool = True) -> Path:
    """The Workspace controller: $KF_CULLER_WORKSPACE_CONTROLLER, else the build cache (built by
    `build.sh workspaces` on first use). Raises WorkspaceControllerUnavailable with the build's error."""
    env = os.environ.get(BINARY_ENV)
    if env:
        path = Path(env)
        if not (path.is_file() and os.access(path, os.X_OK)):
            raise WorkspaceControllerUnavailable(f"{BINARY_ENV}={env} is not an executable file")
        return path
    path = bin_dir() / CONTROLLER
    stamp = bin_dir() / f"{CONTROLLER}.version"
    if path.is_file() and stamp.is_file() and stamp.read_text().strip() == CONTROLLER_VERSION:
        return path
    if not build:
        raise WorkspaceControllerUnavailable(f"{path} ({CONTROLLER_VERSION}) does not exist; run "
                                             "hack/controlplane/build.sh workspaces")
    if shutil.which("go") is None:
        raise WorkspaceControllerUnavailable(f"{path} does not exist and Go is not installed to build it")
    if not (vendored_source() / "go.mod").is_file():
        raise WorkspaceControllerUnavailable(f"{path} does not exist and there is no source to build it from "
                                             f"at {vendored_source()} (set {SOURCE_ENV})")
    if not quiet:
        print(f"Building Kubeflow's Workspace controller into {path.parent} (about 2 minutes) ...",
              file=sys.stderr)
    root = source_root()
    if root is None:
        raise WorkspaceControllerUnavailable(f"{path} does not exist and no kf-culler checkout "
                                             "(hack/controlplane/build.sh) was found; set KF_CULLER_SOURCE")
    # build.sh is idempotent (a binary with a matching .version stamp is kept) and prints its own errors.
    result = subprocess.run(["bash", str(root / REPO_MARKER), "workspaces"], capture_output=True, text=True,
                            check=False)
    if result.returncode != 0:
        lines = [ln for ln in result.stderr.splitlines() if not ln.endswith(": cached")]
        raise WorkspaceControllerUnavailable(
            f"Kubeflow's Workspace controller could not be built (hack/controlplane/build.sh workspaces, exit "
            f"{result.returncode}):\n" + "\n".join(lines[-40:]))
    if not path.is_file():
        raise WorkspaceControllerUnavailable(f"hack/controlplane/build.sh workspaces left no {path}")
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

    def established() -> bool:
        for body in bodies:
            crd = ext.read_custom_resource_definition(body["metadata"]["name"])
            conds = (crd.status.conditions if crd.status else None) or []
            if not any(c.type == "Established" and c.status == "True" for c in conds):
                return False
        return True

    names = ", ".join(b["metadata"]["name"] for b in bodies)
    try:
        procs.wait_until(established, timeout, interval=0.2, what=f"CRDs {names} to be Established")
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
