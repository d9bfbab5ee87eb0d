"""The labels on every object the culler creates itself (records, the brakes' ConfigMap, Leases, probers'
ServiceAccounts and RoleBindings, the AuthorizationPolicies of kf_culler/kube/istio.py), so that an uninstall finds
them all with one selector: `-l app.kubernetes.io/managed-by=kf-culler` (docs/install.md, "Uninstall")."""

from __future__ import annotations

MANAGED_BY = "app.kubernetes.io/managed-by"
OWNER = "kf-culler"
CREATED = {"app.kubernetes.io/name": "kf-culler", MANAGED_BY: OWNER}
