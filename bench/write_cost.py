"""What one session's write costs the culler in CPU, on a local API server (kube-apiserver and etcd, as the tests
build them).

    python bench/write_cost.py [--notebooks 400] [--rounds 3]

For N Notebooks, each round patches every one of them once (a `last-activity` annotation, as a pass writes an
active notebook's) three ways, and prints this process's CPU time per patch:

- generated: the kubernetes client's generated `CustomObjectsApi.patch_namespaced_custom_object`;
- core: the same merge patch through `kf_culler/kube/core.py` (`patch_object`), where the culler's code has it;
- apply: the culler's whole write (`Writer.apply`: the plan's patch with the notebook's resourceVersion, the
  retries' set-up, the answer kept), each notebook as the previous round left it, so none conflicts.

The API server's own CPU is not counted (another process). docs/performance.md records the figures.
"""

from __future__ import annotations

import argparse
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kf_culler.kube import core
from kf_culler.kube.client import api_client
from kf_culler.kube.writer import Writer
from kf_culler.local.cluster import LocalCluster
from kf_culler.local.objects import create_namespace, create_notebook, notebook
from kf_culler.model import LAST_ACTIVITY_ANNOTATION
from kf_culler.plan import Plan

GROUP, VERSION, PLURAL, NS = "kubeflow.org", "v1", "notebooks", "bench-writes"
TIMEOUT = (5.0, 30.0)


def per_patch_ms(n: int, started: float) -> float:
    return (time.process_time() - started) / n * 1000


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--notebooks", type=int, default=400)
    p.add_argument("--rounds", type=int, default=3)
    a = p.parse_args()
    from kubernetes import client

    with LocalCluster(quiet=True) as cluster:
        cluster.apply_notebook_crd()
        api = api_client(str(cluster.kubeconfig))
        create_namespace(api, NS)
        names = [f"nb-{i:05d}" for i in range(a.notebooks)]
        for name in names:
            create_notebook(api, NS, notebook(name))
        custom = client.CustomObjectsApi(api)
        writer = Writer(api)
        patch_object = getattr(core, "patch_object", None)  # not in every version of the culler
        for r in range(a.rounds):
            def body(tag: str, i: int, hour: int = r) -> dict[str, Any]:
                stamp = f"2026-12-08T0{hour}:{tag}:{i % 60:02d}Z"
                return {"metadata": {"annotations": {LAST_ACTIVITY_ANNOTATION: stamp}}}

            t = time.process_time()
            for i, name in enumerate(names):
                custom.patch_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, name, body("10", i),
                                                      _content_type=core.MERGE_PATCH, _request_timeout=TIMEOUT)
            generated = per_patch_ms(len(names), t)
            lean = None
            if patch_object is not None:
                t = time.process_time()
                for i, name in enumerate(names):
                    patch_object(api, GROUP, VERSION, NS, PLURAL, name, body("20", i), core.MERGE_PATCH, TIMEOUT)
                lean = per_patch_ms(len(names), t)
            fresh = [custom.get_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, name) for name in names]
            t = time.process_time()
            results = [writer.apply(nb, Plan(body("30", i)["metadata"]["annotations"]), lambda _o: Plan({}),
                                    datetime.now(UTC)) for i, nb in enumerate(fresh)]
            applied = per_patch_ms(len(names), t)
            outcomes = {res.outcome for res in results}
            print(f"round {r + 1}: CPU ms a patch: generated {generated:.3f}, "
                  f"core {'-' if lean is None else f'{lean:.3f}'}, apply {applied:.3f} (outcomes {sorted(outcomes)})",
                  flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
