"""No silent "GPU never culled": without a GPU metrics source the culler says what GPU notebooks get, in
the header of `check` and in /readyz (the start-up log and `check` on a cluster: test_e2e_policy_rules)."""

from __future__ import annotations

import socket
import urllib.error
import urllib.request
from datetime import UTC, datetime

import pytest

from kf_culler.config import load_mapping
from kf_culler.cycle import CycleResult
from kf_culler.metrics import HealthServer, Metrics
from kf_culler.report import render

KEEP = ("no GPU metrics source is configured (prometheus.url, dcgm.endpoints): gpuWithoutMetrics: keep: "
        "GPU notebooks are never stopped for idleness (kept as no-signal)")


@pytest.mark.parametrize(("cfg", "expected"), [
    ({}, KEEP),
    ({"gpuWithoutMetrics": "ide-only"}, KEEP.split(": gpuWithoutMetrics")[0]
     + ": gpuWithoutMetrics: ide-only: GPU notebooks are judged by their IDE alone, like CPU notebooks"),
    ({"rules": [{"name": "t", "policy": {"gpuWithoutMetrics": "ide-only"}}]},
     KEEP.split(": gpuWithoutMetrics")[0] + ": gpuWithoutMetrics: ide-only: GPU notebooks are judged by their IDE "
     "alone, like CPU notebooks; gpuWithoutMetrics: keep: GPU notebooks are never stopped for idleness (kept as "
     "no-signal)"),
    ({"prometheus": {"url": "http://prometheus:9090"}}, None),
    ({"dcgm": {"endpoints": ["http://node:9400/metrics"]}, "gpuWithoutMetrics": "ide-only"}, None),
])
def test_warning_names_the_choice(cfg: dict[str, object], expected: str | None) -> None:
    assert load_mapping(cfg, "test").gpu_source_warning() == expected


def test_check_header_and_json() -> None:
    now = datetime(2026, 11, 29, 12, tzinfo=UTC)
    result = CycleResult(now, now, 0.1, [])
    assert render(result, "table", [KEEP]).splitlines()[:2] == [f"# warning: {KEEP}", "NAMESPACE   NAME   TYPE   "
                                                               "GPUS   STATE   IDLE   ACTION   REASON"]
    assert render(result, "table").startswith("NAMESPACE")
    assert '"warnings": [\n    "no GPU metrics source' in render(result, "json", [KEEP])
    assert "warnings" not in render(result, "yaml")


def test_readyz_carries_the_warning() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = HealthServer(f"127.0.0.1:{port}", Metrics(), lambda: (True, "ready"))
    server.notes = [f"warning: {KEEP}"]
    server.start()
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/readyz", timeout=5) as resp:
            assert resp.status == 200
            assert resp.read().decode() == f"ready\nwarning: {KEEP}\n"
        server.ready = lambda: (False, "notebook cache not synced")
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(f"http://127.0.0.1:{server.port}/readyz", timeout=5)
        assert err.value.code == 503 and err.value.read().decode().endswith(f"warning: {KEEP}\n")
    finally:
        server.stop()


@pytest.mark.parametrize("overlay", ["kubeflow", "gpu-only", "dry-run"])
def test_shipped_config_states_the_choice_with_a_comment(overlay: str) -> None:
    from test_kustomize import config_text, render

    lines = config_text(render(f"overlays/{overlay}")).splitlines()
    i = lines.index("gpuWithoutMetrics: keep")
    comment = []
    while lines[i - 1].startswith("#"):
        i -= 1
        comment.insert(0, lines[i])
    assert any("NEVER stopped for idleness" in c for c in comment) and any("ide-only" in c for c in comment)
