"""components/exempt-admission on the real API server: only admins set, change or remove
notebook-culler.io/exempt; keep-until is bounded by the culler's Lease clock; everything else that
writes Notebooks (the culler's marks, the web app's Start/Stop, the notebook-controller, a user's
other annotations) passes.

The component is rendered with `kubectl kustomize` inside a throw-away overlay that sets the admin
group (a patch of the ConfigMap kf-culler-exempt-admission, as docs/install.md says) and, for this test
only, narrows the bindings to the test's namespace with matchResources; users are impersonated
(Impersonate-User/-Group) and given the notebook rights a Kubeflow profile contributor has; the culler
acts with a real token of the ServiceAccount kubeflow/kf-culler.
"""

from __future__ import annotations

import contextlib
import functools
import os
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client, utils
from kubernetes.client.rest import ApiException
from support.kustomize import render
from support.target import KubeTarget

from kf_culler.kube import GROUP, PLURAL, VERSION
from kf_culler.local import objects as obj
from kf_culler.model import (
    EXEMPT_ANNOTATION,
    IDLE_SINCE_ANNOTATION,
    KEEP_UNTIL_ANNOTATION,
    REASON_ANNOTATION,
    STATE_ANNOTATION,
    STOP_ANNOTATION,
)

pytestmark = pytest.mark.cluster
ROOT = Path(__file__).resolve().parents[1]
COMPONENT = ROOT / "kustomize" / "components" / "exempt-admission"
ADMIN_GROUP = "kf-admins"
MERGE = "application/merge-patch+json"
ADMISSION_KINDS = ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding")
EXEMPT_REFUSAL = ("only cluster admins may set, change or remove notebook-culler.io/exempt; "
                  f"ask your admin (group {ADMIN_GROUP})")


def rendered(tmp_path: Path, namespace: str) -> list[dict[str, Any]]:
    """kubeflow overlay + the component, admin group patched in, bindings narrowed to `namespace`."""
    overlay = tmp_path / "overlay"
    overlay.mkdir()
    rel = os.path.relpath(ROOT / "kustomize", overlay)
    narrow = [{"op": "add", "path": "/spec/matchResources",
               "value": {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}}}}]
    (overlay / "kustomization.yaml").write_text(yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        "resources": [f"{rel}/overlays/kubeflow"],
        "components": [f"{rel}/components/exempt-admission"],
        "patches": [
            {"patch": yaml.safe_dump({"apiVersion": "v1", "kind": "ConfigMap",
                                      "metadata": {"name": "kf-culler-exempt-admission", "namespace": "kubeflow"},
                                      "data": {"adminGroups": ADMIN_GROUP}})},
            {"target": {"kind": "ValidatingAdmissionPolicyBinding"}, "patch": yaml.safe_dump(narrow)},
        ],
    }))
    return render(overlay)


def as_user(kube: KubeTarget, user: str, group: str | None = None) -> Any:
    api = kube.api_client()
    api.set_default_header("Impersonate-User", user)
    if group:
        api.set_default_header("Impersonate-Group", group)
    return api


def status_of(call: Callable[[], object]) -> tuple[int, str]:
    try:
        call()
    except ApiException as err:
        return int(err.status), str(yaml.safe_load(err.body).get("message", "")) if err.body else ""
    return 200, ""


def patch(api: Any, namespace: str, name: str, annotations: dict[str, str | None]) -> Callable[[], object]:
    body = {"metadata": {"annotations": annotations}}
    return lambda: client.CustomObjectsApi(api).patch_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, name, body, _content_type=MERGE)


def micro(t: datetime) -> str:
    return t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def z(t: datetime) -> str:
    return t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def eventually(what: str, call: Callable[[int], Callable[[], object]], code: int, timeout: float = 60) -> None:
    """Policies, bindings and their params reach the admission plugin a moment after they are created:
    try `call(attempt)` (a write that changes something each attempt, so an early success does not make
    later tries no-ops) until it answers HTTP `code`."""
    deadline = time.monotonic() + timeout
    attempt = 0
    while (got := status_of(call(attempt)))[0] != code:
        assert time.monotonic() < deadline, f"not within {timeout:.0f} s: {what}; last answer {got}"
        attempt += 1
        time.sleep(0.5)


@pytest.fixture()
def admission(kube: KubeTarget, api: Any, namespace: str, tmp_path: Path) -> Iterator[dict[str, Any]]:
    """The component applied, profile-contributor rights for the users, the culler's Lease as the clock."""
    objs = rendered(tmp_path, namespace)
    core, rbac = client.CoreV1Api(api), client.RbacAuthorizationV1Api(api)
    with contextlib.suppress(ApiException):
        core.create_namespace({"metadata": {"name": "kubeflow"}})
    wanted = {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", *ADMISSION_KINDS}
    created: list[dict[str, Any]] = []
    for o in objs:
        if o["kind"] == "ClusterRoleBinding":  # test_rbac binds its own ServiceAccount under the same name
            o = {**o, "metadata": {**o["metadata"], "name": "kf-culler-exempt-admission-test"}}
        if o["kind"] not in wanted and o["metadata"]["name"] != "kf-culler-exempt-admission":
            continue
        try:
            utils.create_from_dict(api, o)
            created.append(o)
        except utils.FailToCreateError as err:
            if not all(getattr(e, "status", None) == 409 for e in err.api_exceptions):
                raise
            if o["kind"] in ADMISSION_KINDS or o["kind"] in ("ConfigMap", "ClusterRoleBinding"):
                raise AssertionError(f"{o['kind']}/{o['metadata']['name']} is left over from another run") from err
    # What a Kubeflow profile contributor may do with notebooks (kubeflow-notebooks-edit), given to a user
    # and to the admin group.
    rbac.create_namespaced_role(namespace, {"metadata": {"name": "notebooks-edit"}, "rules": [
        {"apiGroups": [GROUP], "resources": [PLURAL],
         "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"]}]})
    rbac.create_namespaced_role_binding(namespace, {
        "metadata": {"name": "notebooks-edit"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "notebooks-edit"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "alice@example.com"},
                     {"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": ADMIN_GROUP},
                     {"kind": "ServiceAccount", "name": "notebook-controller-service-account",
                      "namespace": "kubeflow"}]})
    coordination = client.CoordinationV1Api(api)
    lease = {"metadata": {"name": "kf-culler", "namespace": "kubeflow"},
             "spec": {"holderIdentity": "kf-culler-0", "leaseDurationSeconds": 15,
                      "acquireTime": micro(datetime.now(UTC)), "renewTime": micro(datetime.now(UTC))}}
    own_lease = True
    try:
        coordination.create_namespaced_lease("kubeflow", lease)
    except ApiException as err:
        assert err.status == 409
        own_lease = False
    try:
        yield {"objs": objs, "lease": lease}
    finally:
        for o in reversed(created):
            if o["kind"] in ADMISSION_KINDS or o["kind"] in ("ConfigMap", "ClusterRoleBinding"):
                with contextlib.suppress(ApiException):
                    delete(api, o)
        if own_lease:
            with contextlib.suppress(ApiException):
                coordination.delete_namespaced_lease("kf-culler", "kubeflow")


def delete(api: Any, o: dict[str, Any]) -> None:
    name = o["metadata"]["name"]
    admission = client.AdmissionregistrationV1Api(api)
    {"ConfigMap": lambda: client.CoreV1Api(api).delete_namespaced_config_map(name, o["metadata"]["namespace"]),
     "ClusterRoleBinding": lambda: client.RbacAuthorizationV1Api(api).delete_cluster_role_binding(name),
     "ValidatingAdmissionPolicy": lambda: admission.delete_validating_admission_policy(name),
     "ValidatingAdmissionPolicyBinding": lambda: admission.delete_validating_admission_policy_binding(name),
     }[o["kind"]]()


def renew(api: Any, when: datetime) -> None:
    """What the culler's leader does every few seconds: move the Lease's renewTime."""
    client.CoordinationV1Api(api).patch_namespaced_lease(
        "kf-culler", "kubeflow", {"spec": {"renewTime": micro(when)}})


def test_only_admins_set_change_or_remove_exempt(kube: KubeTarget, api: Any, namespace: str,
                                                 admission: dict[str, Any]) -> None:
    alice = as_user(kube, "alice@example.com", "kubeflow-users")
    admin = as_user(kube, "root@example.com", ADMIN_GROUP)
    obj.create_notebook(api, namespace, obj.notebook("nb"))

    # The binding becomes active a moment after it is created.
    eventually("the policy refuses alice's exempt",
               lambda i: patch(alice, namespace, "nb", {EXEMPT_ANNOTATION: f"probe-{i}"}), 403)
    obj.patch_annotations(admin, namespace, "nb", {EXEMPT_ANNOTATION: None})
    code, message = status_of(patch(alice, namespace, "nb", {EXEMPT_ANNOTATION: "true"}))
    print(f"refusal: HTTP {code}: {message}")
    assert code == 403 and EXEMPT_REFUSAL in message
    assert "kf-culler-exempt" in message  # the policy that refused is named

    # ... also on CREATE, with any value.
    for value in ("true", "false"):
        body = obj.notebook(f"nb-{value}", annotations={EXEMPT_ANNOTATION: value})
        code, message = status_of(functools.partial(obj.create_notebook, alice, namespace, body))
        assert code == 403 and EXEMPT_REFUSAL in message, (value, code, message)
    assert status_of(lambda: obj.create_notebook(alice, namespace, obj.notebook("nb-plain")))[0] == 200

    # An admin sets it; alice can neither change nor remove it.
    assert status_of(patch(admin, namespace, "nb", {EXEMPT_ANNOTATION: "true"})) == (200, "")
    changes: list[dict[str, str | None]] = [{EXEMPT_ANNOTATION: "false"}, {EXEMPT_ANNOTATION: "TRUE"},
                                            {EXEMPT_ANNOTATION: None}]
    for change in changes:
        code, message = status_of(patch(alice, namespace, "nb", change))
        assert code == 403 and EXEMPT_REFUSAL in message, change
    assert obj.get_notebook(api, namespace, "nb")["metadata"]["annotations"][EXEMPT_ANNOTATION] == "true"

    # alice's own annotations and the web app's Stop and Start pass while exempt is on the notebook.
    assert status_of(patch(alice, namespace, "nb", {"team.example.com/owner": "alice"}))[0] == 200
    assert status_of(patch(alice, namespace, "nb", {STOP_ANNOTATION: z(datetime.now(UTC))}))[0] == 200
    assert status_of(patch(alice, namespace, "nb", {STOP_ANNOTATION: None}))[0] == 200
    # A full UPDATE (PUT) as Kubeflow's notebook-controller, annotations as they were.
    controller = as_user(kube, "system:serviceaccount:kubeflow:notebook-controller-service-account")
    nb = obj.get_notebook(api, namespace, "nb")
    nb["metadata"]["labels"]["touched-by"] = "notebook-controller"
    assert status_of(lambda: client.CustomObjectsApi(controller).replace_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, "nb", nb))[0] == 200

    # The admin removes it again.
    assert status_of(patch(admin, namespace, "nb", {EXEMPT_ANNOTATION: None}))[0] == 200
    assert EXEMPT_ANNOTATION not in obj.get_notebook(api, namespace, "nb")["metadata"]["annotations"]


def test_the_cullers_own_writes_pass(kube: KubeTarget, api: Any, namespace: str,
                                     admission: dict[str, Any]) -> None:
    alice = as_user(kube, "alice@example.com")
    admin = as_user(kube, "root@example.com", ADMIN_GROUP)
    obj.create_notebook(api, namespace, obj.notebook("nb"))
    eventually("the policy is active",
               lambda i: patch(alice, namespace, "nb", {EXEMPT_ANNOTATION: f"probe-{i}"}), 403)
    assert status_of(patch(admin, namespace, "nb", {EXEMPT_ANNOTATION: "true"}))[0] == 200
    culler = kube.api_client(kube.service_account_kubeconfig("kubeflow", "kf-culler"))
    now = datetime.now(UTC)
    marks: dict[str, str | None] = {
        STOP_ANNOTATION: z(now), STATE_ANNOTATION: "idle", REASON_ANNOTATION: "Stopped after 60 min idle.",
        IDLE_SINCE_ANNOTATION: z(now - timedelta(hours=1)), "notebook-culler.io/stopped-by": "kf-culler",
        "notebook-culler.io/stopped-at": z(now)}
    assert status_of(patch(culler, namespace, "nb", marks)) == (200, "")
    # ...but its ServiceAccount is no admin: it cannot grant or take away an exemption either.
    code, message = status_of(patch(culler, namespace, "nb", {EXEMPT_ANNOTATION: None}))
    assert code == 403 and EXEMPT_REFUSAL in message


def test_keep_until_is_bounded_by_the_cullers_lease_clock(kube: KubeTarget, api: Any, namespace: str,
                                                          admission: dict[str, Any]) -> None:
    alice = as_user(kube, "alice@example.com")
    obj.create_notebook(api, namespace, obj.notebook("nb"))
    now = datetime.now(UTC)
    renew(api, now)
    far = z(now + timedelta(hours=25))
    eventually("the keep-until policy is active", lambda i: patch(
        alice, namespace, "nb", {KEEP_UNTIL_ANNOTATION: z(now + timedelta(hours=26, seconds=i))}), 422)
    code, message = status_of(patch(alice, namespace, "nb", {KEEP_UNTIL_ANNOTATION: far}))
    print(f"refusal: HTTP {code}: {message}")
    assert code == 422 and ("notebook-culler.io/keep-until may be at most 24 hours after the culler's clock "
                            f"({micro(now)}); for longer, ask your admin for an exemption") in message

    for within in (now + timedelta(hours=3), now + timedelta(hours=23, minutes=59)):
        assert status_of(patch(alice, namespace, "nb", {KEEP_UNTIL_ANNOTATION: z(within)})) == (200, "")
    # Other offsets are read as times, too.
    assert status_of(patch(alice, namespace, "nb", {
        KEEP_UNTIL_ANNOTATION: (now + timedelta(hours=2)).astimezone().isoformat(timespec="seconds")}))[0] == 200
    # The same bound on CREATE, and for an admin: the admin's tool is exempt.
    admin = as_user(kube, "root@example.com", ADMIN_GROUP)
    assert status_of(lambda: obj.create_notebook(alice, namespace, obj.notebook(
        "nb-far", annotations={KEEP_UNTIL_ANNOTATION: far})))[0] == 422
    assert status_of(patch(admin, namespace, "nb", {KEEP_UNTIL_ANNOTATION: far}))[0] == 422

    # Unreadable values are refused with the format to use; removing keep-until always passes.
    for bad in ("tomorrow", "2026-11-29 18:00:00", "2026-11-29T18:00:00", "9" * 200):
        code, message = status_of(patch(alice, namespace, "nb", {KEEP_UNTIL_ANNOTATION: bad}))
        assert code == 422 and "must be a UTC time such as 2026-11-29T18:00:00Z" in message, (bad, message)
    assert status_of(patch(alice, namespace, "nb", {KEEP_UNTIL_ANNOTATION: None}))[0] == 200

    # The clock is the Lease: while the culler has not renewed it for 2 hours, the bound is 22 hours ahead.
    renew(api, now - timedelta(hours=2))
    eventually("the policy reads the older renewTime", lambda i: patch(
        alice, namespace, "nb", {KEEP_UNTIL_ANNOTATION: z(now + timedelta(hours=23, seconds=i))}), 422)
    assert status_of(patch(alice, namespace, "nb", {KEEP_UNTIL_ANNOTATION: z(now + timedelta(hours=21))}))[0] == 200

    # A keep-until already on the notebook is not checked again when something else changes.
    renew(api, now - timedelta(days=3))
    eventually("the policy reads the 3-day-old renewTime", lambda i: patch(
        alice, namespace, "nb", {KEEP_UNTIL_ANNOTATION: z(now + timedelta(seconds=i))}), 422)
    assert status_of(patch(alice, namespace, "nb", {STOP_ANNOTATION: z(now)}))[0] == 200
    culler = kube.api_client(kube.service_account_kubeconfig("kubeflow", "kf-culler"))
    assert status_of(patch(culler, namespace, "nb", {STATE_ANNOTATION: "stopped"}))[0] == 200


def test_rendered_component_passes_server_side_dry_run(kube: KubeTarget, api: Any, tmp_path: Path) -> None:
    """As test_rbac does for the overlays: the API server accepts every object, CEL type-checked."""
    import subprocess

    from support.kustomize import kubectl_path

    kubectl = kubectl_path()
    assert kubectl is not None
    with contextlib.suppress(ApiException):
        client.CoreV1Api(api).create_namespace({"metadata": {"name": "kubeflow"}})
    objs = [o for o in rendered(tmp_path, "any") if o["kind"] in ADMISSION_KINDS
            or o["metadata"]["name"] == "kf-culler-exempt-admission"]
    assert len(objs) == 5
    path = tmp_path / "admission.yaml"
    path.write_text(yaml.safe_dump_all(objs))
    done = subprocess.run([kubectl, "--kubeconfig", str(kube.kubeconfig), "apply", "--dry-run=server",
                           "-f", str(path)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "validatingadmissionpolicy.admissionregistration.k8s.io/kf-culler-exempt created (server dry run)" \
        in done.stdout
