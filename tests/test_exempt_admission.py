"""components/exempt-admission on the real API server: only admins set, change or remove
notebook-culler.io/exempt; keep-until is bounded by the culler's Lease clock; everything else that
writes Notebooks (the culler's marks, the web app's Start/Stop, the notebook-controller, a user's
other annotations) passes. The defence-in-depth policies: only the culler (and admins) add or change
its marks; server-type is one Kubeflow knows; the Notebook label notebook-name is the Notebook's name;
a notebook pod's statefulset and notebook-name labels stay as the controllers set them.

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
    RESTARTED_AT_ANNOTATION,
    SERVER_TYPE_ANNOTATION,
    STATE_ANNOTATION,
    STOP_ANNOTATION,
    STOPPED_AT_ANNOTATION,
    STOPPED_BY_ANNOTATION,
    TRACE_ANNOTATION,
    WARNED_AT_ANNOTATION,
)

pytestmark = pytest.mark.cluster
ROOT = Path(__file__).resolve().parents[1]
COMPONENT = ROOT / "kustomize" / "components" / "exempt-admission"
ADMIN_GROUP = "kf-admins"
MERGE = "application/merge-patch+json"
ADMISSION_KINDS = ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding")
EXEMPT_REFUSAL = ("only cluster admins may set, change or remove notebook-culler.io/exempt; "
                  f"ask your admin (group {ADMIN_GROUP})")
MARKS_REFUSAL = "only kf-culler writes its marks on a Notebook ({}); you may remove them, not add or change them"
POD_LABELS_REFUSAL = ("the labels statefulset and notebook-name of a notebook pod are Kubeflow's; they may not be "
                      "changed, added or removed (pod {})")
WRITES = "kf-culler-writes"  # the base's, in the overlay (tests/test_rbac.py)
POLICIES = ("kf-culler-exempt", "kf-culler-keep-until", "kf-culler-marks", "kf-culler-server-type",
            "kf-culler-notebook-name", "kf-culler-pod-labels")


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


def relabel(api: Any, namespace: str, name: str, labels: dict[str, str | None]) -> Callable[[], object]:
    body = {"metadata": {"labels": labels}}
    return lambda: client.CustomObjectsApi(api).patch_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, name, body, _content_type=MERGE)


def relabel_pod(api: Any, namespace: str, name: str, labels: dict[str, str | None]) -> Callable[[], object]:
    return lambda: client.CoreV1Api(api).patch_namespaced_pod(
        name, namespace, {"metadata": {"labels": labels}}, _content_type=MERGE)


def create(api: Any, namespace: str, body: dict[str, Any]) -> Callable[[], object]:
    return functools.partial(obj.create_notebook, api, namespace, body)


def micro(t: datetime) -> str:
    return t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def z(t: datetime) -> str:
    return t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def eventually(what: str, call: Callable[[int], Callable[[], object]], code: int, timeout: float = 60,
               contains: str = "") -> None:
    """Policies, bindings and their params reach the admission plugin a moment after they are created:
    try `call(attempt)` (a write that changes something each attempt, so an early success does not make
    later tries no-ops) until it answers HTTP `code` (with `contains` in the message)."""
    deadline = time.monotonic() + timeout
    attempt = 0
    while (got := status_of(call(attempt)))[0] != code or contains not in got[1]:
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
    # ...and with pods (kubeflow-kubernetes-edit).
    verbs = ["get", "list", "watch", "create", "update", "patch", "delete"]
    # ...and with Workspaces and plain workloads (kubeflow-edit aggregates edit: deployments, statefulsets).
    rbac.create_namespaced_role(namespace, {"metadata": {"name": "notebooks-edit"}, "rules": [
        {"apiGroups": [GROUP], "resources": [PLURAL, "workspaces"], "verbs": verbs},
        {"apiGroups": ["apps"], "resources": ["deployments", "statefulsets"], "verbs": verbs},
        {"apiGroups": [""], "resources": ["pods"], "verbs": verbs}]})
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
        IDLE_SINCE_ANNOTATION: z(now - timedelta(hours=1)), STOPPED_BY_ANNOTATION: "kf-culler",
        STOPPED_AT_ANNOTATION: z(now), WARNED_AT_ANNOTATION: z(now - timedelta(minutes=10)),
        TRACE_ANNOTATION: "4bf92f3577b34da6a3ce929d0e0e4736"}
    # kf-culler-marks lets its ServiceAccount add marks (as it refuses alice's)...
    eventually("the marks policy is active",
               lambda i: patch(alice, namespace, "nb", {STOPPED_BY_ANNOTATION: f"probe-{i}"}), 403)
    assert status_of(patch(culler, namespace, "nb", marks)) == (200, "")
    # ...change them, and remove them.
    assert status_of(patch(culler, namespace, "nb", {
        STATE_ANNOTATION: "stopped", STOP_ANNOTATION: None, RESTARTED_AT_ANNOTATION: z(now)})) == (200, "")
    assert status_of(patch(culler, namespace, "nb", {RESTARTED_AT_ANNOTATION: None})) == (200, "")
    got = obj.get_notebook(api, namespace, "nb")["metadata"]["annotations"]
    assert got[STATE_ANNOTATION] == "stopped" and got[TRACE_ANNOTATION] == marks[TRACE_ANNOTATION]
    assert RESTARTED_AT_ANNOTATION not in got
    # ...but its ServiceAccount is no admin: it cannot grant or take away an exemption either (kf-culler-writes,
    # the base's bound on its own writes, refuses it too: the API server names the first policy that refused).
    code, message = status_of(patch(culler, namespace, "nb", {EXEMPT_ANNOTATION: None}))
    assert code == 403 and (EXEMPT_REFUSAL in message or f"refused {EXEMPT_ANNOTATION}" in message), message


def test_keep_until_is_bounded_by_the_cullers_lease_clock(kube: KubeTarget, api: Any, namespace: str,
                                                          admission: dict[str, Any]) -> None:
    alice = as_user(kube, "alice@example.com")
    obj.create_notebook(api, namespace, obj.notebook("nb"))
    now = datetime.now(UTC)
    renew(api, now)
    far = z(now + timedelta(hours=25))
    eventually("the keep-until policy reads the renewed Lease", lambda i: patch(
        alice, namespace, "nb", {KEEP_UNTIL_ANNOTATION: z(now + timedelta(hours=26, seconds=i))}), 422,
        contains=f"({micro(now)})")
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


def test_profile_users_cannot_add_or_change_the_cullers_marks(kube: KubeTarget, api: Any, namespace: str,
                                                             admission: dict[str, Any]) -> None:
    alice = as_user(kube, "alice@example.com", "kubeflow-users")
    admin = as_user(kube, "root@example.com", ADMIN_GROUP)
    culler = kube.api_client(kube.service_account_kubeconfig("kubeflow", "kf-culler"))
    obj.create_notebook(api, namespace, obj.notebook("nb"))
    eventually("the marks policy refuses alice's stopped-by",
               lambda i: patch(alice, namespace, "nb", {STOPPED_BY_ANNOTATION: f"probe-{i}"}), 403)
    obj.patch_annotations(admin, namespace, "nb", {STOPPED_BY_ANNOTATION: None})  # a probe that got in early

    # Adding a mark: refused, with the mark named and the policy that refused it.
    now = datetime.now(UTC)
    for key, value in ((STOPPED_BY_ANNOTATION, "kf-culler"), (RESTARTED_AT_ANNOTATION, z(now)),
                       ("notebook-culler.io/anything-new", "x")):
        code, message = status_of(patch(alice, namespace, "nb", {key: value}))
        print(f"refusal: HTTP {code}: {message}")
        assert code == 403 and MARKS_REFUSAL.format(key) in message, (key, code, message)
        assert "kf-culler-marks" in message
    # Several at once: each is named (in no particular order).
    code, message = status_of(patch(alice, namespace, "nb", {STATE_ANNOTATION: "active", REASON_ANNOTATION: "x"}))
    assert code == 403 and any(MARKS_REFUSAL.format(f"{a}, {b}") in message for a, b in (
        (REASON_ANNOTATION, STATE_ANNOTATION), (STATE_ANNOTATION, REASON_ANNOTATION))), message
    assert not any(k.startswith("notebook-culler.io/")
                   for k in obj.get_notebook(api, namespace, "nb")["metadata"].get("annotations", {}))

    # The culler marks the notebook; alice cannot change a mark, may write it back unchanged, may remove it.
    assert status_of(patch(culler, namespace, "nb", {
        STATE_ANNOTATION: "idle", STOPPED_BY_ANNOTATION: "kf-culler", IDLE_SINCE_ANNOTATION: z(now)}))[0] == 200
    code, message = status_of(patch(alice, namespace, "nb", {STATE_ANNOTATION: "active"}))
    assert code == 403 and MARKS_REFUSAL.format(STATE_ANNOTATION) in message, message
    code, _ = status_of(patch(alice, namespace, "nb", {STATE_ANNOTATION: "active", STOPPED_BY_ANNOTATION: None}))
    assert code == 403  # a change rides along with a removal: the whole request is refused
    assert obj.get_notebook(api, namespace, "nb")["metadata"]["annotations"][STATE_ANNOTATION] == "idle"
    assert status_of(patch(alice, namespace, "nb", {STATE_ANNOTATION: "idle", "team.example.com/x": "1"})) == (200, "")
    assert status_of(patch(alice, namespace, "nb", {STOPPED_BY_ANNOTATION: None})) == (200, "")
    assert status_of(patch(alice, namespace, "nb", {STATE_ANNOTATION: None, IDLE_SINCE_ANNOTATION: None})) == (200, "")
    assert not any(k.startswith("notebook-culler.io/")
                   for k in obj.get_notebook(api, namespace, "nb")["metadata"]["annotations"])

    # On CREATE, too (a Notebook copied with `kubectl get -o yaml` must drop the culler's marks first).
    code, message = status_of(create(alice, namespace, obj.notebook("nb-copy", annotations={STATE_ANNOTATION: "idle"})))
    assert code == 403 and MARKS_REFUSAL.format(STATE_ANNOTATION) in message, message
    assert status_of(create(alice, namespace, obj.notebook("nb-copy")))[0] == 200

    # exempt and keep-until are the user's requests, not marks: their own policies decide, as before.
    code, message = status_of(patch(alice, namespace, "nb", {EXEMPT_ANNOTATION: "true"}))
    assert code == 403 and EXEMPT_REFUSAL in message and "kf-culler-marks" not in message, message
    assert status_of(patch(admin, namespace, "nb", {EXEMPT_ANNOTATION: "true"})) == (200, "")
    assert status_of(patch(alice, namespace, "nb", {KEEP_UNTIL_ANNOTATION: z(now + timedelta(hours=2))})) == (200, "")
    assert status_of(patch(alice, namespace, "nb", {KEEP_UNTIL_ANNOTATION: None})) == (200, "")
    # An admin may write a mark (e.g. to repair one).
    assert status_of(patch(admin, namespace, "nb", {REASON_ANNOTATION: "reset by admin"})) == (200, "")
    # A full UPDATE (PUT) as the notebook-controller, the marks as they were, passes.
    controller = as_user(kube, "system:serviceaccount:kubeflow:notebook-controller-service-account")
    nb = obj.get_notebook(api, namespace, "nb")
    nb["metadata"]["labels"]["touched-by"] = "notebook-controller"
    assert status_of(lambda: client.CustomObjectsApi(controller).replace_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, "nb", nb))[0] == 200


def test_web_app_start_and_stop_pass_with_the_cullers_marks_on(kube: KubeTarget, api: Any, namespace: str,
                                                               admission: dict[str, Any]) -> None:
    """The Jupyter web app's Stop and Start are JSON merge patches of kubeflow-resource-stopped alone,
    sent for the profile user."""
    alice = as_user(kube, "alice@example.com", "kubeflow-users")
    culler = kube.api_client(kube.service_account_kubeconfig("kubeflow", "kf-culler"))
    obj.create_notebook(api, namespace, obj.notebook("nb"))
    eventually("the marks policy is active",
               lambda i: patch(alice, namespace, "nb", {STOPPED_BY_ANNOTATION: f"probe-{i}"}), 403)
    now = datetime.now(UTC)
    stopped = {STOP_ANNOTATION: z(now), STATE_ANNOTATION: "stopped", STOPPED_BY_ANNOTATION: "kf-culler",
               STOPPED_AT_ANNOTATION: z(now), REASON_ANNOTATION: "Stopped after 60 min idle."}
    assert status_of(patch(culler, namespace, "nb", stopped)) == (200, "")
    # Start (the web app removes only the stop annotation), then Stop again, then Start.
    for value in (None, z(now + timedelta(minutes=5)), None):
        assert status_of(patch(alice, namespace, "nb", {STOP_ANNOTATION: value})) == (200, ""), value
    got = obj.get_notebook(api, namespace, "nb")["metadata"]["annotations"]
    assert STOP_ANNOTATION not in got
    assert {k: got[k] for k in stopped if k != STOP_ANNOTATION} == {k: v for k, v in stopped.items()
                                                                     if k != STOP_ANNOTATION}


def test_server_type_must_be_one_kubeflow_knows(kube: KubeTarget, api: Any, namespace: str,
                                                admission: dict[str, Any]) -> None:
    alice = as_user(kube, "alice@example.com", "kubeflow-users")
    admin = as_user(kube, "root@example.com", ADMIN_GROUP)
    obj.create_notebook(api, namespace, obj.notebook("nb"))
    eventually("the server-type policy is active",
               lambda i: patch(alice, namespace, "nb", {SERVER_TYPE_ANNOTATION: f"probe-{i}"}), 422)
    obj.patch_annotations(admin, namespace, "nb", {SERVER_TYPE_ANNOTATION: "jupyter"})
    code, message = status_of(patch(alice, namespace, "nb", {SERVER_TYPE_ANNOTATION: "none"}))
    print(f"refusal: HTTP {code}: {message}")
    assert code == 422 and "kf-culler-server-type" in message
    assert "notebooks.kubeflow.org/server-type must be one of jupyter, group-one, group-two; none is not one" in message
    for bad in ("", "Jupyter", "group-three", "x" * 300):
        assert status_of(patch(alice, namespace, "nb", {SERVER_TYPE_ANNOTATION: bad}))[0] == 422, bad
    assert obj.get_notebook(api, namespace, "nb")["metadata"]["annotations"][SERVER_TYPE_ANNOTATION] == "jupyter"
    for good in ("group-one", "group-two", "jupyter"):
        assert status_of(patch(alice, namespace, "nb", {SERVER_TYPE_ANNOTATION: good})) == (200, ""), good
    assert status_of(create(alice, namespace, obj.notebook("nb-none", server_type="none")))[0] == 422
    assert status_of(create(alice, namespace, obj.notebook("nb-one", server_type="group-one")))[0] == 200
    # Removing it is allowed (the culler then goes by serverTypeByImage); admins may set anything.
    assert status_of(patch(alice, namespace, "nb", {SERVER_TYPE_ANNOTATION: None})) == (200, "")
    assert status_of(patch(admin, namespace, "nb", {SERVER_TYPE_ANNOTATION: "custom"})) == (200, "")
    # A value already stored is not checked again when something else changes.
    assert status_of(patch(alice, namespace, "nb", {"team.example.com/x": "1"})) == (200, "")


def test_notebook_name_label_must_be_the_notebooks_name(kube: KubeTarget, api: Any, namespace: str,
                                                        admission: dict[str, Any]) -> None:
    alice = as_user(kube, "alice@example.com", "kubeflow-users")
    admin = as_user(kube, "root@example.com", ADMIN_GROUP)
    obj.create_notebook(api, namespace, obj.notebook("nb"))
    eventually("the notebook-name policy is active",
               lambda i: relabel(alice, namespace, "nb", {"notebook-name": f"probe-{i}"}), 422)
    relabel(admin, namespace, "nb", {"notebook-name": None})()
    code, message = status_of(relabel(alice, namespace, "nb", {"notebook-name": "decoy"}))
    print(f"refusal: HTTP {code}: {message}")
    assert code == 422 and "kf-culler-notebook-name" in message
    assert "the label notebook-name of a Notebook must be its name (nb) or absent" in message
    assert "notebook-name" not in obj.get_notebook(api, namespace, "nb")["metadata"]["labels"]
    assert status_of(relabel(alice, namespace, "nb", {"notebook-name": "nb"})) == (200, "")
    assert status_of(relabel(alice, namespace, "nb", {"notebook-name": "nb-other"}))[0] == 422
    assert status_of(relabel(alice, namespace, "nb", {"notebook-name": None})) == (200, "")
    decoy, plain = obj.notebook("nb-2"), obj.notebook("nb-3")
    decoy["metadata"]["labels"]["notebook-name"] = "nb"
    plain["metadata"]["labels"]["notebook-name"] = "nb-3"
    assert status_of(create(alice, namespace, decoy))[0] == 422
    assert status_of(create(alice, namespace, plain))[0] == 200
    # Other labels are the user's.
    assert status_of(relabel(alice, namespace, "nb-3", {"team": "a", "app": "x"})) == (200, "")


def test_notebook_pod_labels_stay_as_kubeflow_set_them(kube: KubeTarget, api: Any, namespace: str,
                                                       admission: dict[str, Any]) -> None:
    alice = as_user(kube, "alice@example.com", "kubeflow-users")
    admin = as_user(kube, "root@example.com", ADMIN_GROUP)
    obj.create_notebook(api, namespace, obj.notebook("nb"))
    obj.running_pod(api, namespace, "nb", datetime.now(UTC))  # nb-0, labelled statefulset and notebook-name
    eventually("the pod-labels policy is active",
               lambda i: relabel_pod(alice, namespace, "nb-0", {"statefulset": f"probe-{i}"}), 403)
    relabel_pod(admin, namespace, "nb-0", {"statefulset": "nb"})()
    code, message = status_of(relabel_pod(alice, namespace, "nb-0", {"statefulset": "decoy"}))
    print(f"refusal: HTTP {code}: {message}")
    assert code == 403 and "kf-culler-pod-labels" in message and POD_LABELS_REFUSAL.format("nb-0") in message
    changes: list[dict[str, str | None]] = [{"statefulset": None}, {"notebook-name": "decoy"},
                                            {"notebook-name": None}]
    for change in changes:
        assert status_of(relabel_pod(alice, namespace, "nb-0", change))[0] == 403, change
    labels = client.CoreV1Api(api).read_namespaced_pod("nb-0", namespace).metadata.labels
    assert (labels["statefulset"], labels["notebook-name"]) == ("nb", "nb")
    # Other labels, and the two left as they were, pass.
    assert status_of(relabel_pod(alice, namespace, "nb-0", {"team": "a", "statefulset": "nb"})) == (200, "")
    # CREATE is not restricted (the StatefulSet controller makes the pods), nor are pods without the labels.
    core = client.CoreV1Api(alice)
    spec = {"containers": [{"name": "c", "image": "notebook:local"}]}
    assert status_of(lambda: core.create_namespaced_pod(namespace, {
        "metadata": {"name": "mine", "labels": {"statefulset": "nb"}}, "spec": spec}))[0] == 200
    assert status_of(relabel_pod(alice, namespace, "mine", {"notebook-name": "nb"}))[0] == 403
    assert status_of(lambda: core.create_namespaced_pod(namespace, {
        "metadata": {"name": "plain"}, "spec": spec}))[0] == 200
    assert status_of(relabel_pod(alice, namespace, "plain", {"team": "a"})) == (200, "")
    # The control plane's ServiceAccounts and admins may.
    rbac = client.RbacAuthorizationV1Api(api)
    rbac.create_namespaced_role_binding(namespace, {
        "metadata": {"name": "statefulset-controller"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "notebooks-edit"},
        "subjects": [{"kind": "ServiceAccount", "name": "statefulset-controller", "namespace": "kube-system"}]})
    sts = as_user(kube, "system:serviceaccount:kube-system:statefulset-controller")
    assert status_of(relabel_pod(admin, namespace, "nb-0", {"notebook-name": "nb-renamed"})) == (200, "")
    eventually("the statefulset-controller's binding is in effect",
               lambda i: relabel_pod(sts, namespace, "nb-0", {"statefulset": f"sts-{i}"}), 200)
    assert status_of(relabel_pod(sts, namespace, "nb-0", {"statefulset": None})) == (200, "")


def test_rendered_component_passes_server_side_dry_run(kube: KubeTarget, api: Any, tmp_path: Path) -> None:
    """As test_rbac does for the overlays: the API server accepts every object, CEL type-checked."""
    import subprocess

    from support.kustomize import kubectl_path

    kubectl = kubectl_path()
    assert kubectl is not None
    with contextlib.suppress(ApiException):
        client.CoreV1Api(api).create_namespace({"metadata": {"name": "kubeflow"}})
    objs = [o for o in rendered(tmp_path, "any") if (o["kind"] in ADMISSION_KINDS and o["metadata"]["name"] != WRITES)
            or o["metadata"]["name"] == "kf-culler-exempt-admission"]
    assert len(objs) == 1 + 2 * len(POLICIES)
    path = tmp_path / "admission.yaml"
    path.write_text(yaml.safe_dump_all(objs))
    done = subprocess.run([kubectl, "--kubeconfig", str(kube.kubeconfig), "apply", "--dry-run=server",
                           "-f", str(path)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    for name in POLICIES:
        for kind in ("validatingadmissionpolicy", "validatingadmissionpolicybinding"):
            assert f"{kind}.admissionregistration.k8s.io/{name} created (server dry run)" in done.stdout


def test_exempt_keep_until_and_marks_are_guarded_on_every_kind_the_culler_stops(
        kube: KubeTarget, api: Any, namespace: str, admission: dict[str, Any]) -> None:
    """Rule 2 reads notebook-culler.io/exempt on Workspaces, Deployments and StatefulSets as on Notebooks: a profile
    contributor (who may edit all three in their namespace) cannot set it there either, nor push keep-until past
    the bound, nor forge the culler's marks (on CREATE as on UPDATE); an admin can, and the culler's
    ServiceAccount writes its own marks."""
    from test_rbac import apply_workspace_crd

    from kf_culler.local.workspaces import workspace_body
    from kf_culler.targets import REPLICAS_BEFORE_ANNOTATION, target_of

    apply_workspace_crd(api)
    alice = as_user(kube, "alice@example.com", "kubeflow-users")
    admin = as_user(kube, "root@example.com", ADMIN_GROUP)
    culler = kube.api_client(kube.service_account_kubeconfig("kubeflow", "kf-culler"))
    client.RbacAuthorizationV1Api(api).create_namespaced_role_binding(namespace, {  # as components/workloads and
        "metadata": {"name": "kf-culler-sessions"},                                  # components/workspaces grant
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "notebooks-edit"},
        "subjects": [{"kind": "ServiceAccount", "name": "kf-culler", "namespace": "kubeflow"}]})
    renew(api, datetime.now(UTC))
    labels = {"session": "s"}
    template = {"metadata": {"labels": labels}, "spec": {"containers": [{"name": "ide", "image": "code-server:4"}]}}
    bodies = {
        "Workspace": lambda name, ann: {**workspace_body(namespace, name, "jupyterlab"), "metadata": {
            "name": name, "namespace": namespace, "annotations": ann}},
        "Deployment": lambda name, ann: {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {
            "name": name, "annotations": ann}, "spec": {"replicas": 1, "selector": {"matchLabels": labels},
                                                        "template": template}},
        "StatefulSet": lambda name, ann: {"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {
            "name": name, "annotations": ann}, "spec": {"replicas": 1, "serviceName": name,
                                                        "selector": {"matchLabels": labels}, "template": template}},
    }

    def make(who: Any, kind: str, name: str, ann: dict[str, str] | None = None) -> Callable[[], object]:
        t = target_of({"kind": kind})
        return lambda: client.CustomObjectsApi(who).create_namespaced_custom_object(
            t.group, t.version, namespace, t.plural, bodies[kind](name, ann or {}))

    def annotate(who: Any, kind: str, ann: dict[str, str | None]) -> Callable[[], object]:
        t = target_of({"kind": kind})
        return lambda: client.CustomObjectsApi(who).patch_namespaced_custom_object(
            t.group, t.version, namespace, t.plural, "s", {"metadata": {"annotations": ann}}, _content_type=MERGE)

    for kind in bodies:
        assert status_of(make(alice, kind, "s")) == (200, ""), kind
    eventually("the exempt policy guards Deployments",
               lambda i: annotate(alice, "Deployment", {EXEMPT_ANNOTATION: f"probe-{i}"}), 403)
    now = datetime.now(UTC)
    for kind in bodies:
        obj_ann = annotate(admin, kind, {EXEMPT_ANNOTATION: None})
        assert status_of(obj_ann)[0] == 200  # a probe that got in before the policy was in force
        # exempt: refused to the user, on UPDATE and on CREATE, with the admin group named.
        code, message = status_of(annotate(alice, kind, {EXEMPT_ANNOTATION: "true"}))
        print(f"{kind} refusal: HTTP {code}: {message}")
        assert code == 403 and EXEMPT_REFUSAL in message and "kf-culler-exempt" in message, (kind, message)
        code, message = status_of(make(alice, kind, "copy", {EXEMPT_ANNOTATION: "true"}))
        assert code == 403 and EXEMPT_REFUSAL in message, (kind, message)
        # keep-until: bounded by the culler's clock, as on Notebooks.
        code, message = status_of(annotate(alice, kind, {KEEP_UNTIL_ANNOTATION: z(now + timedelta(days=30))}))
        assert code == 422 and "kf-culler-keep-until" in message, (kind, message)
        assert status_of(annotate(alice, kind, {KEEP_UNTIL_ANNOTATION: "tomorrow"}))[0] == 422, kind
        assert status_of(annotate(alice, kind, {KEEP_UNTIL_ANNOTATION: z(now + timedelta(hours=2))})) == (200, "")
        # The culler's marks: forged ones refused, on UPDATE and on CREATE.
        for key, value in ((STOPPED_BY_ANNOTATION, "kf-culler"), (REPLICAS_BEFORE_ANNOTATION, "8"),
                           (STATE_ANNOTATION, "stopped")):
            code, message = status_of(annotate(alice, kind, {key: value}))
            assert code == 403 and f"only kf-culler writes its marks on a {kind} ({key})" in message, (kind, message)
        code, message = status_of(make(alice, kind, "copy", {STOPPED_AT_ANNOTATION: z(now)}))
        assert code == 403 and "kf-culler-marks" in message, (kind, message)
        # The culler writes its marks; the user may remove them, not change them.
        assert status_of(annotate(culler, kind, {STATE_ANNOTATION: "idle", IDLE_SINCE_ANNOTATION: z(now)})) == (
            200, ""), kind
        assert status_of(annotate(alice, kind, {STATE_ANNOTATION: "active"}))[0] == 403, kind
        assert status_of(annotate(alice, kind, {IDLE_SINCE_ANNOTATION: None})) == (200, ""), kind
        # ...and never exempt (kf-culler-exempt and kf-culler-writes both refuse it).
        assert status_of(annotate(culler, kind, {EXEMPT_ANNOTATION: "true"}))[0] == 403, kind
        # An admin may grant the exemption and repair a mark.
        assert status_of(annotate(admin, kind, {EXEMPT_ANNOTATION: "true", REASON_ANNOTATION: "x"})) == (200, "")
        # Everything else a user writes on their session passes.
        assert status_of(annotate(alice, kind, {"team.example.com/x": "1"})) == (200, ""), kind
        t = target_of({"kind": kind})
        got = client.CustomObjectsApi(api).get_namespaced_custom_object(t.group, t.version, namespace, t.plural, "s")
        assert got["metadata"]["annotations"][EXEMPT_ANNOTATION] == "true"
        assert got["metadata"]["annotations"][STATE_ANNOTATION] == "idle"
        assert STOPPED_BY_ANNOTATION not in got["metadata"]["annotations"]
