"""Shared fixtures: a real Kubernetes API server (see support.target) and fresh namespaces."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from need import missing
from support.target import KubeTarget, Unavailable, open_target

ROOT = Path(__file__).resolve().parents[1]
SCENARIOS = ROOT.parent / "shared" / "scenarios"


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
