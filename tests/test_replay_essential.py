"""The replay gives decide only the GPU samples that determine its reading of a window; the verdict
must be the one decide gives on the whole window."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from kf_culler.config import load_mapping
from kf_culler.decide import decide
from kf_culler.replay.simulate import essential_samples

T0 = datetime(2026, 3, 2, 8, tzinfo=UTC)


def z(t: datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


samples_st = st.lists(
    st.tuples(st.integers(1, 10), st.sampled_from([0, 3, 5, 40, 97]), st.sampled_from([0, 100, 256, 300, 24000])),
    min_size=1, max_size=40)


@settings(max_examples=400, deadline=None)
@given(
    raw=samples_st,
    util=st.sampled_from([0, 5, 50]),
    mem=st.sampled_from([0, 256]),
    idle=st.sampled_from([30, 60]),
    warn=st.sampled_from([0, 10]),
    busy_gpu_idle=st.sampled_from([None, 15, 60]),
    connected_gpu_idle=st.sampled_from([None, 20]),
    kernel=st.sampled_from(["idle", "busy"]),
    connections=st.sampled_from([0, 1]),
    activity_ago=st.integers(0, 400),
    later=st.integers(0, 10),
)
def test_essential_samples_keep_the_verdict(raw: list[tuple[int, int, int]], util: int, mem: int, idle: int,
                                           warn: int, busy_gpu_idle: int | None,
                                           connected_gpu_idle: int | None, kernel: str, connections: int,
                                           activity_ago: int, later: int) -> None:
    t = T0
    samples = []
    for gap, u, m in raw:
        t += timedelta(minutes=gap)
        samples.append({"time": z(t), "utilPercent": u, "memoryUsedMiB": m})
    now = t + timedelta(minutes=later)
    config: dict[str, Any] = {"idleMinutes": idle, "warnMinutes": warn, "startupGraceMinutes": 5,
                              "busyKernelGpuIdleMinutes": busy_gpu_idle,
                              "connectedGpuIdleMinutes": connected_gpu_idle,
                              "gpu": {"utilPercent": util, "memoryMiB": mem}}
    policy = load_mapping(config, "test").policy
    notebook = {"metadata": {"name": "nb", "namespace": "a", "annotations": {}},
                "spec": {"template": {"spec": {"containers": [
                    {"name": "nb", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}}}
    pod = {"metadata": {"name": "nb-0"},
           "spec": {"containers": [{"name": "nb", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
           "status": {"phase": "Running", "startTime": z(T0 - timedelta(hours=8))}}
    last = z(now - timedelta(minutes=activity_ago))
    jupyter = {"status": {"last_activity": last, "connections": connections},
               "kernels": [{"id": "k", "name": "python3", "last_activity": last, "execution_state": kernel,
                            "connections": connections}],
               "terminals": []}
    full = decide(notebook, pod, {"jupyter": jupyter, "gpu": {"samples": samples}}, policy, now)
    cut = essential_samples(samples, util, mem)
    assert len(cut) <= 3
    thin = decide(notebook, pod, {"jupyter": jupyter, "gpu": {"samples": cut}}, policy, now)
    assert (thin.action, thin.state, thin.reason, thin.rule_id, thin.idle_since, thin.stop_at, thin.warn_at) == (
        full.action, full.state, full.reason, full.rule_id, full.idle_since, full.stop_at, full.warn_at)
