"""The write-up's local experiment (../shared/seeds/000_*.txt) on a kind cluster with a real kubelet, the culler
running as pods from its image: one node with one GPU, two sessions (Deployments, each with a home PVC), the idle one
holding the GPU and the other waiting for it; kf-culler scales the idle one to 0 and the waiting one gets the GPU.

There is no GPU on this machine: the node advertises one `nvidia.com/gpu` because the test patches its status
(capacity and allocatable), as the write-up did. The scheduler counts it like a device plugin's; nothing is attached
to a container. The culler is the rendered kubeflow overlay with `components/workloads` (docs/targets.md, "plain
workloads"), applied as tests/test_kind_culler.py applies it (support/kind_culler.py): its config.yaml is the
shipped one with `targets: [workloads]` (no Kubeflow on this cluster), short times and `gpuWithoutMetrics: ide-only`
(no GPU metrics exist here; the shipped `keep` never stops a GPU session without them).

What is asserted is the behaviour, never a time: the idle session scaled to 0 with its reason, its home claim kept;
the waiting session Ready on the freed GPU; the stopped session, scaled up again by its user, waiting for the GPU
(Pending, Unschedulable); and once the GPU is free again, its home file still there and its /tmp empty. The time
from the culler's stop to the waiting pod Ready is printed; bench/kind_handoff.py measures it over several runs
(docs/performance.md).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from support.kind import Kind
from support.kind_culler import (
    Culler,
    Images,
    deployed_culler,
    fake_gpu,
    get,
    ready,
    wait_for,
)
from support.kind_sessions import (
    CONFIG,
    HOME,
    end_sessions,
    hand_off,
    session_pod,
    start_sessions,
    waiting_for_gpu,
)

from kf_culler.model import REASON_ANNOTATION, STOPPED_BY_ANNOTATION
from kf_culler.targets import REPLICAS_BEFORE_ANNOTATION


@pytest.fixture(scope="module")
def sessions_ns(kind: Kind) -> Iterator[str]:
    name = f"kf-sessions-{uuid.uuid4().hex[:6]}"
    kind.kubectl("create", "namespace", name)
    yield name
    kind.kubectl("delete", "namespace", name, "--wait=true", "--timeout=180s")


@pytest.fixture(scope="module")
def culler(kind: Kind, kind_images: Images, sessions_ns: str,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[Culler]:
    config = {**CONFIG, "namespaces": {"include": [sessions_ns], "exclude": []}}
    with deployed_culler(kind, tmp_path_factory.mktemp("culler"), config, ("workloads",)) as c:
        c.wait_ready(2)
        yield c


def test_the_idle_session_is_scaled_to_zero_and_the_waiting_one_gets_the_gpu(
        kind: Kind, kind_images: Images, culler: Culler, sessions_ns: str) -> None:
    ns = sessions_ns
    with fake_gpu(kind):
        try:
            start_sessions(kind, ns, kind_images.jupyterlab, "a", "b")
            handoff = hand_off(kind, kind.api_client(), ns, "a", "b")
            print(f"\nthe culler's stop Event to b Ready: {handoff.seconds:.0f} s (to the second); "
                  f"a at 0 replicas to b Ready, watched: {handoff.watched:.2f} s")

            a = get(kind, "deployment", "-n", ns, "a")
            ann = a["metadata"].get("annotations") or {}
            assert a["spec"]["replicas"] == 0
            assert ann[REPLICAS_BEFORE_ANNOTATION] == "1" and ann[STOPPED_BY_ANNOTATION] == "kf-culler", ann
            assert "idle" in ann[REASON_ANNOTATION].lower(), ann
            assert not session_pod(kind, ns, "a")  # the pod is gone ...
            assert get(kind, "pvc", "-n", ns, "a-home")["status"]["phase"] == "Bound"  # ... its home stays

            # Its user scales it up again: the GPU is b's now, so it waits.
            kind.kubectl("scale", "-n", ns, "deployment/a", "--replicas=1")
            wait_for("a to wait for the GPU", lambda: waiting_for_gpu(session_pod(kind, ns, "a")), 120)
            # b ends (its user stops it): a gets the GPU, with its home as it was and a fresh /tmp.
            kind.kubectl("scale", "-n", ns, "deployment/b", "--replicas=0")
            wait_for("a Ready again", lambda: ready(session_pod(kind, ns, "a")), 300)
            pod = session_pod(kind, ns, "a")["metadata"]["name"]
            assert kind.kubectl("exec", "-n", ns, pod, "--", "cat", f"{HOME}/keep.txt").strip() == "keep"
            assert "gone.txt" not in kind.kubectl("exec", "-n", ns, pod, "--", "ls", "-A", "/tmp").split()
        finally:
            end_sessions(kind, ns, ["a", "b"])
