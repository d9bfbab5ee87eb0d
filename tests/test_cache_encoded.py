"""The watch cache keeps the targets' collections encoded and hands out decoded copies: a snapshot's objects are
the reader's own (changing one changes nothing the cache holds), the snapshot it keeps for the Service checks
holds none of the pairs it returned, a lean pass's pairs are encoded as they are paired, and what the checks and
metrics read is decoded as before. On the real API server."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from typing import Any

from kubernetes import client

from kf_culler.kube.cache import ClusterCache, identities, unpacked_pairs
from kf_culler.local import objects as obj
from kf_culler.model import STOP_ANNOTATION


def _service(api: Any, namespace: str, name: str, uid: str) -> None:
    client.CoreV1Api(api).create_namespaced_service(namespace, {
        "metadata": {"name": name, "ownerReferences": [{"apiVersion": "kubeflow.org/v1", "kind": "Notebook",
                                                         "name": name, "uid": uid, "controller": True}]},
        "spec": {"selector": {"statefulset": name}, "ports": [{"port": 80, "targetPort": 8888}]}})


def test_the_cache_keeps_bytes_and_every_reader_gets_its_own_objects(api: Any, namespace: str) -> None:
    made = obj.create_notebook(api, namespace, obj.notebook("nb", gpus=1))
    obj.running_pod(api, namespace, "nb", datetime.now(UTC) - timedelta(hours=1), gpus=1)
    _service(api, namespace, "nb", made["metadata"]["uid"])
    obj.create_notebook(api, namespace, obj.notebook("off", annotations={STOP_ANNOTATION: "2026-01-01T00:00:00Z"}))
    cache = ClusterCache(api, (namespace,))
    cache.start()
    try:
        assert cache.wait_synced(30)
        deadline = time.monotonic() + 10
        while len(cache.objects("services")) < 1 and time.monotonic() < deadline:
            time.sleep(0.1)
        for name in ("notebooks", "pods", "statefulsets", "services"):
            kept = [o for c in cache.collections[name] for o in c.objects.values()]
            assert kept and all(type(o) is bytes for o in kept), name

        first = {n["metadata"]["name"]: (n, p) for n, p in cache.snapshot()}
        assert cache.seen.paired == []  # the kept snapshot holds no decoded pairs
        nb, pod = first["nb"]
        assert pod is not None and pod["metadata"]["name"] == "nb-0" and first["off"][1] is None
        assert nb["metadata"]["uid"] == made["metadata"]["uid"]
        assert cache.service_problem(nb) is None  # the Service, looked up encoded, decoded for the check
        assert cache.service_address(nb) is not None
        # Read for its check then for its address, a Service is decoded once while the cache holds the same bytes.
        key = (namespace, "nb")
        svc = cache.seen.now("services", key)
        assert svc is not None and cache.seen.now("services", key) is svc
        client.CoreV1Api(api).patch_namespaced_service("nb", namespace, {"spec": {"selector": {"statefulset": "x"}}})
        deadline = time.monotonic() + 10
        while ((cache.seen.now("services", key) or {}).get("spec") or {}).get("selector") != {"statefulset": "x"} \
                and time.monotonic() < deadline:
            time.sleep(0.1)
        changed = cache.seen.now("services", key)
        assert changed is not None and changed is not svc and changed["spec"]["selector"] == {"statefulset": "x"}
        assert "does not select" in str(cache.service_problem(nb))  # read as the cache has it now
        client.CoreV1Api(api).patch_namespaced_service("nb", namespace, {"spec": {"selector": {"statefulset": "nb"}}})

        nb["metadata"]["annotations"]["changed"] = "by the reader"
        pod["status"]["phase"] = "Failed"
        again = {n["metadata"]["name"]: (n, p) for n, p in cache.snapshot()}
        assert "changed" not in again["nb"][0]["metadata"]["annotations"]
        assert again["nb"][1] is not None and again["nb"][1]["status"]["phase"] == "Running"
        del nb["metadata"]["annotations"]["changed"]
        assert again["nb"][0] is not nb and again["nb"][0] == nb  # an equal copy

        # A lean pass's pairs: each held as the very bytes the cache holds for its notebook and pod (no copy), with
        # the sessions in the same order as the runner holds them through the pass (those bytes again), and their
        # identities read from them after it.
        packed, kept = cache.packed_pairs()
        assert cache.seen.paired == []
        held = {k: v for name in ("notebooks", "pods") for c in cache.collections[name] for k, v in c.objects.items()}
        assert [(type(p), tuple(type(x) for x in p)) for p in packed] == [
            (tuple, (bytes, bytes)), (tuple, (bytes, type(None)))]  # nb with its pod, off without one
        assert packed[0][0] is held[(namespace, "nb")] and packed[0][1] is held[(namespace, "nb-0")]
        assert packed[1][0] is held[(namespace, "off")]
        assert [k is p[0] for k, p in zip(kept, packed, strict=True)] == [True, True]  # the same bytes, no copy
        assert [ident["metadata"] for ident, pod in identities(kept) if pod is None] == [
            {k: n["metadata"][k] for k in ("name", "namespace", "uid", "resourceVersion")} for n, _ in again.values()]
        first = (packed[0][0], packed[0][1])
        reader = unpacked_pairs(packed)
        decoded = [next(reader)]
        assert reader.encoded == first and reader.encoded[0] is first[0]  # what the pass may hold instead
        decoded += list(reader)
        assert packed == [] and reader.encoded is None  # let go of as they are decoded
        assert {n["metadata"]["name"]: (n, p) for n, p in decoded} == again

        assert sorted(s["metadata"]["name"] for s in cache.sessions()) == ["nb", "off"]
        written = {**again["off"][0], "metadata": {**again["off"][0]["metadata"], "annotations": {"a": "b"}}}
        cache.record_notebook(written)  # as the culler's own patch left it
        assert {s["metadata"]["name"]: s["metadata"]["annotations"] for s in cache.sessions()}["off"] == {"a": "b"}
    finally:
        cache.close()


def test_the_culler_record_buckets_are_kept_encoded_and_read_decoded(api: Any, namespace: str) -> None:
    """The culler's own record ConfigMaps are kept as one blob each (a pass's record patches bring whole buckets
    back through the watch, hundreds of small strings each): the store reads them decoded, as the API has them."""
    from kf_culler.kube.records import RECORDS_LABELS

    client.CoreV1Api(api).create_namespaced_config_map(namespace, {
        "metadata": {"name": "kf-culler-records-00", "labels": dict(RECORDS_LABELS)},
        "data": {"uid-1": '{"namespace":"team","stoppedAt":"2026-12-01T00:00:00Z"}'}})
    cache = ClusterCache(api, (namespace,), records_namespace=namespace)
    cache.start()
    try:
        assert cache.wait_synced(30)
        kept = [o for c in cache.records for o in c.objects.values()]
        assert len(kept) == 1 and type(kept[0]) is bytes
        read = cache.record_objects()
        assert [cm["metadata"]["name"] for cm in read] == ["kf-culler-records-00"]
        assert read[0]["data"] == {"uid-1": '{"namespace":"team","stoppedAt":"2026-12-01T00:00:00Z"}'}
        client.CoreV1Api(api).patch_namespaced_config_map("kf-culler-records-00", namespace,
                                                          {"data": {"uid-2": "{}"}})
        deadline = time.monotonic() + 10
        while "uid-2" not in cache.record_objects()[0]["data"] and time.monotonic() < deadline:
            time.sleep(0.1)
        assert set(cache.record_objects()[0]["data"]) == {"uid-1", "uid-2"}
    finally:
        cache.close()
