"""`kf-culler run --record DIR/`: segments rotated by time and size, bounded on disk, restart-safe, replayed as
one trace. The records are a synthetic fleet's (kf_culler/replay/fleet.py), written through the recorder the
culler uses."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest

from kf_culler.replay.contenders import make_contenders
from kf_culler.replay.fleet import FleetSpec, iter_fleet
from kf_culler.replay.recorder import TraceRecorder
from kf_culler.replay.segments import SegmentedRecorder
from kf_culler.replay.simulate import replay
from kf_culler.replay.trace import read_header, read_trace, segment_paths

SPEC = FleetSpec(notebooks=6, days=0.5, seed=3, check_minutes=10)


def record(recorder: TraceRecorder, minutes: tuple[int, int] = (0, 10**9)) -> int:
    n = 0
    for now, nb, pod, obs, _truth in iter_fleet(SPEC):
        minute = (now - SPEC.start).total_seconds() / 60
        if minutes[0] <= minute < minutes[1]:
            recorder.record(now, nb, pod, obs)
            n += 1
    return n


def test_segments_rotate_and_replay_as_one_trace(tmp_path: Path) -> None:
    single = tmp_path / "one.jsonl.gz"
    with TraceRecorder(single, check_period_seconds=600) as rec:
        total = record(rec)
    seg_dir = tmp_path / "dir"
    with SegmentedRecorder(seg_dir, check_period_seconds=600, segment_seconds=3 * 3600) as rec:
        assert record(rec) == total
    segments = segment_paths(seg_dir)
    assert len(segments) == 4  # 12 hours, a segment every 3
    starts = [read_header(p).start for p in segments]
    assert starts == [SPEC.start + timedelta(hours=3 * k) for k in range(4)]
    _, a = read_trace(single)
    _, b = read_trace(seg_dir)
    a_list, b_list = list(a), list(b)
    assert [(r.time, r.id, r.notebook, r.pod) for r in b_list] == [(r.time, r.id, r.notebook, r.pod) for r in a_list]
    # a segment's records carry only the GPU samples it does not hold yet (the first of each notebook, all)
    for ra, rb in zip(a_list, b_list, strict=True):
        sa, sb = (r.observations.get("gpu", {}).get("samples", []) for r in (ra, rb))
        assert {s["time"] for s in sb} <= {s["time"] for s in sa} and (not sa or sb)
    assert sum(len(r.observations.get("gpu", {}).get("samples", [])) for r in b_list) < sum(
        len(r.observations.get("gpu", {}).get("samples", [])) for r in a_list) / 2
    # and nothing a replay needs is lost: the replay of the directory is the replay of the single file
    one = replay(single, make_contenders(None, []))
    many = replay(seg_dir, make_contenders(None, []))
    assert one.total(0) == many.total(0) and one.records == many.records == total


def test_the_directory_is_bounded_on_disk(tmp_path: Path) -> None:
    with SegmentedRecorder(tmp_path / "all", check_period_seconds=600, segment_seconds=3600) as rec:
        record(rec)
    unbounded = sum(p.stat().st_size for p in segment_paths(tmp_path / "all"))
    bound = unbounded // 3
    with SegmentedRecorder(tmp_path, check_period_seconds=600, segment_seconds=3600,
                           max_total_bytes=bound) as rec:
        record(rec)
    segments = segment_paths(tmp_path)
    assert 1 < len(segments) < 12
    sizes = [p.stat().st_size for p in segments]
    # the oldest were deleted: what is left fits the bound, but for the segment being written when it was checked
    assert sum(sizes[:-1]) <= bound
    assert read_header(tmp_path).start > SPEC.start
    _, records = read_trace(tmp_path)
    assert len(list(records)) > 0


def test_a_restart_after_a_kill_begins_a_new_segment(tmp_path: Path) -> None:
    first = SegmentedRecorder(tmp_path, check_period_seconds=600, flush_every=7)
    written = record(first, (0, 240))
    first.flush()
    killed = first.segment
    assert killed is not None
    # the culler is killed: its segment's gzip stream has no end, and the last line may be cut
    data = killed.read_bytes()
    first._stream = None  # abandoned, as by SIGKILL: never closed
    killed.write_bytes(data[: len(data) - 5])
    with SegmentedRecorder(tmp_path, check_period_seconds=600) as second:
        later = record(second, (240, 10**9))
    segments = segment_paths(tmp_path)
    assert len(segments) == 2 and segments[0] == killed
    _, records = read_trace(tmp_path)
    got = list(records)
    before = [r for r in got if (r.time - SPEC.start) < timedelta(minutes=240)]
    after = [r for r in got if (r.time - SPEC.start) >= timedelta(minutes=240)]
    assert 0 < len(before) <= written and len(after) == later
    assert after[0].notebook is not None  # the new segment carries each notebook's objects again


def test_a_directory_of_the_other_hashing_setting_is_refused(tmp_path: Path) -> None:
    with SegmentedRecorder(tmp_path, check_period_seconds=600) as rec:
        record(rec, (0, 20))
    with pytest.raises(ValueError, match="hashed=False"), SegmentedRecorder(tmp_path, hash_key=b"k") as rec:
        record(rec, (20, 30))
