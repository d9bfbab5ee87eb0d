"""Shards held through Leases across replicas, on the real API server: three `kf-culler run --leader-elect`
processes with `shards: 4` split the notebooks by namespace; every notebook is probed by exactly one
process, every idle notebook gets exactly one stop and one stop Event, a killed replica's shards are
taken over once their Leases lapse, and a paused replica writes nothing after its Leases lapsed.

The probes go to the loopback test server (support.faulty), each process through a URL template of its
own (`/<process>-ok/<namespace>/<name>/`), so the server counts the requests per notebook and per process.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException
from support.faulty import FaultyServer
from support.target import KubeTarget
from test_leader_election import wait

from kf_culler.kube.lease import live_holder
from kf_culler.local import objects as obj
from kf_culler.local.procs import free_port
from kf_culler.model import STOP_ANNOTATION
from kf_culler.plan import EVENT_STOP
from kf_culler.sharding import fair_share, shard_of

SHARDS = 4
LEASE_SECONDS = 15  # kf_culler.kube.lease defaults
RENEW_SECONDS = 3
PROCS = {"pa": "culler-a", "pb": "culler-b", "pc": "culler-c"}  # URL segment -> Lease identity


# -- the hash and the share (no cluster) ---------------------------------------------------------------


def test_shard_of_is_stable_and_spread() -> None:
    assert shard_of("kubeflow-user", 1) == 0
    # sha256("team-a")[:8] as a big-endian integer, mod 4: the same in every process and release
    assert shard_of("team-a", 4) == shard_of("team-a", 4) == int.from_bytes(
        __import__("hashlib").sha256(b"team-a").digest()[:8], "big") % 4
    spread = Counter(shard_of(f"ns-{i}", 4) for i in range(4000))
    assert set(spread) == {0, 1, 2, 3} and min(spread.values()) > 900


def test_fair_share() -> None:
    assert fair_share(4, 3) == (1, 2)
    assert fair_share(4, 2) == (2, 2)
    assert fair_share(1, 2) == (0, 1)
    assert fair_share(4, 0) == (4, 4)


def test_shipped_one_shard_two_replicas_and_the_shards_component(tmp_path: Path) -> None:
    from support.kustomize import render

    root = Path(__file__).resolve().parents[1]
    base = yaml.safe_load((root / "kustomize/base/config.yaml").read_text())
    assert base.get("shards", 1) == 1
    overlay = tmp_path / "overlay"
    overlay.mkdir()
    (overlay / "kustomization.yaml").write_text(yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        "resources": [os.path.relpath(root / "kustomize/overlays/kubeflow", overlay)],
        "components": [os.path.relpath(root / "kustomize/components/shards", overlay)]}))
    objs = render(overlay)
    deployment = next(o for o in objs if o["kind"] == "Deployment" and o["metadata"]["name"] == "kf-culler")
    assert deployment["spec"]["replicas"] == 2
    role = next(o for o in objs if o["kind"] == "Role" and o["metadata"]["name"] == "kf-culler-shards")
    binding = next(o for o in objs if o["kind"] == "RoleBinding" and o["metadata"]["name"] == "kf-culler-shards")
    assert role["metadata"]["namespace"] == binding["metadata"]["namespace"] == "kubeflow"
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "kf-culler", "namespace": "kubeflow"}]
    [rule] = role["rules"]
    assert set(rule["verbs"]) == {"get", "update"} and rule["resources"] == ["leases"]
    assert set(rule["resourceNames"]) == {f"kf-culler-{kind}-{i}" for kind in ("shard", "member") for i in range(8)}


# -- on the API server ---------------------------------------------------------------------------------


def holders(api: Any, namespace: str) -> dict[int, str | None]:
    """Each shard's live holder (None: free, or not renewed within its duration)."""
    leases = client.CoordinationV1Api(api)
    out: dict[int, str | None] = {}
    for i in range(SHARDS):
        try:
            out[i] = live_holder(leases.read_namespaced_lease(f"kf-culler-shard-{i}", namespace))
        except ApiException:
            out[i] = None
    return out


def stop_events(api: Any, namespace: str, name: str) -> list[Any]:
    return [e for e in obj.events_for(api, namespace, name) if e.reason == EVENT_STOP]


def stopped(api: Any, namespace: str, name: str) -> bool:
    return STOP_ANNOTATION in (obj.get_notebook(api, namespace, name)["metadata"].get("annotations") or {})


def pick_namespaces() -> dict[str, tuple[int, str]]:
    """Two namespaces per shard: one whose notebooks are kept (probed every pass), one with idle ones."""
    chosen: dict[tuple[int, str], str] = {}
    run = uuid.uuid4().hex[:6]
    i = 0
    while len(chosen) < 2 * SHARDS:
        name = f"t-sh-{run}-{i}"
        i += 1
        s = shard_of(name, SHARDS)
        for kind in ("keep", "idle"):
            if (s, kind) not in chosen:
                chosen[(s, kind)] = name
                break
    return {name: key for key, name in chosen.items()}


def held_by_logs(path: Path) -> list[int] | None:
    """The shards a process last said it holds (its JSON log line 'holding shards ...')."""
    last = None
    for line in path.read_text(errors="replace").splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if isinstance(rec, dict) and "shards" in rec and str(rec.get("msg", "")).startswith("holding shards"):
            last = rec["shards"]
    return last


def metric_held(port: int) -> set[int]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    out = set()
    for line in text.splitlines():
        if line.startswith("kf_culler_shards_held{") and line.rstrip().endswith(" 1.0"):
            out.add(int(line.split('shard="', 1)[1].split('"', 1)[0]))
    return out


@pytest.fixture()
def namespaces(kube: KubeTarget, api: Any) -> Iterator[dict[str, tuple[int, str]]]:
    chosen = pick_namespaces()
    core = client.CoreV1Api(api)
    for ns in chosen:
        core.create_namespace({"metadata": {"name": ns}})
    yield chosen
    for ns in chosen:
        with contextlib.suppress(ApiException):
            core.delete_namespace(ns)


@pytest.mark.cluster
@pytest.mark.slow
def test_shards_across_three_replicas(kube: KubeTarget, api: Any, namespace: str, tmp_path: Path,
                                      namespaces: dict[str, tuple[int, str]]) -> None:
    lease_ns = namespace
    started = datetime.now(UTC) - timedelta(hours=1)
    keep = [(ns, f"keep{k}") for ns, (_, kind) in namespaces.items() if kind == "keep" for k in range(2)]
    idle = [(ns, "idle0") for ns, (_, kind) in namespaces.items() if kind == "idle"]
    for ns, name in keep + idle:
        obj.create_notebook(api, ns, obj.notebook(name))
        obj.running_pod(api, ns, name, started)

    with FaultyServer() as server:
        procs: dict[str, subprocess.Popen[bytes]] = {}
        ports = {p: free_port() for p in PROCS}
        logs = {p: tmp_path / f"{p}.log" for p in PROCS}

        def start(p: str) -> None:
            cfg = tmp_path / f"{p}.yaml"
            cfg.write_text(yaml.safe_dump({
                "idleMinutes": 0.05, "warnMinutes": 0, "startupGraceMinutes": 1, "checkPeriodSeconds": 1,
                "shards": SHARDS, "namespaces": {"include": sorted(namespaces)},
                "namespaceOverrides": {ns: {"idleMinutes": 600} for ns, (_, k) in namespaces.items()
                                       if k == "keep"},
                "urls": {"jupyter": f"{server.base}/{p}-ok/{{namespace}}/{{name}}/"}}))
            procs[p] = subprocess.Popen(
                [sys.executable, "-m", "kf_culler", "run", "--leader-elect", "--lease-namespace", lease_ns,
                 "--culler-namespace", "default", "--kubeconfig", str(kube.kubeconfig), "--config", str(cfg),
                 "--metrics-address", f"127.0.0.1:{ports[p]}"],
                env={**os.environ, "POD_NAME": PROCS[p]}, stdout=logs[p].open("wb"), stderr=subprocess.STDOUT)

        def balanced() -> dict[int, str] | None:
            h = holders(api, lease_ns)
            alive = {PROCS[p] for p, proc in procs.items() if proc.poll() is None}
            if any(v is None or v not in alive for v in h.values()):
                return None
            counts = Counter(h.values())
            floor, ceil = fair_share(SHARDS, len(alive))
            if set(counts) != alive or not all(floor <= c <= ceil for c in counts.values()):
                return None
            return {i: v for i, v in h.items() if v is not None}

        def probes_by_process(since: int) -> dict[tuple[str, str], Counter[str]]:
            """(namespace, notebook) -> {process: api/status requests} among the requests after `since`."""
            with server.lock:
                seen = list(server.seen[since:])
            out: dict[tuple[str, str], Counter[str]] = {}
            for s in seen:
                parts = s.path.strip("/").split("/")
                if len(parts) >= 5 and parts[-1] == "status":
                    out.setdefault((parts[1], parts[2]), Counter())[parts[0].split("-")[0]] += 1
            return out

        def all_stop_events() -> dict[tuple[str, str], list[Any]]:
            return {(ns, n): stop_events(api, ns, n) for ns, n in keep + idle}

        try:
            for p in PROCS:
                start(p)
            # 1. A fair share each: 2, 1 and 1 of the 4 shards.
            owner = wait(balanced, 90, "the 4 shards spread over the 3 replicas")
            for ns, name in idle:
                wait(lambda ns=ns, name=name: stopped(api, ns, name), 60, f"{ns}/{name} to be stopped")
            wait(balanced, 60, "a stable spread")
            time.sleep(2 * RENEW_SECONDS)
            owner = wait(balanced, 60, "a stable spread")

            # Each process knows what it holds: its log, its metrics and /readyz say the same as the Leases.
            for p, ident in PROCS.items():
                mine = sorted(i for i, h in owner.items() if h == ident)
                assert held_by_logs(logs[p]) == mine, (p, mine, logs[p].read_text()[-3000:])
                assert metric_held(ports[p]) == set(mine)
                ready = urllib.request.urlopen(f"http://127.0.0.1:{ports[p]}/readyz", timeout=5).read().decode()
                assert f"shards held: {','.join(map(str, mine)) or 'none'} of {SHARDS}" in ready, ready

            # 2. Every kept notebook is probed, by exactly one process: the holder of its shard.
            mark = len(server.seen)
            time.sleep(6)
            window = probes_by_process(mark)
            assert balanced() == owner, "the spread changed during the window"
            segment = {ident: p for p, ident in PROCS.items()}
            for ns, name in keep:
                by = window.get((ns, name), Counter())
                assert list(by) == [segment[owner[shard_of(ns, SHARDS)]]], (ns, name, by, owner)
                assert by.most_common(1)[0][1] >= 2  # one status probe per pass, several passes
            assert not any(k in window for k in idle), "stopped notebooks are not probed"

            # Each idle notebook: exactly one stop Event, by the holder of its shard; kept ones: none.
            events = all_stop_events()
            for ns, name in idle:
                assert len(events[(ns, name)]) == 1, (ns, name, events[(ns, name)])
            assert not any(events[k] for k in keep)

            # 3. kill -9 a replica that holds a shard: its shards are taken over once their Leases lapse.
            victim_id = owner[0]
            victim = segment[victim_id]
            lost = sorted(i for i, h in owner.items() if h == victim_id)
            leases = client.CoordinationV1Api(api)
            procs[victim].send_signal(signal.SIGKILL)
            procs[victim].wait(10)
            last_renew = {i: leases.read_namespaced_lease(f"kf-culler-shard-{i}", lease_ns).spec.renew_time
                          for i in lost}
            fresh = [(ns, "late0") for ns, (s, kind) in namespaces.items() if s in lost and kind == "idle"]
            for ns, name in fresh:
                obj.create_notebook(api, ns, obj.notebook(name))
                obj.running_pod(api, ns, name, started)
            owner = wait(balanced, LEASE_SECONDS + 45, "the killed replica's shards to be taken over")
            for i in lost:
                lease = leases.read_namespaced_lease(f"kf-culler-shard-{i}", lease_ns)
                assert lease.spec.holder_identity != victim_id
                gap = (lease.spec.acquire_time - last_renew[i]).total_seconds()
                # never before the Lease lapsed; within a few renew periods after it did
                assert LEASE_SECONDS <= gap <= LEASE_SECONDS + 4 * RENEW_SECONDS, (i, gap)
            for ns, name in fresh:
                wait(lambda ns=ns, name=name: stopped(api, ns, name), 60, f"{ns}/{name} to be stopped")
            time.sleep(2)
            for ns, name in idle + fresh:
                evs = stop_events(api, ns, name)
                assert len(evs) == 1, (ns, name, [(e.reporting_instance, e.message) for e in evs])

            # 4. SIGSTOP a replica past its Leases: nobody takes them before they lapse, and after SIGCONT
            # it writes nothing for the shards it lost (no second stop, no Event of its own).
            alive = [p for p, proc in procs.items() if proc.poll() is None]
            paused = max(alive, key=lambda p: sum(1 for h in owner.values() if h == PROCS[p]))
            paused_id = PROCS[paused]
            its = sorted(i for i, h in owner.items() if h == paused_id)
            # notebooks in its shards whose start-up grace ends while it is paused
            soon = datetime.now(UTC) - timedelta(seconds=50)
            due = [(ns, "due0") for ns, (s, kind) in namespaces.items() if s in its and kind == "idle"]
            for ns, name in due:
                obj.create_notebook(api, ns, obj.notebook(name))
                obj.running_pod(api, ns, name, soon)
            time.sleep(2)  # the paused replica's watch has them
            procs[paused].send_signal(signal.SIGSTOP)
            t_stop = datetime.now(UTC)
            before = {i: leases.read_namespaced_lease(f"kf-culler-shard-{i}", lease_ns).spec.renew_time
                      for i in its}
            wait(lambda: all(holders(api, lease_ns)[i] not in (None, paused_id) for i in its),
                 LEASE_SECONDS + 45, "the paused replica's shards to be taken over")
            for i in its:
                lease = leases.read_namespaced_lease(f"kf-culler-shard-{i}", lease_ns)
                assert (lease.spec.acquire_time - before[i]).total_seconds() >= LEASE_SECONDS
            for ns, name in due:
                wait(lambda ns=ns, name=name: stopped(api, ns, name), 60, f"{ns}/{name} to be stopped")
            procs[paused].send_signal(signal.SIGCONT)
            t_cont = datetime.now(UTC)
            # It comes back, gets its fair share again (handed over by the others), and probes again.
            wait(lambda: paused_id in set(holders(api, lease_ns).values()), LEASE_SECONDS + 60,
                 "the resumed replica to hold a shard again")
            owner = wait(balanced, 60, "a stable spread with the resumed replica")
            time.sleep(3)
            for ns, name in due:
                evs = stop_events(api, ns, name)
                assert [e.reporting_instance for e in evs] != [] and len(evs) == 1, (ns, name, evs)
                assert evs[0].reporting_instance != paused_id
            # No Event of the paused replica from its pause until well after SIGCONT: it held nothing then
            # (its shards went to the others; any it gets back come only after a hand-over lapses).
            for ns in namespaces:
                for e in client.CoreV1Api(api).list_namespaced_event(ns).items:
                    if e.reporting_instance == paused_id:  # creationTimestamp: whole seconds, rounded down
                        created = e.metadata.creation_timestamp
                        assert not (t_stop < created < t_cont + timedelta(seconds=10)), (ns, e.message, created)
            for (ns, name), evs in all_stop_events().items():
                assert len(evs) <= 1, (ns, name, evs)
            for ns, name in idle + fresh + due:
                assert len(stop_events(api, ns, name)) == 1
            assert all(procs[p].poll() is None for p in alive)
        finally:
            for proc in procs.values():
                if proc.poll() is None:
                    proc.send_signal(signal.SIGCONT)
                    proc.terminate()
                    try:
                        proc.wait(30)
                    except subprocess.TimeoutExpired:
                        proc.kill()
    assert all(p.returncode in (0, -signal.SIGKILL) for p in procs.values()), {
        p: logs[p].read_text()[-2000:] for p in procs}
