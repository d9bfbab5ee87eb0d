"""The culler's own Istio AuthorizationPolicy in every namespace that holds notebooks (opt-in:
`istio.manageAuthorizationPolicies`).

The policy is `kf-culler-probes` (`security.istio.io/v1`), the same as
kustomize/overlays/kubeflow/profile-namespace/authorization-policy.yaml: ALLOW GET on exactly the probe
paths on port 8888, from the culler's principal only. It carries the label
`app.kubernetes.io/managed-by: kf-culler`, and only a policy with that label is ever updated or deleted:
one applied by hand (or by anyone else) under the same name is left as it is and reported as foreign.

Ours has no selector (Istio selects by exact label values, and no label with a fixed value is on every notebook
pod), and an ALLOW policy turns every other request to the workloads it applies to into a denial. So ours is
kept only where that has already happened: in a namespace that holds another ALLOW policy without a selector
(Kubeflow's profile controller writes `ns-owner-access-istio`), or everywhere when the mesh's root namespace
ROOT_NAMESPACE holds one. There it only adds the probes; elsewhere nothing denies the probes, ours is not
needed, and it is never created (one of ours found there is deleted): it never changes a namespace's other
traffic.

One reconcile: one list request of AuthorizationPolicies (cluster-wide, or per namespace when
`namespaces.include` is set, and the root namespace's), then a create where ours is missing, an update where
its spec was edited, and a delete (with the uid and resourceVersion it was read with as preconditions) where
no notebooks are left or no other ALLOW policy guards the namespace.
Every failure is reported in the result and logged, never raised: without the rights of
kustomize/components/istio-policies the API server answers 403, and the pass goes on.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from kf_culler.config import IstioSettings, Namespaces, Settings, Urls
from kf_culler.sources.codeserver import healthz_url
from kf_culler.sources.jupyter import API_PARTS, api_url
from kf_culler.targets import CONNECT_PREFIX

log = logging.getLogger(__name__)

GROUP, VERSION, PLURAL, KIND = "security.istio.io", "v1", "authorizationpolicies", "AuthorizationPolicy"
NAME = "kf-culler-probes"
MANAGED_BY, OWNER = "app.kubernetes.io/managed-by", "kf-culler"
LABELS = {
    "app.kubernetes.io/name": "kf-culler",
    "app.kubernetes.io/component": "notebook-culler",
    "app.kubernetes.io/part-of": "kubeflow",
    MANAGED_BY: OWNER,
}
ROOT_NAMESPACE = "istio-system"  # Istio's root namespace: its selector-less policies apply to every namespace
PROBE_PORT = "8888"  # the notebook container's port (Kubeflow's notebook-controller; the sample WorkspaceKinds')
PROFILE_TARGETS = ("notebooks", "workspaces")  # the targets whose sessions live in Kubeflow's profile namespaces


def _ide_paths(base: str) -> list[str]:
    """The paths the culler's Jupyter and code-server probes request under a base path (ending in '/'), without
    the query string (Istio matches the path alone), as the probes build them."""
    return [api_url(base, part).split("?", 1)[0] for part in API_PARTS] + [healthz_url(base)]


def probe_paths(targets: Iterable[str] = ("notebooks",)) -> list[str]:
    """Istio path templates of exactly what the culler probes for these targets, derived from where the probe URLs
    are built: a Notebook's `urls.jupyter` and `urls.codeServer` defaults, a Workspace's connect prefix (and `/` for
    a port its kind serves at the root); each namespace, name and port id one segment `{*}`."""
    one = {"namespace": "{*}", "name": "{*}", "port_id": "{*}", "clusterDomain": "d"}
    urls = Urls()
    paths: list[str] = []
    if "notebooks" in targets:
        paths += _ide_paths(urlsplit(urls.jupyter.format(**one)).path)[:len(API_PARTS)]
        paths += [healthz_url(urlsplit(urls.code_server.format(**one)).path)]
    if "workspaces" in targets:
        paths += _ide_paths(CONNECT_PREFIX.format(**one)) + _ide_paths("/")
    return list(dict.fromkeys(paths))


PROBE_PATHS = tuple(probe_paths())
REQUEST_TIMEOUT = (5.0, 30.0)
RBAC_HINT = (f"kf-culler may not manage {PLURAL}.{GROUP}: install kustomize/components/istio-policies "
             "(or turn istio.manageAuthorizationPolicies off)")


def policy_spec(principal: str, targets: Iterable[str] = ("notebooks",)) -> dict[str, Any]:
    """The spec of kf-culler-probes for the culler's principal and targets."""
    return {
        "action": "ALLOW",
        "rules": [{
            "from": [{"source": {"principals": [principal]}}],
            "to": [{"operation": {"methods": ["GET"], "ports": [PROBE_PORT], "paths": probe_paths(targets)}}],
        }],
    }


def policy(namespace: str, principal: str, targets: Iterable[str] = ("notebooks",)) -> dict[str, Any]:
    """The whole object the culler creates in `namespace`."""
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": KIND,
            "metadata": {"name": NAME, "namespace": namespace, "labels": dict(LABELS)},
            "spec": policy_spec(principal, targets)}


def is_ours(obj: dict[str, Any]) -> bool:
    return ((obj.get("metadata") or {}).get("labels") or {}).get(MANAGED_BY) == OWNER


def allows_all_selected(obj: dict[str, Any]) -> bool:
    """An ALLOW policy without a selector, not ours: every workload of its namespace is already deny-by-default."""
    spec = obj.get("spec")
    if not isinstance(spec, dict) or is_ours(obj) or (obj.get("metadata") or {}).get("name") == NAME:
        return False
    return spec.get("action", "ALLOW") == "ALLOW" and not spec.get("selector") and not spec.get("targetRef") \
        and not spec.get("targetRefs")


def namespaces_with_notebooks(snapshot: Iterable[tuple[dict[str, Any], Any]], scope: Namespaces) -> set[str]:
    """The namespaces selected by `namespaces` that hold at least one Notebook (running or stopped)."""
    out = set()
    for notebook, _pod in snapshot:
        ns = str((notebook.get("metadata") or {}).get("namespace") or "")
        if ns and scope.selects(ns):
            out.add(ns)
    return out


@dataclass
class ReconcileResult:
    """What one reconcile did, by namespace."""

    created: list[str] = field(default_factory=list)
    restored: list[str] = field(default_factory=list)  # ours, edited: its spec put back
    deleted: list[str] = field(default_factory=list)  # ours, in a namespace without notebooks
    unchanged: list[str] = field(default_factory=list)
    foreign: list[str] = field(default_factory=list)  # a kf-culler-probes without our label: left alone
    errors: list[str] = field(default_factory=list)
    missing: dict[str, str] = field(default_factory=dict)  # namespace -> why ours could not be put in place

    @property
    def writes(self) -> int:
        return len(self.created) + len(self.restored) + len(self.deleted)


def _api_error(err: Exception, what: str) -> str:
    from kubernetes.client.rest import ApiException

    if isinstance(err, ApiException):
        if err.status == 403:
            return f"{what}: HTTP 403 Forbidden: {RBAC_HINT}"
        if err.status == 404 and what.startswith("list"):
            return f"{what}: HTTP 404: the AuthorizationPolicy CRD ({GROUP}/{VERSION}) is not served (no Istio?)"
        return f"{what}: HTTP {err.status} {err.reason}"
    return f"{what}: {type(err).__name__}: {err}"[:300]


class PolicyKeeper:
    """Keeps kf-culler-probes where notebooks are. `after_pass` is called by the runner after every pass and
    reconciles every `istio.reconcileEveryPasses` passes, only while this replica may write."""

    def __init__(self, api_client: Any, settings: IstioSettings, scope: Namespaces, enabled: bool = True) -> None:
        from kubernetes import client

        self.settings, self.scope = settings, scope
        self.targets: tuple[str, ...] = ("notebooks",)  # whose probe paths the policy admits (`for_settings`)
        self.enabled = enabled and settings.manage_authorization_policies
        self.custom: Any = client.CustomObjectsApi(api_client) if self.enabled else None
        self.passes = 0
        self.reconciles = 0
        self.last: ReconcileResult | None = None
        self._last_errors: list[str] = []
        # Namespaces where the culler confirmed its own access is missing: its policy could not be put in
        # place (rule 16's accessProblem). Read from the mesh's policies, which profile users cannot write.
        self.problems: dict[str, str] = {}

    def access_problem(self, namespace: str) -> str | None:
        """What keeps the culler's probes out of a namespace, when it has confirmed it (else None)."""
        return self.problems.get(namespace)

    @classmethod
    def for_settings(cls, settings: Settings, api_client: Any, dry_run: bool = False) -> PolicyKeeper:
        """A keeper for the configuration; it does nothing when the option is off or the culler writes nothing."""
        ops = settings.operations
        keeper = cls(api_client, ops.istio, ops.namespaces, enabled=not (dry_run or ops.dry_run))
        keeper.targets = tuple(ops.targets)
        return keeper

    def after_pass(self, snapshot: Iterable[tuple[dict[str, Any], Any]],
                   may_write: Callable[[], bool] = lambda: True,
                   owns: Callable[[str], bool] = lambda _ns: True) -> ReconcileResult | None:
        """Reconcile on every N-th pass (the first included), if enabled and this replica may write."""
        if not self.enabled:
            return None
        due = self.passes % self.settings.reconcile_every_passes == 0
        self.passes += 1
        if not due or not may_write():
            return None
        return self.reconcile(namespaces_with_notebooks(snapshot, self.scope), owns)

    def _existing(self) -> tuple[dict[str, dict[str, Any]], set[str] | None]:
        """(kf-culler-probes by namespace, the namespaces another ALLOW policy without a selector guards; None:
        all of them, by one in the root namespace)."""
        if self.scope.include:
            items: list[Any] = []
            for ns in sorted({*self.scope.include, ROOT_NAMESPACE}):
                if self.scope.selects(ns) or ns == ROOT_NAMESPACE:
                    items += self.custom.list_namespaced_custom_object(
                        GROUP, VERSION, ns, PLURAL, _request_timeout=REQUEST_TIMEOUT).get("items") or []
        else:
            items = self.custom.list_cluster_custom_object(
                GROUP, VERSION, PLURAL, _request_timeout=REQUEST_TIMEOUT).get("items") or []
        found = [o for o in items if isinstance(o, dict) and isinstance(o.get("metadata"), dict)]
        guarded = {str(o["metadata"].get("namespace")) for o in found if allows_all_selected(o)}
        ours = {str(o["metadata"]["namespace"]): o for o in found if o["metadata"].get("name") == NAME}
        return ours, (None if ROOT_NAMESPACE in guarded else guarded)

    def reconcile(self, wanted: set[str], owns: Callable[[str], bool] = lambda _ns: True) -> ReconcileResult:
        """Make kf-culler-probes exist (as ours, with our spec) exactly in `wanted`, touching only ours, and only
        in namespaces that `namespaces` selects and `owns` accepts."""
        from kubernetes.client.rest import ApiException

        self.reconciles += 1
        result = ReconcileResult()
        try:
            existing, guarded = self._existing()
        except Exception as err:  # 403 without the component's RBAC, 404 without Istio, the API server away
            result.errors.append(_api_error(err, f"list {PLURAL}.{GROUP}"))
            return self._done(result)
        if guarded is not None:  # where nothing else is ALLOWed, ours would deny the rest: not there
            wanted = wanted & guarded
        spec = policy_spec(self.settings.principal, self.targets)
        for ns in sorted(wanted | set(existing)):
            if not (self.scope.selects(ns) and owns(ns)):  # outside the culler's namespaces: not its business
                continue
            current = existing.get(ns)
            try:
                if current is not None and not is_ours(current):
                    result.foreign.append(ns)
                elif ns in wanted and current is None:
                    self.custom.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL,
                                                                policy(ns, self.settings.principal),
                                                                _request_timeout=REQUEST_TIMEOUT)
                    result.created.append(ns)
                elif ns in wanted and current is not None and current.get("spec") != spec:
                    body = copy.deepcopy(current)
                    body["spec"] = spec  # metadata.resourceVersion kept: an edit in between is a 409
                    self.custom.replace_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, NAME, body,
                                                                 _request_timeout=REQUEST_TIMEOUT)
                    result.restored.append(ns)
                elif ns in wanted:
                    result.unchanged.append(ns)
                elif current is not None:
                    meta = current.get("metadata") or {}
                    self.custom.delete_namespaced_custom_object(
                        GROUP, VERSION, ns, PLURAL, NAME,
                        body={"preconditions": {"uid": meta.get("uid"),
                                                "resourceVersion": meta.get("resourceVersion")}},
                        _request_timeout=REQUEST_TIMEOUT)
                    result.deleted.append(ns)
            except ApiException as err:
                if err.status in (404, 409):  # changed since the list (created, edited, deleted): next time
                    continue
                if err.status == 403 and "being terminated" in str(err.body or ""):  # the namespace is going
                    continue
                result.errors.append(_api_error(err, f"{ns}/{NAME}"))
                result.missing[ns] = result.errors[-1]
            except Exception as err:
                result.errors.append(_api_error(err, f"{ns}/{NAME}"))
        self.problems = {ns: (f"its Istio AuthorizationPolicy {NAME} is not in place in namespace {ns} ({why}); "
                              "an administrator must let the culler create it (kustomize/components/istio-policies) "
                              "or apply it by hand (docs/install.md, Istio).")
                         for ns, why in result.missing.items()}
        return self._done(result)

    def _done(self, result: ReconcileResult) -> ReconcileResult:
        for what, nss in (("created", result.created), ("restored", result.restored),
                          ("deleted", result.deleted)):
            if nss:
                log.info("AuthorizationPolicy %s %s in %s", NAME, what, ", ".join(nss))
        if result.errors and result.errors != self._last_errors:
            log.warning("AuthorizationPolicy %s: %s", NAME, "; ".join(result.errors[:5])
                        + (f" (and {len(result.errors) - 5} more)" if len(result.errors) > 5 else ""))
        new_foreign = set(result.foreign) - set(self.last.foreign if self.last else ())
        if new_foreign:
            log.info("AuthorizationPolicy %s without the label %s=%s left alone in %s", NAME, MANAGED_BY, OWNER,
                     ", ".join(sorted(new_foreign)))
        self._last_errors = result.errors
        self.last = result
        return result
