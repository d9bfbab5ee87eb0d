"""A notebook's pod is found by name and ownership, never by labels (rule 15); a GPU pod taken from its
StatefulSet is reported, not counted as reclaimed. Pure pairing, then on the real API server."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from kubernetes import client
from support.passes import Passes

from kf_culler.config import load_mapping
from kf_culler.local import objects as obj
from kf_culler.metrics import Metrics
from kf_culler.plan import EVENT_ORPHAN
from kf_culler.runner import build_runner
from kf_culler.service import instrument
from kf_culler.targets.pairing import Orphan, pair, pairs


def _nb(name: str, uid: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {"metadata": {"namespace": "ns", "name": name, "uid": uid, "labels": labels or {}}}


def _owned(name: str, kind: str, owner: str, owner_uid: str, uid: str = "") -> dict[str, Any]:
    return {"metadata": {"namespace": "ns", "name": name, "uid": uid or f"uid-{name}", "ownerReferences": [
        {"kind": kind, "name": owner, "uid": owner_uid, "controller": True}]}}


def test_pods_are_paired_as_the_notebook_controller_acts_and_labels_do_not_count() -> None:
    """The StatefulSet `<name>` of the Notebook's namespace, whatever its ownerReferences (the notebook-controller
    scales it by name), then its pod `<name>-0` by the pod's controller uid."""
    notebooks = {("ns", n): _nb(n, f"nb-{n}", {"notebook-name": "decoy"} if n == "a" else None)
                 for n in ("a", "b", "c", "d", "e", "f", "g")}
    bare = {"metadata": {"namespace": "ns", "name": "e", "uid": "sts-e"}}  # its ownerReference removed
    sts = {("ns", "a"): _owned("a", "Notebook", "a", "nb-a", "sts-a"),
           ("ns", "b"): _owned("b", "Notebook", "b", "another-uid", "sts-b"),  # says it is another Notebook's
           ("ns", "c"): _owned("c", "Notebook", "c", "nb-c", "sts-c"),
           ("ns", "e"): bare,
           ("ns", "f"): _owned("f", "Notebook", "f", "nb-f", "sts-f"),
           # a decoy of another name that claims to be g's, its pod named like g's
           ("ns", "decoy"): _owned("decoy", "Notebook", "g", "nb-g", "sts-decoy")}
    pods = {("ns", "a-0"): _owned("a-0", "StatefulSet", "a", "sts-a"),
            ("ns", "b-0"): _owned("b-0", "StatefulSet", "b", "sts-b"),
            ("ns", "c-0"): {"metadata": {"namespace": "ns", "name": "c-0", "labels": {"statefulset": "c"}}},
            ("ns", "decoy-0"): _owned("decoy-0", "StatefulSet", "a", "sts-a"),
            ("ns", "e-0"): _owned("e-0", "StatefulSet", "e", "sts-e"),
            ("ns", "f-0"): _owned("f-0", "StatefulSet", "f", "sts-other"),  # another StatefulSet f's, by uid
            ("ns", "g-0"): _owned("g-0", "StatefulSet", "decoy", "sts-decoy")}
    paired, orphans = pair(notebooks, sts, pods)
    by_name = {nb["metadata"]["name"]: pod for nb, pod in paired}
    assert by_name["a"] is pods[("ns", "a-0")]  # a relabelled Notebook is still paired
    assert by_name["b"] is pods[("ns", "b-0")] and by_name["e"] is pods[("ns", "e-0")]  # ownerReferences aside
    assert by_name["c"] is None and by_name["d"] is None and by_name["f"] is None and by_name["g"] is None
    assert sorted((o.notebook, o.why) for o in orphans) == [
        ("c", "the pod is not controlled by the StatefulSet c"),
        ("f", "the pod is not controlled by the StatefulSet f"),
        ("g", "no StatefulSet g exists")]


def test_a_renumbered_statefulsets_gpu_pod_is_the_notebooks_and_a_decoy_claiming_it_is_not() -> None:
    """`spec.ordinals.start` changed, then set back: `nb-1` Running with the GPU, `nb-0` Pending (the StatefulSet
    controller removes nothing while `nb-0` is not Ready). The notebook's pod is the Running member of its
    StatefulSet asking for the most GPUs, `nb-1`; a pod of the user's own whose ownerReference names the StatefulSet
    but whose name is no member's (`aaa`, `nb-x`, `nbx-0`) is never chosen, Running or not."""
    notebooks = {("ns", "nb"): _nb("nb", "nb-uid")}
    sts = {("ns", "nb"): _owned("nb", "Notebook", "nb", "nb-uid", "sts-nb")}

    def pod(name: str, phase: str, gpus: int) -> dict[str, Any]:
        p = _owned(name, "StatefulSet", "nb", "sts-nb")
        resources = {"limits": {"nvidia.com/gpu": str(gpus)}} if gpus else {}
        p["spec"] = {"containers": [{"name": "c", "resources": resources}]}
        p["status"] = {"phase": phase}
        return p

    pods = {("ns", n): pod(n, phase, gpus) for n, phase, gpus in (
        ("nb-0", "Pending", 1), ("nb-1", "Running", 1), ("aaa", "Running", 4), ("nb-x", "Running", 4),
        ("nbx-0", "Running", 4))}
    paired, orphans = pair(notebooks, sts, pods)
    assert paired == [(notebooks[("ns", "nb")], pods[("ns", "nb-1")])] and orphans == []
    del pods[("ns", "nb-1")]
    paired, _ = pair(notebooks, sts, pods)
    assert paired == [(notebooks[("ns", "nb")], pods[("ns", "nb-0")])]  # the one member left, Pending


@pytest.mark.cluster
class _Reads(dict[tuple[str, str], dict[str, Any]]):
    """A collection that counts the objects read from it (an encoded cache decodes each read)."""

    reads = 0

    def __getitem__(self, key: tuple[str, str]) -> dict[str, Any]:
        self.reads += 1
        return super().__getitem__(key)


def test_the_pairs_are_made_one_at_a_time_as_they_are_read() -> None:
    notebooks = _Reads({("ns", f"nb{i}"): _nb(f"nb{i}", f"u{i}") for i in range(5)})
    sts = {("ns", f"nb{i}"): _owned(f"nb{i}", "Notebook", f"nb{i}", f"u{i}") for i in range(5)}
    pods = _Reads({("ns", f"nb{i}-0"): _owned(f"nb{i}-0", "StatefulSet", f"nb{i}", f"uid-nb{i}") for i in range(5)})
    pods[("ns", "nb4-0")] = _owned("nb4-0", "StatefulSet", "other", "uid-other")  # nb4's own StatefulSet does not
    orphans: list[Orphan] = []
    made = pairs(notebooks, sts, pods, orphans)
    first = next(made)
    assert first[0]["metadata"]["name"] == "nb0" and first[1] is not None
    assert notebooks.reads == 1  # the other notebooks not yet read
    assert pods.reads == 1  # nb0's pod alone: the members of a StatefulSet are found by their names, no pod read
    rest = list(made)
    assert [nb["metadata"]["name"] for nb, _ in rest] == ["nb1", "nb2", "nb3", "nb4"] and rest[-1][1] is None
    assert [(o.notebook, o.why) for o in orphans] == [("nb4", "the pod is not controlled by the StatefulSet nb4")]
    assert notebooks.reads == 5
    assert pods.reads == 5  # each pod once, when its notebook's turn comes


def test_a_gpu_pod_taken_from_its_statefulset_is_reported_once(api: Any, namespace: str) -> None:
    """A user relabels their GPU pod off the StatefulSet (here: the pod has no controller): the notebook has no
    running pod of its own (`starting`), the pod is reported with a Warning Event once and counted by the
    metric."""
    core = client.CoreV1Api(api)
    obj.create_notebook(api, namespace, obj.notebook("nb", gpus=1))
    obj.notebook_statefulset(api, namespace, "nb")
    core.create_namespaced_pod(namespace, {
        "metadata": {"name": "nb-0", "labels": {"app": "mine"}},
        "spec": {"containers": [{"name": "nb", "image": "notebook:local",
                                 "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}})
    core.patch_namespaced_pod_status("nb-0", namespace, {"status": {
        "phase": "Running", "startTime": (datetime.now(UTC) - timedelta(hours=2)).strftime("%Y-%m-%dT%H:%M:%SZ")}})
    obj.create_notebook(api, namespace, obj.notebook("ok"))
    obj.running_pod(api, namespace, "ok", datetime.now(UTC) - timedelta(hours=2))
    time.sleep(1)
    runner = Passes(build_runner(load_mapping({"namespaces": {"include": [namespace]}, "idleMinutes": 600}, "test"),
                                 api))
    metrics = Metrics()
    runner.runner = instrument(runner.runner, metrics)
    with runner:
        first = {r.name: r for r in runner.once().results}
        second = {r.name: r for r in runner.once().results}
    assert (first["nb"].verdict.state, first["nb"].verdict.rule_id) == ("starting", "3-starting")
    assert second["ok"].verdict.rule_id != "3-starting"  # the control: an owned pod is paired
    assert [(o.notebook, o.why) for o in runner.last.gpu_orphans] == [("nb", "the pod is not controlled by the "
                                                                          "StatefulSet nb")]
    events = [e for e in obj.events_for(api, namespace, "nb") if e.reason == EVENT_ORPHAN]
    assert len(events) == 1 and "holds a GPU" in events[0].message and events[0].type == "Warning"
    assert metrics.registry.get_sample_value("kf_culler_orphaned_gpu_pods", {"namespace": namespace}) == 1


@pytest.mark.cluster
def test_a_statefulset_without_its_owner_reference_is_still_the_notebooks(api: Any, namespace: str) -> None:
    """The tenant removes the ownerReference from their GPU notebook's StatefulSet (the notebook-controller scales
    it by name all the same: tests/test_red_team.py shows it with the real controller). The culler still pairs
    the pod, judges the notebook idle on its GPU rather than `starting`, and reports no orphan; a decoy
    StatefulSet of another name that claims the Notebook as its controller, with a GPU pod, pairs with nothing."""
    apps = client.AppsV1Api(api)
    obj.create_notebook(api, namespace, obj.notebook("nb", gpus=1))
    obj.running_pod(api, namespace, "nb", datetime.now(UTC) - timedelta(hours=2), gpus=1)
    apps.patch_namespaced_stateful_set("nb", namespace, [{"op": "remove", "path": "/metadata/ownerReferences"}],
                                       _content_type="application/json-patch+json")
    uid = obj.get_notebook(api, namespace, "nb")["metadata"]["uid"]
    decoy = apps.create_namespaced_stateful_set(namespace, {
        "metadata": {"name": "decoy", "ownerReferences": [{"apiVersion": "kubeflow.org/v1", "kind": "Notebook",
                                                           "name": "nb", "uid": uid, "controller": True}]},
        "spec": {"replicas": 1, "serviceName": "", "selector": {"matchLabels": {"app": "decoy"}},
                 "template": {"metadata": {"labels": {"app": "decoy"}},
                              "spec": {"containers": [{"name": "c", "image": "decoy:local"}]}}}})
    client.CoreV1Api(api).create_namespaced_pod(namespace, {
        "metadata": {"name": "decoy-0", "labels": {"app": "decoy"}, "ownerReferences": [
            {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "decoy", "uid": decoy.metadata.uid,
             "controller": True}]},
        "spec": {"containers": [{"name": "c", "image": "decoy:local",
                                 "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}})
    time.sleep(1)
    runner = Passes(build_runner(load_mapping({"namespaces": {"include": [namespace]}, "idleMinutes": 600,
                                  "noSignalGpuIdleMinutes": 600}, "test"), api, dry_run=True))
    with runner:
        (only,) = runner.once().results
        snapshot = runner.cache.snapshot() if runner.cache is not None else []
    assert only.name == "nb" and only.verdict.rule_id != "3-starting", only.verdict
    assert [(nb["metadata"]["name"], (pod or {}).get("metadata", {}).get("name")) for nb, pod in snapshot] == [
        ("nb", "nb-0")]
    assert runner.last.gpu_orphans == []


def test_reclaimed_gpu_time_counts_only_the_cullers_own_stops_of_unorphaned_notebooks() -> None:
    from kf_culler.model import STOP_ANNOTATION, STOPPED_BY_ANNOTATION, STOPPED_BY_VALUE

    now = datetime.now(UTC)
    ann = {STOP_ANNOTATION: "2026-01-01T00:00:00Z", STOPPED_BY_ANNOTATION: STOPPED_BY_VALUE}
    items: list[tuple[dict[str, Any], dict[str, Any] | None]] = []
    for name in ("ours", "forged", "orphaned"):
        nb = obj.notebook(name, gpus=1, annotations=ann)
        nb["metadata"].update({"namespace": "ns", "uid": name})
        items.append((nb, None))
    metrics = Metrics()

    def recorded(nb: dict[str, Any]) -> bool:  # the culler's record knows "ours" and "orphaned" only
        return nb["metadata"]["uid"] in ("ours", "orphaned")

    for t in (now, now + timedelta(hours=1)):
        metrics.account_reclaimed(items, t, lambda _nb: ("nvidia.com/gpu",), recorded, frozenset({("ns", "orphaned")}))
    assert metrics.registry.get_sample_value("kf_culler_gpu_hours_reclaimed_total") == pytest.approx(1.0, abs=0.01)


@pytest.mark.cluster
def test_a_huge_notebook_costs_the_cache_only_what_the_culler_reads(api: Any, namespace: str) -> None:
    """A user's Notebook with ~900 KiB of env in its spec is kept as a few KiB: the fields the culler reads."""
    import json as _json

    from kf_culler.kube.cache import ClusterCache

    body = obj.notebook("big", gpus=1, annotations={"team.example.com/note": "x" * 1000})
    container = body["spec"]["template"]["spec"]["containers"][0]
    container["env"] = [{"name": f"V{i}", "value": "y" * 900} for i in range(1000)]
    body["spec"]["template"]["spec"]["initContainers"] = [
        {"name": "side", "image": "s:1", "restartPolicy": "Always", "command": ["z" * 1000],
         "resources": {"limits": {"nvidia.com/gpu": "1"}}}]
    obj.create_notebook(api, namespace, body)
    cache = ClusterCache(api, (namespace,))
    cache.start()
    try:
        assert cache.wait_synced(30)
        ((nb, _pod),) = cache.snapshot()
    finally:
        cache.close()
    assert len(_json.dumps(nb)) < 8 * 1024
    spec = nb["spec"]["template"]["spec"]
    assert "env" not in spec["containers"][0] and spec["containers"][0]["resources"] == container["resources"]
    assert spec["initContainers"] == [{"name": "side", "image": "s:1", "restartPolicy": "Always",
                                       "resources": {"limits": {"nvidia.com/gpu": "1"}}}]
    assert nb["metadata"]["annotations"]["team.example.com/note"] == "x" * 1000
    assert nb["metadata"]["uid"] and nb["metadata"]["resourceVersion"]
