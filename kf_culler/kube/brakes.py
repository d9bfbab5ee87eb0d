"""An admin's release of the brakes' hold: ConfigMap `kf-culler-brakes` in the culler's own namespace.

Only admins can write objects in the culler's namespace; profile users cannot release (or hold) anything.
`kf-culler release-brakes` writes `data.releasedAt` (now); the culler reads it while a hold is on, and a hold
whose trip came at or before that time ends (kf_culler/brakes.py). A time in the future counts as now.
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

from kf_culler.kube import core
from kf_culler.kube.labels import CREATED
from kf_culler.timeutil import format_time, parse_time

log = logging.getLogger(__name__)
NAME = "kf-culler-brakes"
KEY = "releasedAt"
REQUEST_TIMEOUT = (5.0, 10.0)


def released_at(api_client: Any, namespace: str, now: datetime) -> datetime | None:
    """When an admin last released the hold, or None (no ConfigMap, no readable time, no access)."""
    from kubernetes.client.rest import ApiException

    try:
        cm = core.read_config_map(api_client, namespace, NAME, timeout=REQUEST_TIMEOUT)
    except ApiException as err:
        if err.status != 404:
            log.warning("brakes: cannot read ConfigMap %s/%s: HTTP %s", namespace, NAME, err.status)
        return None
    except Exception as err:  # the API server unreachable: no release seen this pass
        log.warning("brakes: cannot read ConfigMap %s/%s: %s", namespace, NAME, type(err).__name__)
        return None
    found = parse_time((cm.get("data") or {}).get(KEY))
    return min(found, now) if found is not None else None


def release(api_client: Any, namespace: str, now: datetime) -> None:
    """Write `releasedAt: now` (creating the ConfigMap when it is missing)."""
    from kubernetes.client.rest import ApiException

    body = {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": NAME, "namespace": namespace,
                         "labels": {**CREATED, "app.kubernetes.io/component": "brakes"}},
            "data": {KEY: format_time(now, micro=True)}}
    try:
        core.patch_config_map(api_client, namespace, NAME, {"data": body["data"]}, timeout=REQUEST_TIMEOUT)
    except ApiException as err:
        if err.status != 404:
            raise
        core.create_config_map(api_client, namespace, body, timeout=REQUEST_TIMEOUT)
