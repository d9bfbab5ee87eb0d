"""The cost of `kf-culler replay TRACE --sweep` on a synthetic fleet (docs/performance.md, "Policy sweeps").

Writes a seeded synthetic fleet (kf_culler/replay/fleet.py: a record every 5 minutes, the built-in mix of
behaviours), then replays a grid of 90 policies and the current configuration (the built-in defaults) over it
as the sweep does (kf_culler/replay/sweep.py `evaluate`: the cohort replay, the notebooks split into --jobs
shards, one process each), and prints the wall time, the CPU time of this process and its workers, and the CPU
per policy and notebook-day.

    python3 bench/sweep_speed.py --notebooks 500 --days 30 --jobs 2
    python3 bench/sweep_speed.py --notebooks 20 --days 7 --jobs 2      # a smaller fleet, the same grid
"""

from __future__ import annotations

import argparse
import json
import resource
import tempfile
import time
from pathlib import Path

from kf_culler.replay import sweep as sw
from kf_culler.replay.fleet import FleetSpec, write_fleet

GRID = ["idleMinutes=15,30,60,120,240", "warnMinutes=0,10", "connectedGpuIdleMinutes=off,60,120",
        "busyKernelGpuIdleMinutes=off,60,240"]


def _cpu() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--notebooks", type=int, default=500)
    ap.add_argument("--days", type=float, default=30)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--trace", help="reuse (or write) the fleet trace here instead of a temporary file")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        trace = Path(args.trace) if args.trace else Path(tmp) / "fleet.jsonl.gz"
        t0 = time.perf_counter()
        if not trace.exists():
            write_fleet(FleetSpec(notebooks=args.notebooks, days=args.days, seed=args.seed), trace)
        written_s = time.perf_counter() - t0
        configs = [({}, {})] + [(p, sw.with_point({}, p)) for p in sw.points(sw.parse_grid(GRID))]
        cpu0, t1 = _cpu(), time.perf_counter()
        _, items = sw.evaluate(str(trace), configs, jobs=args.jobs)
        wall, cpu = time.perf_counter() - t1, _cpu() - cpu0
    print(json.dumps({
        "notebooks": args.notebooks, "days": args.days, "policies": len(configs), "jobs": args.jobs,
        "traceWrittenSeconds": round(written_s, 1), "sweepWallSeconds": round(wall, 1),
        "sweepCpuSeconds": round(cpu, 1),
        "cpuMsPerPolicyNotebookDay": round(1000 * cpu / (len(configs) * args.notebooks * args.days), 3),
        "current": items[0].total.to_dict(),
    }, indent=2))


if __name__ == "__main__":
    main()
