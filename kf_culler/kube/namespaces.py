"""Namespace labels for policy rules with a namespaceSelector (kf_culler/policy.py).

A `get` of each Namespace the notebooks live in (the ClusterRole's `namespaces: get`, which a namespaced
deployment can also be given), remembered for `ttl` seconds: no list or watch of every Namespace.
Labels read once are kept through later failures; never read, they are unknown (None) and no
namespaceSelector matches.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)


class NamespaceLabels:
    def __init__(self, api_client: Any, ttl: float = 300.0, retry: float = 30.0, timeout: float = 5.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        from kubernetes import client

        self.core = client.CoreV1Api(api_client)
        self.ttl, self.retry, self.timeout, self.clock = ttl, retry, timeout, clock
        self._known: dict[str, tuple[float, dict[str, str]]] = {}  # namespace -> (read at, labels)
        self._failed: dict[str, float] = {}  # namespace -> when reading it last failed
        self.reads = 0

    def __call__(self, namespace: str) -> dict[str, str] | None:
        """The namespace's labels; None when they have never been read."""
        now = self.clock()
        known = self._known.get(namespace)
        if known is not None and now - known[0] < self.ttl:
            return known[1]
        failed = self._failed.get(namespace)
        if failed is not None and now - failed < self.retry:
            return known[1] if known is not None else None
        self.reads += 1
        try:
            obj = self.core.read_namespace(namespace, _request_timeout=self.timeout)
            raw = obj.metadata.labels or {}
        except Exception as err:
            self._failed[namespace] = now
            status = getattr(err, "status", None)
            log.warning("cannot read the labels of namespace %s (%s); %s", namespace,
                        f"HTTP {status}" if status else type(err).__name__,
                        "keeping the labels read before" if known is not None
                        else "no policy rule's namespaceSelector matches it until they can be read")
            return known[1] if known is not None else None
        labels = {str(k): str(v) for k, v in raw.items()}
        self._known[namespace] = (now, labels)
        self._failed.pop(namespace, None)
        return labels
