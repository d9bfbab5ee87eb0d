"""`kf-culler demo --gpu`: an idle notebook's GPU goes to the notebook waiting for it.

Everything but the culler is upstream code on a local cluster: kube-apiserver, kube-controller-manager,
kube-scheduler, kwok (playing one node with `nvidia.com/gpu: 1`) and Kubeflow's notebook-controller
with its own culling off. See kf_culler.local.handoff for the scenario.
"""

from __future__ import annotations

import time
from typing import Protocol, TextIO

from kf_culler.local.cluster import GPU_NODE, ClusterError, LocalCluster, NotebookControllerUnavailable
from kf_culler.local.handoff import GpuHandoff, PodView, ScenarioError, Unavailable, open_full_cluster
from kf_culler.model import STOP_ANNOTATION
from kf_culler.plan import EVENT_STOP
from kf_culler.report import table


class _Say(Protocol):
    def __call__(self, text: str = "") -> None: ...


def _pods(views: list[PodView]) -> str:
    rows = [["POD", "PHASE", "NODE", "GPUS", "SCHEDULER"]]
    for v in views:
        why = v.unschedulable.split(" preemption:")[0]  # the scheduler's first sentence says it
        rows.append([v.name, v.phase if v.exists else "(gone)", v.node or "-", str(v.gpus) if v.exists else "-",
                     why])
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    return "\n".join("   " + "   ".join(c.ljust(w) for c, w in zip(r[:-1], widths, strict=True)) + "   " + r[-1]
                     for r in rows)


def run_gpu_demo(out: TextIO, idle_minutes: float = 0.1) -> int:
    """Tell the GPU handoff story on `out`. 0 when it ran to the end, 1 when it could not run here."""

    def say(text: str = "") -> None:
        print(text, file=out, flush=True)

    say("kf-culler demo --gpu: stopping an idle notebook hands its GPU to the one waiting for it")
    say()
    say("1. Starting a local cluster built from upstream: kube-apiserver, kube-controller-manager,")
    say(f"   kube-scheduler, and kwok playing one node, {GPU_NODE}, with nvidia.com/gpu: 1 ...")
    t0 = time.monotonic()
    try:
        with open_full_cluster(quiet=False) as cluster:
            say(f"   ready in {time.monotonic() - t0:.1f} s ({cluster.server}).")
            say("2. Starting Kubeflow's notebook-controller (ENABLE_CULLING=false: only kf-culler culls) ...")
            try:
                cluster.start_notebook_controller()
            except NotebookControllerUnavailable as why:
                say("   Kubeflow's notebook-controller is not available here, so the handoff cannot be shown:")
                say(f"   {why}")
                return 1
            say("   running.")
            return _story(cluster, say, idle_minutes)
    except Unavailable as why:
        say(f"   cannot start the local cluster here: {why}")
        return 1
    except (ScenarioError, ClusterError) as err:
        say(f"   the demo stopped: {err}")
        return 1


def _story(cluster: LocalCluster, say: _Say, idle_minutes: float) -> int:
    with GpuHandoff(cluster, idle_minutes=idle_minutes) as s:
        say(f"3. In namespace {s.namespace}: Notebook a asks for 1 GPU; its Jupyter server is idle.")
        say("   Then Notebook b asks for 1 GPU; its Jupyter server runs a kernel that is busy.")
        s.setup()
        say(_pods([s.pod("a-0"), s.pod("b-0")]))
        say("   b waits: the only GPU is a's. The node has no GPU: a dcgm-exporter-shaped endpoint reports")
        say("   a's GPU idle (0 % utilisation, 0 MiB) and a real Prometheus scrapes it for the culler.")
        say(f"   Idle limit {idle_minutes * 60:g} s, no warning step; the culler runs a pass a second.")
        say()
        stop = s.cull_a()
        verdict = stop.result.verdict
        passes = f"{stop.cycles} pass" + ("es" if stop.cycles != 1 else "")
        say(f"4. After {passes} the culler decides to stop a (rule {verdict.rule_id}):")
        say("\n".join("   " + line for line in table(stop.cycle).splitlines()))
        gpu = verdict.evidence.get("gpu") or {}
        latest = gpu.get("latest") or {}
        say(f"   a's GPU evidence: {gpu.get('samples')} samples from Prometheus, the latest "
            f"{latest.get('utilPercent')} % and {latest.get('memoryUsedMiB')} MiB.")
        say()
        say(f"5. a is stopped: {verdict.reason}")
        ann = s.notebook("a")["metadata"].get("annotations") or {}
        say(f"   {STOP_ANNOTATION}: {ann.get(STOP_ANNOTATION)!r}  (a JSON merge patch; Event {EVENT_STOP} on a)")
        times = s.wait_handoff(stop)
        say()
        say("6. The handoff, each step by upstream code, timed from the culler's decision:")
        for line in times.lines():
            say(" " + line)
        say(_pods([s.pod("a-0"), s.pod("b-0")]))
        say(f"   b is Running on {GPU_NODE} {times.pod_b_running:.2f} s after the decision to stop a.")
        say("   (kwok ends a pod at once; a real kubelet first gives its containers up to their grace")
        say("   period, 30 s by default, to exit.)")
        say()
        say("7. The user starts a again, as the Jupyter web app does (the stop annotation is removed):")
        s.start_a_again()
        s.wait("A's StatefulSet back at 1 replica", lambda: s.replicas("a") == 1)
        s.wait_pending_for_gpu("a")
        say(_pods([s.pod("a-0"), s.pod("b-0")]))
        result = s.cycle()
        again = s.verdict_of(result, "a")
        if again is not None:
            say(f"   The culler keeps a while it waits ({again.verdict.state}): {again.verdict.reason}")
        say()
        say("Done: a was stopped through kubeflow-resource-stopped, with its reason on the notebook and in an")
        say("Event, and its GPU went to b, which was waiting for it.")
    return 0
