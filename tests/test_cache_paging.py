"""What listing costs the culler when a tenant makes huge objects: a list answer is read as a stream and split
into its objects (one decoded at a time), and StatefulSets, which the notebook-controller gives a copy of the
Notebook's pod template, are listed and watched as metadata only."""

from __future__ import annotations

import threading
import tracemalloc
from typing import Any

import pytest
from kubernetes import client

from kf_culler.kube import cache as cache_module
from kf_culler.kube.cache import ClusterCache
from kf_culler.local import objects as obj


def big_env(n: int = 1000) -> list[dict[str, str]]:
    return [{"name": f"V{i}", "value": "y" * 900} for i in range(n)]  # ~0.9 MiB


class Recording:
    """Wraps a lister: each list call's Accept header, and the bytes of its answer as the cache reads them."""

    def __init__(self, lister: Any) -> None:
        self.lister = lister
        self.pages: list[tuple[str, list[int]]] = []
        self.lock = threading.Lock()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        resp = self.lister(*args, **kwargs)
        if kwargs.get("watch"):
            return resp
        sizes: list[int] = []
        with self.lock:
            self.pages.append((str((kwargs.get("_headers") or {}).get("Accept", "")), sizes))
        stream = resp.stream

        def counted(amt: int) -> Any:
            for chunk in stream(amt):
                sizes.append(len(chunk))
                yield chunk

        resp.stream = counted
        return resp


@pytest.mark.cluster
def test_huge_notebooks_and_their_statefulsets_are_never_held_whole(api: Any, namespace: str,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """12 Notebooks of 0.9 MiB and their StatefulSets with the same template: the sync's peak of traced
    allocations stays under 3 of them (a whole-page decode is about 25 MiB), and the StatefulSets' lists
    bring a tenth of their templates' bytes."""


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
    tracemalloc.start()
    try:
        cache.start()
        assert cache.wait_synced(60)
        _, peak = tracemalloc.get_traced_memory()
        owners = {s["metadata"]["name"]: s["metadata"]["ownerReferences"][0]["kind"]
                  for s in cache.objects("statefulsets").values()}
        notebooks = {nb["metadata"]["name"] for nb, _ in cache.snapshot()}
    finally:
        tracemalloc.stop()
        cache.close()
    assert notebooks == {f"big-{i:02d}" for i in range(12)}
    assert owners == {f"big-{i:02d}": "Notebook" for i in range(12)}  # pairing still sees the owner
    nb_bytes = sum(sum(sizes) for accept, sizes in next(r.pages for r in recorders
                                                       if r.pages and "PartialObjectMetadata" not in r.pages[0][0]))
    sts_bytes = sum(sum(sizes) for accept, sizes in next(r.pages for r in recorders
                                                        if r.pages and "PartialObjectMetadata" in r.pages[0][0]))
    assert nb_bytes > 12 * 900 * 1024  # every Notebook came whole over the wire...
    assert peak < 3 * 2 * 1024 * 1024, peak  # ...and was never held with the others (about 2 MiB decoded each)
    # metadata only: not 12 pod templates of 0.9 MiB (their managedFields still name each env entry)
    assert sts_bytes < 12 * 900 * 1024 // 10
