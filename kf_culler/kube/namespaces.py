"""Namespace labels for policy rules with a namespaceSelector (kf_culler/policy.py), and annotations for whose
namespace it is (kf_culler/kube/tenants.py).

A `get` of each Namespace the notebooks live in (the ClusterRole's `namespaces: get`, which a namespaced
deployment can also be given), remembered for `ttl` seconds: no list or watch of every Namespace; one read
gives both the labels and the annotations.
What was read once is kept through later failures; never read, it is unknown (None) and no
namespaceSelector matches.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from kf_culler.kube import core

log = logging.getLogger(__name__)


class NamespaceLabels:
    def __init__(self, api_client: Any, ttl: float = 300.0, retry: float = 30.0, timeout: float = 5.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.api_client = api_client
        self.ttl, self.retry, self.timeout, self.clock = ttl, retry, timeout, clock
        # namespace -> (read at, labels, annotations)
        self._known: dict[str, tuple[float, dict[str, str], dict[str, str]]] = {}
        self._failed: dict[str, float] = {}  # namespace -> when reading it last failed
        self.reads = 0

    def __call__(self, namespace: str) -> dict[str, str] | None:
        """The namespace's labels; None when they have never been read."""
        known = self._read(namespace)
        return known[1] if known is not None else None

    def annotations(self, namespace: str) -> dict[str, str] | None:
        """The namespace's annotations (from the same read as its labels); None when never read."""
        known = self._read(namespace)
        return known[2] if known is not None else None

    def _read(self, namespace: str) -> tuple[float, dict[str, str], dict[str, str]] | None:
        now = self.clock()
        known = self._known.get(namespace)
        if known is not None and now - known[0] < self.ttl:
            return known
        failed = self._failed.get(namespace)
        if failed is not None and now - failed < self.retry:
            return known
        self.reads += 1
        try:
            meta = core.read_namespace(self.api_client, namespace, timeout=self.timeout).get("metadata") or {}
            raw = meta.get("labels") or {}
            raw_annotations = meta.get("annotations") or {}
        except Exception as err:
            self._failed[namespace] = now
            status = getattr(err, "status", None)
            log.warning("cannot read namespace %s (%s); %s", namespace,
                        f"HTTP {status}" if status else type(err).__name__,
                        "keeping the labels and annotations read before" if known is not None
                        else "no policy rule's namespaceSelector matches it, and it is its own tenant, until it "
                        "can be read")
            return known
        read = (now, {str(k): str(v) for k, v in raw.items()}, {str(k): str(v) for k, v in raw_annotations.items()})
        self._known[namespace] = read
        self._failed.pop(namespace, None)
        return read
