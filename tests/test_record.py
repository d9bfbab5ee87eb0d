"""`kf-culler run --record FILE` writes what the culler observed as a replayable trace."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from support.target import KubeTarget

from kf_culler.local import objects as obj
from kf_culler.local.jupyter import JupyterServer
from kf_culler.local.router import Router
from kf_culler.replay.trace import read_trace

pytestmark = pytest.mark.cluster


def test_run_records_a_trace_that_replays(kube: KubeTarget, api: Any, namespace: str, tmp_path: Path) -> None:
    trace = tmp_path / "trace.jsonl"
    with Router() as router, JupyterServer(namespace, "nb-idle") as server:
        server.start_kernel()
        router.add("notebook", namespace, "nb-idle", f"http://127.0.0.1:{server.port}", strip=False)
        obj.create_notebook(api, namespace, obj.notebook("nb-idle"))
        obj.running_pod(api, namespace, "nb-idle", datetime.now(UTC) - timedelta(hours=1))
        time.sleep(1)
        cfg = tmp_path / "config.yaml"
        cfg.write_text(yaml.safe_dump({"idleMinutes": 600, "namespaces": {"include": [namespace]},
                                       "urls": {"jupyter": router.template()}, "dryRun": True}))
        for _ in range(2):
            done = subprocess.run([sys.executable, "-m", "kf_culler", "run", "--once", "--text-logs",
                                   "--kubeconfig", str(kube.kubeconfig), "--config", str(cfg),
                                   "--record", str(trace)], capture_output=True, text=True, timeout=120)
            assert done.returncode == 0, done.stderr[-2000:]
    _header, records = read_trace(trace)
    got = list(records)
    assert [r.id for r in got] == [f"{namespace}/nb-idle"] * 2
    jupyter = got[0].observations["jupyter"]
    assert jupyter["kernels"][0]["execution_state"] == "idle"
    assert got[0].pod is not None and got[0].truth is None

    replay = subprocess.run([sys.executable, "-m", "kf_culler", "replay", str(trace), "--config", str(cfg),
                             "--format", "json"], capture_output=True, text=True, timeout=120)
    assert replay.returncode == 0, replay.stderr[-2000:]
    summary = json.loads(replay.stdout)
    # What was recorded: one notebook, two passes, no GPU, no ground truth (a real cluster has none).
    assert (summary["trace"]["notebooks"], summary["trace"]["records"]) == (1, 2), summary["trace"]
    assert summary["replay"]["truthKnown"] is False
    assert summary["gpuHoursWithoutCuller"] == 0
    # The recorded policy (idle limit 600 min) decides the notebook at each of the two records and,
    # with a kernel idle for seconds, neither warns nor stops.
    [policy] = summary["policies"]
    assert (policy["checks"], policy["stops"], policy["warnings"]) == (2, 0, 0), policy
