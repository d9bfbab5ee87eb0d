"""The culler's record of each notebook (kf_culler/record.py), stored where profile users cannot write.

ConfigMaps `kf-culler-records-00` … `-15` in the culler's own namespace, labelled `RECORDS_SELECTOR`; a
notebook's record is the key `<uid>` of the bucket its uid hashes to, its value a small JSON object
(`record_json`). Writes are JSON merge patches of single keys, so two replicas writing other notebooks'
keys of one bucket never conflict, and no resourceVersion is needed: only the culler writes them.

Read through a watch (kf_culler/kube/cache.py), so a pass reads no record from the API server. Bounded: one
key of at most a few hundred bytes per notebook the culler has seen running or stopped, removed when the
notebook is gone (`sweep`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from kf_culler.kube.backoff import with_backoff
from kf_culler.kube.labels import CREATED
from kf_culler.record import CullerRecord, parse_record, record_json

log = logging.getLogger(__name__)
BUCKETS = 16
NAME_PREFIX = "kf-culler-records-"
COMPONENT = "culler-records"
RECORDS_LABELS = {**CREATED, "app.kubernetes.io/component": COMPONENT}
# Found by name and component: buckets made before they carried the managed-by label are still the record.
RECORDS_SELECTOR = ",".join(f"{k}={RECORDS_LABELS[k]}"
                            for k in ("app.kubernetes.io/name", "app.kubernetes.io/component"))
REQUEST_TIMEOUT = (5.0, 30.0)


def bucket_of(uid: str) -> str:
    """The ConfigMap that holds a uid's record."""
    n = int(hashlib.sha256(uid.encode()).hexdigest()[:8], 16) % BUCKETS
    return f"{NAME_PREFIX}{n:02d}"


def bucket_names() -> list[str]:
    return [f"{NAME_PREFIX}{n:02d}" for n in range(BUCKETS)]


class Stored:
    """One record as stored, with the notebook it is about."""

    __slots__ = ("name", "namespace", "record")

    def __init__(self, namespace: str, name: str, record: CullerRecord) -> None:
        self.namespace, self.name, self.record = namespace, name, record


def read_buckets(configmaps: Iterable[dict[str, Any]]) -> dict[str, Stored]:
    """uid -> record from the buckets' ConfigMaps; a value that is not a record is skipped and logged."""
    out: dict[str, Stored] = {}
    for cm in configmaps:
        data = cm.get("data")
        for uid, text in (data.items() if isinstance(data, dict) else ()):
            try:
                raw = json.loads(text)
                ns, name = raw.pop("namespace"), raw.pop("name")
                record = parse_record(raw, f"record {uid}")
            except Exception as err:  # not ours to crash on: an admin may have edited the ConfigMap
                log.warning("culler record %s is unreadable and is ignored: %s", uid, str(err)[:200])
                continue
            if record is not None and isinstance(ns, str) and isinstance(name, str):
                out[uid] = Stored(ns, name, record)
    return out


def _discard(resp: Any) -> None:
    """Read an answer to its end and give its connection back, without decoding it: a bucket's answer is the whole
    ConfigMap (hundreds of records), decoded into a V1ConfigMap for nothing at every patch of a storm."""
    resp.drain_conn()
    resp.release_conn()


class RecordStore:
    """Reads records from the cache's watch of the buckets; writes single keys with merge patches."""

    def __init__(self, api_client: Any, namespace: str) -> None:
        from kubernetes import client

        self.core = client.CoreV1Api(api_client)
        self.namespace = namespace
        self.records: dict[str, Stored] = {}
        self._pending: dict[str, dict[str, str | None]] = {}  # bucket -> key -> value (None: remove)
        self._written: dict[str, Stored | None] = {}  # what this process wrote since the last load
        self.writes = 0
        self.failures = 0
        self._count = threading.Lock()  # the counters, from the writers' threads

    def load(self, configmaps: Iterable[dict[str, Any]]) -> None:
        """The records as the watch has them now, overlaid with what this process wrote since the last load
        and what it has yet to write (the watch may not have delivered those yet)."""
        fresh = read_buckets(configmaps)
        overlay = dict(self._written)
        self._written = {}
        for values in self._pending.values():
            for uid in values:
                overlay[uid] = self.records.get(uid) if uid not in overlay else overlay[uid]
        for uid, stored in overlay.items():
            if stored is None:
                fresh.pop(uid, None)
            else:
                fresh[uid] = stored
        self.records = fresh

    def get(self, uid: str | None) -> CullerRecord | None:
        found = self.records.get(uid) if uid else None
        return found.record if found is not None else None

    def put(self, uid: str, namespace: str, name: str, record: CullerRecord | None) -> bool:
        """Store (or, with None, remove) one record now; False when the API server refused or failed."""
        value = None if record is None else json.dumps(record_json(record, namespace, name), separators=(",", ":"))
        ok = self._patch(bucket_of(uid), {uid: value})
        if ok:
            self._remember(uid, namespace, name, record)
        return ok

    def put_many(self, changes: Sequence[tuple[str, str, str, CullerRecord | None]]) -> set[str]:
        """Store (uid, namespace, name, record) changes now, one merge patch per bucket (the buckets at once);
        the uids whose bucket's patch succeeded. A storm's thousands of stop records are 16 patches, not one
        each."""
        by_bucket: dict[str, dict[str, str | None]] = {}
        for uid, namespace, name, record in changes:
            value = None if record is None else json.dumps(record_json(record, namespace, name),
                                                           separators=(",", ":"))
            by_bucket.setdefault(bucket_of(uid), {})[uid] = value
        if not by_bucket:
            return set()
        with ThreadPoolExecutor(max_workers=len(by_bucket), thread_name_prefix="records") as pool:
            landed = dict(zip(by_bucket, pool.map(lambda b: self._patch(b, by_bucket[b]), by_bucket), strict=True))
        stored: set[str] = set()
        for uid, namespace, name, record in changes:
            if landed[bucket_of(uid)]:
                self._remember(uid, namespace, name, record)
                stored.add(uid)
        return stored

    def defer(self, uid: str, namespace: str, name: str, record: CullerRecord | None) -> None:
        """Store (or remove) one record with the next `flush` (one patch per bucket)."""
        value = None if record is None else json.dumps(record_json(record, namespace, name), separators=(",", ":"))
        self._pending.setdefault(bucket_of(uid), {})[uid] = value
        self._remember(uid, namespace, name, record)

    def _remember(self, uid: str, namespace: str, name: str, record: CullerRecord | None) -> None:
        stored = None if record is None else Stored(namespace, name, record)
        if stored is None:
            self.records.pop(uid, None)
        else:
            self.records[uid] = stored
        self._written[uid] = stored

    def flush(self) -> int:
        """Write every deferred change, one merge patch per bucket; what fails stays for the next flush."""
        done = 0
        for bucket in sorted(self._pending):
            values = self._pending[bucket]
            if self._patch(bucket, values):
                done += len(values)
                del self._pending[bucket]
        return done

    def sweep(self, live_uids: set[str], owns_namespace: Callable[[str], bool]) -> int:
        """Defer the removal of records whose notebook is gone (not among `live_uids`, a synced cache's
        notebooks), for the namespaces this replica watches and writes (`owns_namespace`)."""
        gone = [(uid, s) for uid, s in self.records.items() if uid not in live_uids and owns_namespace(s.namespace)]
        for uid, s in gone:
            self.defer(uid, s.namespace, s.name, None)
        return len(gone)

    def _patch(self, bucket: str, values: dict[str, str | None]) -> bool:
        from kubernetes.client.rest import ApiException

        body = {"data": values}
        for _ in range(3):
            try:
                with_backoff(lambda: _discard(self.core.patch_namespaced_config_map(
                    bucket, self.namespace, body, _content_type="application/merge-patch+json",
                    _request_timeout=REQUEST_TIMEOUT, _preload_content=False)))
                with self._count:
                    self.writes += 1
                return True
            except ApiException as err:
                if err.status != 404:
                    return self._failed(bucket, f"HTTP {err.status}: {err.reason}")
            except Exception as err:
                return self._failed(bucket, f"{type(err).__name__}: {err}")
            if not self._create(bucket):  # the bucket does not exist yet: create it, then patch again
                return False
        return self._failed(bucket, "the ConfigMap could not be created")

    def _create(self, bucket: str) -> bool:
        from kubernetes.client.rest import ApiException

        body = {"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": bucket, "namespace": self.namespace, "labels": dict(RECORDS_LABELS),
                             "annotations": {"notebook-culler.io/about": "kf-culler's own record of notebooks "
                                             "(docs/architecture.md); written by the culler only"}},
                "data": {}}
        try:
            with_backoff(lambda: self.core.create_namespaced_config_map(self.namespace, body,
                                                                        _request_timeout=REQUEST_TIMEOUT))
            return True
        except ApiException as err:
            if err.status == 409:  # created meanwhile (another replica)
                return True
            return self._failed(bucket, f"HTTP {err.status}: {err.reason}")
        except Exception as err:
            return self._failed(bucket, f"{type(err).__name__}: {err}")

    def _failed(self, bucket: str, why: str) -> bool:
        with self._count:
            self.failures += 1
        log.warning("storing the culler's record in %s/%s failed: %s", self.namespace, bucket, why[:300])
        return False
