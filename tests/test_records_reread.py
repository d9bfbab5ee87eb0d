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


def test_an_unchanged_record_keeps_the_text_it_was_first_read_with() -> None:
    """Each load reads every bucket again (the watch decodes a bucket anew whenever one of its records changes):
    what the store keeps between loads for an unchanged record is the text it first read, not the equal string
    just decoded, so a load keeps nothing new of the records that did not change."""
    records = {f"uid-{i}": ("team", CullerRecord(running_since=T0 - timedelta(minutes=i))) for i in range(20)}
    store = RecordStore(None, "culler")
    first_read = buckets(records)
    store.load(first_read)
    first_text = {uid: text for cm in first_read for uid, text in cm["data"].items()}  # type: ignore[attr-defined]
    records["uid-3"] = ("team", CullerRecord(stopped_at=T0))
    again = buckets(records)
    again_text = {uid: text for cm in again for uid, text in cm["data"].items()}  # type: ignore[attr-defined]
    store.load(again)
    kept = {uid: pair[0] for uid, pair in store._texts.items()}
    assert kept["uid-3"] is again_text["uid-3"] and kept["uid-3"] != first_text["uid-3"]
    unchanged = [uid for uid in records if uid != "uid-3"]
    assert all(kept[uid] is first_text[uid] and again_text[uid] is not first_text[uid] for uid in unchanged)
