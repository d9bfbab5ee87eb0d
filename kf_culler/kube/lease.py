"""Leader election and shard ownership with coordination.k8s.io/v1 Leases.

The holder of a Lease renews it every `renew_seconds`; it counts itself holder only until `renew_deadline`
after the start of its last successful renewal, which is shorter than the lease duration, so a holder
that cannot renew stops writing before anyone else may take the Lease over.

`LeaderElector`: one Lease (`kf-culler`), one writer. `ShardManager`: N shard Leases
(`<name>-shard-<i>`), each held by at most one replica, spread evenly over the live replicas, which
announce themselves through member-slot Leases (`<name>-member-<j>`, j < N).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from kf_culler.kube.labels import CREATED
from kf_culler.sharding import fair_share, shard_of
from kf_culler.timeutil import format_time

log = logging.getLogger(__name__)
# On a shard Lease its holder is handing over: it no longer writes, and the Lease is taken once it lapses.
HANDING_OVER = "notebook-culler.io/handing-over"


def _micro(t: datetime) -> str:
    return format_time(t, micro=True)


def _parse(value: Any) -> datetime | None:
    if isinstance(value, datetime):
        return value if value.tzinfo else value.replace(tzinfo=UTC)
    if isinstance(value, str):
        try:
            return datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            return None
    return None


def handing_over(lease: Any) -> bool:
    meta = getattr(lease, "metadata", None)
    return bool(meta is not None and (meta.annotations or {}).get(HANDING_OVER) == "true")


def live_holder(lease: Any, now: datetime | None = None, default_seconds: int = 15) -> str | None:
    """The Lease's holder while its last renewal is within the lease duration, else None (free)."""
    if lease is None or lease.spec is None:
        return None
    holder: str | None = lease.spec.holder_identity
    renewed = _parse(lease.spec.renew_time)
    duration = lease.spec.lease_duration_seconds or default_seconds
    now = now or datetime.now(UTC)
    if holder is None or renewed is None or (now - renewed).total_seconds() > duration:
        return None
    return holder


class Lease:
    """One Lease: acquire it when free, renew it while held, and know whether it is held *now*."""

    def __init__(self, api: Any, namespace: str, name: str, identity: str, lease_seconds: int = 15,
                 renew_deadline: float = 10.0) -> None:
        assert renew_deadline < lease_seconds
        self.api, self.namespace, self.name, self.identity = api, namespace, name, identity
        self.lease_seconds, self.renew_deadline = lease_seconds, renew_deadline
        self._last_ok = -1e18
        self.transitions = 0

    def holds(self) -> bool:
        return time.monotonic() - self._last_ok < self.renew_deadline

    def forget(self) -> None:
        """Stop counting as holder at once (the Lease then lapses unless released)."""
        self._last_ok = -1e18

    def read(self) -> Any:
        """The Lease object, or None when it does not exist yet."""
        from kubernetes.client.rest import ApiException

        try:
            return self.api.read_namespaced_lease(self.name, self.namespace)
        except ApiException as err:
            if err.status == 404:
                return None
            raise

    def try_acquire_or_renew(self, lease: Any = ..., take: bool = True) -> bool:
        """Renew the Lease if held, or take it if free (`take`). `lease`: a fresh read, or read it now.
        True when this replica holds it after the call."""
        from kubernetes.client.rest import ApiException

        t0 = time.monotonic()
        now = datetime.now(UTC)
        spec = {"holderIdentity": self.identity, "leaseDurationSeconds": self.lease_seconds,
                "renewTime": _micro(now)}
        if lease is ...:
            lease = self.read()
        if lease is None:
            if not take:
                return False
            try:
                self.api.create_namespaced_lease(self.namespace, {
                    "metadata": {"name": self.name, "namespace": self.namespace, "labels": dict(CREATED)},
                    "spec": {**spec, "acquireTime": _micro(now), "leaseTransitions": 0}})
            except ApiException as create_err:
                if create_err.status == 409:
                    return False
                raise
            self._won(t0, True)
            return True
        holder = lease.spec.holder_identity
        mine = holder == self.identity
        if not mine and (not take or live_holder(lease, now, self.lease_seconds) is not None):
            return False
        body = {"metadata": {"name": self.name, "namespace": self.namespace, "labels": dict(CREATED),
                             "resourceVersion": lease.metadata.resource_version},
                "spec": dict(spec)}
        if not mine:
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
        if not mine:
            self.transitions += 1
        self._won(t0, not mine)
        return True

    def _won(self, t0: float, acquired: bool) -> None:
        if acquired or not self.holds():
            log.info("holding the Lease %s (%s)", self.name, self.identity)
        self._last_ok = t0

    def hand_over(self, lease: Any) -> None:
        """Stop counting as holder and mark the Lease as handed over, without shortening it: it is taken
        over only once it lapses, so no write of ours can still be on its way by then."""
        self.forget()
        if lease is None or lease.spec is None or lease.spec.holder_identity != self.identity:
            return
        lease.metadata.annotations = {**(lease.metadata.annotations or {}), HANDING_OVER: "true"}
        try:
            self.api.replace_namespaced_lease(self.name, self.namespace, lease)
        except Exception as err:
            log.warning("could not mark the Lease %s as handed over: %s", self.name, err)

    def release(self) -> None:
        """Stop counting as holder, then clear the holder so another replica may take over at once."""
        if not self.holds():
            return
        self.forget()
        try:
            lease = self.read()
            if lease is not None and lease.spec.holder_identity == self.identity:
                lease.spec.holder_identity = None
                lease.spec.renew_time = None
                self.api.replace_namespaced_lease(self.name, self.namespace, lease)
        except Exception as err:
            log.warning("could not release the Lease %s: %s", self.name, err)


class LeaderElector:
    def __init__(self, api_client: Any, namespace: str, name: str, identity: str,
                 lease_seconds: int = 15, renew_seconds: float = 3.0, renew_deadline: float = 10.0) -> None:
        from kubernetes import client

        self.api = client.CoordinationV1Api(api_client)
        self.lease = Lease(self.api, namespace, name, identity, lease_seconds, renew_deadline)
        self.namespace, self.name, self.identity = namespace, name, identity
        self.lease_seconds, self.renew_seconds, self.renew_deadline = lease_seconds, renew_seconds, renew_deadline
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, name="leader-election", daemon=True)

    @property
    def transitions(self) -> int:
        return self.lease.transitions

    def is_leader(self) -> bool:
        return self.lease.holds()

    def start(self) -> None:
        self.thread.start()

    def stop(self, release: bool = True) -> None:
        self._stop.set()
        self.thread.join(timeout=5)
        if release:  # let a follower take over at once
            self.lease.release()

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.try_acquire_or_renew()
            except Exception as err:
                log.warning("leader election: %s", err)
            self._stop.wait(self.renew_seconds)

    def try_acquire_or_renew(self) -> bool:
        return self.lease.try_acquire_or_renew()


class ShardManager:
    """Hold a fair share of N shard Leases; `owns(namespace)` says whether this replica may probe and
    write that namespace's notebooks *now*.

    Presence: each replica holds one member-slot Lease (`<name>-member-<j>`, the first free one of N
    slots); the live replicas are the slots renewed within the lease duration. A replica without a slot
    (more replicas than shards) is a standby: it holds no shard and takes a slot when one lapses.

    Every `renew_seconds` a replica reads the 2N Leases and, with the same data as everyone else:
    - drops shards above the ceiling ceil(N / live);
    - if it is the richest replica (most shards, ties to the smallest identity), holds more than the
      floor and another live replica holds less than the floor, drops one shard;
    - renews the rest;
    - takes free shards (never held, released, or not renewed within their duration) up to the floor,
      and one more up to the ceiling only while no live replica holds fewer than it does.
    A dropped shard is not released but left to lapse: whatever write of ours may still be in flight,
    nobody can take it over before its lease duration is out. Shards are released (at once) only on
    exit, after the last pass.
    """

    def __init__(self, api_client: Any, namespace: str, name: str, identity: str, shards: int,
                 lease_seconds: int = 15, renew_seconds: float = 3.0, renew_deadline: float = 10.0,
                 on_change: Callable[[list[int]], None] | None = None) -> None:
        from kubernetes import client

        assert shards >= 1
        self.api = client.CoordinationV1Api(api_client)
        self.identity, self.count = identity, shards
        self.renew_seconds = renew_seconds
        self.lease_seconds = lease_seconds

        def lease(n: str) -> Lease:
            return Lease(self.api, namespace, n, identity, lease_seconds, renew_deadline)

        self.shards = [lease(f"{name}-shard-{i}") for i in range(shards)]
        self.members = [lease(f"{name}-member-{j}") for j in range(shards)]
        self.live_replicas = 0
        self.on_change = on_change
        self._slot_steps = 0  # steps since this replica got its member slot
        self._reported: list[int] | None = None
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, name="shards", daemon=True)

    def held(self) -> list[int]:
        return [i for i, s in enumerate(self.shards) if s.holds()]

    def holds(self, shard: int) -> bool:
        return 0 <= shard < self.count and self.shards[shard].holds()

    def owns(self, namespace: str) -> bool:
        return self.holds(shard_of(namespace, self.count))

    def start(self) -> None:
        self.thread.start()

    def stop(self, release: bool = True) -> None:
        self._stop.set()
        self.thread.join(timeout=10)
        if release:
            for s in self.shards + self.members:
                s.release()
        self._report()

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.step()
            except Exception as err:
                log.warning("shard leases: %s", err)
            self._report()
            self._stop.wait(self.renew_seconds)

    def _report(self) -> None:
        held = self.held()
        if held != self._reported:
            self._reported = held
            log.info("holding shards %s of %d", held, self.count,
                     extra={"shards": held, "shard_count": self.count, "identity": self.identity})
            if self.on_change is not None:
                self.on_change(held)

    def step(self) -> None:
        """One round: keep (or find) a member slot, count the live replicas, then drop, renew, take."""
        now = datetime.now(UTC)
        member_leases = [m.read() for m in self.members]
        slot = next((j for j, m in enumerate(self.members) if m.holds()), None)
        if slot is not None and not self.members[slot].try_acquire_or_renew(member_leases[slot], take=False):
            slot = None
        if slot is None:
            self._slot_steps = 0
            for j, m in enumerate(self.members):
                if live_holder(member_leases[j], now, self.lease_seconds) is None and \
                        m.try_acquire_or_renew(member_leases[j]):
                    slot = j
                    break
        live = {h for h in (live_holder(x, now, self.lease_seconds) for x in member_leases) if h is not None}
        if slot is None:  # a standby: no slot, no shard
            for s in self.shards:
                s.forget()
            self.live_replicas = len(live)
            return
        self._slot_steps += 1
        live.add(self.identity)
        self.live_replicas = len(live)
        shard_leases = [s.read() for s in self.shards]
        mine = [i for i in range(self.count) if self.shards[i].holds()]
        counts = dict.fromkeys(live, 0)
        free = draining = 0
        for x in shard_leases:
            h = live_holder(x, now, self.lease_seconds)
            if h is None:
                free += 1
            elif handing_over(x):
                draining += 1
            elif h != self.identity:
                counts[h] = counts.get(h, 0) + 1
        counts[self.identity] = len(mine)
        floor, ceil = fair_share(self.count, len(live))

        drop = max(0, len(mine) - ceil)
        needed = sum(max(0, floor - counts.get(r, 0)) for r in live)
        if not drop and len(mine) > floor and needed > free + draining:
            richest = min(live, key=lambda r: (-counts.get(r, 0), r))
            drop = 1 if richest == self.identity else 0
        for i in sorted(mine, reverse=True)[:drop]:
            log.info("handing shard %d over (fair share %d-%d of %d shards over %d replicas)", i, floor, ceil,
                     self.count, len(live))
            self.shards[i].hand_over(shard_leases[i])
            mine.remove(i)
        for i in mine:
            if not self.shards[i].try_acquire_or_renew(shard_leases[i], take=False):
                self.shards[i].forget()
        mine = [i for i in mine if self.shards[i].holds()]
        if self._slot_steps < 2:
            return  # one round of announcing ourselves before taking shards, so replicas that start
            # together see each other and do not all take everything first
        candidates = [i for i, x in enumerate(shard_leases) if i not in mine
                      and live_holder(x, now, self.lease_seconds) is None]
        offset = sum(self.identity.encode()) % self.count  # replicas try free shards in different orders
        candidates.sort(key=lambda i: (i - offset) % self.count)
        for i in candidates:
            counts[self.identity] = len(mine)
            least = min(counts.get(r, 0) for r in live)
            if len(mine) >= ceil or (len(mine) >= floor and len(mine) > least):
                break
            if self.shards[i].try_acquire_or_renew(shard_leases[i]):
                mine.append(i)
