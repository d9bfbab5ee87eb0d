"""The core/v1 and apps/v1 requests the culler sends without the kubernetes client's generated API classes
(kf_culler/kube/core.py), against the real API server: each answers what the generated class would, an answer
other than 2xx is the client's ApiException with its status, and the culler's process never imports those
classes (21 MiB for CoreV1Api, 12 MiB for AppsV1Api)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from kf_culler.kube import core

ROOT = Path(__file__).resolve().parents[1]


def status_of(call: Any) -> int:
    with pytest.raises(ApiException) as err:
        call()
    return int(err.value.status)


@pytest.mark.cluster
def test_config_maps_events_and_namespaces_as_the_generated_classes_answer(api: Any, namespace: str) -> None:
    generated = client.CoreV1Api(api)
    assert status_of(lambda: core.read_config_map(api, namespace, "absent")) == 404
    core.create_config_map(api, namespace, {"metadata": {"name": "cm", "labels": {"a": "b"}}, "data": {"k": "1"}})
    assert status_of(lambda: core.create_config_map(api, namespace, {"metadata": {"name": "cm"}})) == 409
    core.patch_config_map(api, namespace, "cm", {"data": {"k": "2", "j": "3"}})  # strategic merge, as generated
    core.patch_config_map(api, namespace, "cm", {"data": {"j": None}}, core.MERGE_PATCH)
    read = core.read_config_map(api, namespace, "cm")
    assert read["data"] == {"k": "2"} and read["metadata"]["labels"] == {"a": "b"}
    model = generated.read_namespaced_config_map("cm", namespace)  # times come back as the API writes them, not parsed
    assert (read["metadata"]["uid"], read["metadata"]["resourceVersion"], read["data"]) == (
        model.metadata.uid, model.metadata.resource_version, model.data)
    assert status_of(lambda: core.patch_config_map(api, namespace, "absent", {"data": {}})) == 404

    ns = core.read_namespace(api, namespace)
    assert ns["metadata"]["name"] == namespace
    event = {"metadata": {"generateName": "cm.", "namespace": namespace},
             "involvedObject": {"apiVersion": "v1", "kind": "ConfigMap", "name": "cm", "namespace": namespace},
             "type": "Normal", "reason": "Tested", "message": "made by core.create_event"}
    core.create_event(api, namespace, event)
    found = core.list_events(api, namespace, "involvedObject.name=cm,reason=Tested")
    assert [e["message"] for e in found] == ["made by core.create_event"]
    assert core.list_events(api, namespace, "involvedObject.name=other") == []
    # A refused request is the generated classes' ApiException with the server's answer.
    assert status_of(lambda: core.create_event(api, namespace, {"metadata": {"name": "x"}})) == 422


@pytest.mark.cluster
def test_service_accounts_tokens_pods_deployments_and_a_scale_patch(api: Any, namespace: str) -> None:
    made = core.create_service_account(api, namespace, {"metadata": {"name": "sa", "labels": {"x": "y"}}})
    assert made["metadata"]["uid"] == core.read_service_account(api, namespace, "sa")["metadata"]["uid"]
    token = core.create_token(api, namespace, "sa", {"apiVersion": "authentication.k8s.io/v1",
                                                     "kind": "TokenRequest", "spec": {"expirationSeconds": 600}})
    assert token["status"]["token"].count(".") == 2  # a JWT
    assert status_of(lambda: core.create_token(api, namespace, "absent", {"spec": {}})) == 404

    generated = client.CoreV1Api(api)
    for name, labels in (("p1", {"ws": "a"}), ("p2", {"ws": "b"})):
        generated.create_namespaced_pod(namespace, {"metadata": {"name": name, "labels": labels},
                                                    "spec": {"containers": [{"name": "c", "image": "x"}]}})
    assert [p["metadata"]["name"] for p in core.list_pods(api, namespace, "ws=a")] == ["p1"]

    apps = client.AppsV1Api(api)
    labels = {"app": "d"}
    template = {"metadata": {"labels": labels}, "spec": {"containers": [{"name": "c", "image": "x"}]}}
    apps.create_namespaced_deployment(namespace, {"metadata": {"name": "d", "labels": {"ws": "a"}},
                                                  "spec": {"selector": {"matchLabels": labels},
                                                           "template": template}})
    assert [d["metadata"]["name"] for d in core.list_deployments(api, namespace, "ws=a")] == ["d"]
    assert core.list_deployments(api, namespace, "ws=b") == []

    sts = apps.create_namespaced_stateful_set(namespace, {"metadata": {"name": "s"}, "spec": {
        "replicas": 1, "serviceName": "", "selector": {"matchLabels": labels}, "template": template}})
    scale = [{"op": "test", "path": "/metadata/uid", "value": "not-its-uid"},
             {"op": "replace", "path": "/spec/replicas", "value": 0}]
    assert status_of(lambda: core.patch_statefulset_scale(api, namespace, "s", scale)) in (409, 422)
    assert apps.read_namespaced_stateful_set("s", namespace).spec.replicas == 1
    scale[0]["value"] = sts.metadata.uid
    core.patch_statefulset_scale(api, namespace, "s", scale)
    assert apps.read_namespaced_stateful_set("s", namespace).spec.replicas == 0


def test_the_culler_never_imports_the_generated_api_classes(tmp_path: Path) -> None:
    """The Runner as `run` builds it (every collaborator, with the Coder target's writer), then one of each
    request the culler makes outside the watch cache (a session read and patched, a Profile read): none loads a
    generated API class, CoreV1Api, AppsV1Api or CustomObjectsApi (only the Istio policies' keeper, when an
    admin turns it on, uses the last). Nothing is sent: the kubeconfig names a port nothing listens on, and each
    request's failure is expected."""
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(textwrap.dedent("""\
        apiVersion: v1
        kind: Config
        clusters: [{name: c, cluster: {server: "https://127.0.0.1:9", insecure-skip-tls-verify: true}}]
        users: [{name: u, user: {token: x}}]
        contexts: [{name: c, context: {cluster: c, user: u}}]
        current-context: c
        """))
    script = textwrap.dedent(f"""\
        import sys
        from kf_culler.config import load_mapping
        from kf_culler.kube import brakes, core
        from kf_culler.kube.client import api_client
        from kf_culler.runner import build_runner
        api = api_client({str(kubeconfig)!r})
        api.configuration.retries = 0
        settings = load_mapping({{"targets": ["notebooks", "workspaces", "coder"],
                                  "coder": {{"url": "http://127.0.0.1:9", "tokenFile": "/dev/null",
                                            "namespace": "coder"}}}}, "t")
        from kf_culler.kube.writer import Writer
        from kf_culler.kube.tenants import NamespaceOwners
        from kf_culler.kube.namespaces import NamespaceLabels
        from kf_culler.plan import Plan
        from datetime import datetime, UTC
        runner = build_runner(settings, api, records_namespace="kf-culler")
        nb = {{"apiVersion": "kubeflow.org/v1", "kind": "Notebook",
               "metadata": {{"name": "x", "namespace": "n", "resourceVersion": "1"}}}}
        for request in (lambda: core.read_namespace(api, "n", timeout=0.5),
                        lambda: brakes.released_at(api, "n", None),
                        lambda: Writer(api).read("Notebook", "n", "x"),
                        lambda: Writer(api).apply(nb, Plan({{"a": "b"}}), lambda o: Plan({{}}), datetime.now(UTC)),
                        lambda: NamespaceOwners(api, NamespaceLabels(api))._profile_owner("n")):
            try:
                request()
            except Exception:
                pass
        def loaded():
            return " ".join(sorted(m for m in sys.modules if m.startswith("kubernetes.client.api.")))
        print(loaded())
        from kubernetes.client import CustomObjectsApi
        print(loaded())
        """)
    out = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    loaded, then = (line.split() for line in out.stdout.splitlines()[-2:])
    assert "kubernetes.client.api.custom_objects_api" in then  # the check sees what is loaded
    assert not {"kubernetes.client.api.core_v1_api", "kubernetes.client.api.apps_v1_api",
                "kubernetes.client.api.custom_objects_api"} & set(loaded), loaded
