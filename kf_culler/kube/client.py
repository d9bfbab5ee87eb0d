"""The API client: from --kubeconfig, the in-cluster service account, or the default kubeconfig."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

# Connections the client keeps open to the API server. The library's default is 5 per CPU (10 on 2 cores), and
# the culler's watches hold one each for as long as they last (7 or more), so a storm's 16 writers found the
# pool full and each write made a TLS connection of its own, which was then closed: handshakes on both sides
# for every patch. This many covers the watches, `writesInFlight` (up to 256 would still overflow it, rarely
# useful) and the record store's 16 bucket writers.
POOL_SIZE = 64


def api_client(kubeconfig: str | None) -> Any:
    """A kubernetes ApiClient for the given kubeconfig, in-cluster credentials, or ~/.kube/config."""
    from kubernetes import client, config

    cfg = type.__call__(client.Configuration)  # a fresh one, as config.new_client_from_config makes it
    if kubeconfig:
        config.load_kube_config(config_file=kubeconfig, client_configuration=cfg)
    elif os.environ.get("KUBERNETES_SERVICE_HOST"):
        config.load_incluster_config(client_configuration=cfg)
    else:
        config.load_kube_config(client_configuration=cfg)
    cfg.connection_pool_maxsize = POOL_SIZE
    return client.ApiClient(configuration=cfg)


# Where the culler is installed when nothing says otherwise: every overlay but openshift-ai puts it here.
DEFAULT_NAMESPACE = "kubeflow"
# The namespace of a pod's own ServiceAccount, as the kubelet mounts it.
SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


def culler_namespace(explicit: str | None = None, environ: Mapping[str, str] = os.environ,
                     service_account_file: Path = SERVICE_ACCOUNT_NAMESPACE) -> str:
    """The culler's own namespace (its record, the brakes' ConfigMap, its Leases, the probers' ServiceAccounts), the
    same for every command: `--culler-namespace`, else POD_NAMESPACE (the Deployment sets it), else the namespace of
    the pod's ServiceAccount (`kubectl exec` into any pod), else `kubeflow`. A kubeconfig context's namespace is not
    read: it is where its user works, not where the culler runs."""
    if explicit:
        return explicit
    if environ.get("POD_NAMESPACE"):
        return environ["POD_NAMESPACE"]
    try:
        found = service_account_file.read_text(encoding="utf-8").strip()
    except OSError:
        found = ""
    return found or DEFAULT_NAMESPACE
