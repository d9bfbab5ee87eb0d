"""No tenant can fill the culler's record store (kf_culler/kube/records.py): a namespace keeps only its share of
a bucket, the stored record holds no string of the user's choosing, and the old marks are imported once,
remembered across culler starts. Pure bounds first, then on the real API server."""

from __future__ import annotations

import json
import time
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from kubernetes import client
from support.passes import Passes

from kf_culler.config import load_mapping
from kf_culler.kube.records import (
    API_LIMIT,
    BUDGET,
    MARKER_BUCKET,
    MAX_RECORD_BYTES,
    PER_NAMESPACE,
    RecordStore,
    Stored,
    bucket_names,
    bucket_of,
    imported_key,
    record_text,
    room,
)
from kf_culler.local import objects as obj
from kf_culler.local.jupyter import JupyterServer
from kf_culler.local.router import Router
from kf_culler.model import STOP_ANNOTATION, STOPPED_AT_ANNOTATION, STOPPED_BY_ANNOTATION, STOPPED_BY_VALUE
from kf_culler.record import CullerRecord
from kf_culler.runner import build_runner

T0 = datetime(2026, 11, 29, 10, 40, tzinfo=UTC)
FULL = CullerRecord(T0, T0, T0, T0, T0)  # every time set: the largest record
FORGED = {STOPPED_BY_ANNOTATION: STOPPED_BY_VALUE, STOPPED_AT_ANNOTATION: "2026-11-01T10:00:00Z",
          STOP_ANNOTATION: "2026-11-01T10:00:00Z"}


def _uids_in(bucket: str, n: int) -> list[str]:
    out: list[str] = []
    while len(out) < n:
        uid = str(uuid.uuid4())
        if bucket_of(uid) == bucket:
            out.append(uid)
    return out


def _fill(contents: dict[str, Stored], rows: list[tuple[str, Stored]], deferred: bool, batch: int = 64) -> None:
    """Write the records as the store does, `batch` to a patch, with what `room` leaves out (of deferred writes,
    new records too; of a stop's, only records already stored)."""
    for at in range(0, len(rows), batch):
        new = dict(rows[at:at + batch])
        for gone in room(contents, new, protected=() if deferred else None):
            contents.pop(gone, None)
            new.pop(gone, None)
        contents.update(new)
        assert _size(contents) <= BUDGET or not deferred


def _stored(uid: str, ns: str, record: CullerRecord) -> Stored:
    return Stored(ns, record, len(uid) + len(record_text(record, ns)))


def _size(contents: dict[str, Stored]) -> int:
    return sum(s.size for s in contents.values())


def test_a_record_holds_no_name_and_its_largest_size_is_the_documented_bound() -> None:
    uid = str(uuid.uuid4())
    text = record_text(FULL, "n" * 63)  # a namespace is a DNS label: 63 characters at most
    assert set(json.loads(text)) == {"namespace", "stoppedAt", "restartedAt", "runningSince", "warnedAt",
                                     "stopNotTakenAt"}
    assert len(uid) + len(text) == MAX_RECORD_BYTES
    # the worst-case bucket: the budget, and one more record over it, stays under the API server's limit
    assert BUDGET + MAX_RECORD_BYTES < API_LIMIT


def test_one_namespace_alone_keeps_at_most_its_cap_in_a_bucket_with_the_real_bounds() -> None:
    """The reproducer's pattern at its real size: 3,216 records of one namespace in one bucket (there: 1 MiB and
    a 422 for everyone). Now the namespace keeps its newest PER_NAMESPACE, and another namespace still writes."""
    bucket = bucket_names()[3]
    contents: dict[str, Stored] = {}
    attacker = "a" * 63
    _fill(contents, [(u, _stored(u, attacker, CullerRecord(stopped_at=T0 + timedelta(seconds=i))))
                     for i, u in enumerate(_uids_in(bucket, 3216))], deferred=True)
    assert len(contents) == PER_NAMESPACE
    assert min(s.record.stopped_at for s in contents.values() if s.record.stopped_at) == T0 + timedelta(
        seconds=3216 - PER_NAMESPACE)  # the oldest went first
    (victim,) = _uids_in(bucket, 1)
    assert room(contents, {victim: _stored(victim, "team-b", FULL)}) == []


def test_many_full_namespaces_never_take_a_bucket_past_its_budget_and_a_newcomer_always_fits() -> None:
    """Six namespaces (a tenant contributing to several profiles) each at their cap of the largest records: the
    bucket stays within its budget, the namespaces holding the most lose their oldest, a newcomer's record is
    written and none of its own is removed."""
    bucket = bucket_names()[5]
    contents: dict[str, Stored] = {}
    big = [f"{k}" * 63 for k in range(6)]
    for ns in big:
        _fill(contents, [(u, _stored(u, ns, CullerRecord(T0 + timedelta(seconds=i), T0, T0, T0)))
                         for i, u in enumerate(_uids_in(bucket, PER_NAMESPACE))], deferred=False)
        assert _size(contents) <= BUDGET
    assert _size(contents) > BUDGET - MAX_RECORD_BYTES  # full
    held = {ns: sum(s.size for s in contents.values() if s.namespace == ns) for ns in big}
    assert max(held.values()) - min(held.values()) <= 2 * MAX_RECORD_BYTES  # shared evenly
    (victim,) = _uids_in(bucket, 1)
    new = _stored(victim, "b" * 63, FULL)
    gone = room(contents, {victim: new})
    assert gone and all(contents[u].namespace in big for u in gone) and victim not in gone
    for u in gone:
        del contents[u]
    assert _size(contents) + new.size <= BUDGET


def test_a_protected_write_is_never_left_out_and_a_deferred_one_keeps_to_its_share() -> None:
    bucket = bucket_names()[0]
    a, b, c = _uids_in(bucket, 3)
    contents = {c: _stored(c, "ns", CullerRecord(stopped_at=T0 - timedelta(days=1)))}
    values = {a: _stored(a, "ns", CullerRecord(stopped_at=T0 + timedelta(hours=1))),
              b: _stored(b, "ns", CullerRecord(stopped_at=T0))}
    assert room(contents, values, budget=10, per_namespace=1) == [c]  # a stop's record lands whatever the share
    assert room(contents, values, budget=10_000, per_namespace=1, protected=()) == [c, b]  # oldest first


def test_a_record_told_not_taken_lately_is_not_the_oldest() -> None:
    """A record's age is its latest time: the culler's report that a stop did not take (`stopNotTakenAt`) is as
    recent a record as a stop."""
    bucket = bucket_names()[2]
    told, other = _uids_in(bucket, 2)
    contents = {told: _stored(told, "ns", CullerRecord(stopped_at=T0 - timedelta(days=2), not_taken_at=T0)),
                other: _stored(other, "ns", CullerRecord(stopped_at=T0 - timedelta(days=1)))}
    assert contents[told].latest == T0
    assert room(contents, {}, per_namespace=1, protected=()) == [other]


def test_the_import_is_remembered_per_shard_under_any_later_shard_count() -> None:
    from kf_culler.kube.records import read_imported
    from kf_culler.sharding import shard_of

    store = RecordStore(None, "culler")
    store.load([{"metadata": {"name": MARKER_BUCKET}, "data": {imported_key(1, 4): "2026-11-29T10:40:00Z",
                                                             "x": "not a marker"}},
                {"metadata": {"name": bucket_names()[1]}, "data": {imported_key(0, 4): "forged elsewhere"}}])
    assert read_imported([{"metadata": {"name": MARKER_BUCKET}, "data": {"imported-x-of-4": "t"}}]) == set()
    names = [f"team-{i}" for i in range(40)]
    for ns in names:
        assert store.import_due(ns) == (shard_of(ns, 4) != 1), ns  # only bucket 00's markers count
    store.imported.add((0, 1))  # one replica, no shards, after the import
    assert not any(store.import_due(ns) for ns in names)


# On the real API server


def _culler(api: Any, namespaces: list[str], culler_ns: str, router: Router, **store: int) -> Passes:
    settings = load_mapping({"namespaces": {"include": namespaces}, "idleMinutes": 0.05, "warnMinutes": 0,
                             "startupGraceMinutes": 0.5, "urls": {"jupyter": router.template()}}, "test")
    return Passes(build_runner(settings, api, records_namespace=culler_ns,
                               records=RecordStore(api, culler_ns, **store) if store else None))


def _forged(name: str) -> dict[str, Any]:
    """A stopped Notebook with the culler's old marks forged and a name of 204 characters (no label repeats it:
    a label value is 63 at most)."""
    body = obj.notebook(name, annotations=FORGED)
    body["metadata"]["labels"] = {}
    return body


def _buckets(api: Any, culler_ns: str) -> dict[str, dict[str, str]]:
    out = {}
    for cm in client.CoreV1Api(api).list_namespaced_config_map(culler_ns).items:
        out[cm.metadata.name] = dict(cm.data or {})
    return out


def _stop_victim(runner: Passes, namespace: str, name: str) -> Any:
    deadline = time.monotonic() + 40  # the fresh server's own start is activity: 3 s idle to go
    while time.monotonic() < deadline:
        mine = [r for r in runner.once().results if (r.namespace, r.name) == (namespace, name)]
        if mine and mine[0].verdict.action == "stop":
            return mine[0]
        time.sleep(1)
    raise AssertionError("the victim's notebook was never due")


@pytest.mark.cluster
def test_forged_marks_fill_only_their_namespaces_share_and_are_imported_once(api: Any, namespace: str) -> None:
    """The reproducer's pattern, small: a tenant's stopped Notebooks with long names and forged `stopped-by:
    kf-culler` marks (no pods) before the culler's first start. With a bucket budget of 2 KiB and 3 records per
    namespace per bucket (the real bounds are the pure tests above), their import keeps to that share; another
    namespace's idle notebook is stopped with its record; a second culler start imports nothing more."""
    culler_ns, attacker = f"{namespace}-culler", f"{namespace}-evil"
    for ns in (culler_ns, attacker):
        obj.create_namespace(api, ns)
    long = "x" * 200
    for i in range(60):
        obj.create_notebook(api, attacker, _forged(f"{long}-{i:03d}"))
    budget, cap = 2048, 3
    with Router() as router, JupyterServer(namespace, "nb") as server:
        router.add("notebook", namespace, "nb", f"http://127.0.0.1:{server.port}", strip=False)
        obj.create_notebook(api, namespace, obj.notebook("nb"))
        obj.running_pod(api, namespace, "nb", datetime.now(UTC) - timedelta(hours=2))
        uid = obj.get_notebook(api, namespace, "nb")["metadata"]["uid"]
        time.sleep(1)
        with _culler(api, [namespace, attacker], culler_ns, router, budget=budget, per_namespace=cap) as first:
            result = _stop_victim(first, namespace, "nb")
        assert result.write is not None and result.write.outcome == "patched"
        buckets = _buckets(api, culler_ns)
        mine = json.loads(buckets[bucket_of(uid)][uid])
        assert mine["namespace"] == namespace and "stoppedAt" in mine and "name" not in mine
        assert imported_key(0, 1) in buckets[MARKER_BUCKET]
        evil = [json.loads(v) for b in buckets.values() for k, v in b.items() if not k.startswith("imported-")
                and json.loads(v)["namespace"] == attacker]
        for name, data in buckets.items():
            assert sum(len(k) + len(v) for k, v in data.items()) <= budget, name
            assert sum(1 for k, v in data.items() if not k.startswith("imported-")
                       and json.loads(v)["namespace"] == attacker) <= cap, name
        assert 0 < len(evil) <= cap * 16
        assert all(long not in json.dumps(e) for e in evil)  # the user's names are not stored

        # More forged notebooks later, and a new culler process: the import is done, nothing is imported.
        for i in range(60, 70):
            obj.create_notebook(api, attacker, _forged(f"{long}-{i:03d}"))
        late = {obj.get_notebook(api, attacker, f"{long}-{i:03d}")["metadata"]["uid"] for i in range(60, 70)}
        time.sleep(1)
        with _culler(api, [namespace, attacker], culler_ns, router, budget=budget, per_namespace=cap) as second:
            second.once()
            second.once()
    after = _buckets(api, culler_ns)
    assert not late & {k for data in after.values() for k in data}
    assert uid in after[bucket_of(uid)]


@pytest.mark.cluster
def test_a_bucket_filled_to_the_real_limit_by_other_namespaces_does_not_block_a_stop(api: Any,
                                                                                    namespace: str) -> None:
    """The victim's bucket is first filled, as the culler's own writes would fill it, with the largest records
    of six 63-character namespaces at their cap (1.5 MiB offered; before, the bucket passed 1 MiB and the API
    server answered 422 to every later write). The real bounds: the bucket stays within its budget, and the
    victim's idle notebook is stopped with its record."""
    culler_ns = f"{namespace}-culler"
    obj.create_namespace(api, culler_ns)
    with Router() as router, JupyterServer(namespace, "nb") as server:
        router.add("notebook", namespace, "nb", f"http://127.0.0.1:{server.port}", strip=False)
        obj.create_notebook(api, namespace, obj.notebook("nb"))
        obj.running_pod(api, namespace, "nb", datetime.now(UTC) - timedelta(hours=2))
        uid = obj.get_notebook(api, namespace, "nb")["metadata"]["uid"]
        bucket = bucket_of(uid)
        filler = RecordStore(api, culler_ns)
        for k in range(6):
            ns = f"{k}" * 63
            rows = [(u, ns, "", CullerRecord(T0 + timedelta(seconds=i), T0, T0, T0))
                    for i, u in enumerate(_uids_in(bucket, PER_NAMESPACE))]
            assert filler.put_many(rows), k
        data = _buckets(api, culler_ns)[bucket]
        assert BUDGET - MAX_RECORD_BYTES < sum(len(k) + len(v) for k, v in data.items()) <= BUDGET
        time.sleep(1)
        with _culler(api, [namespace], culler_ns, router) as runner:
            # the culler's view of the buckets is listed after the filler's last write
            assert runner.cache is not None and runner.cache.wait_synced(120)
            result = _stop_victim(runner, namespace, "nb")
    assert result.write is not None and result.write.outcome == "patched"
    data = _buckets(api, culler_ns)[bucket]
    assert json.loads(data[uid])["namespace"] == namespace and "stoppedAt" in json.loads(data[uid])
    assert sum(len(k) + len(v) for k, v in data.items()) <= BUDGET


def _configmaps(api: Any, culler_ns: str) -> list[dict[str, Any]]:
    """The buckets as the watch gives them (JSON dicts)."""
    return [{"metadata": {"name": cm.metadata.name}, "data": dict(cm.data or {})}
            for cm in client.CoreV1Api(api).list_namespaced_config_map(culler_ns).items]


@pytest.mark.cluster
def test_the_import_marker_counts_in_its_buckets_budget(api: Any, namespace: str) -> None:
    """The first bucket holds the import's markers as well as records. A bucket filled by records to just under
    its budget stays within it when the marker is written (the oldest record makes room), and a later record
    written there by another culler process, which reads the bucket as its watch has it, makes room for the
    marker too. Before, the marker was written without room and never counted: the bucket passed its budget
    by the marker's size (35 B)."""
    culler_ns = f"{namespace}-culler"
    obj.create_namespace(api, culler_ns)
    uids = _uids_in(MARKER_BUCKET, 9)
    rows = [(u, "team-a", "", CullerRecord(stopped_at=T0 + timedelta(seconds=i))) for i, u in enumerate(uids)]
    sizes = [_stored(u, ns, r).size for u, ns, _, r in rows]
    assert len(set(sizes)) == 1  # all the same size: what fits is plain arithmetic
    marker = len(imported_key(0, 1)) + len("2026-11-29T10:40:00Z")
    budget = sum(sizes[:8]) + marker - 1  # eight records fill it; the marker does not fit beside them
    store = RecordStore(api, culler_ns, budget=budget)
    assert store.put_many(rows[:8]) == set(uids[:8])
    assert store.mark_imported([0], 1, T0)
    data = _buckets(api, culler_ns)[MARKER_BUCKET]
    assert imported_key(0, 1) in data and uids[0] not in data  # the oldest record made room
    assert sum(len(k) + len(v) for k, v in data.items()) <= budget

    later = RecordStore(api, culler_ns, budget=budget)
    later.load(_configmaps(api, culler_ns))
    assert not later.import_due(namespace)
    assert later.put(uids[8], "team-a", "", rows[8][3])
    data = _buckets(api, culler_ns)[MARKER_BUCKET]
    assert uids[8] in data and imported_key(0, 1) in data
    assert sum(len(k) + len(v) for k, v in data.items()) <= budget
