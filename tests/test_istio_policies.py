"""istio.manageAuthorizationPolicies: the culler keeps its AuthorizationPolicy kf-culler-probes where notebooks
are, on the real API server with our own permissive AuthorizationPolicy CRD (tests/crds), touching no other
policy; and kustomize/components/istio-policies grants exactly the rights it needs, proven as the culler's
ServiceAccount (with them it works, without them the pass reports HTTP 403 and goes on)."""

from __future__ import annotations

import contextlib
import copy
import os
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException
from support.kustomize import render
from support.passes import Passes
from support.target import KubeTarget
from test_rbac import apply

from kf_culler.config import Settings, load_mapping
from kf_culler.config_layers import load_layered
from kf_culler.kube import istio
from kf_culler.kube.istio import GROUP, NAME, PLURAL, VERSION, PolicyKeeper
from kf_culler.local import objects as obj
from kf_culler.runner import build_runner

ROOT = Path(__file__).resolve().parents[1]
KUSTOMIZE = ROOT / "kustomize"
CRD = ROOT / "tests" / "crds" / "authorizationpolicies.security.istio.io.yaml"
PRINCIPAL = "cluster.local/ns/kubeflow/sa/kf-culler"
CLOSED = "http://127.0.0.1:9/{namespace}/{name}/"  # nothing listens: the probes fail at once


def render_with_component(tmp_path: Path) -> list[dict[str, Any]]:
    """overlays/kubeflow + components/istio-policies, as docs/install.md tells an admin to write it."""
    overlay = tmp_path / "with-istio-policies"
    overlay.mkdir()
    rel = os.path.relpath(KUSTOMIZE, overlay)
    (overlay / "kustomization.yaml").write_text(yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        "resources": [f"{rel}/overlays/kubeflow"], "components": [f"{rel}/components/istio-policies"]}))
    return render(overlay)


def mounted_config(objs: list[dict[str, Any]]) -> dict[str, Any]:
    (cm,) = [o for o in objs if o["kind"] == "ConfigMap" and o["metadata"]["name"].startswith("kf-culler-config")]
    data: dict[str, Any] = yaml.safe_load(cm["data"]["config.yaml"])
    return data


# --- what is rendered ------------------------------------------------------------------------------


def test_the_kept_policy_is_the_profile_namespace_policy() -> None:
    (shipped,) = render(KUSTOMIZE / "overlays" / "kubeflow" / "profile-namespace")
    ours = istio.policy("team-a", PRINCIPAL)
    assert (ours["apiVersion"], ours["kind"]) == (shipped["apiVersion"], shipped["kind"]) == (
        "security.istio.io/v1", "AuthorizationPolicy")
    assert ours["metadata"]["name"] == shipped["metadata"]["name"] == NAME
    assert ours["spec"] == shipped["spec"]
    labels = ours["metadata"]["labels"]
    assert labels.items() >= shipped["metadata"]["labels"].items()
    assert labels["app.kubernetes.io/managed-by"] == "kf-culler"
    other = istio.policy_spec("example.org/ns/tools/sa/culler")["rules"][0]["from"]
    assert other == [{"source": {"principals": ["example.org/ns/tools/sa/culler"]}}]


def test_the_base_and_the_overlays_grant_nothing_on_authorization_policies() -> None:
    for path in ("base", "overlays/kubeflow", "overlays/dry-run", "overlays/gpu-only"):
        for o in render(KUSTOMIZE / path):
            if o["kind"] in ("ClusterRole", "Role"):
                for rule in o["rules"]:
                    assert "security.istio.io" not in rule.get("apiGroups", []), (path, o["metadata"]["name"])
        assert mounted_config(render(KUSTOMIZE / path)).get("istio", {}).get("manageAuthorizationPolicies") in (
            None, False), path


def test_the_component_grants_the_rights_and_turns_the_option_on(tmp_path: Path) -> None:
    objs = render_with_component(tmp_path)
    assert len(objs) == len(render(KUSTOMIZE / "overlays" / "kubeflow")) + 2
    (role,) = [o for o in objs if o["kind"] == "ClusterRole" and o["metadata"]["name"] == "kf-culler-istio-policies"]
    assert role["rules"] == [{"apiGroups": ["security.istio.io"], "resources": ["authorizationpolicies"],
                              "verbs": ["list", "create", "update", "delete"]}]
    (binding,) = [o for o in objs if o["kind"] == "ClusterRoleBinding"
                  and o["metadata"]["name"] == "kf-culler-istio-policies"]
    assert binding["roleRef"]["name"] == "kf-culler-istio-policies"
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "kf-culler", "namespace": "kubeflow"}]
    # The configuration the Deployment mounts: the base's config.yaml untouched, the istio section in a fragment
    # beside it, and the two load.
    mine, base = mounted_config(objs), mounted_config(render(KUSTOMIZE / "base"))
    assert mine == base
    (cm,) = [o for o in objs if o["kind"] == "ConfigMap" and o["metadata"]["name"].startswith("kf-culler-config")]
    assert yaml.safe_load(cm["data"]["istio-policies.fragment.yaml"]) == {"istio": {
        "manageAuthorizationPolicies": True, "principal": PRINCIPAL, "reconcileEveryPasses": 1}}
    (sa,) = [o for o in objs if o["kind"] == "ServiceAccount"]
    assert f"cluster.local/ns/{sa['metadata']['namespace']}/sa/{sa['metadata']['name']}" == PRINCIPAL
    for name, text in cm["data"].items():
        (tmp_path / name).write_text(text)
    assert load_layered(tmp_path / "config.yaml").operations.istio.manage_authorization_policies
    for o in objs:
        assert (o["metadata"].get("labels") or {}).get("app.kubernetes.io/name") == "kf-culler", o["metadata"]


def test_every_nth_pass_and_only_while_writing() -> None:
    settings = load_mapping({"istio": {"manageAuthorizationPolicies": True, "reconcileEveryPasses": 3}}, "t")
    keeper = PolicyKeeper.for_settings(settings, client.ApiClient())
    asked: list[set[str]] = []
    keeper.reconcile = lambda wanted, owns=None: asked.append(wanted) or istio.ReconcileResult()  # type: ignore
    snapshot = [({"metadata": {"namespace": "a", "name": "nb"}}, None)]
    for _ in range(7):
        keeper.after_pass(snapshot)
    assert asked == [{"a"}] * 3  # passes 0, 3 and 6
    keeper.after_pass(snapshot, may_write=lambda: False)
    keeper.after_pass(snapshot, may_write=lambda: False)
    assert len(asked) == 3
    for off in ({"istio": {"manageAuthorizationPolicies": False}},
                {"istio": {"manageAuthorizationPolicies": True}, "dryRun": True}):
        idle = PolicyKeeper.for_settings(load_mapping(off, "t"), client.ApiClient())
        assert not idle.enabled and idle.after_pass(snapshot) is None
    assert not PolicyKeeper.for_settings(settings, client.ApiClient(), dry_run=True).enabled


# --- on the API server -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def authz_crd(kube: KubeTarget) -> None:
    """Our AuthorizationPolicy CRD (tests/crds), Established and served."""
    api = kube.api_client()
    ext = client.ApiextensionsV1Api(api)
    with contextlib.suppress(ApiException):
        ext.create_custom_resource_definition(yaml.safe_load(CRD.read_text()))
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        crd = ext.read_custom_resource_definition(f"{PLURAL}.{GROUP}")
        if any(c.type == "Established" and c.status == "True" for c in (crd.status.conditions or [])):
            with contextlib.suppress(ApiException):
                client.CustomObjectsApi(api).list_cluster_custom_object(GROUP, VERSION, PLURAL)
                return
        time.sleep(0.2)
    raise AssertionError("the AuthorizationPolicy CRD was not served within 60 s")


def policies(api: Any, ns: str) -> dict[str, dict[str, Any]]:
    items = client.CustomObjectsApi(api).list_namespaced_custom_object(GROUP, VERSION, ns, PLURAL)["items"]
    return {o["metadata"]["name"]: o for o in items}


def foreign(api: Any, ns: str, name: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
    """A policy someone else owns, as Kubeflow's profile controller or an admin would write one."""
    body = {"apiVersion": f"{GROUP}/v1beta1", "kind": "AuthorizationPolicy",
            "metadata": {"name": name, "labels": labels or {"app": "someone-else"}},
            "spec": {"action": "ALLOW", "rules": [{"when": [{"key": "request.headers[kubeflow-userid]",
                                                               "values": ["alice@example.com"]}]}]}}
    created: dict[str, Any] = client.CustomObjectsApi(api).create_namespaced_custom_object(
        GROUP, "v1beta1", ns, PLURAL, body)
    return created


def namespaces(api: Any, base: str, *suffixes: str) -> list[str]:
    out = []
    for s in suffixes:
        obj.create_namespace(api, f"{base}-{s}")
        out.append(f"{base}-{s}")
    return out


def settings_for(include: list[str], manage: bool = True) -> Settings:
    return load_mapping({"istio": {"manageAuthorizationPolicies": manage}, "namespaces": {"include": include},
                         "urls": {"jupyter": CLOSED, "codeServer": CLOSED},
                         "probe": {"timeoutSeconds": 2, "retries": 0}}, "test")


def wait_for(check: Callable[[], bool], what: str, seconds: float = 30) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.1)
    raise AssertionError(f"not within {seconds} s: {what}")


@pytest.mark.cluster
def test_kept_where_notebooks_are_and_nowhere_else(api: Any, namespace: str, authz_crd: None) -> None:
    with_nb, without, hand = namespaces(api, namespace, "nb", "empty", "hand")
    obj.create_notebook(api, with_nb, obj.notebook("nb"))
    obj.create_notebook(api, hand, obj.notebook("nb"))
    profile_owner = foreign(api, with_nb, "ns-owner-access-istio")
    # In `hand` an admin applied profile-namespace by hand: same name, without our label.
    (by_hand,) = render(KUSTOMIZE / "overlays" / "kubeflow" / "profile-namespace")
    client.CustomObjectsApi(api).create_namespaced_custom_object(GROUP, VERSION, hand, PLURAL, by_hand)
    by_hand = policies(api, hand)[NAME]
    custom = client.CustomObjectsApi(api)

    runner = Passes(build_runner(settings_for([with_nb, without, hand]), api))
    with runner:
        runner.once()
        assert runner.policies is not None and runner.policies.last is not None
        last = runner.policies.last
        assert (last.created, last.foreign, last.errors) == ([with_nb], [hand], [])
        ours = policies(api, with_nb)[NAME]
        assert ours["spec"] == istio.policy_spec(PRINCIPAL)
        assert ours["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "kf-culler"
        assert policies(api, without) == {}
        # The other policies: not touched at all (same resourceVersion).
        assert policies(api, with_nb)["ns-owner-access-istio"]["metadata"]["resourceVersion"] == (
            profile_owner["metadata"]["resourceVersion"])
        assert policies(api, hand)[NAME]["metadata"]["resourceVersion"] == by_hand["metadata"]["resourceVersion"]

        # Ours deleted: back at the next reconcile.
        custom.delete_namespaced_custom_object(GROUP, VERSION, with_nb, PLURAL, NAME)
        runner.once()
        assert runner.policies.last.created == [with_nb]
        again = policies(api, with_nb)[NAME]
        assert again["metadata"]["uid"] != ours["metadata"]["uid"] and again["spec"] == ours["spec"]

        # Ours edited (another principal, another path): restored.
        edited = copy.deepcopy(again)
        edited["spec"]["rules"][0]["from"][0]["source"]["principals"] = ["cluster.local/ns/x/sa/intruder"]
        edited["spec"]["rules"][0]["to"][0]["operation"]["paths"].append("/notebook/{*}/{*}/api/contents")
        custom.replace_namespaced_custom_object(GROUP, VERSION, with_nb, PLURAL, NAME, edited)
        runner.once()
        assert runner.policies.last.restored == [with_nb]
        restored = policies(api, with_nb)[NAME]
        assert restored["spec"] == istio.policy_spec(PRINCIPAL)
        assert restored["metadata"]["uid"] == again["metadata"]["uid"]

        # Steady state: one list, no write.
        runner.once()
        assert runner.policies.last.writes == 0 and runner.policies.last.unchanged == [with_nb]

        # The hand-applied one stays foreign even when edited: never updated.
        by_hand_now = policies(api, hand)[NAME]
        by_hand_now["spec"]["action"] = "DENY"
        custom.replace_namespaced_custom_object(GROUP, VERSION, hand, PLURAL, NAME, by_hand_now)
        runner.once()
        assert policies(api, hand)[NAME]["spec"]["action"] == "DENY"

        # The last notebook deleted: ours goes, the other policies stay.
        custom.delete_namespaced_custom_object("kubeflow.org", "v1", with_nb, "notebooks", "nb")
        assert runner.cache is not None
        cache = runner.cache
        wait_for(lambda: all(nb["metadata"]["namespace"] != with_nb for nb, _ in cache.snapshot()),
                 "the cache sees the notebook gone")
        runner.once()
        assert runner.policies.last.deleted == [with_nb]
        assert set(policies(api, with_nb)) == {"ns-owner-access-istio"}
        assert NAME in policies(api, hand)  # its notebook is still there, and it is not ours anyway
        obj.create_notebook(api, hand, obj.notebook("nb2"))
        custom.delete_namespaced_custom_object("kubeflow.org", "v1", hand, "notebooks", "nb")
        custom.delete_namespaced_custom_object("kubeflow.org", "v1", hand, "notebooks", "nb2")
        wait_for(lambda: all(nb["metadata"]["namespace"] != hand for nb, _ in cache.snapshot()),
                 "the cache sees the notebooks gone")
        runner.once()
        assert policies(api, hand)[NAME]["metadata"]["uid"] == by_hand["metadata"]["uid"]  # never deleted


@pytest.mark.cluster
def test_never_where_it_would_deny_other_traffic(api: Any, namespace: str, authz_crd: None) -> None:
    """Ours would make every other request to the namespace's workloads a denial where no other ALLOW policy
    applies to them: there it is not created. Neither a policy with a selector (it guards some workloads
    only), nor a DENY, nor a kf-culler-probes applied by hand counts; a selector-less ALLOW someone else owns
    does (ours is then created), and once that one is gone, ours goes too.

    Policies are not enforced without Istio (there is none here): this asserts which objects exist and their
    shape, not what a proxy would do with them."""
    bare, other_kinds = namespaces(api, namespace, "bare", "other-kinds")
    custom = client.CustomObjectsApi(api)
    for ns in (bare, other_kinds):
        obj.create_notebook(api, ns, obj.notebook("nb"))
    selected = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "AuthorizationPolicy",
                "metadata": {"name": "db-only"},
                "spec": {"selector": {"matchLabels": {"app": "db"}}, "action": "ALLOW", "rules": [{}]}}
    deny = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "AuthorizationPolicy", "metadata": {"name": "deny-some"},
            "spec": {"action": "DENY", "rules": [{"to": [{"operation": {"paths": ["/admin"]}}]}]}}
    for body in (selected, deny):
        custom.create_namespaced_custom_object(GROUP, VERSION, other_kinds, PLURAL, body)
    keeper = PolicyKeeper.for_settings(settings_for([bare, other_kinds]), api)
    wanted = {bare, other_kinds}
    result = keeper.reconcile(wanted)
    assert (result.created, result.errors) == ([], [])
    assert policies(api, bare) == {} and set(policies(api, other_kinds)) == {"db-only", "deny-some"}
    assert keeper.access_problem(bare) is None  # nothing keeps the probes out there

    owner = foreign(api, bare, "ns-owner-access-istio")
    assert keeper.reconcile(wanted).created == [bare]
    ours = policies(api, bare)[NAME]
    assert ours["spec"] == istio.policy_spec(PRINCIPAL) and "selector" not in ours["spec"]
    assert policies(api, other_kinds).keys() == {"db-only", "deny-some"}

    custom.delete_namespaced_custom_object(GROUP, "v1beta1", bare, PLURAL, owner["metadata"]["name"])
    result = keeper.reconcile(wanted)
    assert (result.deleted, result.errors) == ([bare], [])
    assert policies(api, bare) == {}


@pytest.mark.cluster
def test_excluded_namespaces_are_left_alone(api: Any, namespace: str, authz_crd: None) -> None:
    """Ours in a namespace the culler no longer looks at stays; ours in a looked-at one without notebooks goes.
    (`owns` keeps this cluster-wide reconcile to the test's namespaces.)"""
    kept, gone = namespaces(api, namespace, "excluded", "looked-at")
    for ns in (kept, gone):
        client.CustomObjectsApi(api).create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL,
                                                                     istio.policy(ns, PRINCIPAL))
    settings = load_mapping({"istio": {"manageAuthorizationPolicies": True}, "namespaces": {"exclude": [kept]}}, "t")
    keeper = PolicyKeeper.for_settings(settings, api)
    result = keeper.reconcile(set(), owns=lambda ns: ns in (kept, gone))
    assert (result.deleted, result.errors) == ([gone], [])
    assert NAME in policies(api, kept) and policies(api, gone) == {}


@pytest.mark.cluster
@pytest.mark.parametrize("how", ["option off", "dry run"])
def test_nothing_is_created_unless_asked(api: Any, namespace: str, authz_crd: None, how: str) -> None:
    settings = settings_for([namespace], manage=how != "option off")
    obj.create_notebook(api, namespace, obj.notebook("nb"))
    runner = Passes(build_runner(settings, api, dry_run=how == "dry run"))
    with runner:
        runner.once()
        runner.once()
    assert policies(api, namespace) == {}


# --- as the culler's ServiceAccount ---------------------------------------------------------------


def culler_rbac(objs: list[dict[str, Any]], ns: str, suffix: str, with_component: bool) -> list[dict[str, Any]]:
    """The rendered ServiceAccount and cluster roles, in `ns`, renamed with `suffix` (no clash with other
    tests' copies); the component's only `with_component`. The Lease's Role is left out (no election); the
    record's Role is in `ns`, the culler's own namespace."""
    out = []
    for o in objs:
        if o["kind"] in ("Role", "RoleBinding") and o["metadata"]["name"] == "kf-culler-records":
            o = copy.deepcopy(o)
            o["metadata"]["namespace"] = ns
            for subject in o.get("subjects", []):
                subject["namespace"] = ns
            out.append(o)
            continue
        if o["kind"] not in ("ServiceAccount", "ClusterRole", "ClusterRoleBinding"):
            continue
        if not with_component and o["metadata"]["name"] == "kf-culler-istio-policies":
            continue
        o = copy.deepcopy(o)
        if o["kind"] == "ServiceAccount":
            o["metadata"]["namespace"] = ns
        else:
            o["metadata"]["name"] += suffix
        if o["kind"] == "ClusterRoleBinding":
            o["roleRef"]["name"] += suffix
            o["subjects"] = [{**s, "namespace": ns} for s in o["subjects"]]
        out.append(o)
    return out


@pytest.mark.cluster
@pytest.mark.parametrize("with_component", [True, False], ids=["with-component", "base-only"])
def test_as_the_service_account(kube: KubeTarget, api: Any, namespace: str, authz_crd: None, tmp_path: Path,
                                with_component: bool) -> None:
    culler_ns, work = namespaces(api, namespace, "culler", "work")
    apply(api, culler_rbac(render_with_component(tmp_path), culler_ns, f"-{namespace}", with_component))
    sa_api = kube.api_client(kube.service_account_kubeconfig(culler_ns, "kf-culler"))
    obj.create_notebook(api, work, obj.notebook("nb"))
    foreign(api, work, "ns-owner-access-istio")  # as in a Kubeflow profile's namespace
    # exactly the culler's identity
    runner = Passes(build_runner(settings_for([work]), sa_api, records_namespace=culler_ns))
    with runner:
        result = runner.once()  # never raises, whatever the API server answers
    assert [r.name for r in result.results] == ["nb"]
    assert runner.policies is not None and runner.policies.last is not None
    last = runner.policies.last
    if with_component:
        assert (last.created, last.errors) == ([work], [])
        assert policies(api, work)[NAME]["spec"] == istio.policy_spec(PRINCIPAL)
    else:
        assert last.writes == 0 and NAME not in policies(api, work)
        (error,) = last.errors
        assert error.startswith(f"list {PLURAL}.{GROUP}: HTTP 403 Forbidden")
        assert "kustomize/components/istio-policies" in error


@pytest.mark.cluster
def test_a_policy_the_culler_cannot_put_in_place_is_a_confirmed_access_problem(
        kube: KubeTarget, api: Any, namespace: str, authz_crd: None, tmp_path: Path) -> None:
    """Rule 16's exception: the culler may read AuthorizationPolicies but not create its own (an admin's RBAC
    left out `create`): where kf-culler-probes is missing, that is confirmed from objects profile users
    cannot write, and a notebook there that gives no signal is kept with a reason for the admin."""
    culler_ns, work = namespaces(api, namespace, "culler", "work")
    objs = culler_rbac(render_with_component(tmp_path), culler_ns, f"-{namespace}", True)
    for o in objs:
        if o["kind"] == "ClusterRole" and o["metadata"]["name"].startswith("kf-culler-istio-policies"):
            o["rules"] = [{**r, "verbs": ["get", "list"]} for r in o["rules"]]
    apply(api, objs)
    sa_api = kube.api_client(kube.service_account_kubeconfig(culler_ns, "kf-culler"))
    obj.create_notebook(api, work, obj.notebook("nb", gpus=1))
    obj.running_pod(api, work, "nb", datetime.now(UTC) - timedelta(hours=3), gpus=1)
    foreign(api, work, "ns-owner-access-istio")  # as in a Kubeflow profile's namespace
    time.sleep(1)
    runner = Passes(build_runner(settings_for([work]), sa_api, records_namespace=culler_ns))
    with runner:
        first = runner.once().results[0]
        assert runner.policies is not None and runner.policies.last is not None
        assert list(runner.policies.last.missing) == [work]
        second = runner.once().results[0]
    assert first.verdict.rule_id == "6-no-signal"  # before the culler knew
    assert (second.verdict.action, second.verdict.state, second.verdict.rule_id) == (
        "keep", "no-signal", "16-access-problem")
    assert "kf-culler-probes is not in place" in second.verdict.reason and "403" in second.verdict.reason


# --- the paths admitted, per target ----------------------------------------------------------------------------------


def _workspace_probe_paths(namespace: str, name: str, port_id: str) -> list[str]:
    """The paths of the culler's probes of a Workspace, built as the culler builds them: the `urls.workspace`
    template with the connect prefix (kf_culler/kube/cache.py), then each IDE probe's own URLs."""
    from urllib.parse import urlsplit

    from kf_culler.config import Urls
    from kf_culler.sources.codeserver import healthz_url
    from kf_culler.sources.jupyter import API_PARTS, api_url
    from kf_culler.targets import CONNECT_PREFIX

    out = []
    for path in (CONNECT_PREFIX.format(namespace=namespace, name=name, port_id=port_id), "/"):
        base = Urls().workspace.format(service=f"ws-{name}", namespace=namespace, clusterDomain="cluster.local",
                                       port=8888, path=path)
        out += [urlsplit(api_url(base, p)).path for p in API_PARTS] + [urlsplit(healthz_url(base)).path]
    return out


def test_the_kept_policy_admits_the_workspace_probes_only_with_the_workspaces_target() -> None:
    """With `targets: [notebooks, workspaces]` the policy the culler keeps admits every path its Workspace probes
    request (the connect prefix /workspace/connect/<ns>/<name>/<port id>/ and a kind's port served at the root), and
    still nothing else; with notebooks alone, no Workspace path."""
    from test_kustomize import _probe_paths, _template_matches

    both = istio.policy_spec(PRINCIPAL, ("notebooks", "workspaces"))["rules"][0]["to"][0]["operation"]["paths"]
    alone = istio.policy_spec(PRINCIPAL)["rules"][0]["to"][0]["operation"]["paths"]
    probes = _workspace_probe_paths("team-a", "my-ws", "jupyterlab")
    assert any(p.startswith("/workspace/connect/team-a/my-ws/jupyterlab/api/") for p in probes)
    for path in probes + _probe_paths("team-a", "nb"):
        assert any(_template_matches(t, path) for t in both), path
    assert not [p for p in probes if p.startswith("/workspace/") and any(_template_matches(t, p) for t in alone)]
    for other in ("/workspace/connect/team-a/my-ws/jupyterlab/lab", "/workspace/connect/team-a/my-ws/jupyterlab/",
                  "/workspace/connect/team-a/my-ws/jupyterlab/api/contents",
                  "/workspace/connect/team-a/my-ws/jupyterlab/api/kernels/abc/channels",
                  "/workspace/connect/team-a/my-ws/api/status", "/notebook/team-a/nb/lab", "/lab", "/"):
        assert not any(_template_matches(t, other) for t in both), other
    keeper = PolicyKeeper.for_settings(load_mapping({"targets": ["notebooks", "workspaces"], "istio": {
        "manageAuthorizationPolicies": True}}, "t"), client.ApiClient())
    assert keeper.targets == ("notebooks", "workspaces")
