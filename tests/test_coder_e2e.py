"""Coder workspaces culled end to end (`targets: [coder]`, docs/targets.md, "Coder workspaces"): a real Coder v2.36.0
server (kf_culler.local.coder: its PostgreSQL, Terraform and the coder/coder provider, `coder agent`), the shared
full local cluster (kube-apiserver, kube-controller-manager, kube-scheduler, kwok nodes with `nvidia.com/gpu`) and a
real Prometheus; the culler runs in-process (`Passes.once`) with an Owner's API token from a file.

What is approximated, and why:
- The template's Kubernetes objects. Coder's upstream template makes the workspace's Deployment with
  `count = data.coder_workspace.me.start_count`, so a stop build scales it away. On kind, where pods run,
  tests/test_coder_kind.py runs such a template for real (the `hashicorp/kubernetes` provider built from its
  vendored source, the API server reached through `CoderServer.reaching`). On this local cluster, where kwok plays
  the pods, the test stands in for the template (`Template` below): after
  a start build it creates the workspace's Deployment (the labels of the upstream template, `com.coder.workspace.id`
  among them, and a GPU request) and, when it sees a stop build, it scales that Deployment to 0, polling Coder's API
  every 0.2 s.
- The GPUs. kwok nodes advertise `nvidia.com/gpu` and run no containers, so GPU utilisation and memory come from a
  stand-in dcgm-exporter endpoint (kf_culler.local.prometheus `dcgm_exposition`: the metric names, HELP texts and
  labels of dcgm-exporter's default counters, etc/default-counters.csv, with the `namespace`/`pod`/`container`
  labels its Kubernetes pod mapper adds) scraped by the real Prometheus. These metrics are the only fake here.

Cases: (a) an idle GPU workspace without connection is stopped through a stop build by the culler's token (its
initiator), with the reason in an Event on its Deployment, and the workspace waiting for that GPU runs (the time
from the decision to its pod Running is printed; docs/performance.md); (e) that waiting workspace, Pending for the
GPU while its build says `running`, is `starting`; (c) a workspace with GPU work and no connection is kept;
(b) a workspace with a real `coder agent` connected and use reported (`POST /usage`, what Coder's IDE clients send)
but an idle GPU follows connectedGpuIdleMinutes; (d) a template admin's token (it may read every workspace, not
stop one) is refused with a clear error, nothing stopped; (f) Coder unreachable: no signal, nothing stopped;
(g) a plain member who makes more workspaces than coder.maxWorkspaces with their own token: the first
maxWorkspaces by owner, name and id are judged (another member's idle one among them is stopped), the others are
counted (kf_culler_coder_workspaces_unjudged, a log line) and left running, though idle.
"""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from need import missing
from support.passes import Passes

from kf_culler.config import load_mapping
from kf_culler.cycle import NotebookResult
from kf_culler.local import procs
from kf_culler.local.coder import (
    CODER_ONLY_TEMPLATE,
    CoderServer,
    CoderUnavailable,
    HostRelay,
    Session,
    ensure_binaries,
    postgres_bindir,
)
from kf_culler.local.prometheus import Exposition, FakeGpu, Prometheus, dcgm_exposition, find_prometheus, static_job
from kf_culler.local.prometheus import Unavailable as PrometheusUnavailable
from kf_culler.metrics import Metrics
from kf_culler.plan import EVENT_STOP
from kf_culler.runner import build_runner
from kf_culler.service import instrument

pytestmark = pytest.mark.cluster
TIMEOUT = 90.0
TAINT = "kf-culler.test/coder"
HANDOFF_NODE, GPU_NODE = "coder-handoff", "coder-gpus"  # 1 GPU, 4 GPUs; tainted: only these tests' pods go there
ID_LABEL = "com.coder.workspace.id"


@dataclass
class Gpus:
    """The GPUs of the test's kwok nodes as dcgm-exporter reports them, scraped by a real Prometheus."""

    exposition: Exposition = field(default_factory=Exposition)
    prometheus: Prometheus | None = None
    gpus: dict[tuple[str, str], FakeGpu] = field(default_factory=dict)  # (namespace, pod) -> its GPU
    lock: threading.Lock = field(default_factory=threading.Lock)

    def set(self, namespace: str, pod: str, node: str, util: float) -> None:
        with self.lock:
            index = len(self.gpus) if (namespace, pod) not in self.gpus else self.gpus[(namespace, pod)].index
            self.gpus[(namespace, pod)] = FakeGpu(index, f"GPU-{namespace}-{pod}", util=util,
                                                  used_mib=4096.0 if util else 0.0, namespace=namespace, pod=pod,
                                                  container="dev", hostname=node)
            self.exposition.set(dcgm_exposition(self.gpus.values()))

    def wait_scraped(self, pod: str, util: float) -> None:
        assert self.prometheus is not None
        self.prometheus.wait_for(f'count_over_time((DCGM_FI_DEV_GPU_UTIL{{pod="{pod}"}} == {util:g})[10s:1s]) >= 3',
                                 timeout=60)


@dataclass
class World:
    coder: CoderServer
    template: dict[str, Any]
    api: Any
    gpus: Gpus
    token_file: Path  # an Owner's API token (`coder tokens create`), the culler's
    culler_user: str

    @property
    def core(self) -> Any:
        return client.CoreV1Api(self.api)

    @property
    def apps(self) -> Any:
        return client.AppsV1Api(self.api)


@pytest.fixture(scope="module")
def world(full_cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    try:
        postgres_bindir()
    except CoderUnavailable as why:
        missing("PostgreSQL", why)
    try:
        binaries = ensure_binaries(quiet=False)
    except CoderUnavailable as why:
        missing("Coder", why)
    try:
        prometheus_binary = find_prometheus()
    except PrometheusUnavailable as why:
        missing("Prometheus", why)
    api = full_cluster.api_client()
    core = client.CoreV1Api(api)
    for name, count in ((HANDOFF_NODE, 1), (GPU_NODE, 4)):
        full_cluster.add_fake_node(name, gpus=count)
        core.patch_node(name, {"spec": {"taints": [{"key": TAINT, "value": "true", "effect": "NoSchedule"}]}})
    gpus = Gpus()
    gpus.exposition.__enter__()
    try:
        gpus.prometheus = Prometheus([static_job("dcgm", [gpus.exposition.stub.address], honor_labels=True)],
                                     scrape_interval="1s", binary=prometheus_binary).start()
        with CoderServer(binaries) as coder:
            template = coder.push_template("kubernetes-gpu", CODER_ONLY_TEMPLATE)
            token = coder.post("/api/v2/users/me/keys/tokens", {"token_name": "kf-culler"})["key"]
            token_file = tmp_path_factory.mktemp("coder") / "token"
            token_file.write_text(token + "\n")
            assert coder.owner is not None
            yield World(coder, template, api, gpus, token_file, coder.owner.username)
    finally:
        if gpus.prometheus is not None:
            gpus.prometheus.stop()
        gpus.exposition.__exit__()
        for name in (HANDOFF_NODE, GPU_NODE):
            with contextlib.suppress(Exception):
                core.delete_node(name)


class Template:
    """The template's `count = start_count` Deployment, played by the test (see the module's docstring): made for
    a workspace after its start build, scaled to 0 when Coder shows a stop build."""

    def __init__(self, world: World, namespace: str) -> None:
        self.world, self.namespace = world, namespace
        self.workspaces: dict[str, str] = {}  # workspace id -> Deployment name
        self.scaled: dict[str, float] = {}  # workspace id -> when its Deployment was scaled to 0 (epoch)
        self.stop_event = threading.Event()
        self.errors: list[str] = []
        self.thread = threading.Thread(target=self._run, name="template", daemon=True)
        self.thread.start()

    def start(self, owner: Session, name: str, node: str, gpus: int = 1) -> dict[str, Any]:
        ws = self.world.coder.create_workspace(owner, self.world.template["id"], name)
        deployment = f"coder-{owner.username}-{name}"
        labels = {"com.coder.resource": "true", ID_LABEL: ws["id"], "com.coder.workspace.name": name,
                  "com.coder.user.id": owner.id, "com.coder.user.username": owner.username}
        resources = {"requests": {"cpu": "100m", "nvidia.com/gpu": str(gpus)}, "limits": {"nvidia.com/gpu": str(gpus)}}
        self.world.apps.create_namespaced_deployment(self.namespace, {
            "metadata": {"name": deployment, "labels": labels},
            "spec": {"replicas": 1, "strategy": {"type": "Recreate"}, "selector": {"matchLabels": {ID_LABEL: ws["id"]}},
                     "template": {"metadata": {"labels": labels}, "spec": {
                         "nodeSelector": {"kubernetes.io/hostname": node},
                         "tolerations": [{"key": TAINT, "operator": "Exists", "effect": "NoSchedule"}],
                         "containers": [{"name": "dev", "image": "codercom/enterprise-base:ubuntu",
                                         "resources": resources}]}}}})
        self.workspaces[ws["id"]] = deployment
        return ws

    def _run(self) -> None:
        while not self.stop_event.wait(0.2):
            try:
                listed = self.world.coder.get("/api/v2/workspaces?limit=100")["workspaces"]
                for ws in listed:
                    if ws["id"] in self.workspaces and ws["id"] not in self.scaled \
                            and ws["latest_build"]["transition"] == "stop":
                        self.world.apps.patch_namespaced_deployment_scale(
                            self.workspaces[ws["id"]], self.namespace, {"spec": {"replicas": 0}})
                        self.scaled[ws["id"]] = time.time()
            except Exception as err:
                self.errors.append(f"{type(err).__name__}: {err}"[:300])

    def close(self) -> None:
        self.stop_event.set()
        self.thread.join(5)

    def pods(self, ws: dict[str, Any]) -> list[Any]:
        return list(self.world.core.list_namespaced_pod(self.namespace, label_selector=f"{ID_LABEL}={ws['id']}").items)

    def running(self, ws: dict[str, Any]) -> Any:
        found = [p for p in self.pods(ws) if p.status.phase == "Running" and not p.metadata.deletion_timestamp]
        return found[0] if found else None

    def pending_for_gpu(self, ws: dict[str, Any]) -> bool:
        return any(c.type == "PodScheduled" and c.status == "False" and "nvidia.com/gpu" in (c.message or "")
                   for p in self.pods(ws) for c in (p.status.conditions or []))


@pytest.fixture()
def site(world: World) -> Iterator[tuple[World, Template]]:
    namespace = f"coder-{uuid.uuid4().hex[:8]}"
    world.core.create_namespace({"metadata": {"name": namespace}})
    template = Template(world, namespace)
    try:
        yield world, template
    finally:
        template.close()
        with contextlib.suppress(Exception):
            world.core.delete_namespace(namespace)
        procs.wait_until(lambda: not world.core.list_namespaced_pod(namespace).items, TIMEOUT, 0.2,
                         f"the pods of namespace {namespace} to be deleted")


def culler(world: World, namespace: str, token_file: Path | None = None, url: str | None = None,
           max_workspaces: int | None = None, **policy: Any) -> Passes:
    cap = {} if max_workspaces is None else {"maxWorkspaces": max_workspaces}
    settings = load_mapping({
        "targets": ["coder"],
        "coder": {"url": url or world.coder.url, "tokenFile": str(token_file or world.token_file),
                  "namespace": namespace, "pageSize": 2, "timeoutSeconds": 5, **cap},
        "prometheus": {"url": world.gpus.prometheus.url if world.gpus.prometheus else None, "stepSeconds": 1},
        "warnMinutes": 0, "startupGraceMinutes": 0, **policy}, "test")
    return Passes(build_runner(settings, world.api, records_namespace=namespace))


def result_for(results: list[NotebookResult], owner: Session, name: str) -> NotebookResult:
    found = [r for r in results if r.name == f"CoderWorkspace/{owner.username}.{name}"]
    assert len(found) == 1, [r.name for r in results]
    return found[0]


def running_gpu(world: World, template: Template, owner: Session, name: str, node: str, util: float
                ) -> tuple[dict[str, Any], str]:
    ws = template.start(owner, name, node)
    procs.wait_until(lambda: template.running(ws) is not None, TIMEOUT, 0.2, f"workspace {name}'s pod to run")
    pod = template.running(ws).metadata.name
    world.gpus.set(template.namespace, pod, node, util)
    world.gpus.wait_scraped(pod, util)
    return ws, pod


def test_an_idle_gpu_workspace_is_stopped_through_a_stop_build_and_the_waiting_one_runs(
        site: tuple[World, Template]) -> None:
    world, template = site
    coder, ns = world.coder, template.namespace
    alice, carol, dave = (coder.create_member(f"{n}-{ns[-8:]}") for n in ("alice", "carol", "dave"))
    idle, _ = running_gpu(world, template, alice, "idle", HANDOFF_NODE, util=0)
    busy, _ = running_gpu(world, template, dave, "busy", GPU_NODE, util=85)  # (c) GPU work, no connection
    waiting = template.start(carol, "waiting", HANDOFF_NODE)  # (e) its build says running; its pod waits
    procs.wait_until(lambda: template.pending_for_gpu(waiting), TIMEOUT, 0.2, "the waiting workspace's pod Pending")
    assert coder.get(f"/api/v2/workspaces/{waiting['id']}")["latest_build"]["status"] == "running"
    with culler(world, ns, idleMinutes=0.1) as runner:
        deadline = time.monotonic() + 60
        while True:
            result = runner.once()
            a = result_for(result.results, alice, "idle")
            assert result_for(result.results, carol, "waiting").verdict.state == "starting"
            kept = result_for(result.results, dave, "busy").verdict
            assert (kept.action, kept.state) == ("keep", "active"), kept
            if a.verdict.action == "stop":
                break
            assert time.monotonic() < deadline, a.verdict
            time.sleep(1)
        decided = result.now.timestamp()
        assert a.verdict.state == "idle" and a.verdict.rule_id == "10-idle", a.verdict
        assert a.write is not None and a.write.outcome == "patched" and a.write.event == "created", a.write
        procs.wait_until(lambda: template.running(waiting) is not None, TIMEOUT, 0.1, "the waiting workspace to run")
        ran = time.time()
        scaled = template.scaled[idle["id"]]
        print(f"\nkf-culler's decision to the waiting workspace's pod Running: {ran - decided:.2f} s "
              f"(the stop build seen and the Deployment scaled to 0 at +{scaled - decided:.2f} s)")
        after = runner.once()
        assert result_for(after.results, alice, "idle").verdict.state == "stopped"
        assert result_for(after.results, carol, "waiting").verdict.state in ("starting", "idle", "no-signal")
        assert result_for(after.results, dave, "busy").verdict.action == "keep"
    build = coder.get(f"/api/v2/workspaces/{idle['id']}")["latest_build"]
    assert build["transition"] == "stop" and build["initiator_name"] == world.culler_user
    assert coder.get(f"/api/v2/workspaces/{busy['id']}")["latest_build"]["transition"] == "start"
    assert coder.get(f"/api/v2/workspaces/{waiting['id']}")["latest_build"]["transition"] == "start"
    events = [e for e in world.core.list_namespaced_event(ns).items if e.reason == EVENT_STOP]
    assert [(e.involved_object.kind, e.involved_object.name) for e in events] == [
        ("Deployment", template.workspaces[idle["id"]])]
    assert "idle" in events[0].message.lower()
    assert not template.errors, template.errors


def test_a_connected_workspace_with_an_idle_gpu_follows_connected_gpu_idle_minutes(
        site: tuple[World, Template]) -> None:
    world, template = site
    coder, ns = world.coder, template.namespace
    bob = coder.create_member(f"bob-{ns[-8:]}")
    ws, pod = running_gpu(world, template, bob, "connected", GPU_NODE, util=90)
    agent = coder.start_agent(coder.agent_token(ws["latest_build"]["id"]), coder.dir / f"agent-{ns}.log")
    try:
        def agent_connected() -> dict[str, Any] | None:
            now = coder.get(f"/api/v2/workspaces/{ws['id']}")
            agents = [a for r in now["latest_build"]["resources"] for a in r.get("agents") or []]
            return agents[0] if agents and agents[0]["status"] == "connected" else None

        procs.wait_until(lambda: agent_connected() is not None, 60, 0.5, "the agent to connect")
        before = coder.get(f"/api/v2/workspaces/{ws['id']}")["last_used_at"]
        found = agent_connected()
        assert found is not None
        # what Coder's IDE clients report while in use; Coder writes last_used_at in 60 s batches
        coder.post(f"/api/v2/workspaces/{ws['id']}/usage", {"agent_id": found["id"], "app_name": "vscode"},
                   token=bob.token)
        procs.wait_until(lambda: coder.get(f"/api/v2/workspaces/{ws['id']}")["last_used_at"] != before, 90, 1,
                         "Coder to record the use")
        world.gpus.set(ns, pod, GPU_NODE, 0)  # the GPU's work ends now
        gpu_idle_from = time.time()
        world.gpus.wait_scraped(pod, 0)
        with culler(world, ns, idleMinutes=10, connectedGpuIdleMinutes=0.3) as runner:
            first = result_for(runner.once().results, bob, "connected")
            assert (first.verdict.action, first.verdict.state) == ("keep", "connected"), first.verdict
            deadline = time.monotonic() + 60
            while (r := result_for(runner.once().results, bob, "connected")).verdict.action != "stop":
                assert r.verdict.state == "connected", r.verdict
                assert time.monotonic() < deadline, r.verdict
                time.sleep(1)
        assert time.time() - gpu_idle_from >= 0.3 * 60 - 2  # not before the limit (the last busy sample)
        assert (r.verdict.state, r.verdict.rule_id) == ("connected", "9-connected-gpu-idle"), r.verdict
        assert r.write is not None and r.write.outcome == "patched", r.write
        assert coder.get(f"/api/v2/workspaces/{ws['id']}")["latest_build"]["transition"] == "stop"
    finally:
        procs.stop(agent)


def test_a_token_that_may_not_stop_is_refused_and_nothing_is_stopped(site: tuple[World, Template],
                                                                      tmp_path: Path) -> None:
    world, template = site
    coder, ns = world.coder, template.namespace
    erin = coder.create_member(f"erin-{ns[-8:]}")
    ws, _ = running_gpu(world, template, erin, "idle", GPU_NODE, util=0)
    # a member with the template-admin role: reads every workspace, may not stop another's
    frank = coder.create_member(f"frank-{ns[-8:]}")
    coder.request("PUT", f"/api/v2/users/{frank.username}/roles", {"roles": ["template-admin"]})
    token = tmp_path / "token"
    token.write_text(frank.token)
    with culler(world, ns, token_file=token, idleMinutes=0.05) as runner:
        deadline = time.monotonic() + 30
        while (r := result_for(runner.once().results, erin, "idle")).verdict.action != "stop":
            assert time.monotonic() < deadline, r.verdict
            time.sleep(1)
    assert r.write is not None and r.write.outcome == "failed", r.write
    assert "HTTP 403" in str(r.write.error) and "may not stop this workspace" in str(r.write.error), r.write
    assert frank.token not in str(r.write.error)
    assert coder.get(f"/api/v2/workspaces/{ws['id']}")["latest_build"]["transition"] == "start"
    assert template.running(ws) is not None
    # a plain member's token lists only its own workspaces: the others are not there to stop
    plain = tmp_path / "plain"
    plain.write_text(coder.create_member(f"gina-{ns[-8:]}").token)
    with culler(world, ns, token_file=plain, idleMinutes=0.05) as runner:
        assert runner.once().results == []


def test_coder_unreachable_is_no_signal_and_nothing_is_stopped(site: tuple[World, Template]) -> None:
    world, template = site
    coder, ns = world.coder, template.namespace
    hal = coder.create_member(f"hal-{ns[-8:]}")
    ws, _ = running_gpu(world, template, hal, "idle", GPU_NODE, util=0)
    started = datetime.now(UTC)
    port = procs.free_port()
    relay = HostRelay(port, coder.socket)  # Coder's API through a relay the test can take away
    try:
        with culler(world, ns, url=f"http://127.0.0.1:{port}", idleMinutes=0.15,
                    noSignalGpuIdleMinutes=5) as runner:
            first = result_for(runner.once().results, hal, "idle")
            assert first.verdict.action == "keep" and first.verdict.state == "idle", first.verdict
            relay.close()
            time.sleep(max(0.0, 0.15 * 60 + 1 - (datetime.now(UTC) - started).total_seconds()))
            r = result_for(runner.once().results, hal, "idle")
            assert (r.verdict.action, r.verdict.state) == ("keep", "no-signal"), r.verdict
            assert "Coder could not be read" in r.verdict.reason, r.verdict.reason
            problem = runner.memory.coder.problem
            assert problem is not None and world.token_file.read_text().strip() not in problem
    finally:
        relay.close()
    assert coder.get(f"/api/v2/workspaces/{ws['id']}")["latest_build"]["transition"] == "start"


def test_a_member_with_more_workspaces_than_max_leaves_the_rest_unjudged_and_another_idle_one_is_stopped(
        site: tuple[World, Template], caplog: pytest.LogCaptureFixture) -> None:
    """(g) As the tenant: a plain member makes, with their own token, more workspaces than coder.maxWorkspaces
    (here 2). Before, the whole listing failed and no Coder workspace was judged (after a restart, none ever):
    another member's idle GPU workspace kept its GPU. Now the first 2 by owner, workspace name and id are judged
    (the user names sort before the other tests' users, so they are these two; Coder's own list puts running
    workspaces first, then owner and name, so they are also within the 4 x maxWorkspaces the culler reads), the
    rest are counted and left as they are: idle, but never stopped. A dry run without the cap shows those others
    were due, so what spared them is the cap, not the policy."""
    world, template = site
    coder, ns = world.coder, template.namespace
    cap = 2
    other = coder.create_member(f"0a-{ns[-8:]}")  # sorts first: its one workspace is judged
    tenant = coder.create_member(f"0b-{ns[-8:]}")
    # made in the reverse of the judged order: the order is by name, not by when they were made
    extra = [running_gpu(world, template, tenant, name, GPU_NODE, util=0)[0] for name in ("ws-2", "ws-1")]
    busy, _ = running_gpu(world, template, tenant, "ws-0", GPU_NODE, util=85)
    idle, _ = running_gpu(world, template, other, "idle", HANDOFF_NODE, util=0)
    every = coder.get("/api/v2/workspaces?limit=100")  # as the site owner: every workspace of this Coder
    assert every["count"] == len(every["workspaces"])
    first = sorted((w["owner_name"], w["name"], w["id"]) for w in every["workspaces"])[:cap]
    judged = [f"CoderWorkspace/{owner}.{name}" for owner, name, _ in first]
    assert judged == [f"CoderWorkspace/{other.username}.idle", f"CoderWorkspace/{tenant.username}.ws-0"]
    # at most 4 x maxWorkspaces are read per pass (docs/configuration.md, coder.maxWorkspaces)
    unjudged = min(every["count"], 4 * cap) - cap
    metrics = Metrics()
    with culler(world, ns, max_workspaces=cap, idleMinutes=0.1) as runner, caplog.at_level("WARNING"):
        runner.runner = instrument(runner.runner, metrics)
        deadline = time.monotonic() + 60
        while True:
            result = runner.once()
            assert sorted(r.name for r in result.results) == judged
            kept = result_for(result.results, tenant, "ws-0").verdict
            assert (kept.action, kept.state) == ("keep", "active"), kept
            assert not any(ws["id"] in template.scaled for ws in extra)
            a = result_for(result.results, other, "idle")
            if a.verdict.action == "stop":
                break
            assert time.monotonic() < deadline, a.verdict
            time.sleep(1)
        assert a.verdict.state == "idle" and a.verdict.rule_id == "10-idle", a.verdict
        assert a.write is not None and a.write.outcome == "patched", a.write
        assert runner.memory.coder.unjudged == unjudged and runner.memory.coder.problem is None
    assert f"kf_culler_coder_workspaces_unjudged {float(unjudged)}".encode() in metrics.render()
    assert f"{unjudged} more than coder.maxWorkspaces ({cap})" in caplog.text
    build = coder.get(f"/api/v2/workspaces/{idle['id']}")["latest_build"]
    assert build["transition"] == "stop" and build["initiator_name"] == world.culler_user
    procs.wait_until(lambda: idle["id"] in template.scaled, TIMEOUT, 0.2, "the stopped workspace scaled to 0")
    for ws in (*extra, busy):
        assert coder.get(f"/api/v2/workspaces/{ws['id']}")["latest_build"]["transition"] == "start"
        assert template.running(ws) is not None and ws["id"] not in template.scaled
    events = [e for e in world.core.list_namespaced_event(ns).items if e.reason == EVENT_STOP]
    assert [e.involved_object.name for e in events] == [template.workspaces[idle["id"]]]
    # the others were due: judged without the cap (a dry run: nothing written), they would be stopped as idle
    with culler(world, ns, idleMinutes=0.1, dryRun=True) as runner:
        deadline = time.monotonic() + 60
        while True:
            result = runner.once()
            assert result_for(result.results, other, "idle").verdict.state == "stopped"
            due = [result_for(result.results, tenant, ws["name"]).verdict for ws in extra]
            if all(v.action == "stop" for v in due):
                break
            assert time.monotonic() < deadline, due
            time.sleep(1)
        assert all(v.state == "idle" and v.rule_id == "10-idle" for v in due), due
        assert all(r.write is None or r.write.outcome != "patched" for r in result.results)
    for ws in extra:
        assert coder.get(f"/api/v2/workspaces/{ws['id']}")["latest_build"]["transition"] == "start"
    assert not template.errors, template.errors
