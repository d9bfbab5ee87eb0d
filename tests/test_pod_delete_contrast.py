"""Why the culler stops through the annotation: deleting a notebook's pod frees no GPU.

On the local control plane in "full" mode (kube-controller-manager, kube-scheduler, kwok playing a
node with one nvidia.com/gpu): A holds the GPU, B waits for it. Deleting A's pod makes the StatefulSet
controller create a new A pod at once, with the same GPU request, so two pods still ask for one GPU.
Setting the StatefulSet to 0 replicas (what the notebook-controller does for a stopped notebook)
removes the request and B gets the GPU.

The "statefulset" variant creates StatefulSets of the notebook-controller's shape directly and needs
no notebook-controller; the "notebook" variant goes through Notebooks and Kubeflow's controller.
"""

from __future__ import annotations

import pytest
from need import missing

from kf_culler.local.cluster import GPU_NODE, LocalCluster, NotebookControllerUnavailable
from kf_culler.local.handoff import (
    INSUFFICIENT_GPU,
    GpuHandoff,
    PodView,
    start_controller,
)
from kf_culler.model import STOP_ANNOTATION

pytestmark = [pytest.mark.slow, pytest.mark.cluster]


@pytest.fixture()
def cluster(full_cluster: LocalCluster) -> LocalCluster:
    """The session's full cluster (tests/conftest.py)."""
    return full_cluster


@pytest.fixture(params=["statefulset", "notebook"])
def via(request: pytest.FixtureRequest, cluster: LocalCluster) -> str:
    if request.param == "notebook" and "notebook-controller" not in cluster.procs:
        try:
            start_controller(cluster)
        except NotebookControllerUnavailable as why:
            missing("Kubeflow's notebook-controller", why)
    return str(request.param)


def _holder_and_waiter(s: GpuHandoff) -> tuple[PodView, PodView] | None:
    """(the pod on the GPU node, the pod Pending for want of a GPU), once the scheduler has settled."""
    a, b = s.pod("a-0"), s.pod("b-0")
    for holder, waiter in ((a, b), (b, a)):
        if holder.phase == "Running" and holder.node == GPU_NODE and waiter.exists and \
                waiter.phase == "Pending" and not waiter.node and INSUFFICIENT_GPU in waiter.unschedulable:
            return holder, waiter
    return None


def test_deleting_the_pod_keeps_the_gpu_request(cluster: LocalCluster, via: str) -> None:
    with GpuHandoff(cluster) as s:
        a, _ = s.setup(via=via, culler=False)
        old_uid = s.delete_pod("a-0")
        assert old_uid == a.uid

        # A new A pod replaces the deleted one, asking for the same GPU.
        s.wait("a new pod a-0", lambda: (p := s.pod("a-0")).exists and p.uid != old_uid and
               (p.node == GPU_NODE or INSUFFICIENT_GPU in p.unschedulable), seen=lambda: repr(s.pod("a-0")))
        new_a = s.pod("a-0")
        assert new_a.gpus == 1
        assert s.replicas("a") == 1
        if via == "notebook":
            assert STOP_ANNOTATION not in (s.notebook("a")["metadata"].get("annotations") or {})

        # Two pods still ask for the one GPU: one holds it (either may win the race), one waits.
        settled: list[tuple[PodView, PodView]] = []

        def settle() -> bool:
            found = _holder_and_waiter(s)
            if found is not None:
                settled.append(found)
            return found is not None

        s.wait("one pod on the GPU and one Pending for it", settle,
               seen=lambda: f"a-0 {s.pod('a-0')!r}, b-0 {s.pod('b-0')!r}")
        holder, waiter = settled[-1]
        assert {holder.name, waiter.name} == {"a-0", "b-0"}
        assert holder.gpus == waiter.gpus == 1


def test_scaling_to_zero_frees_the_gpu(cluster: LocalCluster) -> None:
    """The other half of the contrast, below the notebook-controller: replicas 0 hands the GPU on."""
    with GpuHandoff(cluster) as s:
        _, b = s.setup(via="statefulset", culler=False)
        s.scale("a", 0)
        s.wait("pod a-0 gone", lambda: not s.pod("a-0").exists, seen=lambda: repr(s.pod("a-0")))
        s.wait("pod b-0 Running on the GPU node",
               lambda: (p := s.pod("b-0")).phase == "Running" and p.node == GPU_NODE,
               seen=lambda: repr(s.pod("b-0")))
        assert s.pod("b-0").uid == b.uid
        assert not s.pod("a-0").exists
