"""Whose namespace it is (kf_culler/kube/tenants.py), read on the real API server as the culler reads it.

The owner comes from what only an admin or a controller writes: a Kubeflow Profile's `spec.owner.name` (the
profile-controller's `owner` annotation marks its Namespace), OpenShift's `openshift.io/requester`; a
namespace with neither is its own tenant. The Profile CRD is tests/crds' minimal one (no profile-controller
runs here: the test writes the Namespace as it would); OpenShift's project request API does not run here
either, so the test writes the annotation it sets. What the test proves of RBAC is Kubernetes' own: a user
given the built-in `admin` role in their namespace (the bootstrap `system:aggregate-to-admin`, `-edit` and
`-view` roles it aggregates, which `kubeflow-admin`/`kubeflow-edit` aggregate too) reads their Namespace but
cannot change its annotations.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException
from test_notifications import profile, profiles  # noqa: F401 (a fixture)

from kf_culler.kube.namespaces import NamespaceLabels
from kf_culler.kube.tenants import NamespaceOwners
from kf_culler.local import objects as obj

pytestmark = pytest.mark.cluster


@pytest.fixture()
def made(api: Any, namespace: str) -> Iterator[dict[str, str]]:
    """Namespaces `<namespace>-<kind>`: a profile's (its Profile's owner changed since the annotation was
    written), one with the profile-controller's annotation but no Profile, two OpenShift projects of one user,
    a plain one."""
    names = {kind: f"{namespace}-{kind}" for kind in ("kf", "kf-noprofile", "os1", "os2", "plain")}
    obj.create_namespace(api, names["kf"], {"owner": "alice@example.com"})
    profile(api, names["kf"], "bob@example.com")
    obj.create_namespace(api, names["kf-noprofile"], {"owner": "carol@example.com"})
    for kind in ("os1", "os2"):
        obj.create_namespace(api, names[kind], {"openshift.io/requester": "mallory",
                                                "openshift.io/display-name": f"mallory's {kind}"})
    obj.create_namespace(api, names["plain"])
    yield names
    custom, core = client.CustomObjectsApi(api), client.CoreV1Api(api)
    with contextlib.suppress(ApiException):
        custom.delete_cluster_custom_object("kubeflow.org", "v1", "profiles", names["kf"])
    for name in names.values():
        with contextlib.suppress(ApiException):
            core.delete_namespace(name)


def test_the_owner_is_read_from_the_profile_and_the_namespace_annotations(
        api: Any, profiles: None, made: dict[str, str]) -> None:  # noqa: F811 (the imported fixture)
    labels = NamespaceLabels(api)
    owners = NamespaceOwners(api, labels)
    assert owners(made["kf"]) == "bob@example.com"  # the Profile's spec.owner.name, not the annotation
    assert owners(made["kf-noprofile"]) == "carol@example.com"  # the controller's annotation, no Profile
    assert owners(made["os1"]) == owners(made["os2"]) == "mallory"  # one user's two projects: one owner
    assert owners(made["plain"]) is None  # its own tenant
    assert owners(f"{made['plain']}-gone") is None  # cannot be read: its own tenant
    assert owners.profile_reads == 2  # only namespaces with the profile-controller's annotation
    reads = labels.reads, owners.profile_reads
    for name in made.values():  # within the TTL: no API call
        owners(name)
    assert (labels.reads, owners.profile_reads) == reads


def test_a_namespace_admin_cannot_write_the_annotations_the_owner_is_read_from(
        kube: Any, api: Any, made: dict[str, str]) -> None:
    """As the tenant (impersonated), holding Kubernetes' `admin` role in her namespace by RoleBindings: she
    reads her Namespace, but cannot change its `openshift.io/requester` (to split her projects into several
    owners) or `owner` annotations."""
    ns = made["os1"]
    for part in ("admin", "edit", "view"):  # what `admin` aggregates (no kube-controller-manager fills it here)
        client.RbacAuthorizationV1Api(api).create_namespaced_role_binding(ns, {
            "metadata": {"name": f"mallory-{part}"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                        "name": f"system:aggregate-to-{part}"},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "mallory"}]})
    mallory = kube.api_client()
    mallory.set_default_header("Impersonate-User", "mallory")
    core = client.CoreV1Api(mallory)
    deadline = time.monotonic() + 30
    while True:  # the binding takes a moment to be in force
        try:
            core.read_namespace(ns)
            break
        except ApiException as err:
            if err.status != 403 or time.monotonic() > deadline:
                raise
            time.sleep(0.2)
    for annotation in ("openshift.io/requester", "owner"):
        with pytest.raises(ApiException) as refused:
            core.patch_namespace(ns, {"metadata": {"annotations": {annotation: "someone-else"}}})
        assert refused.value.status == 403
    assert client.CoreV1Api(api).read_namespace(ns).metadata.annotations["openshift.io/requester"] == "mallory"


def test_without_profiles_get_the_owner_annotation_stands_for_the_profile(
        kube: Any, api: Any, profiles: None, made: dict[str, str],  # noqa: F811 (the imported fixture)
        caplog: pytest.LogCaptureFixture) -> None:
    """A culler allowed to read Namespaces but not Profiles (the read-only dry-run install): the
    profile-controller's annotation is the owner, the refusal is logged once and not asked again in the TTL."""
    rbac = client.RbacAuthorizationV1Api(api)
    role = f"{made['plain']}-reader"
    rbac.create_cluster_role({"metadata": {"name": role},
                              "rules": [{"apiGroups": [""], "resources": ["namespaces"], "verbs": ["get"]}]})
    rbac.create_cluster_role_binding({
        "metadata": {"name": role},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": role}]})
    try:
        reader = kube.api_client()
        reader.set_default_header("Impersonate-User", role)
        deadline = time.monotonic() + 30
        while True:  # the binding takes a moment to be in force
            try:
                client.CoreV1Api(reader).read_namespace(made["kf"])
                break
            except ApiException as err:
                if err.status != 403 or time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        owners = NamespaceOwners(reader, NamespaceLabels(reader))
        assert owners(made["kf"]) == "alice@example.com"  # the annotation (its Profile says bob)
        assert owners(made["kf-noprofile"]) == "carol@example.com"
        assert owners(made["kf"]) == "alice@example.com"
        assert owners.profile_reads == 2
        assert sum("cannot read Profiles (HTTP 403)" in r.getMessage() for r in caplog.records) == 1
    finally:
        with contextlib.suppress(ApiException):
            rbac.delete_cluster_role_binding(role)
        with contextlib.suppress(ApiException):
            rbac.delete_cluster_role(role)
