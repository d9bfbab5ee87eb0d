"""The write-up's sessions on kind (../shared/seeds/000_*.txt, "로컬 실험"): a session is a Deployment of one pod
(strategy Recreate) with one nvidia.com/gpu, a home PersistentVolumeClaim, /tmp on an emptyDir and a Service; the
node advertises one fake GPU. kf-culler, as pods (`components/workloads`), scales the idle session to 0 and the
scheduler gives the GPU to the waiting one. Used by tests/test_kind_handoff.py and bench/kind_handoff.py.

The session's IDE is the Jupyter image of hack/kind/images.sh at base URL `/` (the write-up's was code-server, which
is not built here), ready when its port answers (a tcpSocket readiness probe every second, as the write-up's
session.yaml: an HTTP probe would count as activity). The home volume is a hostPath PersistentVolume on the node, in
a directory a helper pod makes writable first, as kind's local-path provisioner does.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from kf_culler.plan import EVENT_STOP
from kf_culler.timeutil import parse_time
from support.kind import Kind
from support.kind_culler import GPU, apply, condition, get, ready, wait_for

SESSION_LABEL = "sessions.example.com/reclaim"  # components/workloads' selector, as shipped
HOME = "/home/jovyan"
VOLUMES = "/var/local/kf-sessions"
# The admin's changes to base/config.yaml: plain workloads only (a cluster without Kubeflow: no Notebook CRD),
# short times so that a stop comes within a run, and GPU sessions judged by their IDE (no GPU metrics exist here;
# with the shipped `gpuWithoutMetrics: keep` a GPU session is never stopped).
CONFIG = {"targets": ["workloads"], "idleMinutes": 0.75, "warnMinutes": 0, "startupGraceMinutes": 0,
          "checkPeriodSeconds": 2, "gpuWithoutMetrics": "ide-only"}


def session(namespace: str, name: str, image: str, labelled: bool) -> list[dict[str, Any]]:
    """A session's objects: its PersistentVolume and claim, Deployment and Service."""
    pv = f"{namespace}-{name}"
    gpu = {GPU: "1"}
    return [
        {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": pv},
         "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"], "storageClassName": "standard",
                  "persistentVolumeReclaimPolicy": "Retain",
                  "hostPath": {"path": f"{VOLUMES}/{pv}", "type": "Directory"},
                  "claimRef": {"namespace": namespace, "name": f"{name}-home"}}},
        {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
         "metadata": {"name": f"{name}-home", "namespace": namespace},
         "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "standard", "volumeName": pv,
                  "resources": {"requests": {"storage": "1Gi"}}}},
        {"apiVersion": "apps/v1", "kind": "Deployment",
         "metadata": {"name": name, "namespace": namespace, "labels": {SESSION_LABEL: "true"} if labelled else {}},
         "spec": {"replicas": 1, "strategy": {"type": "Recreate"}, "selector": {"matchLabels": {"session": name}},
                  "template": {"metadata": {"labels": {"session": name}}, "spec": {
                      "containers": [{
                          "name": "ide", "image": image, "imagePullPolicy": "Never",
                          "ports": [{"containerPort": 8888}],
                          "readinessProbe": {"tcpSocket": {"port": 8888}, "periodSeconds": 1},
                          "resources": {"requests": {"cpu": "50m", "memory": "128Mi", **gpu}, "limits": gpu},
                          "volumeMounts": [{"name": "home", "mountPath": HOME}, {"name": "tmp", "mountPath": "/tmp"}]}],
                      "volumes": [{"name": "home", "persistentVolumeClaim": {"claimName": f"{name}-home"}},
                                  {"name": "tmp", "emptyDir": {}}]}}}},
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "namespace": namespace},
         "spec": {"selector": {"session": name}, "ports": [{"port": 80, "targetPort": 8888}]}},
    ]


def prepare_volumes(kind: Kind, namespace: str, names: list[str]) -> None:
    """The home directories on the node, writable by the session's user (a helper pod, root, the tools image)."""
    dirs = " ".join(f"/v/{namespace}-{n}" for n in names)
    helper = f"volumes-{int(time.time() * 1000) % 10**8}"
    apply(kind, [{"apiVersion": "v1", "kind": "Pod", "metadata": {"name": helper, "namespace": namespace}, "spec": {
        "restartPolicy": "Never", "terminationGracePeriodSeconds": 0,
        "containers": [{"name": "mkdir", "image": kind.backend.tools_image, "imagePullPolicy": "Never",
                        "command": ["sh", "-c", f"mkdir -p {dirs} && chmod 0777 {dirs}"],
                        "volumeMounts": [{"name": "v", "mountPath": "/v"}]}],
        "volumes": [{"name": "v", "hostPath": {"path": VOLUMES, "type": "DirectoryOrCreate"}}]}}])
    wait_for("the volume helper to finish",
             lambda: get(kind, "pod", "-n", namespace, helper).get("status", {}).get("phase") == "Succeeded", 120)
    kind.kubectl("delete", "pod", "-n", namespace, helper, "--wait=false")


def session_pod(kind: Kind, namespace: str, name: str) -> dict[str, Any]:
    """The session's pod that is not being deleted, or {}."""
    items = get(kind, "pods", "-n", namespace, "-l", f"session={name}").get("items", [])
    live = [p for p in items if not p["metadata"].get("deletionTimestamp")]
    assert len(live) <= 1, [p["metadata"]["name"] for p in live]
    return live[0] if live else {}


def waiting_for_gpu(pod: dict[str, Any]) -> bool:
    """Pending, not scheduled for want of a GPU."""
    c = condition(pod, "PodScheduled")
    return bool(pod) and pod["status"].get("phase") == "Pending" and c is not None and c["status"] == "False" \
        and c.get("reason") == "Unschedulable" and f"Insufficient {GPU}" in c.get("message", "")


@dataclass(frozen=True)
class Handoff:
    """One hand-off. `stopped`: the culler's stop Event's timestamp; `ready`: the waiting session's pod's Ready
    condition's lastTransitionTime (both to the second, as the API gives them). `watched`: seconds from the test
    seeing the idle Deployment at 0 replicas to seeing the waiting pod Ready, polling every 0.1 s."""

    stopped: datetime
    ready: datetime
    watched: float

    @property
    def seconds(self) -> float:
        return (self.ready - self.stopped).total_seconds()


def start_sessions(kind: Kind, namespace: str, image: str, idle: str, waiting: str) -> None:
    """The idle session running on the GPU with a file in its home and one in /tmp; the waiting one Pending for the
    GPU."""
    prepare_volumes(kind, namespace, [idle, waiting])
    apply(kind, session(namespace, idle, image, labelled=True))
    wait_for(f"session {idle} Ready", lambda: ready(session_pod(kind, namespace, idle)), 300, 0.5)
    pod = session_pod(kind, namespace, idle)["metadata"]["name"]
    kind.kubectl("exec", "-n", namespace, pod, "--", "sh", "-c",
                 f"echo keep > {HOME}/keep.txt && echo gone > /tmp/gone.txt")
    # Not a session of the culler's (no label): the run decides when it ends.
    apply(kind, session(namespace, waiting, image, labelled=False))
    wait_for(f"session {waiting} to wait for the GPU", lambda: waiting_for_gpu(session_pod(kind, namespace, waiting)),
             120, 0.5)


def hand_off(kind: Kind, api: Any, namespace: str, idle: str, waiting: str, timeout: float = 300) -> Handoff:
    """Wait for the culler to scale the idle session to 0, then for the waiting session's pod to be Ready."""
    from kubernetes import client

    apps, core = client.AppsV1Api(api), client.CoreV1Api(api)
    deadline = time.monotonic() + timeout
    while apps.read_namespaced_deployment(idle, namespace).spec.replicas != 0:
        assert time.monotonic() < deadline, f"the culler did not scale {idle} to 0 in {timeout:.0f} s"
        time.sleep(0.1)
    scaled = time.monotonic()

    def ready_now() -> bool:
        pods = core.list_namespaced_pod(namespace, label_selector=f"session={waiting}").items
        return any(c.type == "Ready" and c.status == "True" for p in pods for c in p.status.conditions or [])

    while not ready_now():
        assert time.monotonic() < deadline, f"{waiting} was not Ready in {timeout:.0f} s"
        time.sleep(0.1)
    watched = time.monotonic() - scaled
    stops = wait_for("the culler's stop Event", lambda: [
        e for e in get(kind, "events", "-n", namespace, "--field-selector",
                       f"involvedObject.kind=Deployment,involvedObject.name={idle}").get("items", [])
        if e["reason"] == EVENT_STOP], 60)
    assert len(stops) == 1, stops
    stopped = parse_time(stops[0]["firstTimestamp"])
    ready_condition = condition(session_pod(kind, namespace, waiting), "Ready")
    assert ready_condition is not None
    became_ready = parse_time(ready_condition["lastTransitionTime"])
    assert stopped is not None and became_ready is not None
    return Handoff(stopped, became_ready, watched)


def end_sessions(kind: Kind, namespace: str, names: list[str]) -> None:
    """Delete the sessions and wait for their pods to be gone (the GPU free for the next run)."""
    for name in names:
        kind.kubectl("delete", "deployment,service,pvc", "-n", namespace, name, f"{name}-home", "--ignore-not-found",
                     "--wait=false")
    wait_for("the sessions' pods to be gone", lambda: not any(
        get(kind, "pods", "-n", namespace, "-l", f"session={n}").get("items") for n in names), 180, 0.5)
    for name in names:
        kind.kubectl("delete", "pv", f"{namespace}-{name}", "--ignore-not-found", "--wait=false")
