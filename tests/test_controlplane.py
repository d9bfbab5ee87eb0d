"""The Kubernetes API behaviour kf-culler relies on, checked against a real kube-apiserver."""

from __future__ import annotations

import os
import queue
import threading
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, watch
from kubernetes.client.rest import ApiException
from support.target import KubeTarget

from kf_culler.kube import GROUP, PLURAL, VERSION

pytestmark = pytest.mark.cluster


def notebook(name: str, annotations: dict[str, str] | None = None) -> dict[str, Any]:
    return {"apiVersion": "kubeflow.org/v1", "kind": "Notebook",
            "metadata": {"name": name, "annotations": annotations or {}},
            "spec": {"template": {"spec": {"containers": [{"name": name, "image": "jupyter:test"}]}}}}


def crd(api: Any) -> Any:
    return client.CustomObjectsApi(api)


def test_api_server_is_real_and_versioned(kube: KubeTarget, api: Any) -> None:
    info = client.VersionApi(api).get_code()
    assert info.git_version.startswith("v1.")
    if kube.backend == "local":
        assert info.git_version != "v0.0.0-master+$Format:%H$"


def test_create_get_list_watch(api: Any, namespace: str) -> None:
    c = crd(api)
    events: queue.Queue[tuple[str, str]] = queue.Queue()
    rv = c.list_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL)["metadata"]["resourceVersion"]
    w = watch.Watch()

    def follow() -> None:
        for e in w.stream(c.list_namespaced_custom_object, GROUP, VERSION, namespace, PLURAL,
                          resource_version=rv, timeout_seconds=30):
            events.put((e["type"], e["object"]["metadata"]["name"]))
            if events.qsize() >= 2:
                w.stop()

    t = threading.Thread(target=follow, daemon=True)
    t.start()
    c.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, notebook("a"))
    got = c.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "a")
    assert got["spec"]["template"]["spec"]["containers"][0]["image"] == "jupyter:test"
    names = [i["metadata"]["name"] for i in c.list_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL)["items"]]
    assert names == ["a"]
    c.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "a")
    seen = [events.get(timeout=30), events.get(timeout=30)]
    assert seen == [("ADDED", "a"), ("DELETED", "a")]


def test_merge_patch_adds_stop_and_keeps_other_annotations(api: Any, namespace: str) -> None:
    c = crd(api)
    others = {"notebooks.kubeflow.org/server-type": "jupyter", "team": "vision", "owner": "kim"}
    created = c.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, notebook("b", others))
    patched = c.patch_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, "b",
        {"metadata": {"resourceVersion": created["metadata"]["resourceVersion"],
                      "annotations": {"kubeflow-resource-stopped": "2026-11-29T12:00:00Z"}}},
        _content_type="application/merge-patch+json")
    assert patched["metadata"]["annotations"] == {**others, "kubeflow-resource-stopped": "2026-11-29T12:00:00Z"}


def test_stale_resource_version_is_a_conflict(api: Any, namespace: str) -> None:
    c = crd(api)
    created = c.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, notebook("c"))
    stale = created["metadata"]["resourceVersion"]
    c.patch_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "c",
                                     {"metadata": {"annotations": {"x": "1"}}},
                                     _content_type="application/merge-patch+json")
    with pytest.raises(ApiException) as err:
        c.patch_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "c",
                                         {"metadata": {"resourceVersion": stale, "annotations": {"y": "2"}}},
                                         _content_type="application/merge-patch+json")
    assert err.value.status == 409


def test_status_subresource_is_separate(api: Any, namespace: str) -> None:
    c = crd(api)
    c.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, notebook("d"))
    c.patch_namespaced_custom_object_status(GROUP, VERSION, namespace, PLURAL, "d",
                                            {"status": {"readyReplicas": 1}},
                                            _content_type="application/merge-patch+json")
    # a status write through the main resource is ignored ...
    after_spec = c.patch_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, "d",
        {"spec": {"template": {"spec": {"containers": [{"name": "d", "image": "new"}]}}},
         "status": {"readyReplicas": 7}}, _content_type="application/merge-patch+json")
    assert after_spec["status"]["readyReplicas"] == 1
    assert after_spec["spec"]["template"]["spec"]["containers"][0]["image"] == "new"
    # ... and a spec write through the status subresource too
    after_status = c.patch_namespaced_custom_object_status(
        GROUP, VERSION, namespace, PLURAL, "d",
        {"spec": {"template": {"spec": {"containers": [{"name": "d", "image": "other"}]}}},
         "status": {"readyReplicas": 0}}, _content_type="application/merge-patch+json")
    assert after_status["status"]["readyReplicas"] == 0
    assert after_status["spec"]["template"]["spec"]["containers"][0]["image"] == "new"


def test_all_three_versions_are_served(api: Any, namespace: str) -> None:
    c = crd(api)
    c.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, notebook("e"))
    for version in ("v1", "v1beta1", "v1alpha1"):
        assert c.get_namespaced_custom_object(GROUP, version, namespace, PLURAL, "e")["metadata"]["name"] == "e"


def test_rbac_is_enforced(kube: KubeTarget, api: Any, namespace: str) -> None:
    rbac = client.RbacAuthorizationV1Api(api)
    rbac.create_namespaced_role(namespace, {
        "metadata": {"name": "notebook-reader"},
        "rules": [{"apiGroups": [GROUP], "resources": [PLURAL], "verbs": ["get", "list", "watch"]}]})
    rbac.create_namespaced_role_binding(namespace, {
        "metadata": {"name": "notebook-reader"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "notebook-reader"},
        "subjects": [{"kind": "ServiceAccount", "name": "reader", "namespace": namespace}]})
    crd(api).create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, notebook("f"))
    reader = crd(kube.api_client(kube.service_account_kubeconfig(namespace, "reader")))
    assert reader.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "f")["metadata"]["name"] == "f"
    with pytest.raises(ApiException) as err:
        reader.patch_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "f",
                                              {"metadata": {"annotations": {"kubeflow-resource-stopped": "x"}}},
                                              _content_type="application/merge-patch+json")
    assert err.value.status == 403


def test_launcher_leaves_nothing_behind_even_when_the_body_fails(kube: KubeTarget) -> None:
    if kube.backend != "local":
        pytest.skip("the launcher's own clean-up is tested on the local control plane")
    from kf_culler.local.cluster import LocalCluster

    pids: list[int] = []
    workdir: Path | None = None
    with pytest.raises(RuntimeError, match="a failing test"), LocalCluster() as cluster:
        pids = [p.pid for p in cluster.procs.values()]
        workdir = cluster.dir
        assert len(pids) == 2 and workdir.is_dir()
        raise RuntimeError("a failing test")
    assert workdir is not None and not workdir.exists()
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_launcher_start_failure_raises_with_the_log_tail(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                        kube: KubeTarget) -> None:
    if kube.backend != "local":
        pytest.skip("local launcher only")
    from kf_culler.local import cluster as cl

    real = cl.ensure_binaries()
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "etcd").symlink_to(real / "etcd")
    (fake / "kube-apiserver").write_text("#!/bin/sh\necho 'bad flag --nope' >&2\nexit 3\n")
    (fake / "kube-apiserver").chmod(0o755)
    monkeypatch.setenv("KF_CULLER_BIN_DIR", str(fake))
    c = cl.LocalCluster()
    with pytest.raises(cl.ClusterError, match="bad flag --nope"):
        c.start()
    assert not c.dir.exists() and not c.procs
