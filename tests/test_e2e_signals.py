"""Every signal together, end to end on the real API server: a real code-server, a real Jupyter server
and a real Prometheus scraping GPU series.

The GPU series come from a stand-in dcgm-exporter (kf_culler.local.prometheus.dcgm_exposition; no GPU
exists here): dcgm-exporter's text format with its default counters DCGM_FI_DEV_GPU_UTIL and
DCGM_FI_DEV_FB_USED and its pod/namespace/container labels, as in dcgm-exporter's
etc/default-counters.csv.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from need import missing
from support.codeserver import CodeServer
from support.codeserver import Unavailable as NoCodeServer
from support.passes import Passes

from kf_culler.config import load_mapping
from kf_culler.local import objects as obj
from kf_culler.local.jupyter import JupyterServer
from kf_culler.local.prometheus import Exposition, FakeGpu, Prometheus, Unavailable, dcgm_exposition, static_job
from kf_culler.local.router import Router
from kf_culler.model import STOP_ANNOTATION
from kf_culler.runner import build_runner

pytestmark = [pytest.mark.cluster, pytest.mark.slow]


@pytest.fixture()
def world(api: Any, namespace: str) -> Iterator[dict[str, Any]]:
    gpus = [FakeGpu(0, "GPU-0", util=0, used_mib=0, namespace=namespace, pod="cs-closed-0"),
            FakeGpu(1, "GPU-1", util=80, used_mib=4000, namespace=namespace, pod="jup-gpu-busy-0"),
            FakeGpu(2, "GPU-2", util=0, used_mib=0, namespace=namespace, pod="cs-unreachable-0")]
    try:
        code = CodeServer()
    except NoCodeServer as why:
        missing("code-server", why)
    with Router() as router, Exposition(dcgm_exposition(gpus)) as exp, code, \
            JupyterServer(namespace, "jup-gpu-busy") as jup:
        try:
            prom = Prometheus([static_job("dcgm", [exp.stub.address], honor_labels=True)]).start()
        except Unavailable as why:
            missing("Prometheus", why)
        try:
            jup.start_kernel()
            router.add("notebook", namespace, "jup-gpu-busy", f"http://127.0.0.1:{jup.port}", strip=False)
            router.add("cs", namespace, "cs-closed", code.url, strip=True)
            started = datetime.now(UTC) - timedelta(hours=1)
            for name, stype in (("cs-closed", "group-one"), ("jup-gpu-busy", "jupyter"),
                                ("cs-unreachable", "group-one")):
                obj.create_notebook(api, namespace, obj.notebook(name, server_type=stype, gpus=1))
                obj.running_pod(api, namespace, name, started, gpus=1)
            prom.wait_for("count_over_time(DCGM_FI_DEV_FB_USED[1m]) >= 2", count=3, timeout=60)
            yield {"router": router, "prom": prom, "code": code}
        finally:
            prom.stop()


def test_code_server_closed_gpu_idle_is_stopped_and_the_others_kept(api: Any, namespace: str,
                                                                    world: dict[str, Any]) -> None:
    code: CodeServer = world["code"]

    async def open_then_close() -> None:
        async with code.client():
            await asyncio.sleep(2)

    asyncio.run(open_then_close())  # a browser tab, then closed
    deadline = time.monotonic() + 150
    while code.healthz()["status"] != "expired" and time.monotonic() < deadline:
        time.sleep(2)
    health = code.healthz()
    assert health["status"] == "expired" and health["lastHeartbeat"] > 0
    time.sleep(3.5)

    settings = load_mapping({
        "idleMinutes": 0.05, "warnMinutes": 0, "startupGraceMinutes": 1,
        # rule 6 alone for the unreachable one (rule 16, an idle GPU behind an unreadable IDE: test_red_team.py)
        "noSignalGpuIdleMinutes": None,
        "namespaces": {"include": [namespace]},
        "urls": {"jupyter": world["router"].template(), "codeServer": world["router"].template("cs")},
        "prometheus": {"url": world["prom"].url, "stepSeconds": 1}}, "test")
    with Passes(build_runner(settings, api)) as runner:
        by_name = {r.name: r for r in runner.once().results}

    closed = by_name["cs-closed"].verdict
    assert (closed.action, closed.state) == ("stop", "idle"), closed.reason
    assert "code-server" in closed.reason and "GPU" in closed.reason
    assert STOP_ANNOTATION in obj.get_notebook(api, namespace, "cs-closed")["metadata"]["annotations"]

    busy = by_name["jup-gpu-busy"].verdict
    assert (busy.action, busy.state) == ("keep", "active"), busy.reason
    assert busy.evidence["jupyter"]["busyKernels"] == 0  # the kernels are idle: the GPU alone shows work

    unreachable = by_name["cs-unreachable"].verdict
    assert (unreachable.action, unreachable.state) == ("keep", "no-signal"), unreachable.reason
    for name in ("jup-gpu-busy", "cs-unreachable"):
        assert STOP_ANNOTATION not in obj.get_notebook(api, namespace, name)["metadata"]["annotations"]
