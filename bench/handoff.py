"""GPU handoff latency: from the culler's decision to stop an idle notebook to the waiting one Running.

    python bench/handoff.py [--runs 10] [--json]

Each run is the whole scenario in a fresh namespace of one local cluster (kube-apiserver,
kube-controller-manager, kube-scheduler, kwok with one fake `nvidia.com/gpu: 1` node, Kubeflow's
notebook-controller with ENABLE_CULLING=false): Notebook A Running on the GPU with an idle Jupyter
server, Notebook B Pending for the GPU, the culler stops A, and the time to each upstream step is
taken from watch events. kwok finishes a pod's deletion at once, so no container termination grace
period is in these figures (a real kubelet adds up to terminationGracePeriodSeconds, 30 s by default).
Exit status 2 when the cluster or the notebook-controller cannot be had here (the reason is printed).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

from kf_culler.local.cluster import NotebookControllerUnavailable
from kf_culler.local.handoff import (
    HandoffTimes,
    Unavailable,
    decision_to_running,
    open_full_cluster,
    start_controller,
)

STEPS = ("statefulset_scaled", "pod_a_gone", "pod_b_bound", "pod_b_running")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--idle-minutes", type=float, default=0.1,
                        help="the culler's idleMinutes (default 0.1)")
    parser.add_argument("--json", action="store_true", help="print the runs and the summary as JSON")
    args = parser.parse_args()
    runs: list[HandoffTimes] = []
    t0 = time.monotonic()
    try:
        with open_full_cluster(quiet=False) as cluster:
            start_controller(cluster)
            started = time.monotonic() - t0
            if not args.json:
                print(f"cluster and notebook-controller up in {started:.1f} s; {args.runs} runs")
                print("run  sts->0   A gone   B bound  B Running   (seconds after the decision)")
            for i in range(args.runs):
                times, _ = decision_to_running(cluster, idle_minutes=args.idle_minutes)
                runs.append(times)
                if not args.json:
                    print(f"{i + 1:3d}  " + "  ".join(f"{getattr(times, s):7.2f}" for s in STEPS), flush=True)
    except (Unavailable, NotebookControllerUnavailable) as why:
        print(f"cannot run the GPU handoff here: {why}", file=sys.stderr)
        return 2
    summary = {s: {"median": statistics.median(getattr(r, s) for r in runs),
                   "max": max(getattr(r, s) for r in runs)} for s in STEPS}
    if args.json:
        print(json.dumps({"runs": [{s: getattr(r, s) for s in STEPS} for r in runs], "summary": summary},
                         indent=2))
    else:
        print("median " + "  ".join(f"{summary[s]['median']:7.2f}" for s in STEPS))
        print("max    " + "  ".join(f"{summary[s]['max']:7.2f}" for s in STEPS))
        b = summary["pod_b_running"]
        print(f"decision to B Running over {len(runs)} runs: median {b['median']:.2f} s, "
              f"max {b['max']:.2f} s; total wall time {time.monotonic() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
