"""Shared fixtures: a real Kubernetes API server (see support.target) and fresh namespaces."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from need import missing
from support.kind import Kind, KindUnavailable, kind_backend, open_kind
from support.kind_culler import Images, ImagesUnavailable, build_images
from support.target import KubeTarget, Unavailable, open_target

ROOT = Path(__file__).resolve().parents[1]
SCENARIOS = ROOT.parent / "shared" / "scenarios"
# Tests whose components hack/test.sh builds in the background while the others run (hack/background-builds.sh),
# in the order it builds them: Kubeflow Notebooks 2.0's Workspace controller and backend first, then kf-culler's
# image, Coder and Terraform, the kind backend, Open Data Hub's controllers. They run last, group by group, and
# their harness waits for the build.
WORKSPACES_LATE = ("test_e2e_workspaces", "test_workspace_controller", "test_demo.py::test_demo_target_workspaces")
LATE = ("test_coder_", "test_image", "test_kind_", "test_odh_")


def late_group(item: pytest.Item) -> int:
    """0 for a test that needs nothing built in the background, 1 for the Workspaces' tests, 2 for the rest."""
    where = f"{item.path.name}::{item.name}"
    if where.startswith(WORKSPACES_LATE):
        return 1
    return 2 if item.path.name.startswith(LATE) else 0


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    items.sort(key=late_group)  # stable: the others keep their order


@pytest.fixture(scope="session")
def kind() -> Iterator[Kind]:
    """One kind cluster for every real-kubelet test (tests/test_kind_*.py), made once through pytest-kind from
    the local node image (hack/kind/build.sh); its tools image loaded. Deleted, and the build's Docker daemon
    stopped unless another kind cluster runs on it, at the end of the session (KF_CULLER_KIND_CLUSTER names it)."""
    try:
        backend = kind_backend()
    except KindUnavailable as why:
        missing("kind", why)
    with open_kind(backend) as kind:
        yield kind


@pytest.fixture(scope="session")
def kind_images(kind: Kind) -> Images:
    """The images the kind tests run (hack/kind/images.sh: kf-culler's, a JupyterLab image, Kubeflow's
    notebook-controller), on the kind cluster's node."""
    try:
        return build_images(kind)
    except ImagesUnavailable as why:
        missing("the kind tests' images (hack/kind/images.sh)", why)


@pytest.fixture(scope="session")
def kube() -> Iterator[KubeTarget]:
    """The cluster the tests run against, with the Notebook CRD applied."""
    try:
        with open_target() as target:
            yield target
    except Unavailable as why:
        missing("a Kubernetes API server", why)


@pytest.fixture()
def namespace(kube: KubeTarget) -> Iterator[str]:
    from kubernetes import client

    name = f"t-{uuid.uuid4().hex[:10]}"
    core = client.CoreV1Api(kube.api_client())
    core.create_namespace({"metadata": {"name": name}})
    yield name
    with contextlib.suppress(Exception):  # left Terminating on an API-server-only cluster: harmless
        core.delete_namespace(name)


@pytest.fixture()
def api(kube: KubeTarget) -> Any:
    return kube.api_client()


@pytest.fixture(scope="session")
def full_cluster() -> Iterator[Any]:
    """One local cluster in "full" mode (kube-controller-manager, kube-scheduler, kwok playing a node with
    one nvidia.com/gpu) for every test that needs it, with Kubeflow's notebook-controller started on first
    use (`notebook_controller` below). Tests using it delete their namespace's pods before they end."""
    from kf_culler.local.handoff import Unavailable, open_full_cluster

    try:
        with open_full_cluster() as c:
            yield c
    except Unavailable as why:
        missing("the full local cluster", why)


@pytest.fixture()
def notebook_controller(full_cluster: Any) -> Any:
    """The full cluster, with Kubeflow's notebook-controller running on it."""
    from kf_culler.local.cluster import NotebookControllerUnavailable
    from kf_culler.local.handoff import start_controller

    if "notebook-controller" not in full_cluster.procs:
        try:
            start_controller(full_cluster)
        except NotebookControllerUnavailable as why:
            missing("Kubeflow's notebook-controller", why)
    return full_cluster


@pytest.fixture(scope="session")
def workspace_controller(full_cluster: Any) -> Any:
    """The session's full cluster with Kubeflow Notebooks 2.0's Workspace controller running on it (built from
    the vendored source on first use: hack/controlplane/build.sh workspaces)."""
    from kf_culler.local.workspaces import WorkspaceControllerUnavailable, start_workspace_controller

    try:
        start_workspace_controller(full_cluster)
    except WorkspaceControllerUnavailable as why:
        missing("Kubeflow's Workspace controller", why)
    return full_cluster
