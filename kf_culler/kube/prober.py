"""The prober's credentials for workbenches behind kube-rbac-proxy (`probe.authProxy`, Open Data Hub).

What a probe through the proxy needs, once per pass and per namespace: the `Authorization` header (a token of
that namespace's prober) and the TLS context that verifies the proxy's serving certificate (`caFile`, OpenShift's
service CA). The token is sent to a pod its user controls, so it is never the culler's own token, it is
short-lived, and it opens nothing outside the namespace it is sent to:

- `serviceAccount` (a name prefix): one prober per probed namespace N, the ServiceAccount `<prefix>.<N>` in the
  culler's own namespace (labelled app.kubernetes.io/component=culler-prober, annotated with N), and the
  RoleBinding `<prefix>` in N binding `clusterRole` (only `get notebooks`) to it. The name holds N whole (a
  namespace is a DNS label, so it fits in a ServiceAccount's name, and the dot, which no label has, makes it
  one-to-one): no two namespaces share a prober. Before a RoleBinding is made or restored to name it, the account
  is read and must be the culler's (the label) and serve N (the annotation); one that does not is never bound,
  and N reads no signal with the reason (logged). The names of older versions, `<prefix>-<10 hex of a hash>`,
  have no dot: they are never made, bound or minted for again (the component's admission policy refuses them
  too). The culler creates both when missing and restores the RoleBinding each pass a user edited or deleted it
  (a user can break only their own namespace's probing, which then reads no signal). N's token is a
  TokenRequest for N's prober, `expirationSeconds` long (600 by default, the API server's minimum), renewed once
  half of it has passed; a failed renewal keeps the token while it has more than a tenth of its life left, then
  N's proxy probes report the error (no signal, nothing is sent). A captured token passes the proxies of N's
  workbenches only, which N's members pass anyway.
- `tokenFile`: the file's content, read again whenever its modification time, size or inode changes (a
  projected or mounted Secret is replaced by a symlink swap); one file is one identity, so config.py allows it
  only when exactly one namespace is probed.

The CA file is read again when it changes too. Nothing here raises: a problem is `ProxyAuth.error`.
"""

from __future__ import annotations

import logging
import os
import ssl
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from kf_culler.config import AuthProxySettings
from kf_culler.kube import core
from kf_culler.kube.labels import CREATED

FileKey = tuple[int, int, int]
COMPONENT_LABEL = "app.kubernetes.io/component"
PROBER_COMPONENT = "culler-prober"
SERVES_ANNOTATION = "notebook-culler.io/prober-for-namespace"  # the namespace a prober's token is sent to
RBAC_GROUP = "rbac.authorization.k8s.io"
log = logging.getLogger(__name__)


def prober_name(prefix: str, namespace: str) -> str:
    """The ServiceAccount whose tokens go to namespace's workbenches: `<prefix>.<namespace>`. One-to-one: the prefix
    and a namespace are DNS labels (no dot), so the name gives both back; at most 63 + 1 + 63 characters, within a
    ServiceAccount name's 253."""
    return f"{prefix}.{namespace}"


def serves(account: dict[str, Any], prefix: str, namespace: str) -> str | None:
    """None when `account` (a ServiceAccount read from the culler's namespace, as the API's JSON) is namespace's
    prober as the culler made it: named for namespace, labelled culler-prober, annotated with namespace; else why
    it may not be used."""
    meta = account.get("metadata") or {}
    name, where = meta.get("name"), meta.get("namespace")
    if name != prober_name(prefix, namespace):
        return (f"ServiceAccount {where}/{name} is not the prober of {namespace!r} "
                f"({prober_name(prefix, namespace)}); not bound")
    label = (meta.get("labels") or {}).get(COMPONENT_LABEL)
    if label != PROBER_COMPONENT:
        return (f"ServiceAccount {where}/{name} was not made by the culler (label {COMPONENT_LABEL}="
                f"{label!r}, not {PROBER_COMPONENT!r}); not bound")
    served = (meta.get("annotations") or {}).get(SERVES_ANNOTATION)
    if served != namespace:
        return (f"ServiceAccount {where}/{name} serves namespace {served!r}, not {namespace!r} "
                f"(annotation {SERVES_ANNOTATION}); not bound")
    return None


def _why(err: Exception) -> str:
    if hasattr(err, "status") and hasattr(err, "reason"):
        return f"HTTP {err.status} {err.reason}"
    return f"{type(err).__name__}: {err}"[:300] if isinstance(err, ValueError) else type(err).__name__


@dataclass(frozen=True)
class ProxyAuth:
    """`header`: the Authorization header's value; `tls`: the context verifying the proxy; or `error`."""

    header: str | None = None
    tls: ssl.SSLContext | None = None
    error: str | None = None


def _key(path: str) -> FileKey:
    st = os.stat(path)
    return (st.st_mtime_ns, st.st_size, st.st_ino)


class ProberTokens:
    """`get(namespaces)` -> {namespace: ProxyAuth} for this pass; thread-safe, cheap when nothing changed (a stat
    or two, and one GET of each namespace's RoleBinding)."""

    def __init__(self, settings: AuthProxySettings, api: Any = None, namespace: str = "default",
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.settings = settings
        self.api = api
        self.namespace = namespace  # the culler's own: where the probers' ServiceAccounts live
        self.clock = clock
        self.requests = 0  # TokenRequests made (for tests)
        self.repairs = 0  # RoleBindings created or restored (for tests)
        self._lock = threading.Lock()
        self._tokens: dict[str, tuple[str, float]] = {}  # namespace -> (token, when issued)
        self._accounts: set[str] = set()  # namespaces whose prober ServiceAccount was seen to be theirs
        self.problems: dict[str, str] = {}  # namespace -> why its prober or RoleBinding cannot be used now
        self._fresh: set[str] = set()  # namespaces whose RoleBinding was made or restored, not yet seen in force
        self._file_token: str | None = None
        self._file_key: FileKey | None = None
        self._tls: ssl.SSLContext | None = None
        self._tls_key: FileKey | None = None

    def get(self, namespaces: Iterable[str]) -> dict[str, ProxyAuth]:
        wanted = sorted(set(namespaces))
        with self._lock:
            try:
                tls = self._context()
            except (OSError, ssl.SSLError, ValueError) as err:
                bad_ca = f"probe.authProxy.caFile {self.settings.ca_file}: {err}"[:300]
                return {ns: ProxyAuth(error=bad_ca) for ns in wanted}
            out: dict[str, ProxyAuth] = {}
            for ns in wanted:
                token, error = self._from_file() if self.settings.token_file else self._for(ns)
                out[ns] = ProxyAuth(error=error) if error is not None else ProxyAuth(header=f"Bearer {token}", tls=tls)
            return out

    def account(self, namespace: str) -> str:
        return prober_name(str(self.settings.service_account), namespace)

    def _context(self) -> ssl.SSLContext:
        path = self.settings.ca_file
        key = _key(path) if path else None
        if self._tls is None or key != self._tls_key:
            self._tls = ssl.create_default_context(cafile=path) if path else ssl.create_default_context()
            self._tls_key = key
        return self._tls

    def _from_file(self) -> tuple[str | None, str | None]:
        path = str(self.settings.token_file)
        try:
            key = _key(path)
            if self._file_token is None or key != self._file_key:
                with open(path, encoding="utf-8") as f:
                    token = f.read(16 * 1024).strip()
                self._file_token, self._file_key = token, key
        except OSError as err:
            self._file_token = None
            return None, f"cannot read probe.authProxy.tokenFile {path}: {err.strerror or err}"
        if not self._file_token or "\n" in self._file_token or "\r" in self._file_token:
            return None, f"probe.authProxy.tokenFile {path} holds no usable token"
        return self._file_token, None

    def _for(self, namespace: str) -> tuple[str | None, str | None]:
        """namespace's token, its prober checked to serve it and its RoleBinding checked (and repaired) first: every
        pass, so a binding a user deleted or edited is back before their namespace's next probes."""
        problem = self._check_account(namespace)
        if problem is None:
            problem = self._ensure_binding(namespace)
        self._report(namespace, problem)
        if problem is not None:
            self._tokens.pop(namespace, None)
            return None, problem
        token, error = self._requested(namespace)
        if token is not None and namespace in self._fresh:
            # The API server authorises from a cache that follows the RoleBinding a moment later, and the proxy
            # keeps a refusal for 30 s: the token goes out once the binding is seen in force, else next pass.
            if not self._in_force(namespace, token):
                return None, (f"RoleBinding {namespace}/{self.settings.service_account} made or restored this pass, "
                              "not in force yet; probed from the next pass")
            self._fresh.discard(namespace)
        return token, error

    def _report(self, namespace: str, problem: str | None) -> None:
        """Log a namespace's prober problem when it appears or changes, and when it is gone (`problems` holds the
        standing ones)."""
        if problem is None:
            if self.problems.pop(namespace, None) is not None:
                log.info("probe.authProxy: namespace %s: its prober is usable again", namespace)
        elif self.problems.get(namespace) != problem:
            self.problems[namespace] = problem
            log.warning("probe.authProxy: namespace %s reads no signal: %s", namespace, problem)

    def _requested(self, namespace: str) -> tuple[str | None, str | None]:
        life = float(self.settings.expiration_seconds)
        now = self.clock()
        held = self._tokens.get(namespace)
        if held is not None and now - held[1] < life / 2:
            return held[0], None
        try:
            token = self._request(namespace)
        except Exception as err:
            why = f"TokenRequest for ServiceAccount {self.namespace}/{self.account(namespace)} failed: {_why(err)}"
            if held is not None and now - held[1] < life * 0.9:
                return held[0], None  # still valid for a while: try again next pass
            self._tokens.pop(namespace, None)
            return None, why
        self._tokens[namespace] = (token, now)
        return token, None

    # -- the API server: each namespace's ServiceAccount, RoleBinding and tokens --------------------------------
    def _meta(self, name: str, namespace: str, serves: str) -> dict[str, Any]:
        return {"name": name, "namespace": namespace, "labels": {**CREATED, COMPONENT_LABEL: PROBER_COMPONENT},
                "annotations": {SERVES_ANNOTATION: serves}}

    def _binding(self, namespace: str) -> dict[str, Any]:
        return {"apiVersion": f"{RBAC_GROUP}/v1", "kind": "RoleBinding",
                "metadata": self._meta(str(self.settings.service_account), namespace, namespace),
                "roleRef": {"apiGroup": RBAC_GROUP, "kind": "ClusterRole", "name": self.settings.cluster_role},
                "subjects": [{"kind": "ServiceAccount", "name": self.account(namespace), "namespace": self.namespace}]}

    def _ensure_binding(self, namespace: str) -> str | None:
        """None when namespace's RoleBinding is as the culler made it (made or restored now if need be), else why
        its probes get no token. A GET that fails otherwise than 404 leaves the binding as it is: the proxy
        decides."""
        from kubernetes import client
        from kubernetes.client.exceptions import ApiException

        rbac = client.RbacAuthorizationV1Api(self.api)
        body = self._binding(namespace)
        name = body["metadata"]["name"]
        try:
            found = rbac.read_namespaced_role_binding(name, namespace, _request_timeout=10)
        except ApiException as err:
            if err.status != 404:
                return None
            found = None
        except Exception:
            return None
        try:
            if found is None:
                problem = self._check_account(namespace, again=True)  # never bind an account that is not namespace's
                if problem is not None:
                    return problem
                rbac.create_namespaced_role_binding(namespace, body, _request_timeout=10)
                self.repairs += 1
                self._fresh.add(namespace)
                return None
            ref = found.role_ref
            if (ref.kind, ref.name) != ("ClusterRole", self.settings.cluster_role):
                return (f"RoleBinding {namespace}/{name} binds {ref.kind} {ref.name}, not ClusterRole "
                        f"{self.settings.cluster_role} (edited in the namespace; the culler cannot change a roleRef: "
                        "delete the RoleBinding and the culler makes it again)")
            subjects = [(s.kind, s.name, s.namespace) for s in found.subjects or []]
            labels = (found.metadata.labels or {}).get(COMPONENT_LABEL)
            serves = (found.metadata.annotations or {}).get(SERVES_ANNOTATION)
            if subjects == [("ServiceAccount", self.account(namespace), self.namespace)] \
                    and labels == PROBER_COMPONENT and serves == namespace:
                return None
            problem = self._check_account(namespace, again=True)
            if problem is not None:
                return problem
            body["metadata"]["resourceVersion"] = found.metadata.resource_version
            rbac.replace_namespaced_role_binding(name, namespace, body, _request_timeout=10)
            self.repairs += 1
            self._fresh.add(namespace)
            return None
        except Exception as err:
            if getattr(err, "status", None) == 409:
                return None  # made or changed meanwhile: checked again next pass
            return f"cannot {'create' if found is None else 'restore'} RoleBinding {namespace}/{name}: {_why(err)}"

    def _in_force(self, namespace: str, token: str, wait: float = 3.0) -> bool:
        """Whether the API server lets namespace's prober (its token) `get notebooks` there (a
        SelfSubjectAccessReview, which anyone may make about themselves), asked for up to `wait` seconds."""
        import copy

        from kubernetes import client

        config = copy.copy(self.api.configuration if self.api is not None else client.Configuration.get_default_copy())
        config.api_key, config.api_key_prefix = {"authorization": f"Bearer {token}"}, {}
        config.refresh_api_key_hook = None
        config.cert_file = config.key_file = config.username = config.password = None
        review = {"spec": {"resourceAttributes": {"group": "kubeflow.org", "resource": "notebooks", "verb": "get",
                                                  "namespace": namespace}}}
        deadline = time.monotonic() + wait
        with client.ApiClient(config) as api:
            while True:
                try:
                    out = client.AuthorizationV1Api(api).create_self_subject_access_review(review, _request_timeout=5)
                    if out.status.allowed:
                        return True
                except Exception:
                    return False
                if time.monotonic() >= deadline:
                    return False
                time.sleep(0.1)

    def _check_account(self, namespace: str, again: bool = False) -> str | None:
        """None when namespace's prober ServiceAccount exists (made now if missing) and serves namespace, as the
        culler made it; else why not. Read once, and `again` before each RoleBinding that is to name it."""
        from kubernetes.client.exceptions import ApiException

        if namespace in self._accounts and not again:
            return None
        self._accounts.discard(namespace)
        prefix = str(self.settings.service_account)
        name = self.account(namespace)
        try:
            try:
                found = core.read_service_account(self.api, self.namespace, name, timeout=10)
            except ApiException as err:
                if err.status != 404:
                    raise
                body = {"apiVersion": "v1", "kind": "ServiceAccount",
                        "metadata": self._meta(name, self.namespace, namespace), "automountServiceAccountToken": False}
                found = core.create_service_account(self.api, self.namespace, body, timeout=10)
        except Exception as err:
            return f"cannot read or create ServiceAccount {self.namespace}/{name}: {_why(err)}"
        problem = serves(found, prefix, namespace)
        if problem is None:
            self._accounts.add(namespace)
        return problem

    def _request(self, namespace: str) -> str:
        from kubernetes.client.exceptions import ApiException

        self.requests += 1
        body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                "spec": {"expirationSeconds": self.settings.expiration_seconds}}  # the API server's audience
        try:
            out = core.create_token(self.api, self.namespace, self.account(namespace), body, timeout=10)
        except ApiException as err:
            if err.status == 404:
                self._accounts.discard(namespace)  # deleted: made again next time
            raise
        token = str((out.get("status") or {}).get("token") or "")
        if not token:
            raise ValueError("empty token")
        return token
