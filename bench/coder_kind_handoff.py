"""GPU hand-off through Coder on a real kubelet: from kf-culler's stop build of an idle workspace to the waiting
workspace's pod Ready.

    python bench/coder_kind_handoff.py [--runs 5] [--json]

The write-up's Coder experiment (../shared/seeds/001_*.txt: 136 s from the stop request to B's pod Ready, measured
once, Coder v2.36.0 on kind on a Mac) on a kind cluster built here (hack/kind/build.sh, docs/kind.md) with a real
Coder v2.36.0 server whose provisioner runs Terraform with hashicorp/kubernetes (hack/coder/build.sh), the template
tests/data/coder-kubernetes/main.tf (the shape of Coder's upstream Kubernetes template) and kf-culler in-process
(`targets: [coder]`); tests/support/coder_kind.py says how the pieces are joined and what is not reproduced (no
Coder agent runs; no GPU metrics: `gpuWithoutMetrics: ide-only`). One node advertising one fake `nvidia.com/gpu`.

Per run, two new workspaces of two users: A's pod Ready on the GPU, B's Pending for it; the culler's passes (every
second, idle limit 15 s) until it stops A through a stop build; Coder's provisioner runs `terraform apply`, which
deletes A's Deployment; the pod's container exits on SIGTERM; the scheduler binds B's pod; its container starts
(no readiness probe, as upstream: Ready is the container started). Then both workspaces are deleted (delete builds).

Per run: `build`, from the stop build's created_at (Coder's clock) to B's pod's Ready condition's
lastTransitionTime (to the second), the write-up's measure; `watched`, from the culler's pass returning with the
stop build made to this script seeing B's pod Ready (polling every 0.2 s). The cluster is made for the benchmark
and deleted after it. Exit status 2 when kind or Coder cannot be had here (the reason is printed).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from support.coder_kind import Handoff, check_components, coder_on_kind, end_pair, hand_off, start_pair
from support.kind import KindUnavailable, kind_backend, open_kind
from support.kind_culler import fake_gpu

from kf_culler.local.coder import CoderUnavailable


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--json", action="store_true", help="print the runs and the summary as JSON")
    args = parser.parse_args()
    runs: list[Handoff] = []
    t0 = time.monotonic()
    try:
        check_components()
        backend = kind_backend()
        with open_kind(backend) as kind, tempfile.TemporaryDirectory() as tmp, \
                coder_on_kind(kind, Path(tmp)) as c, fake_gpu(kind):
            usera, userb = c.coder.create_member("usera"), c.coder.create_member("userb")
            if not args.json:
                print(f"kind cluster, Coder and its template up in {time.monotonic() - t0:.0f} s; {args.runs} runs")
                print("run  build (s)  watched (s)")
            for i in range(args.runs):
                idle, waiting = (usera, f"ws-a{i}"), (userb, f"ws-b{i}")
                a, b = start_pair(c, idle, waiting)
                try:
                    with c.culler() as runner:
                        runs.append(hand_off(c, runner, idle, waiting, a, b))
                    c.coder.wait_job(f"/api/v2/workspacebuilds/{c.latest_build(a)['id']}", 300)
                finally:
                    end_pair(c, [a, b])
                if not args.json:
                    print(f"{i + 1:3d}  {runs[-1].seconds:9.1f}  {runs[-1].watched:11.2f}", flush=True)
    except (KindUnavailable, CoderUnavailable) as why:
        print(f"cannot run the Coder hand-off on kind here: {why}", file=sys.stderr)
        return 2
    summary = {name: {"median": statistics.median(values), "max": max(values)}
               for name, values in (("build", [r.seconds for r in runs]), ("watched", [r.watched for r in runs]))}
    if args.json:
        print(json.dumps({"runs": [{"build": r.seconds, "watched": r.watched, "requested": r.requested.isoformat(),
                                    "ready": r.ready.isoformat()} for r in runs], "summary": summary}, indent=2))
    else:
        s, w = summary["build"], summary["watched"]
        print(f"over {len(runs)} runs: stop build to Ready median {s['median']:.1f} s, max {s['max']:.1f} s; "
              f"pass returned to Ready seen median {w['median']:.2f} s, max {w['max']:.2f} s; "
              f"total wall time {time.monotonic() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
