"""The culler's record of each notebook (kf_culler/record.py), stored where profile users cannot write.

ConfigMaps `kf-culler-records-00` … `-15` in the culler's own namespace, labelled `RECORDS_SELECTOR`; a
notebook's record is the key `<uid>` of the bucket its uid hashes to, its value a small JSON object
(`record_json`: the namespace and the times, never the notebook's name, a string of the user's choosing).
Writes are JSON merge patches of single keys, so two replicas writing other notebooks' keys of one bucket
never conflict, and no resourceVersion is needed: only the culler writes them.

Read through a watch (kf_culler/kube/cache.py), so a pass reads no record from the API server. Bounded: one
key of at most `MAX_RECORD_BYTES` per notebook the culler has seen running, warned or stopped, removed when
the notebook is gone (`sweep`). No namespace can fill a bucket for the others: each patch makes room first
(`room`): a namespace keeps at most `per_namespace` records in a bucket (its oldest go first), and a bucket
over `budget` bytes (below the API server's 1 MiB for a ConfigMap) loses the oldest records of the namespace
that holds the most of it. The record being written is never what makes room for itself.

The one-time import of the old marks (kf_culler/record.py `imported`) is remembered as done by the key
`imported-<shard>-of-<shards>` of the first bucket, per shard of namespaces (kf_culler/sharding.py), so a
restart, a new leader or a new shard holder never runs it again. Those markers, and any value that is not a
record (an admin's edit), count in their bucket's budget like the records, and are never left out.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any

from kf_culler.kube import core
from kf_culler.kube.backoff import with_backoff
from kf_culler.kube.labels import CREATED
from kf_culler.record import CullerRecord, parse_record, record_json
from kf_culler.sharding import shard_of
from kf_culler.timeutil import format_time

log = logging.getLogger(__name__)
BUCKETS = 16
NAME_PREFIX = "kf-culler-records-"
COMPONENT = "culler-records"
RECORDS_LABELS = {**CREATED, "app.kubernetes.io/component": COMPONENT}
# Found by name and component: buckets made before they carried the managed-by label are still the record.
RECORDS_SELECTOR = ",".join(f"{k}={RECORDS_LABELS[k]}"
                            for k in ("app.kubernetes.io/name", "app.kubernetes.io/component"))
REQUEST_TIMEOUT = (5.0, 30.0)
# The API server refuses a ConfigMap whose data (keys and values) exceeds 1 MiB (HTTP 422). A bucket is kept
# below BUDGET, which leaves room for what other replicas write meanwhile; a 422 all the same re-reads the
# bucket and makes room again.
API_LIMIT = 1024 * 1024
BUDGET = 896 * 1024
# At most this many records of one namespace in one bucket (16 buckets: 16,384 notebooks of one namespace).
PER_NAMESPACE = 1024
# The largest record: a uid key (36) and {"namespace": 63 characters, the five times to the second}.
MAX_RECORD_BYTES = 299
IMPORTED_PREFIX = "imported-"  # `imported-<shard>-of-<shards>` in the first bucket: the import is done


def bucket_of(uid: str) -> str:
    """The ConfigMap that holds a uid's record."""
    n = int(hashlib.sha256(uid.encode()).hexdigest()[:8], 16) % BUCKETS
    return f"{NAME_PREFIX}{n:02d}"


def bucket_names() -> list[str]:
    return [f"{NAME_PREFIX}{n:02d}" for n in range(BUCKETS)]


MARKER_BUCKET = bucket_names()[0]


def imported_key(shard: int, shards: int) -> str:
    return f"{IMPORTED_PREFIX}{shard}-of-{shards}"


def _latest(record: CullerRecord) -> datetime | None:
    times = [t for t in (record.stopped_at, record.restarted_at, record.running_since, record.warned_at,
                         record.not_taken_at) if t is not None]
    return max(times) if times else None


def record_text(record: CullerRecord, namespace: str) -> str:
    return json.dumps(record_json(record, namespace), separators=(",", ":"))


Row = tuple["Stored | None", "str | None"]  # a record to write and its stored text (None, None: removed)


def _row(uid: str, namespace: str, record: CullerRecord | None) -> Row:
    if record is None:
        return None, None
    text = record_text(record, namespace)
    return Stored(namespace, record, len(uid.encode()) + len(text.encode())), text


class Stored:
    """One record as stored: the notebook's namespace, the record, its size in the bucket (key and value)."""

    __slots__ = ("latest", "namespace", "record", "size")

    def __init__(self, namespace: str, record: CullerRecord, size: int) -> None:
        self.namespace, self.record, self.size = namespace, record, size
        self.latest = _latest(record)


def read_buckets(configmaps: Iterable[dict[str, Any]],
                 known: Mapping[str, tuple[str, Stored]] | None = None) -> dict[str, Stored]:
    """uid -> record from the buckets' ConfigMaps; a value that is not a record is skipped and logged (the
    import markers are not records). A `name` stored by an older version is read and dropped. A value as it was
    in `known` (uid -> (its text, its record): the last read's, `texts`) is not decoded again."""
    out: dict[str, Stored] = {}
    known = known or {}
    for cm in configmaps:
        data = cm.get("data")
        for uid, text in (data.items() if isinstance(data, dict) else ()):
            if str(uid).startswith(IMPORTED_PREFIX):
                continue
            seen = known.get(uid)
            if seen is not None and seen[0] == text:
                out[uid] = seen[1]
                continue
            try:
                raw = json.loads(text)
                ns = raw.pop("namespace")
                raw.pop("name", None)
                record = parse_record(raw, f"record {uid}")
            except Exception as err:  # not ours to crash on: an admin may have edited the ConfigMap
                log.warning("culler record %s is unreadable and is ignored: %s", uid, str(err)[:200])
                continue
            if record is not None and isinstance(ns, str):
                out[uid] = Stored(ns, record, len(str(uid).encode()) + len(str(text).encode()))
    return out


def texts(configmaps: Iterable[dict[str, Any]], records: Mapping[str, Stored],
          known: Mapping[str, tuple[str, Stored]] | None = None) -> dict[str, tuple[str, Stored]]:
    """uid -> (its text, its record) of the `records` read from these ConfigMaps (`read_buckets`' `known`). A
    record as it was in `known` keeps the pair it had there, and so the text it was first read with: the text
    just read, an equal string, goes with the ConfigMaps it was read from (each load reads them all again, and
    held, ten thousand new strings a pass would outlive the pass among its short-lived objects)."""
    out: dict[str, tuple[str, Stored]] = {}
    known = known or {}
    for cm in configmaps:
        data = cm.get("data")
        for uid, text in (data.items() if isinstance(data, dict) else ()):
            if uid in records:
                seen = known.get(uid)
                if seen is None or seen[1] is not records[uid] or seen[0] != text:
                    seen = (text, records[uid])
                out[uid] = seen
    return out


def read_others(configmaps: Iterable[dict[str, Any]], records: Collection[str]) -> dict[str, dict[str, int]]:
    """bucket -> key -> size (key and value) of the keys that are not `records` (`read_buckets`' uids): the import
    markers, unreadable values. They take room in their bucket, and `room` cannot leave them out."""
    out: dict[str, dict[str, int]] = {}
    for cm in configmaps:
        name, data = (cm.get("metadata") or {}).get("name"), cm.get("data")
        for key, text in (data.items() if isinstance(data, dict) else ()):
            if key not in records:
                out.setdefault(str(name), {})[str(key)] = len(str(key).encode()) + len(str(text).encode())
    return out


def read_imported(configmaps: Iterable[dict[str, Any]]) -> set[tuple[int, int]]:
    """The (shard, shards) whose import of the old marks is done, from the first bucket's markers."""
    done: set[tuple[int, int]] = set()
    for cm in configmaps:
        if (cm.get("metadata") or {}).get("name") not in (MARKER_BUCKET, None):
            continue
        data = cm.get("data")
        for key in (data if isinstance(data, dict) else {}):
            shard, _, shards = str(key).removeprefix(IMPORTED_PREFIX).partition("-of-")
            if str(key).startswith(IMPORTED_PREFIX) and shard.isdigit() and shards.isdigit():
                done.add((int(shard), int(shards)))
    return done


def room(contents: Mapping[str, Stored], values: Mapping[str, Stored | None], budget: int = BUDGET,
         per_namespace: int = PER_NAMESPACE, protected: Collection[str] | None = None) -> list[str]:
    """The uids to leave out of a bucket so that writing `values` (uid -> its new record, None: removed) over
    its `contents` leaves every namespace within `per_namespace` records and the bucket within `budget` bytes.
    The oldest records of a namespace over its cap go first; then, while the bucket is over its budget, the
    oldest of the namespace holding the most bytes. `protected` (None: all of `values`) are never left out:
    a stop's record, stored before its patch, never makes room for itself (a single patch of protected records
    larger than the budget is left to the API server). Pure."""
    keep = set(values) if protected is None else set(protected)
    rows: dict[str, Stored] = {uid: s for uid, s in contents.items() if uid not in values}
    rows.update({uid: s for uid, s in values.items() if s is not None})
    by_ns: dict[str, list[tuple[str, Stored]]] = {}
    for uid, stored in rows.items():
        by_ns.setdefault(stored.namespace, []).append((uid, stored))
    never = datetime.min.replace(tzinfo=UTC)
    oldest_last = {ns: sorted((r for r in found if r[0] not in keep),
                              key=lambda r: (r[1].latest or never, r[0]), reverse=True)
                   for ns, found in by_ns.items()}  # popped from the end: the oldest first
    count = {ns: len(found) for ns, found in by_ns.items()}
    held = {ns: sum(r[1].size for r in found) for ns, found in by_ns.items()}
    total = sum(held.values())
    evicted: list[str] = []

    def evict(ns: str) -> None:
        nonlocal total
        uid, stored = oldest_last[ns].pop()
        evicted.append(uid)
        count[ns] -= 1
        held[ns] -= stored.size
        total -= stored.size

    for ns in sorted(count):
        while count[ns] > per_namespace and oldest_last[ns]:
            evict(ns)
    while total > budget:
        candidates = [ns for ns in held if oldest_last[ns]]
        if not candidates:
            break
        evict(max(candidates, key=lambda ns: (held[ns], ns)))
    return evicted


class RecordStore:
    """Reads records from the cache's watch of the buckets; writes single keys with merge patches, each patch
    making room in its bucket first (`room`). `budget` and `per_namespace` bound each bucket (tests set them
    small)."""

    def __init__(self, api_client: Any, namespace: str, budget: int = BUDGET,
                 per_namespace: int = PER_NAMESPACE) -> None:
        self.api_client = api_client
        self.namespace = namespace
        self.budget, self.per_namespace = budget, per_namespace
        self.records: dict[str, Stored] = {}
        self._texts: dict[str, tuple[str, Stored]] = {}  # each record's stored text, as the last load read it
        self._buckets: dict[str, dict[str, Stored]] = {}  # the same records by bucket
        self._pending: dict[str, dict[str, Row]] = {}  # bucket -> uid -> what to write
        self._written: dict[str, Stored | None] = {}  # what this process wrote since the last load
        self._others: dict[str, dict[str, int]] = {}  # bucket -> key -> size of what is not a record (`read_others`)
        self._markers: dict[str, int] = {}  # the import markers this process wrote (never removed) -> their size
        self.imported: set[tuple[int, int]] = set()  # (shard, shards) whose old marks were imported
        self.writes = 0
        self.failures = 0
        self.evicted = 0
        self._count = threading.Lock()  # the counters, from the writers' threads
        self._lock = threading.RLock()  # the records, from the writers' threads

    def load(self, configmaps: Iterable[dict[str, Any]]) -> None:
        """The records as the watch has them now, overlaid with what this process wrote since the last load
        and what it has yet to write (the watch may not have delivered those yet)."""
        configmaps = list(configmaps)
        fresh = read_buckets(configmaps, self._texts)  # a record unchanged since the last load is not decoded
        self._texts = texts(configmaps, fresh, self._texts)
        others = read_others(configmaps, fresh)
        with self._lock:
            self.imported |= read_imported(configmaps)
            others.setdefault(MARKER_BUCKET, {}).update(self._markers)
            self._others = others
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
            self._buckets = {}
            for uid, stored in fresh.items():
                self._buckets.setdefault(bucket_of(uid), {})[uid] = stored

    def get(self, uid: str | None) -> CullerRecord | None:
        found = self.records.get(uid) if uid else None
        return found.record if found is not None else None

    def import_due(self, namespace: str) -> bool:
        """Whether the old marks of this namespace's Notebooks are still to be imported: no shard it falls in,
        under any shard count the culler ran with, is marked done."""
        return not any(shard_of(namespace, n) == i for i, n in self.imported)

    def mark_imported(self, shards: Iterable[int], count: int, now: datetime) -> bool:
        """Remember that the old marks of these shards' namespaces are imported (after their records are
        stored): never again, whoever holds them next."""
        keys = {imported_key(i, count): format_time(now) for i in shards if (i, count) not in self.imported}
        if not keys:
            return True
        if self._patch(MARKER_BUCKET, {}, protect=True, others=keys) is None:
            return False
        self.imported |= {(i, count) for i in shards}
        return True

    def put(self, uid: str, namespace: str, name: str, record: CullerRecord | None) -> bool:
        """Store (or, with None, remove) one record now; False when the API server refused or failed. `name`
        is the notebook's: it is not stored."""
        del name
        row = _row(uid, namespace, record)
        ok = self._patch(bucket_of(uid), {uid: row}, protect=True) is not None
        if ok:
            self._remember(uid, row[0])
        return ok

    def put_many(self, changes: Sequence[tuple[str, str, str, CullerRecord | None]]) -> set[str]:
        """Store (uid, namespace, name, record) changes now, one merge patch per bucket (the buckets at once);
        the uids whose bucket's patch succeeded. A storm's thousands of stop records are 16 patches, not one
        each. Names are not stored."""
        by_bucket: dict[str, dict[str, Row]] = {}
        for uid, namespace, _name, record in changes:
            by_bucket.setdefault(bucket_of(uid), {})[uid] = _row(uid, namespace, record)
        if not by_bucket:
            return set()
        with ThreadPoolExecutor(max_workers=len(by_bucket), thread_name_prefix="records") as pool:
            landed = dict(zip(by_bucket, pool.map(lambda b: self._patch(b, by_bucket[b], protect=True) is not None,
                                                  by_bucket), strict=True))
        stored: set[str] = set()
        for bucket, rows in by_bucket.items():
            if landed[bucket]:
                for uid, row in rows.items():
                    self._remember(uid, row[0])
                    stored.add(uid)
        return stored

    def defer(self, uid: str, namespace: str, name: str, record: CullerRecord | None) -> None:
        """Store (or remove) one record with the next `flush` (one patch per bucket). The name is not stored."""
        del name
        row = _row(uid, namespace, record)
        with self._lock:
            self._pending.setdefault(bucket_of(uid), {})[uid] = row
        self._remember(uid, row[0])

    def _remember(self, uid: str, stored: Stored | None) -> None:
        with self._lock:
            self._set(uid, stored)
            self._written[uid] = stored

    def _set(self, uid: str, stored: Stored | None) -> None:
        bucket = self._buckets.setdefault(bucket_of(uid), {})
        if stored is None:
            self.records.pop(uid, None)
            bucket.pop(uid, None)
        else:
            self.records[uid] = bucket[uid] = stored

    @property
    def pending(self) -> int:
        return sum(len(v) for v in self._pending.values())

    def flush(self) -> int:
        """Write every deferred change, one merge patch per bucket; what fails stays for the next flush. A
        deferred record may itself be left out to keep its namespace within its share."""
        done = 0
        for bucket in sorted(self._pending):
            values = self._pending[bucket]
            if self._patch(bucket, values, protect=False) is not None:
                done += len(values)
                del self._pending[bucket]
        return done

    def sweep(self, live_uids: set[str], owns_namespace: Callable[[str], bool]) -> int:
        """Defer the removal of records whose notebook is gone (not among `live_uids`, a synced cache's
        notebooks), for the namespaces this replica watches and writes (`owns_namespace`)."""
        gone = [(uid, s) for uid, s in self.records.items() if uid not in live_uids and owns_namespace(s.namespace)]
        for uid, s in gone:
            self.defer(uid, s.namespace, "", None)
        return len(gone)

    def _patch(self, bucket: str, values: Mapping[str, Row], protect: bool,
               others: Mapping[str, str] | None = None) -> list[str] | None:
        """Write these keys of one bucket, and `others` (keys that are not records: the import markers), with the
        removals that make room for them (`room`, in the budget less what is not a record; with `protect`, none
        of `values` is left out); the uids removed, or None when the write failed. After a 422 (the bucket is
        fuller than this replica's view: another replica wrote meanwhile), once more from the bucket as the API
        server has it."""
        from kubernetes.client.rest import ApiException

        new = {uid: row[0] for uid, row in values.items()}
        extra = {key: len(key.encode()) + len(text.encode()) for key, text in (others or {}).items()}
        for attempt in range(2):
            with self._lock:
                contents = self._buckets.get(bucket, {})
                fixed = sum({**self._others.get(bucket, {}), **extra}.values())
                evict = room(contents, new, self.budget - fixed, self.per_namespace, None if protect else ())
                whose = sorted({(contents.get(uid) or new[uid] or Stored("", CullerRecord(), 0)).namespace
                                for uid in evict})
            body: dict[str, str | None] = {**dict.fromkeys(evict), **(others or {}),
                                           **{uid: row[1] for uid, row in values.items() if uid not in evict}}
            try:
                landed = self._send(bucket, body, raise_invalid=attempt == 0)
            except ApiException:  # 422: read the bucket, make room again
                if not self._refresh(bucket):
                    return None
                continue
            if not landed:
                return None
            if extra:
                with self._lock:
                    self._others.setdefault(bucket, {}).update(extra)
                    if bucket == MARKER_BUCKET:
                        self._markers.update(extra)
            if evict:
                with self._lock:
                    for uid in evict:
                        self._set(uid, None)
                        self._written[uid] = None
                with self._count:
                    self.evicted += len(evict)
                log.warning("records of %s/%s over their share: left out the %d oldest of namespace %s",
                            self.namespace, bucket, len(evict), ", ".join(whose)[:300])
            return evict
        return None

    def _refresh(self, bucket: str) -> bool:
        """Read one bucket from the API server into this view (after a 422)."""
        try:
            cm = with_backoff(lambda: core.read_config_map(self.api_client, self.namespace, bucket,
                                                           timeout=REQUEST_TIMEOUT))
        except Exception as err:
            return self._failed(bucket, f"{type(err).__name__}: {str(err)[:200]}")
        data = cm.get("data") or {}
        fresh = read_buckets([{"data": data}])
        others = read_others([{"metadata": {"name": bucket}, "data": data}], fresh).get(bucket, {})
        with self._lock:
            self._others[bucket] = {**others, **(self._markers if bucket == MARKER_BUCKET else {})}
            for uid in list(self._buckets.get(bucket, {})):
                if uid not in fresh:
                    self._set(uid, None)
            for uid, stored in fresh.items():
                self._set(uid, stored)
        return True

    def _send(self, bucket: str, values: dict[str, str | None], raise_invalid: bool = False) -> bool:
        from kubernetes.client.rest import ApiException

        body = {"data": values}
        for _ in range(3):
            try:
                with_backoff(lambda: core.patch_config_map(self.api_client, self.namespace, bucket, body,
                                                           core.MERGE_PATCH, timeout=REQUEST_TIMEOUT))
                with self._count:
                    self.writes += 1
                return True
            except ApiException as err:
                if err.status == 422 and raise_invalid:
                    raise
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
            with_backoff(lambda: core.create_config_map(self.api_client, self.namespace, body,
                                                        timeout=REQUEST_TIMEOUT))
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
