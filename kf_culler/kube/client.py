"""The API client: from --kubeconfig, the in-cluster service account, or the default kubeconfig."""

from __future__ import annotations

import os
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
