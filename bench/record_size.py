"""Bytes on disk per notebook-day of `kf-culler run --record DIR/` (docs/replay.md, "Recording a real fleet").

The records are a synthetic fleet's (kf_culler/replay/fleet.py) observed as the culler observes with its
defaults: a check every 60 s, and a GPU query whose look-back covers the longest limit (130 minutes of
samples at a 60 s step for the built-in defaults: twice idleMinutes, plus 10). They are written once
through the segmented recorder, once through a single-file recorder (every record with its whole GPU
look-back), and the sizes compared.

    python3 bench/record_size.py --notebooks 20 --days 1
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from kf_culler.replay.fleet import FleetSpec, iter_fleet
from kf_culler.replay.recorder import TraceRecorder
from kf_culler.replay.segments import SegmentedRecorder
from kf_culler.replay.trace import segment_paths


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--notebooks", type=int, default=20)
    ap.add_argument("--days", type=float, default=1)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--lookback", type=int, default=130, help="minutes of GPU samples each check returns")
    args = ap.parse_args()
    spec = FleetSpec(notebooks=args.notebooks, days=args.days, seed=args.seed, check_minutes=1,
                     gpu_lookback_minutes=args.lookback, gpu_step_minutes=1)
    with tempfile.TemporaryDirectory() as tmp:
        seg_dir, single = Path(tmp) / "dir", Path(tmp) / "one.jsonl.gz"
        t0 = time.process_time()
        records = 0
        with SegmentedRecorder(seg_dir, check_period_seconds=60) as seg, \
                TraceRecorder(single, check_period_seconds=60) as one:
            for now, nb, pod, obs, _ in iter_fleet(spec):
                seg.record(now, nb, pod, obs)
                one.record(now, nb, pod, obs)
                records += 1
        cpu = time.process_time() - t0
        seg_bytes = sum(p.stat().st_size for p in segment_paths(seg_dir))
        one_bytes = single.stat().st_size
    nb_days = args.notebooks * args.days
    print(f"{records:,} records ({args.notebooks} notebooks x {args.days:g} days, a check every 60 s, "
          f"{args.lookback} min of GPU samples per check); {cpu:.1f} s CPU for both recorders")
    print(f"segments (only new GPU samples): {seg_bytes:,} bytes, {seg_bytes / nb_days / 1024:,.1f} KiB per "
          "notebook-day")
    print(f"single file (whole look-back):   {one_bytes:,} bytes, {one_bytes / nb_days / 1024:,.1f} KiB per "
          "notebook-day")


if __name__ == "__main__":
    main()
