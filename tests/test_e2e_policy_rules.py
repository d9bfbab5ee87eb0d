"""Policy rules on a real API server: two namespaces with different labels get different idle limits from
`rules` (the namespaces' labels read through the API), and check/explain/the verdict name the rule. Also
the warning about no GPU metrics source, at start-up (`run`) and in the header of `check`."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from support.passes import Passes
from support.target import KubeTarget

from kf_culler.config import load_mapping
from kf_culler.local import objects as obj
from kf_culler.local.jupyter import JupyterServer
from kf_culler.local.router import Router
from kf_culler.model import STOP_ANNOTATION
from kf_culler.runner import build_runner

pytestmark = pytest.mark.cluster
ROOT = Path(__file__).resolve().parents[1]
TIER = "culler.example.com/tier"
NO_GPU_SOURCE = "no GPU metrics source is configured (prometheus.url, dcgm.endpoints)"


@pytest.fixture()
def two_namespaces(api: Any, namespace: str) -> Iterator[tuple[str, str]]:
    """`namespace` labelled research, and a second one labelled course."""
    from kubernetes import client

    core = client.CoreV1Api(api)
    core.patch_namespace(namespace, {"metadata": {"labels": {TIER: "research"}}})
    other = f"{namespace}-b"
    core.create_namespace({"metadata": {"name": other, "labels": {TIER: "course"}}})
    yield namespace, other
    with contextlib.suppress(Exception):
        core.delete_namespace(other)


def config(router: Router, research: str, course: str) -> dict[str, Any]:
    return {
        "namespaces": {"include": [research, course]},
        "idleMinutes": 60, "warnMinutes": 0, "startupGraceMinutes": 10,
        "urls": {"jupyter": router.template("notebook")}, "probe": {"timeoutSeconds": 5},
        "rules": [
            {"name": "research", "match": {"namespaceSelector": {"matchLabels": {TIER: "research"}}},
             "policy": {"idleMinutes": 600}},
            {"name": "students", "match": {"namespaceSelector": {"matchExpressions": [
                {"key": TIER, "operator": "In", "values": ["course", "workshop"]}]},
                "serverTypes": ["jupyter"]},
             "policy": {"idleMinutes": 0.05}},
        ],
    }


def cli(kube: KubeTarget, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kf_culler", *args, "--kubeconfig", str(kube.kubeconfig)],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)


def test_namespace_labels_choose_the_rule(kube: KubeTarget, api: Any, two_namespaces: tuple[str, str],
                                          tmp_path: Path) -> None:
    research, course = two_namespaces
    with Router() as router, contextlib.ExitStack() as stack:
        for ns in (research, course):
            server = stack.enter_context(JupyterServer(ns, "nb"))
            server.start_kernel()
            router.add("notebook", ns, "nb", f"http://127.0.0.1:{server.port}", strip=False)
            obj.create_notebook(api, ns, obj.notebook("nb"))
            obj.running_pod(api, ns, "nb", datetime.now(UTC) - timedelta(hours=1))
        time.sleep(3.5)  # idle past the students' 3-second limit, far inside the research 10 hours
        cfg = config(router, research, course)
        path = tmp_path / "config.yaml"
        path.write_text(yaml.safe_dump(cfg))

        done = cli(kube, "check", "--config", str(path), "-o", "wide")
        assert done.returncode == 0, done.stderr
        lines = done.stdout.splitlines()
        assert lines[0] == f"# warning: {NO_GPU_SOURCE}: gpuWithoutMetrics: keep: GPU notebooks are never " \
                           "stopped for idleness (kept as no-signal)"
        header = lines[1].split()
        assert header[:8] == ["NAMESPACE", "NAME", "TYPE", "GPUS", "STATE", "IDLE", "ACTION", "POLICY"]
        rows = {line.split()[0]: line.split() for line in lines[2:]}
        assert rows[research][6:8] == ["keep", "research"], done.stdout
        assert rows[course][6:8] == ["stop", "students"], done.stdout

        done = cli(kube, "check", "--config", str(path), "-o", "json")
        assert done.returncode == 0, done.stderr
        doc = json.loads(done.stdout)
        assert doc["warnings"] == [lines[0].removeprefix("# warning: ")]
        assert {n["namespace"]: n["policyRule"] for n in doc["notebooks"]} == {research: "research",
                                                                               course: "students"}

        for ns, rule in ((research, "research"), (course, "students")):
            done = cli(kube, "explain", f"{ns}/nb", "--config", str(path))
            assert done.returncode == 0, done.stderr
            assert f"\nPolicy: rule {rule}\n" in done.stdout, done.stdout

        # The culler itself: the course notebook is stopped, the research one kept.
        runner = Passes(build_runner(load_mapping(cfg, "test"), api))
        with runner:
            result = runner.once()
        verdicts = {r.namespace: r.verdict for r in result.results}
        assert (verdicts[research].action, verdicts[research].policy_rule) == ("keep", "research")
        assert (verdicts[course].action, verdicts[course].policy_rule) == ("stop", "students")
        assert "(limit 3 s)" in verdicts[course].reason, verdicts[course].reason
        assert STOP_ANNOTATION in obj.get_notebook(api, course, "nb")["metadata"]["annotations"]
        assert STOP_ANNOTATION not in (obj.get_notebook(api, research, "nb")["metadata"].get("annotations") or {})

        # The labels came from the API server, through the culler's cached lister.
        assert runner.namespace_labels is not None and runner.namespace_labels(research) == {
            TIER: "research", "kubernetes.io/metadata.name": research}


def test_start_up_warning_and_check_header_without_gpu_source(kube: KubeTarget, namespace: str,
                                                              tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump({"namespaces": {"include": [namespace]}, "gpuWithoutMetrics": "ide-only"}))
    done = cli(kube, "run", "--once", "--dry-run", "--text-logs", "--config", str(path))
    assert done.returncode == 0, done.stderr
    warning = (f"{NO_GPU_SOURCE}: gpuWithoutMetrics: ide-only: GPU notebooks are judged by their IDE alone, "
               "like CPU notebooks")
    assert [line for line in (done.stderr + done.stdout).splitlines() if "WARNING" in line and warning in line]
    done = cli(kube, "check", "--config", str(path))
    assert done.returncode == 0 and done.stdout.splitlines()[0] == f"# warning: {warning}", done.stdout

    # With a GPU source configured there is nothing to warn about.
    path.write_text(yaml.safe_dump({"namespaces": {"include": [namespace]},
                                    "dcgm": {"endpoints": ["http://127.0.0.1:9/metrics"]}}))
    done = cli(kube, "check", "--config", str(path))
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0].startswith("NAMESPACE"), done.stdout
    done = cli(kube, "run", "--once", "--dry-run", "--text-logs", "--config", str(path))
    assert done.returncode == 0 and NO_GPU_SOURCE not in done.stderr + done.stdout
