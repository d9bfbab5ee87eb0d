"""The write-up's Coder on kind (../shared/seeds/001_*.txt): a real Coder v2.36.0 server (kf_culler.local.coder)
whose provisioner runs Terraform with the coder/coder and hashicorp/kubernetes providers against the shared kind
cluster, through a template in the shape of Coder's upstream Kubernetes template (tests/data/coder-kubernetes/
main.tf: a home PVC without count, a Deployment with `count = start_count`, `wait_for_rollout = false`, one
nvidia.com/gpu). The node advertises one fake GPU (support/kind_culler.py `fake_gpu`). kf-culler runs in-process
(`Passes.once`, `targets: [coder]`) with an Owner's API token, reading Coder's API and the kind cluster's pods.
Used by tests/test_coder_kind.py and bench/coder_kind_handoff.py.

How Terraform reaches the cluster: Coder runs in a network namespace of its own with only `lo` (its tailnet binds
UDP on every interface), and its provisioner runs Terraform there. The kind API server listens on this machine's
127.0.0.1:<port> (the kubeconfig pytest-kind wrote); `CoderServer.reaching(port)` relays that port into Coder's
namespace at the same address (a relay process there, a Unix socket, a relay thread here), so the kubeconfig is
used as it is, its certificate valid for 127.0.0.1.

What is not reproduced: Coder's agent. Its init script downloads the agent binary from Coder's access URL, which
the Coder built here does not serve (no web UI, no embedded binaries), and the pods could not reach Coder's
loopback anyway; the workspace's container sleeps instead (the template says so). Coder therefore sees no agent
and no use: `last_used_at` does not move and the workspace has no connection, so it is idle by Coder's signals
from its start. There is no GPU and no GPU metrics here: the culler runs with `gpuWithoutMetrics: ide-only`, so a
GPU workspace is judged by Coder's signals alone (without it, the shipped `keep` never stops a GPU workspace
without metrics).

Home volumes: hostPath PersistentVolumes made per workspace before its start build, pre-bound (claimRef) to the
claim the template will make, in a directory made writable first (support/kind_sessions.py `prepare_volumes`): no
storage provisioner runs on this kind cluster.
"""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from kf_culler.config import load_mapping
from kf_culler.cycle import CycleResult, NotebookResult
from kf_culler.local.coder import (
    CoderServer,
    Session,
    ensure_binaries,
    ensure_kubernetes_provider,
    postgres_bindir,
)
from kf_culler.runner import build_runner
from kf_culler.timeutil import parse_time
from support.kind import Kind
from support.kind_culler import condition, get, wait_for
from support.kind_sessions import VOLUMES, prepare_volumes
from support.passes import Passes

TEMPLATE = Path(__file__).resolve().parents[1] / "data" / "coder-kubernetes" / "main.tf"
HOME = "/home/coder"
ID_LABEL = "com.coder.workspace.id"
PV_LABEL = "kf-culler.test/coder-kind"
GPU_MESSAGE = "Insufficient nvidia.com/gpu"
# The admin's culler settings: Coder workspaces only, short times so that a stop comes within a run, GPU
# workspaces judged by Coder's signals (no GPU metrics exist here; see the module's docstring).
POLICY = {"idleMinutes": 0.25, "warnMinutes": 0, "startupGraceMinutes": 0, "gpuWithoutMetrics": "ide-only"}


def check_components() -> None:
    """PostgreSQL, Coder, Terraform and both providers, built now when missing; CoderUnavailable says what is not."""
    postgres_bindir()
    ensure_kubernetes_provider(ensure_binaries(quiet=False))


@dataclass
class CoderOnKind:
    kind: Kind
    coder: CoderServer
    namespace: str  # where the template makes the workspaces' objects: the culler's coder.namespace
    template: dict[str, Any]
    token_file: Path  # an Owner's API token, the culler's
    culler_user: str
    api: Any

    def volume(self, owner: Session, name: str) -> None:
        """The home volume the workspace's claim will bind to (made before its first start build)."""
        claim = f"coder-{owner.username}-{name}-home"
        key = f"coder-{owner.username}-{name}"
        prepare_volumes(self.kind, self.namespace, [key])
        classes = get(self.kind, "storageclass").get("items", [])
        default = [c["metadata"]["name"] for c in classes
                   if (c["metadata"].get("annotations") or {}).get("storageclass.kubernetes.io/is-default-class")
                   == "true"]
        pv = {"apiVersion": "v1", "kind": "PersistentVolume",
              "metadata": {"name": f"{self.namespace}-{key}", "labels": {PV_LABEL: self.namespace}},
              "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
                       "storageClassName": default[0] if default else "",
                       "persistentVolumeReclaimPolicy": "Retain",
                       "hostPath": {"path": f"{VOLUMES}/{self.namespace}-{key}", "type": "Directory"},
                       "claimRef": {"namespace": self.namespace, "name": claim}}}
        self.kind.kubectl("apply", "-f", "-", stdin=json.dumps(pv))

    def workspace(self, owner: Session, name: str) -> dict[str, Any]:
        """A workspace of `owner`, started with its own token (the start build ends once the objects are made)."""
        self.volume(owner, name)
        return self.coder.create_workspace(owner, self.template["id"], name, timeout=300)

    def pods(self, ws: dict[str, Any]) -> list[dict[str, Any]]:
        items = get(self.kind, "pods", "-n", self.namespace, "-l", f"{ID_LABEL}={ws['id']}").get("items", [])
        return [p for p in items if not p["metadata"].get("deletionTimestamp")]

    def pod(self, ws: dict[str, Any]) -> dict[str, Any]:
        """The workspace's pod that is not being deleted, or {}."""
        live = self.pods(ws)
        assert len(live) <= 1, [p["metadata"]["name"] for p in live]
        return live[0] if live else {}

    def deployments(self, ws: dict[str, Any]) -> list[str]:
        items = get(self.kind, "deployments", "-n", self.namespace, "-l", f"{ID_LABEL}={ws['id']}").get("items", [])
        return [d["metadata"]["name"] for d in items]

    def claim(self, owner: Session, name: str) -> dict[str, Any]:
        return get(self.kind, "pvc", "-n", self.namespace, f"coder-{owner.username}-{name}-home")

    def build(self, ws: dict[str, Any], transition: str, token: str | None = None) -> dict[str, Any]:
        """A build of the workspace, once its job has ended."""
        build = self.coder.build(ws["id"], transition, token=token)
        return self.coder.wait_job(f"/api/v2/workspacebuilds/{build['id']}", 300)

    def latest_build(self, ws: dict[str, Any]) -> dict[str, Any]:
        build: dict[str, Any] = self.coder.get(f"/api/v2/workspaces/{ws['id']}")["latest_build"]
        return build

    def culler(self, **policy: Any) -> Passes:
        settings = load_mapping({
            "targets": ["coder"],
            "coder": {"url": self.coder.url, "tokenFile": str(self.token_file), "namespace": self.namespace,
                      "timeoutSeconds": 10},
            **POLICY, **policy}, "test")
        return Passes(build_runner(settings, self.api, records_namespace=self.namespace))


def ready(pod: dict[str, Any]) -> bool:
    c = condition(pod, "Ready") if pod else None
    return c is not None and c["status"] == "True"


def waiting_for_gpu(pod: dict[str, Any]) -> bool:
    """Pending, not scheduled for want of a GPU."""
    c = condition(pod, "PodScheduled") if pod else None
    return bool(pod) and pod["status"].get("phase") == "Pending" and c is not None and c["status"] == "False" \
        and c.get("reason") == "Unschedulable" and GPU_MESSAGE in c.get("message", "")


def api_port(kind: Kind) -> int:
    """The port of this machine's 127.0.0.1 where the kind cluster's API server is published."""
    server = kind.kubectl("config", "view", "--minify", "-o", "jsonpath={.clusters[0].cluster.server}").strip()
    host, _, port = server.removeprefix("https://").partition(":")
    assert host in ("127.0.0.1", "localhost") and port.isdigit(), f"the kind API server is at {server}"
    return int(port)


@contextlib.contextmanager
def coder_on_kind(kind: Kind, workdir: Path) -> Iterator[CoderOnKind]:
    """A Coder server with the Kubernetes template pushed, its workspaces made in a namespace of their own, an
    Owner's token for the culler. check_components() first (it raises CoderUnavailable)."""
    binaries = ensure_binaries(quiet=False)
    namespace = f"coder-{uuid.uuid4().hex[:6]}"
    kind.kubectl("create", "namespace", namespace)
    try:
        with CoderServer(binaries) as coder, coder.reaching(api_port(kind)):
            template = coder.push_template("kubernetes-gpu", TEMPLATE.read_text(), timeout=300, variables={
                "kubeconfig": str(kind.kubeconfig), "namespace": namespace, "image": kind.backend.tools_image})
            token = coder.post("/api/v2/users/me/keys/tokens", {"token_name": "kf-culler"})["key"]
            token_file = workdir / "coder-token"
            token_file.write_text(token + "\n")
            assert coder.owner is not None
            yield CoderOnKind(kind, coder, namespace, template, token_file, coder.owner.username, kind.api_client())
    finally:
        kind.kubectl("delete", "namespace", namespace, "--wait=true", "--timeout=180s")
        kind.kubectl("delete", "pv", "-l", f"{PV_LABEL}={namespace}", "--ignore-not-found", "--wait=false")


@dataclass(frozen=True)
class Handoff:
    """One hand-off. `requested`: the culler's stop build's created_at (Coder's clock); `ready`: the waiting
    workspace's pod's Ready condition's lastTransitionTime (to the second, as the API gives it); `watched`: seconds
    from the culler's pass returning with the stop build made to this process seeing the waiting pod Ready (polling
    every 0.2 s). `stop` is the culler's result for the idle workspace; `passes`, every pass up to it."""

    requested: datetime
    ready: datetime
    watched: float
    stop: NotebookResult
    passes: list[CycleResult]

    @property
    def seconds(self) -> float:
        return (self.ready - self.requested).total_seconds()


def result_for(result: CycleResult, owner: Session, name: str) -> NotebookResult:
    found = [r for r in result.results if r.name == f"CoderWorkspace/{owner.username}.{name}"]
    assert len(found) == 1, [r.name for r in result.results]
    return found[0]


def start_pair(c: CoderOnKind, idle: tuple[Session, str], waiting: tuple[Session, str]
               ) -> tuple[dict[str, Any], dict[str, Any]]:
    """The idle workspace Ready on the GPU with a file in its home and one in /tmp; the waiting one's pod Pending
    for the GPU while its start build succeeded."""
    a = c.workspace(*idle)
    wait_for(f"{idle[1]}'s pod Ready", lambda: ready(c.pod(a)), 300, 0.5)
    c.kind.kubectl("exec", "-n", c.namespace, c.pod(a)["metadata"]["name"], "--", "sh", "-c",
                   f"echo keep > {HOME}/keep.txt && echo gone > /tmp/gone.txt")
    b = c.workspace(*waiting)
    wait_for(f"{waiting[1]}'s pod to wait for the GPU", lambda: waiting_for_gpu(c.pod(b)), 120, 0.5)
    return a, b


def hand_off(c: CoderOnKind, runner: Passes, idle: tuple[Session, str], waiting: tuple[Session, str],
             a: dict[str, Any], b: dict[str, Any], timeout: float = 300) -> Handoff:
    """Passes of the culler until it stops the idle workspace (the waiting one `starting` in each), then wait
    for the waiting workspace's pod to be Ready."""
    passes: list[CycleResult] = []
    deadline = time.monotonic() + timeout
    while True:
        result = runner.once()
        passes.append(result)
        verdict = result_for(result, *waiting).verdict
        assert verdict.state == "starting", verdict
        stop = result_for(result, *idle)
        if stop.verdict.action == "stop":
            break
        assert time.monotonic() < deadline, stop.verdict
        time.sleep(1)
    stopped = time.monotonic()
    wait_for(f"{waiting[1]}'s pod Ready", lambda: ready(c.pod(b)), max(1.0, deadline - time.monotonic()), 0.2)
    watched = time.monotonic() - stopped
    build = c.latest_build(a)
    requested = parse_time(build["created_at"])
    ready_condition = condition(c.pod(b), "Ready")
    assert ready_condition is not None and requested is not None
    became_ready = parse_time(ready_condition["lastTransitionTime"])
    assert became_ready is not None
    return Handoff(requested, became_ready, watched, stop, passes)


def end_pair(c: CoderOnKind, workspaces: list[dict[str, Any]]) -> None:
    """Delete the workspaces (delete builds: Terraform destroys their objects) and wait for their pods to go."""
    for ws in workspaces:
        with contextlib.suppress(Exception):
            c.build(ws, "delete")
    wait_for("the workspaces' pods to be gone", lambda: not any(c.pods(ws) for ws in workspaces), 180, 0.5)
