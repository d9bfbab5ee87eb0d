"""Two culler processes against the real API server: one Lease holder writes; kill -9 it and the other
takes over, and no notebook gets two stop Events."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException
from support.target import KubeTarget

from kf_culler.local import objects as obj
from kf_culler.local.jupyter import JupyterServer
from kf_culler.local.router import Router
from kf_culler.model import STOP_ANNOTATION
from kf_culler.plan import EVENT_STOP

pytestmark = [pytest.mark.cluster, pytest.mark.slow]


def wait(pred: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = pred()
        if value:
            return value
        time.sleep(0.3)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture()
def idle_servers(namespace: str) -> Iterator[tuple[Router, dict[str, JupyterServer]]]:
    servers: dict[str, JupyterServer] = {}
    with Router() as router:
        try:
            for name in ("nb-one", "nb-two"):
                s = JupyterServer(namespace, name)
                s.start()
                s.start_kernel()
                servers[name] = s
                router.add("notebook", namespace, name, f"http://127.0.0.1:{s.port}", strip=False)
            yield router, servers
        finally:
            for s in servers.values():
                s.stop()


def holder(api: Any, namespace: str) -> str | None:
    try:
        lease = client.CoordinationV1Api(api).read_namespaced_lease("kf-culler", namespace)
    except ApiException:
        return None
    value: str | None = lease.spec.holder_identity
    return value


def stop_events(api: Any, namespace: str, name: str) -> list[Any]:
    return [e for e in obj.events_for(api, namespace, name) if e.reason == EVENT_STOP]


def test_one_writer_and_takeover(kube: KubeTarget, api: Any, namespace: str, tmp_path: Path,
                                 idle_servers: tuple[Router, dict[str, JupyterServer]]) -> None:
    router, _ = idle_servers
    cfg = tmp_path / "config.yaml"
    cfg.write_text(yaml.safe_dump({"idleMinutes": 0.05, "warnMinutes": 0, "startupGraceMinutes": 1,
                                   "checkPeriodSeconds": 1, "namespaces": {"include": [namespace]},
                                   "urls": {"jupyter": router.template()}}))
    procs: dict[str, subprocess.Popen[bytes]] = {}
    try:
        for ident in ("culler-a", "culler-b"):
            log = open(tmp_path / f"{ident}.log", "wb")  # noqa: SIM115
            procs[ident] = subprocess.Popen(
                [sys.executable, "-m", "kf_culler", "run", "--leader-elect", "--lease-namespace", namespace,
                 "--culler-namespace", "default", "--kubeconfig", str(kube.kubeconfig), "--config", str(cfg)],
                env={**os.environ, "POD_NAME": ident}, stdout=log, stderr=subprocess.STDOUT)
        leader = wait(lambda: holder(api, namespace), 60, "a leader")
        follower = next(i for i in procs if i != leader)

        started = datetime.now(UTC) - timedelta(hours=1)
        obj.create_notebook(api, namespace, obj.notebook("nb-one"))
        obj.running_pod(api, namespace, "nb-one", started)
        wait(lambda: STOP_ANNOTATION in obj.get_notebook(api, namespace, "nb-one")["metadata"]["annotations"],
             60, "nb-one to be stopped")
        events = wait(lambda: stop_events(api, namespace, "nb-one"), 30, "the stop Event")
        assert [e.reporting_instance for e in events] == [leader]

        procs[leader].send_signal(signal.SIGKILL)
        procs[leader].wait(10)
        obj.create_notebook(api, namespace, obj.notebook("nb-two"))
        obj.running_pod(api, namespace, "nb-two", started)
        wait(lambda: holder(api, namespace) == follower, 60, "the follower to take the lease")
        wait(lambda: STOP_ANNOTATION in obj.get_notebook(api, namespace, "nb-two")["metadata"]["annotations"],
             60, "nb-two to be stopped")
        time.sleep(3)  # a few more passes of the new leader
        assert [e.reporting_instance for e in stop_events(api, namespace, "nb-two")] == [follower]
        assert [e.reporting_instance for e in stop_events(api, namespace, "nb-one")] == [leader]
        assert procs[follower].poll() is None
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(30)
                except subprocess.TimeoutExpired:
                    p.kill()
    assert all(p.returncode in (0, -signal.SIGKILL) for p in procs.values()), [
        (tmp_path / f"{i}.log").read_text()[-2000:] for i in procs]
