"""Leader election with a coordination.k8s.io/v1 Lease.

The holder renews every `renew_seconds`; it counts itself leader only until `renew_deadline` after its
last successful renewal, which is shorter than the lease duration, so a leader that cannot renew stops
writing before anyone else may take the lease over.
"""

from __future__ import annotations

import logging
import threading
import time
from datetime import UTC, datetime
from typing import Any

log = logging.getLogger(__name__)


def _micro(t: datetime) -> str:
    return t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _parse(value: Any) -> datetime | None:
    if isinstance(value, datetime):
        return value if value.tzinfo else value.replace(tzinfo=UTC)
    if isinstance(value, str):
        try:
            return datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            return None
    return None


class LeaderElector:
    def __init__(self, api_client: Any, namespace: str, name: str, identity: str,
                 lease_seconds: int = 15, renew_seconds: float = 3.0, renew_deadline: float = 10.0) -> None:
        from kubernetes import client

        assert renew_deadline < lease_seconds
        self.api = client.CoordinationV1Api(api_client)
        self.namespace, self.name, self.identity = namespace, name, identity
        self.lease_seconds, self.renew_seconds, self.renew_deadline = lease_seconds, renew_seconds, renew_deadline
        self._last_ok = -1e18
        self._stop = threading.Event()
        self.transitions = 0
        self.thread = threading.Thread(target=self._loop, name="leader-election", daemon=True)

    def is_leader(self) -> bool:
        return time.monotonic() - self._last_ok < self.renew_deadline

    def start(self) -> None:
        self.thread.start()

    def stop(self, release: bool = True) -> None:
        self._stop.set()
        self.thread.join(timeout=5)
        if release and self.is_leader():
            self._last_ok = -1e18
            try:  # let a follower take over at once
                lease = self.api.read_namespaced_lease(self.name, self.namespace)
                if lease.spec.holder_identity == self.identity:
                    lease.spec.holder_identity = None
                    lease.spec.renew_time = None
                    self.api.replace_namespaced_lease(self.name, self.namespace, lease)
            except Exception as err:
                log.warning("could not release the lease: %s", err)

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.try_acquire_or_renew()
            except Exception as err:
                log.warning("leader election: %s", err)
            self._stop.wait(self.renew_seconds)

    def try_acquire_or_renew(self) -> bool:
        from kubernetes.client.rest import ApiException

        now = datetime.now(UTC)
        t0 = time.monotonic()
        spec = {"holderIdentity": self.identity, "leaseDurationSeconds": self.lease_seconds,
                "renewTime": _micro(now)}
        try:
            lease = self.api.read_namespaced_lease(self.name, self.namespace)
        except ApiException as err:
            if err.status != 404:
                raise
            try:
                self.api.create_namespaced_lease(self.namespace, {
                    "metadata": {"name": self.name, "namespace": self.namespace},
                    "spec": {**spec, "acquireTime": _micro(now), "leaseTransitions": 0}})
            except ApiException as create_err:
                if create_err.status == 409:
                    return False
                raise
            self._won(t0)
            return True
        holder = lease.spec.holder_identity
        renewed = _parse(lease.spec.renew_time)
        duration = lease.spec.lease_duration_seconds or self.lease_seconds
        expired = holder is None or renewed is None or (now - renewed).total_seconds() > duration
        if holder != self.identity and not expired:
            return False
        body = {"metadata": {"name": self.name, "namespace": self.namespace,
                             "resourceVersion": lease.metadata.resource_version},
                "spec": dict(spec)}
        if holder != self.identity:
            body["spec"]["acquireTime"] = _micro(now)
            body["spec"]["leaseTransitions"] = (lease.spec.lease_transitions or 0) + 1
        else:
            body["spec"]["acquireTime"] = _micro(_parse(lease.spec.acquire_time) or now)
            body["spec"]["leaseTransitions"] = lease.spec.lease_transitions or 0
        try:
            self.api.replace_namespaced_lease(self.name, self.namespace, body)
        except ApiException as err:
            if err.status == 409:
                return False
            raise
        if holder != self.identity:
            self.transitions += 1
        self._won(t0)
        return True

    def _won(self, t0: float) -> None:
        if not self.is_leader():
            log.info("became the leader (%s)", self.identity)
        self._last_ok = t0
