"""A pass reads the culler's record from the watch of its ConfigMaps (kf_culler/kube/records.py `load`): a record
whose stored text did not change since the last pass is not decoded again, and one that changed, appeared or
went is read as it is now."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from kf_culler.kube.records import RecordStore, bucket_of, record_text
from kf_culler.record import CullerRecord

T0 = datetime(2026, 12, 1, tzinfo=UTC)


def buckets(records: dict[str, tuple[str, CullerRecord]]) -> list[dict[str, object]]:
    data: dict[str, dict[str, str]] = {}
    for uid, (namespace, record) in records.items():
        data.setdefault(bucket_of(uid), {})[uid] = record_text(record, namespace)
    return [{"metadata": {"name": name}, "data": values} for name, values in data.items()]


def test_an_unchanged_record_is_not_decoded_again_and_a_changed_one_is() -> None:
    records = {f"uid-{i}": ("team", CullerRecord(running_since=T0 - timedelta(minutes=i))) for i in range(20)}
    store = RecordStore(None, "culler")
    store.load(buckets(records))
    first = dict(store.records)
    records["uid-3"] = ("team", CullerRecord(stopped_at=T0))
    del records["uid-4"]
    records["uid-new"] = ("other", CullerRecord(warned_at=T0))
    store.load(buckets(records))
    assert store.get("uid-3") == CullerRecord(stopped_at=T0)
    assert store.get("uid-4") is None and store.get("uid-new") == CullerRecord(warned_at=T0)
    assert store.records["uid-new"].namespace == "other"
    assert all(store.records[uid] is first[uid] for uid in records if uid not in ("uid-3", "uid-new"))
    assert store.records["uid-3"] is not first["uid-3"]
