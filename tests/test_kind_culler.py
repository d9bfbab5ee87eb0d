"""kf-culler as pods, from its image, on a kind cluster with a real kubelet (the session's `kind` fixture,
hack/kind/build.sh; docs/kind.md), judging Kubeflow Notebooks with real Jupyter pods.

What runs: the rendered `kustomize/overlays/kubeflow`, applied as an admin would apply it through an overlay of their
own (docs/install.md, "Overlays": the namespace the test chose, a `config.yaml` of their own merged into the
ConfigMap, the image taken from the node); Kubeflow's notebook-controller v1.11.0 from upstream's own standalone
kustomization (its CRD, RBAC and Deployment, USE_ISTIO=false, ENABLE_CULLING=false) in Kubeflow's namespace, with the
image built from the vendored source; Notebooks whose pods run a Jupyter image
built here (Debian, JupyterLab from PyPI, Kubeflow's `jupyter lab` command line). hack/kind/images.sh builds the
three images; nothing is pulled.

What is left out of the overlay, and why: the Istio component's AuthorizationPolicy and DestinationRule (no Istio
here: their CRDs are absent and the API server refuses them). Its NetworkPolicies are applied, but the cluster's
static bridge CNI does not enforce NetworkPolicies, so nothing here shows them holding.

The configuration is the shipped base/config.yaml with shorter times (idle after 2 minutes, warned a minute
before, no start-up grace, a pass every 5 s) so that a stop happens within the test. The culler probes each
notebook at the shipped `urls.jupyter` template, i.e. through the Service the notebook-controller made, at its
ClusterIP (`probe.serviceClusterIP`).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from support.kind import Kind
from support.kind_culler import (
    NBC_DEPLOYMENT,
    NBC_NAMESPACE,
    ROOT,
    Culler,
    Images,
    deployed_culler,
    events,
    get,
    kernels,
    notebook_controller,
    ready,
    start_kernel,
    wait_for,
)

from kf_culler.model import REASON_ANNOTATION, STATE_ANNOTATION, STOP_ANNOTATION, STOPPED_BY_ANNOTATION
from kf_culler.plan import EVENT_RESTART, EVENT_STOP, EVENT_WARN

# Idle for 2 minutes is a stop, 1 minute a warning: room for a loaded machine to start the kernels after the servers
# answer (the busy cell must run before its notebook's idle limit is reached).
CONFIG = {"idleMinutes": 2, "warnMinutes": 1, "startupGraceMinutes": 0, "checkPeriodSeconds": 5}
BUSY_CELL = "import time; time.sleep(3600)"


@pytest.fixture(scope="module")
def controller(kind: Kind, kind_images: Images, tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    with notebook_controller(kind, tmp_path_factory.mktemp("nbc"), kind_images.notebook_controller):
        yield


@pytest.fixture(scope="module")
def notebooks_ns(kind: Kind) -> Iterator[str]:
    name = f"kf-nb-{uuid.uuid4().hex[:6]}"
    kind.kubectl("create", "namespace", name)
    yield name
    kind.kubectl("delete", "namespace", name, "--wait=true", "--timeout=180s")


@pytest.fixture(scope="module")
def culler(kind: Kind, kind_images: Images, controller: None, notebooks_ns: str,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[Culler]:
    config = {**CONFIG, "namespaces": {"include": [notebooks_ns], "exclude": []}}
    with deployed_culler(kind, tmp_path_factory.mktemp("culler"), config) as c:
        yield c


def notebook(namespace: str, name: str, image: str) -> dict[str, Any]:
    return {"apiVersion": "kubeflow.org/v1", "kind": "Notebook", "metadata": {"name": name, "namespace": namespace},
            "spec": {"template": {"spec": {"containers": [{
                "name": name, "image": image, "imagePullPolicy": "Never",
                "resources": {"requests": {"cpu": "50m", "memory": "128Mi"}}}]}}}}


def annotations(kind: Kind, namespace: str, name: str) -> dict[str, str]:
    return dict(get(kind, "notebook", "-n", namespace, name)["metadata"].get("annotations") or {})


def pod(kind: Kind, namespace: str, name: str) -> dict[str, Any]:
    found = get(kind, "pod", "-n", namespace, name)
    return {} if found.get("metadata", {}).get("deletionTimestamp") else found


def test_the_culler_pods_are_ready_elect_one_leader_and_cannot_write_their_root(
        kind: Kind, kind_images: Images, culler: Culler) -> None:
    """Two replicas, both Ready through their real readiness probe (/readyz: caches synced, passes completing), none
    restarted by its liveness probe (/healthz); one Lease holder among them; the pod's securityContext as rendered,
    and inside it a write to / fails while /tmp (its emptyDir) takes one."""
    pods = culler.wait_ready(2)
    rendered = culler.deployment["spec"]["template"]["spec"]
    (rendered_container,) = rendered["containers"]
    assert rendered_container["image"] == kind_images.culler  # the image built here, taken from the node
    leader = wait_for("a Lease holder", culler.leader, 120)
    assert leader in pods
    for name in pods:
        live = get(kind, "pod", "-n", culler.namespace, name)
        (container,) = live["spec"]["containers"]
        assert live["spec"]["securityContext"] == rendered["securityContext"]
        assert container["securityContext"] == rendered_container["securityContext"]
        assert container["securityContext"]["readOnlyRootFilesystem"] is True
        assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
        assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
        (status,) = live["status"]["containerStatuses"]
        assert status["ready"] is True and status["restartCount"] == 0, status
        # The probes' endpoints at the pod's address, through the API server's proxy, as the kubelet reaches them.
        for path in ("healthz", "readyz"):
            kind.kubectl("get", "--raw", f"/api/v1/namespaces/{culler.namespace}/pods/{name}:9090/proxy/{path}")
        uid = kind.kubectl("exec", "-n", culler.namespace, name, "--", "python3", "-c",
                           "import os; print(os.getuid(), os.getgid())")
        assert uid.split() == [str(rendered["securityContext"]["runAsUser"]),
                               str(rendered["securityContext"]["runAsGroup"])]
        with pytest.raises(AssertionError, match="Read-only file system"):
            kind.kubectl("exec", "-n", culler.namespace, name, "--", "python3", "-c", "open('/kf-culler-probe', 'w')")
        kind.kubectl("exec", "-n", culler.namespace, name, "--", "python3", "-c",
                     "open('/tmp/kf-culler-probe', 'w').write('ok')")
    followers = [p for p in pods if p != leader]
    assert len(followers) == 1
    assert culler.leader() == leader  # one holder, kept


def test_idle_notebook_warned_then_stopped_busy_kept_restart_honoured_across_a_leader_change(
        kind: Kind, kind_images: Images, culler: Culler, notebooks_ns: str) -> None:
    """Two Notebooks with real Jupyter pods: `nb-idle` with a kernel opened and left, `nb-busy` with a kernel running a
    long cell. The leader pod is deleted while they run; the other replica takes the Lease and goes on judging: it
    warns nb-idle, then stops it (Events, the culler's annotations, kubeflow-resource-stopped) and the
    notebook-controller scales its StatefulSet to 0 (the pod goes); nb-busy is kept. The user then removes
    kubeflow-resource-stopped: the controller starts the notebook again, the culler records the restart and does
    not stop it again at once."""
    ns = notebooks_ns
    pods = culler.wait_ready(2)
    for name in ("nb-idle", "nb-busy"):
        kind.kubectl("apply", "-f", "-", stdin=json.dumps(notebook(ns, name, kind_images.jupyterlab)))
    for name in ("nb-idle", "nb-busy"):
        wait_for(f"pod {name}-0 Ready", lambda n=name: ready(pod(kind, ns, f"{n}-0")), 300)
        service = get(kind, "service", "-n", ns, name)
        assert service and service["spec"]["ports"][0]["port"] == 80  # the controller's, probed at its ClusterIP
    prefix = {name: f"/notebook/{ns}/{name}" for name in ("nb-idle", "nb-busy")}

    def kernel(name: str, code: str = "") -> str | None:
        try:
            return start_kernel(kind, ns, f"{name}-0", prefix[name], code)
        except AssertionError:  # the server is still starting
            return None

    busy_kernel = wait_for("a kernel running a cell in nb-busy", lambda: kernel("nb-busy", BUSY_CELL), 120, 2)
    wait_for("a kernel opened in nb-idle", lambda: kernel("nb-idle"), 120, 2)
    assert [k["execution_state"] for k in kernels(kind, ns, "nb-busy-0", prefix["nb-busy"])] == ["busy"]

    # The leader goes; the other replica takes the Lease over.
    old_leader = wait_for("a Lease holder", culler.leader, 120)
    assert old_leader in pods, (old_leader, pods)
    kind.kubectl("delete", "pod", "-n", culler.namespace, old_leader, "--wait=false")
    new_leader = wait_for("another Lease holder", lambda: (h := culler.leader()) not in (None, old_leader) and h, 120)
    # The other replica, or the pod the Deployment made in the deleted one's place: whichever asked first once the
    # Lease expired (both are live culler pods; the deleted leader never holds it again).
    assert new_leader in [p["metadata"]["name"] for p in culler.pods()], new_leader

    # nb-idle: warned, then stopped with its reason, by the new leader; the controller scales it to 0.
    assert wait_for("the warning", lambda: events(kind, ns, "Notebook", "nb-idle", EVENT_WARN), 180)
    stopped = wait_for("the stop", lambda: events(kind, ns, "Notebook", "nb-idle", EVENT_STOP), 180)
    assert len(stopped) == 1 and stopped[0]["reportingInstance"] == new_leader, stopped
    ann = annotations(kind, ns, "nb-idle")
    assert STOP_ANNOTATION in ann and ann[STOPPED_BY_ANNOTATION] == "kf-culler", ann
    assert ann[STATE_ANNOTATION] == "idle" and "idle" in ann[REASON_ANNOTATION].lower(), ann
    wait_for("nb-idle's StatefulSet at 0 replicas",
             lambda: get(kind, "statefulset", "-n", ns, "nb-idle")["spec"]["replicas"] == 0, 120)
    wait_for("nb-idle's pod to be gone", lambda: not get(kind, "pod", "-n", ns, "nb-idle-0"), 180)

    # nb-busy: past the same idle limit, kept: no warning, no stop, its pod and its cell still running.
    busy_ann = annotations(kind, ns, "nb-busy")
    assert STOP_ANNOTATION not in busy_ann, busy_ann
    assert not events(kind, ns, "Notebook", "nb-busy", EVENT_WARN)
    assert not events(kind, ns, "Notebook", "nb-busy", EVENT_STOP)
    assert ready(pod(kind, ns, "nb-busy-0"))
    assert [(k["id"], k["execution_state"]) for k in kernels(kind, ns, "nb-busy-0", prefix["nb-busy"])] == [
        (busy_kernel, "busy")]

    # The user starts nb-idle again by removing the stop annotation (as Kubeflow's web app does).
    kind.kubectl("annotate", "notebook", "-n", ns, "nb-idle", f"{STOP_ANNOTATION}-")
    wait_for("nb-idle's pod Ready again", lambda: ready(pod(kind, ns, "nb-idle-0")), 300)
    wait_for("the restart recorded", lambda: events(kind, ns, "Notebook", "nb-idle", EVENT_RESTART), 120)
    seen = culler.passes(new_leader)
    wait_for("two more passes of the leader", lambda: culler.passes(new_leader) >= seen + 2, 60, 1)
    assert STOP_ANNOTATION not in annotations(kind, ns, "nb-idle")
    assert len(events(kind, ns, "Notebook", "nb-idle", EVENT_STOP)) == 1
    assert ready(pod(kind, ns, "nb-idle-0"))


def test_the_builtin_culling_off_patch_applies_to_upstreams_deployment(kind: Kind, controller: None) -> None:
    """docs/install.md's `kubectl patch` with `overlays/kubeflow/builtin-culling-off`, on the notebook-controller
    Deployment upstream's kustomization renders (ENABLE_CULLING from its ConfigMap by `valueFrom`): accepted, and
    the controller rolls out with ENABLE_CULLING=false."""
    patch = ROOT / "kustomize" / "overlays" / "kubeflow" / "builtin-culling-off" / "notebook-controller-env.yaml"
    kind.kubectl("patch", "-n", NBC_NAMESPACE, "deployment", NBC_DEPLOYMENT, "--patch-file", str(patch))
    kind.kubectl("rollout", "status", "-n", NBC_NAMESPACE, f"deployment/{NBC_DEPLOYMENT}", "--timeout=300s")
    deployment = get(kind, "deployment", "-n", NBC_NAMESPACE, NBC_DEPLOYMENT)
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    (env,) = [e for e in container["env"] if e["name"] == "ENABLE_CULLING"]
    assert env == {"name": "ENABLE_CULLING", "value": "false"}  # upstream's valueFrom gone
    pods = get(kind, "pods", "-n", NBC_NAMESPACE)["items"]
    assert [p["spec"]["containers"][0]["env"] for p in pods if not p["metadata"].get("deletionTimestamp")
            and ready(p)] == [container["env"]]  # the controller restarted with it
