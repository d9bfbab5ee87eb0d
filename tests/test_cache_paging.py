"""What listing costs the culler when a tenant makes huge objects: list pages are sized by bytes (a page's
JSON is decoded whole), and StatefulSets, which the notebook-controller
gives a copy of the Notebook's pod template, are listed and watched as metadata only."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from kubernetes import client

from kf_culler.kube import cache as cache_module
from kf_culler.kube.cache import FIRST_PAGE, LIST_PAGE, PAGE_BYTES, ClusterCache, next_limit
from kf_culler.local import objects as obj


def test_pages_are_sized_by_bytes() -> None:
    assert FIRST_PAGE == 1
    assert next_limit(1, 3_000) == LIST_PAGE  # ordinary Notebooks, a few KiB: full pages from the second on
    assert next_limit(1, 1_400_000) == 1  # a tenant's 1.4 MiB Notebooks: one a page
    assert next_limit(10, 10 * 300_000) == PAGE_BYTES // 300_000
    assert next_limit(500, 0) == LIST_PAGE


def big_env(n: int = 1000) -> list[dict[str, str]]:
    return [{"name": f"V{i}", "value": "y" * 900} for i in range(n)]  # ~0.9 MiB


class Recording:
    """Wraps a lister: each call's `limit` and the bytes of its answer."""

    def __init__(self, lister: Any) -> None:
        self.lister = lister
        self.pages: list[tuple[int | None, int, str]] = []
        self.lock = threading.Lock()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        resp = self.lister(*args, **kwargs)
        if not kwargs.get("watch"):
            accept = str((kwargs.get("_headers") or {}).get("Accept", ""))
            with self.lock:
                self.pages.append((kwargs.get("limit"), len(resp.data), accept))
        return resp


@pytest.mark.cluster
def test_huge_notebooks_and_their_statefulsets_cost_small_pages(api: Any, namespace: str,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    apps = client.AppsV1Api(api)
    for i in range(12):
        body = obj.notebook(f"big-{i:02d}")
        body["spec"]["template"]["spec"]["containers"][0]["env"] = big_env()
        created = obj.create_notebook(api, namespace, body)
        apps.create_namespaced_stateful_set(namespace, {
            "metadata": {"name": f"big-{i:02d}", "ownerReferences": [{
                "apiVersion": "kubeflow.org/v1", "kind": "Notebook", "name": f"big-{i:02d}",
                "uid": created["metadata"]["uid"], "controller": True}]},
            "spec": {"replicas": 0, "serviceName": "", "selector": {"matchLabels": {"statefulset": f"big-{i:02d}"}},
                     "template": {"metadata": {"labels": {"statefulset": f"big-{i:02d}"}},
                                  "spec": {"containers": [{"name": "nb", "image": "x:1", "env": big_env()}]}}}})
    recorders: list[Recording] = []
    original = cache_module._Collection.__init__

    def recording_init(self: Any, name: str, lister: Any, *args: Any, **kwargs: Any) -> None:
        rec = Recording(lister)
        if name.startswith(("notebooks/", "statefulsets/")):
            recorders.append(rec)
        original(self, name, rec, *args, **kwargs)

    monkeypatch.setattr(cache_module._Collection, "__init__", recording_init)
    cache = ClusterCache(api, (namespace,))
    cache.start()
    try:
        assert cache.wait_synced(60)
        owners = {s["metadata"]["name"]: s["metadata"]["ownerReferences"][0]["kind"]
                  for c in cache.statefulsets for s in c.snapshot().values()}
        notebooks = {nb["metadata"]["name"] for nb, _ in cache.snapshot()}
    finally:
        cache.close()
    assert notebooks == {f"big-{i:02d}" for i in range(12)}
    assert owners == {f"big-{i:02d}": "Notebook" for i in range(12)}  # pairing still sees the owner
    nb_pages = next(r.pages for r in recorders if r.pages and "PartialObjectMetadata" not in r.pages[0][2])
    sts_pages = next(r.pages for r in recorders if r.pages and "PartialObjectMetadata" in r.pages[0][2])
    assert nb_pages[0][0] == FIRST_PAGE
    one = 1024 * 1024  # a Notebook here is under 1 MiB of JSON
    assert max(size for _, size, _ in nb_pages) <= PAGE_BYTES + one  # never a 500-object page of them
    assert len(nb_pages) >= 6  # 12 Notebooks of 0.9 MiB: two or fewer a page
    # metadata only: not 12 pod templates of 0.9 MiB (their managedFields still name each env entry)
    assert sum(size for _, size, _ in sts_pages) < 12 * 900 * 1024 // 10
