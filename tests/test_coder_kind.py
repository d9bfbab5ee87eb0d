"""The write-up's Coder experiment (../shared/seeds/001_*.txt) on a kind cluster with a real kubelet, with kf-culler
deciding: a real Coder v2.36.0 server whose provisioner runs Terraform with hashicorp/kubernetes against the
cluster (support/coder_kind.py: how Terraform reaches the cluster, what is not reproduced and why), a template in
the shape of Coder's upstream Kubernetes template (tests/data/coder-kubernetes/main.tf), one node advertising one
fake `nvidia.com/gpu` (its status patched; there is no GPU here).

User A's workspace holds the GPU; user B's is started after it: its start build succeeds and Coder says `running`
while its pod waits, Pending for the GPU (`wait_for_rollout = false`). kf-culler (`targets: [coder]`, in-process,
an Owner's API token, `gpuWithoutMetrics: ide-only` since no GPU metrics exist here) counts B `starting` and stops
A, idle, through a stop build: Terraform deletes A's Deployment (count = start_count = 0) and keeps its home PVC,
and B's pod gets the GPU and becomes Ready. A, started again by its user, waits for the GPU; once B is stopped by
its user, A runs again with its home file and without its /tmp file.

What is asserted is the behaviour, never a time; the time from the culler's stop build to B's pod Ready is printed
(bench/coder_kind_handoff.py measures it over several runs; docs/performance.md).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from need import missing
from support.coder_kind import (
    HOME,
    CoderOnKind,
    check_components,
    coder_on_kind,
    end_pair,
    hand_off,
    ready,
    start_pair,
    waiting_for_gpu,
)
from support.kind import Kind
from support.kind_culler import fake_gpu, get, wait_for

from kf_culler.local.coder import CoderUnavailable
from kf_culler.plan import EVENT_STOP


@pytest.fixture(scope="module")
def coder(kind: Kind, tmp_path_factory: pytest.TempPathFactory) -> Iterator[CoderOnKind]:
    try:
        check_components()
    except CoderUnavailable as why:
        missing("Coder with Terraform's Kubernetes provider", why)
    with coder_on_kind(kind, tmp_path_factory.mktemp("coder-kind")) as c:
        yield c


def test_the_culler_stops_the_idle_gpu_workspace_through_a_stop_build_and_the_waiting_one_gets_the_gpu(
        kind: Kind, coder: CoderOnKind) -> None:
    c, ns = coder, coder.namespace
    usera, userb = c.coder.create_member("usera"), c.coder.create_member("userb")
    idle, waiting = (usera, "ws-a"), (userb, "ws-b")
    with fake_gpu(kind):
        a, b = start_pair(c, idle, waiting)
        try:
            # B's start build succeeded and Coder counts it running, though its pod has no GPU
            assert c.latest_build(b)["status"] == "running"
            assert c.latest_build(b)["transition"] == "start"
            with c.culler() as runner:  # its passes end with the stop: B, Running now, is idle too
                handoff = hand_off(c, runner, idle, waiting, a, b)
            print(f"\nthe culler's stop build to ws-b's pod Ready: {handoff.seconds:.1f} s (Ready to the second); "
                  f"the pass returning to Ready seen: {handoff.watched:.2f} s")
            stop = handoff.stop
            assert stop.verdict.state == "idle" and stop.verdict.rule_id == "10-idle", stop.verdict
            assert stop.write is not None and stop.write.outcome == "patched", stop.write

            # the stop build: made by the culler's Owner token, Terraform deleted the Deployment, kept the PVC
            build = c.coder.wait_job(f"/api/v2/workspacebuilds/{c.latest_build(a)['id']}", 300)
            assert build["transition"] == "stop" and build["initiator_name"] == c.culler_user, build
            assert c.latest_build(a)["status"] == "stopped"
            assert c.deployments(a) == [] and not c.pods(a)
            assert c.claim(*idle)["status"]["phase"] == "Bound"
            # B got the GPU; nothing of B was written
            pod_b = c.pod(b)
            assert ready(pod_b) and pod_b["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "1"
            assert c.latest_build(b)["transition"] == "start"
            assert c.deployments(b) == ["coder-userb-ws-b"]
            # the reason, on A's Deployment (an Event outlives it)
            events = [e for e in get(kind, "events", "-n", ns).get("items", []) if e["reason"] == EVENT_STOP]
            assert [(e["involvedObject"]["kind"], e["involvedObject"]["name"]) for e in events] == [
                ("Deployment", "coder-usera-ws-a")], events
            assert "idle" in events[0]["message"].lower()

            # A's user starts it again: the GPU is B's now, so its pod waits (its build says running)
            again = c.build(a, "start", token=usera.token)
            assert again["transition"] == "start" and again["initiator_name"] == "usera"
            wait_for("ws-a's pod to wait for the GPU", lambda: waiting_for_gpu(c.pod(a)), 120)
            # B's user stops it: A gets the GPU, with its home as it was and a fresh /tmp
            c.build(b, "stop", token=userb.token)
            wait_for("ws-a's pod Ready again", lambda: ready(c.pod(a)), 300)
            pod = c.pod(a)["metadata"]["name"]
            assert kind.kubectl("exec", "-n", ns, pod, "--", "cat", f"{HOME}/keep.txt").strip() == "keep"
            assert "gone.txt" not in kind.kubectl("exec", "-n", ns, pod, "--", "ls", "-A", "/tmp").split()
            assert c.claim(*waiting)["status"]["phase"] == "Bound" and c.deployments(b) == []
        finally:
            end_pair(c, [a, b])
