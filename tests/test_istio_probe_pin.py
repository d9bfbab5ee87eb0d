"""components/istio-probe-pin on the real API server: a tenant of a Kubeflow profile namespace (with the rights
to write networking.istio.io objects there) cannot store a VirtualService that routes sidecars' requests, or a
ServiceEntry, unless it is exported to its own namespace only; so none can route the culler's probe of another
namespace's notebook (or its pod IP) elsewhere. A VirtualService bound to gateways only, and the same objects
with `exportTo: ["."]`, are stored; the platform's controllers are not concerned.

Istio does not run here: our stand-in CRDs (tests/crds) store what they are given; what is asserted is what
the API server lets the tenant store, not what a proxy does with it. The policy's binding is narrowed to the
test's namespace (besides the profile label) so that other tests' objects are not concerned.
"""

from __future__ import annotations

import contextlib
import copy
import os
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException
from support.kustomize import render
from support.target import KubeTarget
from test_exempt_admission import as_user, eventually, status_of

ROOT = Path(__file__).resolve().parents[1]
COMPONENT = ROOT / "kustomize" / "components" / "istio-probe-pin"
CRDS = [ROOT / "tests" / "crds" / f"{p}.networking.istio.io.yaml" for p in ("virtualservices", "serviceentries")]
G, V = "networking.istio.io", "v1"
TENANT = "alice@example.com"


def component(tmp_path: Path) -> list[dict[str, Any]]:
    overlay = tmp_path / "pin"
    overlay.mkdir()
    (overlay / "kustomization.yaml").write_text(yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        "components": [os.path.relpath(COMPONENT, overlay)]}))
    return render(overlay)


def served(api: Any) -> None:
    ext = client.ApiextensionsV1Api(api)
    for path in CRDS:
        with contextlib.suppress(ApiException):
            ext.create_custom_resource_definition(yaml.safe_load(path.read_text()))
    deadline = time.monotonic() + 60
    for plural in ("virtualservices", "serviceentries"):
        while True:
            try:
                client.CustomObjectsApi(api).list_cluster_custom_object(G, V, plural)
                break
            except ApiException:
                assert time.monotonic() < deadline, f"{plural}.{G} not served within 60 s"
                time.sleep(0.2)


def mesh_vs(name: str, host: str, **spec: Any) -> dict[str, Any]:
    """A VirtualService that sends requests for `host` to the tenant's own fake."""
    return {"apiVersion": f"{G}/{V}", "kind": "VirtualService", "metadata": {"name": name},
            "spec": {"hosts": [host], "http": [{"route": [{"destination": {"host": "fake"}}]}], **spec}}


def entry(name: str, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": f"{G}/{V}", "kind": "ServiceEntry", "metadata": {"name": name},
            "spec": {"hosts": ["nb.victim.svc.cluster.local"], "addresses": ["10.244.1.7/32"],
                     "ports": [{"number": 8888, "name": "http", "protocol": "HTTP"}],
                     "resolution": "STATIC", "endpoints": [{"address": "10.244.9.9"}], **spec}}


@pytest.mark.cluster
def test_tenants_cannot_route_other_namespaces_requests(kube: KubeTarget, api: Any, namespace: str,
                                                        tmp_path: Path) -> None:
    served(api)
    core, rbac = client.CoreV1Api(api), client.RbacAuthorizationV1Api(api)
    core.patch_namespace(namespace, {"metadata": {"labels": {"app.kubernetes.io/part-of": "kubeflow-profile"}}})
    rbac.create_namespaced_role(namespace, {"metadata": {"name": "istio-edit"}, "rules": [{
        "apiGroups": [G], "resources": ["virtualservices", "serviceentries"],
        "verbs": ["get", "list", "create", "update", "patch", "delete"]}]})
    rbac.create_namespaced_role_binding(namespace, {
        "metadata": {"name": "istio-edit"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "istio-edit"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": TENANT}]})
    objs = component(tmp_path)
    suffix = f"-{namespace}"
    for o in objs:
        o = copy.deepcopy(o)
        o["metadata"]["name"] += suffix
        if o["kind"] == "ValidatingAdmissionPolicy":
            client.AdmissionregistrationV1Api(api).create_validating_admission_policy(o)
        else:
            o["spec"]["policyName"] += suffix
            o["spec"]["matchResources"]["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"] = namespace
            client.AdmissionregistrationV1Api(api).create_validating_admission_policy_binding(o)
    tenant = client.CustomObjectsApi(as_user(kube, TENANT))
    try:
        def vs_attempt(attempt: int) -> Any:
            return lambda: tenant.create_namespaced_custom_object(
                G, V, namespace, "virtualservices", mesh_vs(f"steal-{attempt}", "nb.victim.svc.cluster.local"))

        # Exported everywhere by default: refused (once the policy is in force).
        eventually("the policy refuses a VirtualService exported by default", vs_attempt, 403, contains="exportTo")
        refused = [
            ("virtualservices", mesh_vs("all", "nb.victim.svc.cluster.local", exportTo=["*"])),
            ("virtualservices", mesh_vs("both", "nb.victim.svc.cluster.local", exportTo=[".", "kubeflow"])),
            ("virtualservices", mesh_vs("to-culler", "nb.victim.svc.cluster.local", exportTo=["kubeflow"])),
            ("virtualservices", mesh_vs("mesh-too", "nb.victim.svc.cluster.local",
                                        gateways=["kubeflow/kubeflow-gateway", "mesh"])),
            ("serviceentries", entry("pod-ip")),
            ("serviceentries", entry("pod-ip-all", exportTo=["*"])),
        ]
        for plural, body in refused:
            code, message = status_of(lambda p=plural, b=body: tenant.create_namespaced_custom_object(
                G, V, namespace, p, b))
            assert code == 403 and 'exportTo: ["."]' in message, (body["metadata"]["name"], code, message)
        stored = [
            ("virtualservices", mesh_vs("own", "nb.victim.svc.cluster.local", exportTo=["."])),
            ("virtualservices", mesh_vs("gateway", "*", gateways=["kubeflow/kubeflow-gateway"])),
            ("serviceentries", entry("own-entry", exportTo=["."])),
        ]
        for plural, body in stored:
            assert status_of(lambda p=plural, b=body: tenant.create_namespaced_custom_object(
                G, V, namespace, p, b)) == (200, ""), body["metadata"]["name"]
        # An update that widens an allowed one: refused.
        own = tenant.get_namespaced_custom_object(G, V, namespace, "virtualservices", "own")
        own["spec"]["exportTo"] = ["*"]
        code, _ = status_of(lambda: tenant.replace_namespaced_custom_object(G, V, namespace, "virtualservices",
                                                                            "own", own))
        assert code == 403
        # The platform's controllers (here the notebook-controller's ServiceAccount) are not concerned.
        controller = "system:serviceaccount:kubeflow:notebook-controller-service-account"
        ctl = client.CustomObjectsApi(as_user(kube, controller, "system:masters"))
        assert status_of(lambda: ctl.create_namespaced_custom_object(
            G, V, namespace, "virtualservices", mesh_vs("controller", "nb.victim.svc.cluster.local"))) == (200, "")
    finally:
        adm = client.AdmissionregistrationV1Api(api)
        with contextlib.suppress(ApiException):
            adm.delete_validating_admission_policy_binding(f"kf-culler-istio-export{suffix}")
        with contextlib.suppress(ApiException):
            adm.delete_validating_admission_policy(f"kf-culler-istio-export{suffix}")
