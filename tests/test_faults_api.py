"""Fault matrix, Kubernetes side: the API server killed and restarted mid-pass, conflicts on every first
patch, a Notebook deleted between gather and apply, Events refused by RBAC, SIGTERM during a pass.

Each test runs against its own local control plane (etcd + kube-apiserver), so that stopping the API
server here disturbs no other test. Probes go to a loopback server whose `ok` answer is a Jupyter
server idle for an hour: every notebook in these tests is due to be stopped, exactly once.
"""

from __future__ import annotations

import asyncio
import base64
import os
import shutil
import signal
import ssl
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from need import missing
from support.faulty import FaultyServer
from support.passes import Passes

from kf_culler.config import load_mapping
from kf_culler.cycle import NotebookResult
from kf_culler.kube.writer import MAX_CONFLICT_RETRIES
from kf_culler.local import objects as obj
from kf_culler.local.cluster import ClusterError, LocalCluster
from kf_culler.local.procs import free_port
from kf_culler.model import (
    EXEMPT_ANNOTATION,
    KEEP_UNTIL_ANNOTATION,
    PREFIX,
    REASON_ANNOTATION,
    STATE_ANNOTATION,
    STOP_ANNOTATION,
    STOPPED_AT_ANNOTATION,
    STOPPED_BY_ANNOTATION,
)
from kf_culler.plan import EVENT_STOP
from kf_culler.runner import build_runner
from kf_culler.timeutil import format_time

pytestmark = pytest.mark.cluster
STOP_KEYS = {STOP_ANNOTATION, STOPPED_BY_ANNOTATION, STOPPED_AT_ANNOTATION, STATE_ANNOTATION, REASON_ANNOTATION}


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    """A control plane of this module's own: its API server is killed and restarted here."""
    if shutil.which("go") is None and not (Path.home() / ".cache/kf-culler/bin").exists():
        missing("kube-apiserver and etcd", "no Go toolchain to build them and no cached binaries")
    c = LocalCluster()
    try:
        c.start()
    except ClusterError as err:
        raise RuntimeError(f"the local control plane failed to start: {err}") from err
    try:
        c.apply_notebook_crd()
        yield c
    finally:
        c.stop()


@pytest.fixture()
def api(cluster: LocalCluster) -> Any:
    return cluster.api_client()


@pytest.fixture()
def ns(cluster: LocalCluster, api: Any) -> str:
    from kubernetes import client

    name = f"f-{uuid.uuid4().hex[:10]}"
    client.CoreV1Api(api).create_namespace({"metadata": {"name": name}})
    return name


@pytest.fixture(scope="module")
def faulty() -> Iterator[FaultyServer]:
    with FaultyServer() as server:
        yield server


def settings_for(faulty: FaultyServer, namespace: str, **extra: Any) -> dict[str, Any]:
    return {"namespaces": {"include": [namespace]},
            "idleMinutes": 1, "warnMinutes": 0, "startupGraceMinutes": 0,
            "urls": {"jupyter": faulty.base + "/{name}/", "codeServer": faulty.base + "/{name}/"},
            "probe": {"timeoutSeconds": 3, "connectTimeoutSeconds": 1, "retries": 1}, **extra}


def make(api: Any, namespace: str, *names: str) -> None:
    started = datetime.now(UTC) - timedelta(hours=1)
    for name in names:
        obj.create_notebook(api, namespace, obj.notebook(name))
        obj.running_pod(api, namespace, name, started)


def notebook_annotations(api: Any, namespace: str, name: str) -> dict[str, str]:
    return dict(obj.get_notebook(api, namespace, name)["metadata"].get("annotations") or {})


def stop_events(api: Any, namespace: str, name: str) -> int:
    return sum(1 for e in obj.events_for(api, namespace, name) if e.reason == EVENT_STOP)


def wait_for(pred: Any, what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(0.1)


def cached_names(runner: Passes) -> set[str]:
    assert runner.cache is not None
    return {nb["metadata"]["name"] for nb, _ in runner.cache.snapshot()}


# -- the API server killed and restarted mid-pass ---------------------------------------------------------------

def test_api_server_killed_mid_pass_and_restarted(cluster: LocalCluster, api: Any, ns: str,
                                                  faulty: FaultyServer) -> None:
    names = [f"nb-{i}" for i in range(6)]
    make(api, ns, *names)
    # One write at a time, so that "after the second notebook's write" is a place in the pass.
    runner = Passes(build_runner(load_mapping({**settings_for(faulty, ns), "writesInFlight": 1}, "test"), api))
    killed_after: list[str] = []

    def kill_after_two(result: NotebookResult) -> None:
        if len(killed_after) < 2:
            killed_after.append(result.name)
            if len(killed_after) == 2:
                cluster.stop_apiserver(kill=True)

    runner.change(on_result=kill_after_two)
    runner.start_cache(30)
    assert runner.cache is not None
    # Read before the kill: the watches break when the API server dies. Read later (after the pass with it down),
    # the count may already hold every break: a watch whose next try comes after the restart resumes without
    # another (it did, once, on a loaded machine).
    errors_before = runner.cache.stats()["watchErrors"]
    try:
        first = runner.once()  # the API server dies after the second notebook's write
        writes = {r.name: r.write for r in first.results}
        assert [r.name for r in first.results] == names, "the pass did not go on after the API server died"
        for name in names[:2]:
            w = writes[name]
            assert w is not None and w.outcome == "patched", w
        for name in names[2:]:
            w = writes[name]
            assert w is not None and w.outcome == "failed" and w.error, w
            assert w.event is None  # no Event for a stop that was not written

        runner.change(on_result=None)
        down = runner.once()  # a whole pass with the API server down: no crash, nothing written
        assert all(r.write is not None and r.write.outcome == "failed" for r in down.results
                   if r.verdict.action == "stop")
        assert down.seconds <= 60  # refused connections fail fast; every write is bounded anyway
        assert cached_names(runner) == set(names)  # the cache keeps serving what it knew

        cluster.start_apiserver()
        # Changes made right after the restart, while the culler's watches are still broken or backing off.
        make(api, ns, "nb-new")
        obj.delete_pod(api, ns, "nb-5-0")
        from kubernetes import client

        client.CustomObjectsApi(api).delete_namespaced_custom_object("kubeflow.org", "v1", ns, "notebooks", "nb-5")
        wait_for(lambda: cached_names(runner) == {*names[:5], "nb-new"}, "the cache to see the changes")
        assert runner.cache.stats()["watchErrors"] > errors_before  # the watches did break and resume

        third = runner.once()
        outcomes = {r.name: (r.verdict.action, r.write.outcome if r.write else None) for r in third.results}
        assert outcomes == {
            **{n: ("keep", None) for n in names[:2]},  # stopped before the crash: stopped stays stopped
            **{n: ("stop", "patched") for n in [*names[2:5], "nb-new"]},
        }, outcomes
        fourth = runner.once()
        assert all(r.verdict.action == "keep" and r.write is None for r in fourth.results)
    finally:
        runner.cache.close()
        cluster.start_apiserver()

    for name in [*names[:5], "nb-new"]:  # no stop lost, none doubled
        assert set(notebook_annotations(api, ns, name)) >= STOP_KEYS, name
        assert stop_events(api, ns, name) == 1, name


# -- 409 on every first patch, and 404 between gather and apply ------------------------------------------------

def test_conflict_on_every_first_patch(api: Any, ns: str, faulty: FaultyServer) -> None:
    """Another writer edits every notebook after the culler read it: each first patch gets 409, the culler
    re-reads, re-decides on the fresh object and writes again. Both writers' changes are kept, and a
    change that alters the decision (an exemption, a stop by the user) is honoured."""
    make(api, ns, "nb-plain", "nb-exempted", "nb-user-stopped")
    other = {"nb-plain": {"team.example.com/owner": "kim"},
             "nb-exempted": {"team.example.com/owner": "kim", EXEMPT_ANNOTATION: "true"},
             "nb-user-stopped": {"team.example.com/owner": "kim", STOP_ANNOTATION: "2026-01-01T00:00:00Z"}}
    runner = Passes(build_runner(load_mapping(settings_for(faulty, ns, allowExempt=True), "test"), api))

    def other_writer(now: datetime, nb: dict[str, Any], pod: Any, observations: Any, context: Any) -> None:
        obj.patch_annotations(api, ns, nb["metadata"]["name"], dict(other[nb["metadata"]["name"]]))

    runner.change(on_observed=other_writer)
    runner.start_cache(30)
    assert runner.cache is not None
    try:
        result = runner.once()
    finally:
        runner.cache.close()
    by = {r.name: r for r in result.results}
    for name in other:
        w = by[name].write
        assert w is not None and w.conflicts == 1 and w.attempts >= 1, (name, w)
        assert by[name].verdict.action == "stop"  # decided on the object as read; re-decided after the 409
        ann = notebook_annotations(api, ns, name)
        assert ann["team.example.com/owner"] == "kim"
    assert by["nb-plain"].write is not None and by["nb-plain"].write.outcome == "patched"
    assert set(notebook_annotations(api, ns, "nb-plain")) >= STOP_KEYS and stop_events(api, ns, "nb-plain") == 1
    ann = notebook_annotations(api, ns, "nb-exempted")
    assert STOP_ANNOTATION not in ann and stop_events(api, ns, "nb-exempted") == 0
    ann = notebook_annotations(api, ns, "nb-user-stopped")
    assert ann[STOP_ANNOTATION] == "2026-01-01T00:00:00Z"  # never rewritten
    assert not [k for k in ann if k.startswith(PREFIX)] and stop_events(api, ns, "nb-user-stopped") == 0


def test_a_stop_lands_despite_a_users_write_loop(api: Any, ns: str, faulty: FaultyServer) -> None:
    """A user's script writes their own Notebook after every read the culler makes (right after each of the
    writer's GETs, and once before the first patch), so every resourceVersion-guarded patch loses with 409.
    The stop still lands, through the final JSON Patch that tests the decision's inputs instead of the
    resourceVersion; the user's writes are all kept. The control: the same loop changing a decision input
    (a keep-until that now asks for more time) between that last read and the patch makes the patch fail its
    test, and no stop is written."""
    make(api, ns, "nb-loop", "nb-loop-keep")
    obj.patch_annotations(api, ns, "nb-loop-keep", {KEEP_UNTIL_ANNOTATION: "2026-01-01T00:00:00Z"})
    runner = Passes(build_runner(load_mapping(settings_for(faulty, ns, maxExtendMinutes=600), "test"), api))
    gets: Counter[str] = Counter()

    def user_write(name: str) -> None:
        extra = {}
        if name == "nb-loop-keep" and gets[name] > MAX_CONFLICT_RETRIES:  # the guarded patch's own read
            extra = {KEEP_UNTIL_ANNOTATION: format_time(datetime.now(UTC) + timedelta(hours=2))}
        obj.patch_annotations(api, ns, name, {"team.example.com/tick": str(gets[name]), **extra})

    runner.change(on_observed=lambda now, nb, pod, observations, context: user_write(nb["metadata"]["name"]))
    runner.start_cache(30)
    assert runner.cache is not None
    try:
        cycle = runner.build_cycle()
        assert cycle.writer is not None
        real_get = cycle.writer.get_object

        def get_then_user_writes(target: Any, namespace: str, name: str) -> Any:
            got = real_get(target, namespace, name)
            gets[name] += 1
            user_write(name)
            return got

        cycle.writer.get_object = get_then_user_writes  # type: ignore[method-assign]
        result = cycle.run(runner.cache.snapshot())
        assert result.wait_events(60)  # the runner's passes send their Events after the patches, in the background
    finally:
        runner.cache.close()
    by = {r.name: r for r in result.results}
    w = by["nb-loop"].write
    assert w is not None and w.outcome == "patched" and w.conflicts == MAX_CONFLICT_RETRIES + 1, w
    assert gets["nb-loop"] == MAX_CONFLICT_RETRIES + 1
    ann = notebook_annotations(api, ns, "nb-loop")
    assert set(ann) >= STOP_KEYS and ann["team.example.com/tick"] == str(gets["nb-loop"])
    assert stop_events(api, ns, "nb-loop") == 1
    kept = by["nb-loop-keep"].write
    assert kept is not None and kept.outcome == "conflict-exhausted", kept
    ann = notebook_annotations(api, ns, "nb-loop-keep")
    assert STOP_ANNOTATION not in ann and stop_events(api, ns, "nb-loop-keep") == 0


def test_notebook_deleted_between_gather_and_apply(api: Any, ns: str, faulty: FaultyServer) -> None:
    make(api, ns, "nb-a", "nb-b-gone", "nb-c")
    runner = Passes(build_runner(load_mapping(settings_for(faulty, ns), "test"), api))

    def delete_one(now: datetime, nb: dict[str, Any], pod: Any, observations: Any, context: Any) -> None:
        if nb["metadata"]["name"] == "nb-b-gone":
            from kubernetes import client

            client.CustomObjectsApi(api).delete_namespaced_custom_object(
                "kubeflow.org", "v1", ns, "notebooks", "nb-b-gone")

    runner.change(on_observed=delete_one)
    runner.start_cache(30)
    assert runner.cache is not None
    try:
        result = runner.once()
    finally:
        runner.cache.close()
    by = {r.name: r for r in result.results}
    gone = by["nb-b-gone"].write
    assert gone is not None and gone.outcome == "gone"
    assert gone.event is None and stop_events(api, ns, "nb-b-gone") == 0
    for name in ("nb-a", "nb-c"):  # the rest of the sweep went on
        w = by[name].write
        assert w is not None and w.outcome == "patched"
        assert stop_events(api, ns, name) == 1


# -- the Event API refusing writes ------------------------------------------------------------------------------

def test_events_refused_by_rbac_the_stop_still_happens(cluster: LocalCluster, api: Any, ns: str,
                                                       faulty: FaultyServer) -> None:
    from kubernetes import client

    rbac = client.RbacAuthorizationV1Api(api)
    role = f"kf-culler-no-events-{ns}"
    rbac.create_cluster_role({"metadata": {"name": role}, "rules": [
        {"apiGroups": ["kubeflow.org"], "resources": ["notebooks"], "verbs": ["get", "list", "watch", "patch"]},
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]},
        {"apiGroups": ["apps"], "resources": ["statefulsets"], "verbs": ["get", "list", "watch"]},
        # the culler's record, here in the same namespace
        {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list", "watch", "create", "patch"]},
    ]})
    rbac.create_namespaced_role_binding(ns, {
        "metadata": {"name": "kf-culler"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
        "subjects": [{"kind": "ServiceAccount", "name": "kf-culler", "namespace": ns}]})
    sa_api = cluster.api_client(cluster.service_account_kubeconfig(ns, "kf-culler"))
    make(api, ns, "nb-a", "nb-b")
    runner = Passes(build_runner(load_mapping(settings_for(faulty, ns), "test"), sa_api, records_namespace=ns))
    runner.start_cache(30)
    assert runner.cache is not None
    try:
        result = runner.once()
    finally:
        runner.cache.close()
    for r in result.results:
        assert r.write is not None and r.write.outcome == "patched", r.write
        assert r.write.event == "failed: HTTP 403", r.write.event  # reported, not raised
        assert set(notebook_annotations(api, ns, r.name)) >= STOP_KEYS
        assert stop_events(api, ns, r.name) == 0
    # The same account can indeed not create Events: the refusal above is RBAC's, not a culler bug.
    with pytest.raises(client.ApiException) as err:
        client.CoreV1Api(sa_api).create_namespaced_event(ns, {
            "metadata": {"generateName": "x."}, "involvedObject": {"kind": "Notebook", "name": "nb-a"}})
    assert err.value.status == 403


# -- SIGTERM during a pass --------------------------------------------------------------------------------------

class LoopServer:
    """A TCP server on 127.0.0.1 run by an asyncio loop in a thread of its own; a subclass says in `_handle`
    what one connection gets, and may pass an SSL context."""

    def __init__(self, tls: ssl.SSLContext | None = None) -> None:
        self.port = free_port()
        self.tls = tls
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._server: asyncio.AbstractServer | None = None
        self._writers: list[asyncio.StreamWriter] = []

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        raise NotImplementedError

    def __enter__(self) -> LoopServer:
        self.thread.start()

        async def up() -> None:
            self._server = await asyncio.start_server(self._handle, "127.0.0.1", self.port, ssl=self.tls)

        asyncio.run_coroutine_threadsafe(up(), self.loop).result(10)
        return self

    def __exit__(self, *exc: object) -> None:
        async def down() -> None:
            if self._server is not None:
                self._server.close()
            for w in self._writers:
                w.close()

        asyncio.run_coroutine_threadsafe(down(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


class SlowProxy(LoopServer):
    """A TCP proxy to the API server that holds every chunk the client sends for `delay` seconds, so each
    API call of the culler takes a while and a signal can land in the middle of its writes."""

    def __init__(self, target_port: int, delay: float) -> None:
        super().__init__()
        self.target_port = target_port
        self.delay = delay

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay: float) -> None:
        try:
            while data := await reader.read(65536):
                if delay:
                    await asyncio.sleep(delay)
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            writer.close()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            writer.close()
            return
        await asyncio.gather(self._pipe(reader, up_writer, self.delay), self._pipe(up_reader, writer, 0.0))


class SilentProxy(LoopServer):
    """Where the API server should be: accepts every connection, reads what the client sends and never
    answers (an API server that hangs). Without `tls` it does not even complete the TLS handshake; with
    it the handshake completes and the request is read whole, then nothing comes back. Counts the
    connections and records each request line it read."""

    def __init__(self, tls: ssl.SSLContext | None = None) -> None:
        super().__init__(tls)
        self.connections = 0
        self.request_lines: list[str] = []

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self._writers.append(writer)
        try:
            if self.tls is not None:
                head = await reader.readuntil(b"\r\n\r\n")
                self.request_lines.append(head.split(b"\r\n", 1)[0].decode("latin-1"))
            while await reader.read(65536):
                pass
        except (ConnectionError, OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            pass


@pytest.mark.timeout(300)  # a guard only: without a request timeout the pass would never end
@pytest.mark.parametrize("mode", ["no-handshake", "no-answer"])
def test_a_hanging_api_server_fails_the_write_and_the_next_pass_writes(
        cluster: LocalCluster, api: Any, ns: str, faulty: FaultyServer, tmp_path: Path, monkeypatch: Any,
        mode: str) -> None:
    """The writer's API server accepts connections and hangs, before the TLS handshake (bounded by the
    connect timeout) or after reading the PATCH (bounded by the read timeout): each write ends `failed`
    after one attempt, no Event is written, and the pass ends; the next pass, with the API server
    answering, writes every stop once. The timeouts keep production's shape (connect, read), shorter so
    that the test does not wait 30 s per write."""
    from kubernetes import config as kube_config

    from kf_culler.cycle import Cycle
    from kf_culler.kube import writer as writer_module
    from kf_culler.local.pki import Authority

    monkeypatch.setattr(writer_module, "REQUEST_TIMEOUT", (1.0, 2.0))
    tls: ssl.SSLContext | None = None
    kubeconfig = yaml.safe_load(cluster.kubeconfig.read_text())
    if mode == "no-answer":  # a server certificate the client trusts, so the handshake completes
        ca = Authority(tmp_path)
        serving = ca.issue("silent", "kube-apiserver", server=True)
        tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        tls.load_cert_chain(serving.cert, serving.key)
        for c in kubeconfig["clusters"]:
            c["cluster"].pop("certificate-authority", None)
            c["cluster"]["certificate-authority-data"] = base64.b64encode(ca.pair.cert.read_bytes()).decode()
    names = ["nb-a", "nb-b", "nb-c"]
    make(api, ns, *names)
    settings = load_mapping(settings_for(faulty, ns), "test")
    runner = Passes(build_runner(settings, api))
    with runner:
        wait_for(lambda: cached_names(runner) == set(names), "the cache to list the notebooks")
        with SilentProxy(tls) as proxy:
            for c in kubeconfig["clusters"]:
                c["cluster"]["server"] = f"https://127.0.0.1:{proxy.port}"
            (tmp_path / "kubeconfig").write_text(yaml.safe_dump(kubeconfig))
            hanging = kube_config.new_client_from_config(config_file=str(tmp_path / "kubeconfig"))
            assert runner.cache is not None
            result = Cycle(settings, writer=writer_module.Writer(hanging)).run(runner.cache.snapshot())
            connections, request_lines = proxy.connections, list(proxy.request_lines)
        by_name = {r.name: r for r in result.results}
        assert set(by_name) == set(names)
        for name in names:
            r = by_name[name]
            assert r.verdict.action == "stop", r.verdict.reason
            assert r.write is not None and (r.write.outcome, r.write.attempts) == ("failed", 1), r.write
            assert r.write.event is None  # no Event for a stop that was not written
            assert r.write.error is not None and "timed out" in r.write.error.lower(), r.write.error
            # which timeout ended it: the handshake runs under the connect timeout, the answer under the read one
            assert f"timeout={1.0 if mode == 'no-handshake' else 2.0}" in r.write.error, r.write.error
            assert STOP_ANNOTATION not in notebook_annotations(api, ns, name)
            assert stop_events(api, ns, name) == 0
        # one write per notebook, each at most a connection plus urllib3's own connect retries (3)
        assert len(names) <= connections <= 4 * len(names), connections
        if mode == "no-answer":  # each PATCH was sent whole, and only the answer was missing
            assert sorted(request_lines) == sorted(
                f"PATCH /apis/kubeflow.org/v1/namespaces/{ns}/notebooks/{n} HTTP/1.1" for n in names)
        again = {r.name: r for r in runner.once().results}
    for name in names:
        write = again[name].write
        assert write is not None and write.outcome == "patched", write
        assert STOP_ANNOTATION in notebook_annotations(api, ns, name) and stop_events(api, ns, name) == 1


def kubeconfig_through(cluster: LocalCluster, port: int, path: Path) -> Path:
    cfg = yaml.safe_load(cluster.kubeconfig.read_text())
    for c in cfg["clusters"]:
        c["cluster"]["server"] = f"https://127.0.0.1:{port}"
    path.write_text(yaml.safe_dump(cfg))
    return path


def start_culler(cluster: LocalCluster, kubeconfig: Path, config: dict[str, Any], tmp: Path) -> subprocess.Popen[bytes]:
    cfg = tmp / "config.yaml"
    cfg.write_text(yaml.safe_dump(config))
    log = (tmp / "culler.log").open("wb")
    env = {**os.environ, "OTEL_TRACES_EXPORTER": "none", "PYTHONUNBUFFERED": "1"}
    try:
        return subprocess.Popen([sys.executable, "-m", "kf_culler", "run", "--kubeconfig", str(kubeconfig),
                                 "--culler-namespace", "default", "--config", str(cfg)], stdout=log,
                                stderr=subprocess.STDOUT, env=env)
    finally:
        log.close()


def assert_all_or_nothing(api: Any, ns: str, names: list[str]) -> int:
    """Every notebook has the full stop (annotations + one Event) or no trace of the culler. Returns the
    number stopped."""
    stopped = 0
    for name in names:
        ann = notebook_annotations(api, ns, name)
        ours = {k for k in ann if k.startswith(PREFIX)}
        events = stop_events(api, ns, name)
        if STOP_ANNOTATION in ann:
            assert set(ann) >= STOP_KEYS and events == 1, (name, ann, events)
            stopped += 1
        else:
            assert not ours and events == 0, (name, ann, events)
    return stopped


@pytest.mark.parametrize("when", ["during-gather", "during-apply"])
def test_sigterm_during_a_pass(cluster: LocalCluster, api: Any, ns: str, faulty: FaultyServer,
                               tmp_path: Path, when: str) -> None:
    """`kf-culler run` gets SIGTERM while probing (one endpoint hangs) or while writing stops: it exits
    with 0 within the grace period, and no notebook is left half-written."""
    names = [f"nb-{i:02d}" for i in range(30)]
    make(api, ns, *names, "nb-hang")  # the `hang` endpoint holds the gather for the probe timeout
    grace = 30.0
    port = int(cluster.server.rsplit(":", 1)[1])
    config = settings_for(faulty, ns, checkPeriodSeconds=3600)
    config["probe"]["timeoutSeconds"] = 8
    if when == "during-apply":
        # One write at a time, each through the slow proxy, so that the signal lands with stops still to write:
        # 16 writers wrote all 30 within the second it took to see the first (the signal then ends nothing).
        config["writesInFlight"] = 1
    with SlowProxy(port, delay=0.15 if when == "during-apply" else 0.0) as proxy:
        kubeconfig = kubeconfig_through(cluster, proxy.port, tmp_path / "kubeconfig")
        hang_before = len(faulty.requests_for("hang"))
        proc = start_culler(cluster, kubeconfig, config, tmp_path)
        try:
            if when == "during-gather":
                wait_for(lambda: len(faulty.requests_for("hang")) > hang_before, "the hanging probe", 90)
                time.sleep(0.5)
            else:
                wait_for(lambda: any(STOP_ANNOTATION in notebook_annotations(api, ns, n) for n in names),
                         "the first stop", 90)
            assert proc.poll() is None, (tmp_path / "culler.log").read_text()[-3000:]
            proc.send_signal(signal.SIGTERM)
            t0 = time.monotonic()
            code = proc.wait(grace + 10)
            waited = time.monotonic() - t0
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
    log_text = (tmp_path / "culler.log").read_text()
    assert code == 0, log_text[-3000:]
    assert waited <= grace, f"exit took {waited:.1f}s after SIGTERM"
    stopped = assert_all_or_nothing(api, ns, [*names, "nb-hang"])
    if when == "during-gather":
        assert stopped == 0  # the signal came before any write: the pass ended without writing
    else:
        assert 0 < stopped < len(names), f"{stopped} stopped: the signal did not land mid-apply"
    assert "signal 15" in log_text
