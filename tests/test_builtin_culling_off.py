"""`overlays/kubeflow/builtin-culling-off` against the Deployment Kubeflow's notebook-controller v1.11.0 ships, on the
real API server (the `kube` fixture): upstream's own kustomization (`config/overlays/standalone` of the vendored
source, rendered in the test's namespace) sets ENABLE_CULLING with `valueFrom: configMapKeyRef`, and the API server
refuses an env entry with both `value` and `valueFrom`. docs/install.md's `kubectl patch --patch-file` is accepted
and leaves ENABLE_CULLING an explicit "false". (tests/test_kind_culler.py does the same to the controller running on
kind, with the file as shipped, in `kubeflow`.)
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from support.kind_culler import NBC_DEPLOYMENT, ROOT, render_notebook_controller
from support.kustomize import kubectl_path
from support.target import KubeTarget

pytestmark = pytest.mark.cluster
PATCH = ROOT / "kustomize" / "overlays" / "kubeflow" / "builtin-culling-off" / "notebook-controller-env.yaml"


def kubectl(kube: KubeTarget, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    kubectl_bin = kubectl_path()
    assert kubectl_bin is not None
    return subprocess.run([kubectl_bin, f"--kubeconfig={kube.kubeconfig}", *args], input=stdin, capture_output=True,
                          text=True, timeout=120)


def test_the_patch_turns_culling_off_on_upstreams_deployment(kube: KubeTarget, namespace: str, tmp_path: Path) -> None:
    (deployment,) = [o for o in render_notebook_controller(tmp_path, "kf-culler.local/notebook-controller:v1.11.0")
                     if o["kind"] == "Deployment"]
    deployment["metadata"]["namespace"] = namespace
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    (upstream,) = [e for e in container["env"] if e["name"] == "ENABLE_CULLING"]
    assert "configMapKeyRef" in upstream["valueFrom"]  # how v1.11.0 sets it
    created = kubectl(kube, "create", "-f", "-", stdin=yaml.safe_dump(deployment))
    assert created.returncode == 0, created.stderr
    # The shipped file names Kubeflow's namespace; the same patch, in this test's namespace.
    patch: dict[str, Any] = yaml.safe_load(PATCH.read_text())
    patch["metadata"]["namespace"] = namespace
    (tmp_path / "patch.yaml").write_text(yaml.safe_dump(patch))
    done = kubectl(kube, "patch", "-n", namespace, "deployment", NBC_DEPLOYMENT, "--patch-file",
                   str(tmp_path / "patch.yaml"))
    assert done.returncode == 0, done.stderr
    live = json.loads(kubectl(kube, "get", "-n", namespace, "deployment", NBC_DEPLOYMENT, "-o", "json").stdout)
    (container,) = live["spec"]["template"]["spec"]["containers"]
    assert [e for e in container["env"] if e["name"] == "ENABLE_CULLING"] == [
        {"name": "ENABLE_CULLING", "value": "false"}]
    assert [e["name"] for e in container["env"]] == [e["name"] for e in deployment["spec"]["template"]["spec"][
        "containers"][0]["env"]]  # nothing else changed
