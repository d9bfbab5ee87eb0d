"""The kind backend hack/kind/build.sh makes (docs/kind.md): its binaries, node image and Docker daemon.

What pytest-kind's options name (`--kind-bin`, `--kind-kubectl-bin`, `--kind-image`) come from the build's
`env` file, so pytest-kind downloads nothing; DOCKER_HOST points kind at the build's own Docker daemon.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kf_culler.local.cluster import source_root

BUILD = Path("hack") / "kind" / "build.sh"


class KindUnavailable(RuntimeError):
    """kind cannot be had on this machine; the message says why."""


@dataclass(frozen=True)
class KindBackend:
    kind_bin: Path
    kubectl_bin: Path
    node_image: str
    tools_image: str
    docker_host: str

    def env(self) -> dict[str, str]:
        return {**os.environ, "DOCKER_HOST": self.docker_host}

    def load_image(self, cluster: str, image: str, workdir: Path) -> None:
        """`docker save` IMAGE from the build's daemon and `kind load image-archive` it into CLUSTER."""
        archive = workdir / "image.tar"
        subprocess.run(["docker", "save", "-o", str(archive), image], env=self.env(), check=True)
        subprocess.run([str(self.kind_bin), "load", "image-archive", "--name", cluster, str(archive)],
                       env=self.env(), check=True, capture_output=True)
        archive.unlink()


def kind_backend() -> KindBackend:
    """Build (or find cached) the kind backend; waits on the build's lock if hack/background-builds.sh runs it."""
    root = source_root() or Path.cwd()
    script = root / BUILD
    if not script.is_file():
        raise KindUnavailable(f"no {BUILD} under {root}")
    if shutil.which("go") is None:
        raise KindUnavailable("go is not on PATH (hack/kind/build.sh builds kind and the node's binaries)")
    if os.geteuid() != 0:
        raise KindUnavailable("hack/kind/build.sh runs its own Docker daemon and needs root")
    done = subprocess.run(["bash", str(script), "all"], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{BUILD} failed:\n{done.stderr[-4000:]}")
    env_file = Path(done.stdout.strip().splitlines()[-1]) / "env"
    values = dict(line.split("=", 1) for line in env_file.read_text().splitlines() if "=" in line)
    return KindBackend(kind_bin=Path(values["KIND_BIN"]), kubectl_bin=Path(values["KUBECTL_BIN"]),
                       node_image=values["KIND_NODE_IMAGE"], tools_image=values["KIND_TOOLS_IMAGE"],
                       docker_host=values["DOCKER_HOST"])


# KF_CULLER_KIND_CLUSTER names it otherwise, e.g. for a benchmark run beside a test session on the same daemon.
CLUSTER = os.environ.get("KF_CULLER_KIND_CLUSTER", "kf-culler-kind-test")


class Kind:
    """One kind cluster the real-kubelet tests share (tests/conftest.py's `kind` fixture, made once a session)."""

    name = CLUSTER

    def __init__(self, backend: KindBackend, kubeconfig: Path, workdir: Path) -> None:
        self.backend = backend
        self.kubeconfig = kubeconfig
        self.workdir = workdir
        self.loaded: set[Path] = set()  # archives already on the node (load_archive_once)

    def kubectl(self, *args: str, stdin: str | None = None, timeout: float = 300) -> str:
        done = subprocess.run([str(self.backend.kubectl_bin), f"--kubeconfig={self.kubeconfig}", *args],
                              input=stdin, capture_output=True, text=True, timeout=timeout)
        if done.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed: {done.stderr.strip()}")
        return done.stdout

    def wait_condition(self, resource: str, condition: str, *, namespace: str | None = None,
                       timeout: float = 180) -> None:
        """Wait until `resource` (e.g. `pod/session-0`) has `condition` True. Not `kubectl wait`: an object just
        applied may not exist yet, or have no status.conditions yet, and kubectl wait then fails at once
        ("accessor error: <nil> is of the type <nil>") instead of waiting."""
        where = ["-n", namespace] if namespace else []
        path = f'jsonpath={{.status.conditions[?(@.type=="{condition}")].status}}'
        deadline = time.monotonic() + timeout
        seen = ""
        while True:
            done = subprocess.run([str(self.backend.kubectl_bin), f"--kubeconfig={self.kubeconfig}", "get",
                                   resource, *where, "--ignore-not-found", "-o", path],
                                  capture_output=True, text=True, timeout=60)
            seen = done.stdout.strip() or done.stderr.strip() or "not found"
            if done.returncode == 0 and seen == "True":
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"{resource} not {condition} after {timeout:.0f} s (last read: {seen})")
            time.sleep(1)

    def load_image(self, image: str) -> None:
        """Put an image of the build's Docker daemon onto the cluster's node (nothing is pulled)."""
        self.backend.load_image(self.name, image, self.workdir)

    def load_archive(self, archive: Path) -> None:
        """Put an image archive (docker-archive, e.g. hack/image/build.sh's) onto the cluster's node."""
        subprocess.run([str(self.backend.kind_bin), "load", "image-archive", "--name", self.name, str(archive)],
                       env=self.backend.env(), check=True, capture_output=True)

    def load_archive_once(self, archive: Path) -> None:
        """load_archive, once a cluster: the tests that share the cluster share its images."""
        if archive not in self.loaded:
            self.load_archive(archive)
            self.loaded.add(archive)

    def api_client(self) -> Any:
        """A Kubernetes API client for the cluster (the kubeconfig pytest-kind wrote)."""
        from kubernetes import config

        return config.new_client_from_config(config_file=str(self.kubeconfig))

    def node(self) -> str:
        (name,) = self.kubectl("get", "nodes", "-o", "jsonpath={.items[*].metadata.name}").split()
        return name


@contextlib.contextmanager
def open_kind(backend: KindBackend) -> Iterator[Kind]:
    """A kind cluster made through pytest-kind's KindCluster from the local node image, its node Ready and the
    tools image loaded; deleted, and the build's Docker daemon stopped, on leaving."""
    from pytest_kind import KindCluster

    saved = os.environ.get("DOCKER_HOST")
    os.environ["DOCKER_HOST"] = backend.docker_host  # kind (run by pytest-kind) talks to the build's daemon
    workdir = Path(tempfile.mkdtemp(prefix="kf-culler-kind-"))
    cluster = KindCluster(Kind.name, kubeconfig=workdir / "kubeconfig", image=backend.node_image,
                          kind_path=backend.kind_bin, kubectl_path=backend.kubectl_bin)
    cluster.delete()  # a cluster left by an interrupted run: start clean
    try:
        cluster.create()
        kind = Kind(backend, workdir / "kubeconfig", workdir)
        kind.wait_condition(f"node/{kind.node()}", "Ready", timeout=300)
        kind.load_image(backend.tools_image)
        yield kind
    finally:
        cluster.delete()
        shutil.rmtree(workdir, ignore_errors=True)  # its kubeconfig, of a cluster now gone
        # The build's Docker daemon outlives nothing it served: stopped once the cluster is gone, unless another
        # kind cluster still runs on it.
        others = subprocess.run([str(backend.kind_bin), "get", "clusters"], env=backend.env(), capture_output=True,
                                text=True)
        if others.returncode != 0 or not others.stdout.split():
            subprocess.run(["bash", str(Path(__file__).resolve().parents[2] / "hack" / "kind" / "dockerd.sh"), "stop"],
                           check=False)
        if saved is None:
            os.environ.pop("DOCKER_HOST", None)
        else:
            os.environ["DOCKER_HOST"] = saved
