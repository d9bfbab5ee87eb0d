"""End to end: stopping an idle GPU notebook hands its GPU to the notebook waiting for it.

Runs on the local control plane in "full" mode (kube-apiserver, kube-controller-manager,
kube-scheduler, kwok playing a node with one nvidia.com/gpu) with Kubeflow's notebook-controller
(ENABLE_CULLING=false). A's Jupyter server is real and idle, B's runs a kernel that is busy. The fake
node has no GPU: its GPU is a dcgm-exporter-shaped /metrics endpoint (metric names and labels of
dcgm-exporter's default counters, kf_culler.local.prometheus.FakeGpu) scraped by a real Prometheus,
which the culler queries as it would a cluster's; A's GPU reads idle, then B's reads working.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from kf_culler.local.cluster import (
    GPU_NODE,
    LocalCluster,
)
from kf_culler.local.handoff import (
    INSUFFICIENT_GPU,
    GpuHandoff,
)
from kf_culler.model import REASON_ANNOTATION, STOP_ANNOTATION, STOPPED_BY_ANNOTATION, STOPPED_BY_VALUE
from kf_culler.plan import EVENT_STOP

pytestmark = [pytest.mark.slow, pytest.mark.cluster]


@pytest.fixture()
def cluster(notebook_controller: LocalCluster) -> LocalCluster:
    """The session's full cluster with Kubeflow's notebook-controller (tests/conftest.py)."""
    return notebook_controller


def _events(scenario: GpuHandoff, name: str) -> list[dict[str, Any]]:
    from kubernetes import client

    core: Any = client.CoreV1Api(scenario.api)
    listed = scenario.api.sanitize_for_serialization(core.list_namespaced_event(scenario.namespace))
    return [e for e in listed.get("items") or [] if (e.get("involvedObject") or {}).get("name") == name]


def test_stopping_an_idle_notebook_hands_its_gpu_to_the_waiting_one(cluster: LocalCluster) -> None:
    with GpuHandoff(cluster) as s:
        a, b = s.setup()
        assert a.gpus == 1 and a.node == GPU_NODE and a.phase == "Running"
        assert b.gpus == 1 and not b.node and INSUFFICIENT_GPU in b.unschedulable

        stop = s.cull_a()
        verdict = stop.result.verdict
        assert verdict.action == "stop" and verdict.state == "idle", verdict
        # The GPU evidence came from Prometheus, scraped from the node's dcgm-exporter-shaped endpoint.
        gpu = verdict.evidence["gpu"]
        assert gpu["read"] is True and gpu["samples"] >= 2, gpu
        assert gpu["latest"]["utilPercent"] == 0 and gpu["latest"]["memoryUsedMiB"] == 0 and gpu["lastWork"] is None
        assert "an idle GPU" in verdict.reason, verdict.reason
        assert stop.result.write is not None and stop.result.write.outcome == "patched", stop.result.write
        b_verdict = s.verdict_of(stop.cycle, "b")
        assert b_verdict is not None and b_verdict.verdict.state == "starting"  # B waits: never a candidate
        ann = s.notebook("a")["metadata"]["annotations"]
        assert STOP_ANNOTATION in ann
        assert ann[STOPPED_BY_ANNOTATION] == STOPPED_BY_VALUE
        assert ann[REASON_ANNOTATION] == verdict.reason[:1000]
        assert any(e.get("reason") == EVENT_STOP and verdict.reason[:60] in str(e.get("message"))
                   for e in _events(s, "a")), _events(s, "a")

        times = s.wait_handoff(stop)
        print("\nGPU handoff, from the culler's decision to stop A:\n" + "\n".join(times.lines()))
        print(f"decision to B Running: {times.pod_b_running:.2f} s")
        assert min(times.statefulset_scaled, times.pod_a_gone, times.pod_b_bound, times.pod_b_running) >= 0
        # The order of the steps, by etcd revision (arrival times in two watch threads can cross).
        scaled, a_gone, b_bound, b_running = times.revisions
        assert 0 < scaled < a_gone < b_bound <= b_running, times.revisions
        assert s.replicas("a") == 0
        assert not s.pod("a-0").exists
        b_now = s.pod("b-0")
        assert b_now.phase == "Running" and b_now.node == GPU_NODE and b_now.uid == b.uid

        # B's pod now holds the GPU and works on it; the culler reads that from Prometheus too.
        s.gpu.assign("b-0", util=85, used_mib=6000)
        s.gpu.wait_scraped("b-0")

        # Start A again as the Jupyter web app does: it waits for the GPU that B now holds.
        s.start_a_again()
        s.wait("A's StatefulSet back at 1 replica", lambda: s.replicas("a") == 1)
        a_again = s.wait_pending_for_gpu("a")
        assert a_again.uid != a.uid
        assert STOP_ANNOTATION not in (s.notebook("a")["metadata"].get("annotations") or {})

        # The culler keeps a notebook that has no running pod ("starting"), however long it waits:
        # cycles over twice the idle limit never stop A, and B keeps the GPU.
        until = time.monotonic() + s.idle_minutes * 60 * 2 + 2
        seen_cycles = 0
        while time.monotonic() < until:
            result = s.cycle()
            r = s.verdict_of(result, "a")
            assert r is not None
            assert r.verdict.action == "keep" and r.verdict.state == "starting", r.verdict
            rb = s.verdict_of(result, "b")
            assert rb is not None
            assert rb.verdict.action == "keep" and rb.verdict.state == "active", rb.verdict
            assert rb.verdict.evidence["gpu"]["read"] is True, rb.verdict.evidence
            seen_cycles += 1
            time.sleep(0.5)
        assert seen_cycles >= 3
        assert STOP_ANNOTATION not in (s.notebook("a")["metadata"].get("annotations") or {})
        assert s.pod("a-0").phase == "Pending" and INSUFFICIENT_GPU in s.pod("a-0").unschedulable
        b_final = s.pod("b-0")
        assert b_final.phase == "Running" and b_final.node == GPU_NODE and b_final.uid == b.uid
