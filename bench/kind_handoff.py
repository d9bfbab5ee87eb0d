"""GPU hand-off on a real kubelet: from kf-culler's stop of an idle session to the waiting session's pod Ready.

    python bench/kind_handoff.py [--runs 5] [--json]

The write-up's experiment (../shared/seeds/000_*.txt, 5 s measured once) on a kind cluster built here
(hack/kind/build.sh, docs/kind.md), with kf-culler running as pods from its image (the rendered kubeflow overlay with
components/workloads; hack/kind/images.sh builds the images): one node advertising one fake `nvidia.com/gpu` (its
status patched; there is no GPU here), and per run two sessions (Deployments of one Jupyter pod, a home PVC on a
hostPath PersistentVolume, /tmp on an emptyDir), the idle one on the GPU, the other Pending for it. The culler scales
the idle one to 0 once its idle limit (45 s) is past; the old pod's containers stop (SIGTERM, Jupyter exits), the
scheduler binds the waiting pod, its container starts and its tcpSocket readiness probe (every second) passes.

Per run: `event`, from the culler's stop Event (its timestamp, to the second) to the waiting pod's Ready condition's
lastTransitionTime (to the second), the write-up's measure; `watched`, from this script seeing the idle Deployment
at 0 replicas to seeing the waiting pod Ready (polling every 0.1 s). The cluster is made for the benchmark and
deleted after it. Exit status 2 when kind or the images cannot be had here (the reason is printed).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from support.kind import KindUnavailable, kind_backend, open_kind
from support.kind_culler import ImagesUnavailable, build_images, deployed_culler, fake_gpu
from support.kind_sessions import CONFIG, Handoff, end_sessions, hand_off, start_sessions


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--json", action="store_true", help="print the runs and the summary as JSON")
    args = parser.parse_args()
    runs: list[Handoff] = []
    t0 = time.monotonic()
    try:
        backend = kind_backend()
        with open_kind(backend) as kind:
            images = build_images(kind)
            ns = f"kf-bench-{uuid.uuid4().hex[:6]}"
            kind.kubectl("create", "namespace", ns)
            config = {**CONFIG, "namespaces": {"include": [ns], "exclude": []}}
            with tempfile.TemporaryDirectory() as tmp, deployed_culler(kind, Path(tmp), config, ("workloads",)) as c, \
                    fake_gpu(kind):
                c.wait_ready(2)
                if not args.json:
                    print(f"kind cluster, images and culler up in {time.monotonic() - t0:.0f} s; {args.runs} runs")
                    print("run  event (s)  watched (s)")
                api = kind.api_client()
                for i in range(args.runs):
                    idle, waiting = f"a{i}", f"b{i}"
                    try:
                        start_sessions(kind, ns, images.jupyterlab, idle, waiting)
                        runs.append(hand_off(kind, api, ns, idle, waiting))
                    finally:
                        end_sessions(kind, ns, [idle, waiting])
                    if not args.json:
                        print(f"{i + 1:3d}  {runs[-1].seconds:9.0f}  {runs[-1].watched:11.2f}", flush=True)
    except (KindUnavailable, ImagesUnavailable) as why:
        print(f"cannot run the kind hand-off here: {why}", file=sys.stderr)
        return 2
    summary = {name: {"median": statistics.median(values), "max": max(values)}
               for name, values in (("event", [r.seconds for r in runs]), ("watched", [r.watched for r in runs]))}
    if args.json:
        print(json.dumps({"runs": [{"event": r.seconds, "watched": r.watched, "stopped": r.stopped.isoformat(),
                                    "ready": r.ready.isoformat()} for r in runs], "summary": summary}, indent=2))
    else:
        e, w = summary["event"], summary["watched"]
        print(f"over {len(runs)} runs: stop Event to Ready median {e['median']:.1f} s, max {e['max']:.0f} s; "
              f"0 replicas seen to Ready seen median {w['median']:.2f} s, max {w['max']:.2f} s; "
              f"total wall time {time.monotonic() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
