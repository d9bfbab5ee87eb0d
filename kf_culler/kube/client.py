"""The API client: from --kubeconfig, the in-cluster service account, or the default kubeconfig."""

from __future__ import annotations

import os
from typing import Any


def api_client(kubeconfig: str | None) -> Any:
    """A kubernetes ApiClient for the given kubeconfig, in-cluster credentials, or ~/.kube/config."""
    from kubernetes import client, config

    if kubeconfig:
        return config.new_client_from_config(config_file=kubeconfig)
    if os.environ.get("KUBERNETES_SERVICE_HOST"):
        config.load_incluster_config()
        return client.ApiClient()
    return config.new_client_from_config()
