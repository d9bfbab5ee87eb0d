"""One interface over the clusters tests can run against: local control plane, KUBECONFIG, or kind.

Chosen by KF_CULLER_TEST_CLUSTER = local (default) | kubeconfig | kind.
"""

from __future__ import annotations

import base64
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

from kf_culler.local.cluster import ClusterError, LocalCluster, service_account_kubeconfig, source_root

CRD_PATH = Path("kustomize") / "crd" / "notebooks.kubeflow.org.yaml"


class Unavailable(RuntimeError):
    """No cluster of the chosen kind can be had here; the message says why (used as a skip reason)."""


class KubeTarget:
    def __init__(self, backend: str, kubeconfig: Path, workdir: Path, local: LocalCluster | None = None):
        self.backend = backend
        self.kubeconfig = kubeconfig
        self.workdir = workdir
        self.local = local

    def api_client(self, kubeconfig: Path | None = None) -> Any:
        from kubernetes import config

        return config.new_client_from_config(config_file=str(kubeconfig or self.kubeconfig))

    def _server_and_ca(self) -> tuple[str, Path]:
        cfg = yaml.safe_load(self.kubeconfig.read_text())
        ctx_name = cfg.get("current-context")
        ctx = next(c["context"] for c in cfg["contexts"] if c["name"] == ctx_name)
        cluster = next(c["cluster"] for c in cfg["clusters"] if c["name"] == ctx["cluster"])
        ca = self.workdir / "target-ca.crt"
        if "certificate-authority-data" in cluster:
            ca.write_bytes(base64.b64decode(cluster["certificate-authority-data"]))
        else:
            ca.write_bytes(Path(cluster["certificate-authority"]).read_bytes())
        return str(cluster["server"]), ca

    def service_account_kubeconfig(self, namespace: str, name: str) -> Path:
        server, ca = self._server_and_ca()
        return service_account_kubeconfig(self.api_client(), server, ca, namespace, name,
                                          self.workdir / f"sa-{namespace}-{name}.kubeconfig")

    def apply_notebook_crd(self) -> None:
        apply_notebook_crd(self.api_client())


def apply_notebook_crd(api: Any) -> None:
    """Create kustomize/crd's Notebook CRD (if absent) and wait until it is served."""
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    root = source_root() or Path.cwd()
    body = yaml.safe_load((root / CRD_PATH).read_text())
    ext = client.ApiextensionsV1Api(api)
    try:
        ext.create_custom_resource_definition(body)
    except ApiException as err:
        if err.status != 409:
            raise
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        crd = ext.read_custom_resource_definition("notebooks.kubeflow.org")
        if any(c.type == "Established" and c.status == "True" for c in crd.status.conditions or []):
            return
        time.sleep(0.2)
    raise RuntimeError("the Notebook CRD did not become Established within 60 s")


def _docker_works() -> bool:
    if shutil.which("docker") is None:
        return False
    return subprocess.run(["docker", "info"], capture_output=True, timeout=20).returncode == 0


@contextmanager
def open_target() -> Iterator[KubeTarget]:
    backend = os.environ.get("KF_CULLER_TEST_CLUSTER", "local")
    workdir = Path(tempfile.mkdtemp(prefix="kf-culler-target-"))
    try:
        if backend == "local":
            if shutil.which("go") is None and not (Path.home() / ".cache/kf-culler/bin").exists():
                raise Unavailable("no Go toolchain to build kube-apiserver/etcd and no cached binaries")
            try:
                cluster = LocalCluster()
                cluster.start()
            except ClusterError as err:
                raise RuntimeError(f"the local control plane failed to start: {err}") from err
            try:
                target = KubeTarget("local", cluster.kubeconfig, workdir, cluster)
                target.apply_notebook_crd()
                yield target
            finally:
                cluster.stop()
        elif backend == "kubeconfig":
            path = os.environ.get("KUBECONFIG")
            if not path:
                raise Unavailable("KF_CULLER_TEST_CLUSTER=kubeconfig but KUBECONFIG is not set")
            target = KubeTarget("kubeconfig", Path(path.split(os.pathsep)[0]), workdir)
            target.apply_notebook_crd()
            yield target
        elif backend == "kind":
            from pytest_kind import KindCluster

            from support.kind import KindUnavailable, kind_backend

            try:  # hack/kind/build.sh: kind, the node image and its own Docker daemon (docs/kind.md)
                built = kind_backend()
            except KindUnavailable as why:
                raise Unavailable(f"KF_CULLER_TEST_CLUSTER=kind but {why}") from why
            os.environ["DOCKER_HOST"] = built.docker_host
            if not _docker_works():
                raise Unavailable("KF_CULLER_TEST_CLUSTER=kind but no Docker engine answers `docker info`")
            kind = KindCluster("kf-culler-test", kubeconfig=workdir / "kind.kubeconfig", image=built.node_image,
                               kind_path=built.kind_bin, kubectl_path=built.kubectl_bin)
            kind.create()
            try:
                target = KubeTarget("kind", Path(kind.kubeconfig_path), workdir)
                target.apply_notebook_crd()
                yield target
            finally:
                kind.delete()
        else:
            raise Unavailable(f"unknown KF_CULLER_TEST_CLUSTER={backend!r} (local, kubeconfig or kind)")
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
