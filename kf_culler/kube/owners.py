"""Who owns a namespace: the address notices go to. A small lookup with a TTL cache.

An admin-set namespace annotation `notebook-culler.io/notify-email` wins; otherwise the `spec.owner.name` of
the Kubeflow Profile (`kubeflow.org/v1`, cluster-scoped, named like the namespace), which Kubeflow sets to
the user's email. Needs `namespaces` get and `profiles` get (kustomize/base/clusterrole.yaml).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from kf_culler.kube import core

log = logging.getLogger(__name__)
NOTIFY_EMAIL_ANNOTATION = "notebook-culler.io/notify-email"
PROFILE_GROUP, PROFILE_VERSION, PROFILE_PLURAL = "kubeflow.org", "v1", "profiles"
REQUEST_TIMEOUT = (5.0, 10.0)


class OwnerLookup:
    def __init__(self, api_client: Any, ttl_seconds: float = 300, use_profile: bool = True,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.api_client = api_client
        self.ttl = ttl_seconds
        self.use_profile = use_profile
        self.clock = clock
        self.lookups = 0  # API reads, for tests
        self._cache: dict[str, tuple[float, str | None]] = {}
        self._lock = threading.Lock()

    def email_for(self, namespace: str) -> str | None:
        """The owner's address, or None (no annotation, no Profile, or no owner). Errors are not cached."""
        now = self.clock()
        with self._lock:
            hit = self._cache.get(namespace)
            if hit is not None and now - hit[0] < self.ttl:
                return hit[1]
        found = self._read(namespace)
        with self._lock:
            self._cache[namespace] = (now, found)
        return found

    def _read(self, namespace: str) -> str | None:
        from kubernetes.client.rest import ApiException

        self.lookups += 1
        try:
            meta = core.read_namespace(self.api_client, namespace, timeout=REQUEST_TIMEOUT).get("metadata") or {}
            override = (meta.get("annotations") or {}).get(NOTIFY_EMAIL_ANNOTATION)
            if override and "@" in override:
                return str(override).strip()
        except ApiException as err:
            if err.status != 404:
                raise
        if not self.use_profile:
            return None
        try:
            profile = core.read_cluster_object(self.api_client, PROFILE_GROUP, PROFILE_VERSION, PROFILE_PLURAL,
                                               namespace, timeout=REQUEST_TIMEOUT)
        except ApiException as err:
            if err.status == 404:
                return None
            raise
        owner = ((profile.get("spec") or {}).get("owner") or {}) if isinstance(profile, dict) else {}
        name = owner.get("name") if isinstance(owner, dict) else None
        return str(name) if isinstance(name, str) and "@" in name else None
