"""`kf-culler demo --target workspaces`: a Kubeflow Notebooks 2.0 Workspace paused with its reason.

Everything but the culler is upstream code on a local cluster: kube-apiserver, kube-controller-manager,
kube-scheduler, kwok (playing one node) and Kubeflow's Workspace controller v2.0.0-beta.0 (built on first use
from the vendored source, docs/targets.md). kwok's pods run no containers, so two real Jupyter servers serve
the Workspaces' connect paths behind a local router, where the Workspaces' Services would route.
"""

from __future__ import annotations

import time
import uuid
from typing import Any, TextIO

from kf_culler.config import load_mapping
from kf_culler.local import procs
from kf_culler.local.cluster import ClusterError
from kf_culler.local.handoff import Unavailable, open_full_cluster
from kf_culler.local.jupyter import JupyterServer
from kf_culler.local.router import Router
from kf_culler.local.workspaces import (
    GROUP,
    KINDS,
    VERSION,
    WORKSPACES,
    WorkspaceControllerUnavailable,
    connect_path,
    start_workspace_controller,
    workspace_body,
    workspace_kind_body,
)
from kf_culler.model import REASON_ANNOTATION, STATE_ANNOTATION, STOPPED_BY_ANNOTATION
from kf_culler.plan import EVENT_STOP
from kf_culler.report import table
from kf_culler.runner import build_runner

TIMEOUT = 60.0


def run_workspaces_demo(out: TextIO, idle_seconds: float = 20.0) -> int:
    """Tell the story on `out`. 0 when it ran to the end, 1 when it could not run here."""

    def say(text: str = "") -> None:
        print(text, file=out, flush=True)

    say("kf-culler demo --target workspaces: an idle Kubeflow Notebooks 2.0 Workspace is paused, and says why")
    say()
    say("1. Starting a local cluster built from upstream: kube-apiserver, kube-controller-manager,")
    say("   kube-scheduler, and kwok playing one node ...")
    t0 = time.monotonic()
    try:
        with open_full_cluster(quiet=False) as cluster:
            say(f"   ready in {time.monotonic() - t0:.1f} s ({cluster.server}).")
            say("2. Starting Kubeflow's Workspace controller v2.0.0-beta.0 (built from its source on first use;")
            say("   ENABLE_WEBHOOKS=false, no Istio) ...")
            try:
                start_workspace_controller(cluster)
            except WorkspaceControllerUnavailable as why:
                say(f"   the Workspace controller is not available here: {why}")
                return 1
            say("   running.")
            return _story(cluster.api_client(), say, idle_seconds)
    except Unavailable as why:
        say(f"   cannot start the local cluster here: {why}")
        return 1
    except (ClusterError, TimeoutError) as err:
        say(f"   the demo stopped: {err}")
        return 1


def _story(api: Any, say: Any, idle_seconds: float) -> int:
    from kubernetes import client

    core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
    suffix = uuid.uuid4().hex[:6]
    ns, kind = f"demo-{suffix}", f"jupyterlab-{suffix}"
    core.create_namespace({"metadata": {"name": ns}})
    custom.create_cluster_custom_object(GROUP, VERSION, KINDS, workspace_kind_body(kind))

    def workspace(name: str) -> dict[str, Any]:
        found: dict[str, Any] = custom.get_namespaced_custom_object(GROUP, VERSION, ns, WORKSPACES, name)
        return found

    say(f"3. In namespace {ns}: WorkspaceKind {kind} (JupyterLab on port 8888) and two Workspaces, idle and busy.")
    for name in ("idle", "busy"):
        custom.create_namespaced_custom_object(GROUP, VERSION, ns, WORKSPACES, workspace_body(ns, name, kind))
    for name in ("idle", "busy"):
        procs.wait_until(lambda n=name: workspace(n).get("status", {}).get("state") == "Running", TIMEOUT, 0.2,
                         f"workspace {name} to be Running")
    with Router() as router, JupyterServer(ns, "idle", base_path=connect_path(ns, "idle", "jupyterlab")) as idle, \
            JupyterServer(ns, "busy", base_path=connect_path(ns, "busy", "jupyterlab")) as busy:
        for name, server in (("idle", idle), ("busy", busy)):
            router.add("ws", ns, name, f"http://127.0.0.1:{server.port}", strip=True)
        kernel = busy.start_kernel()
        busy.execute(kernel, "import time; time.sleep(3600)")
        say("   The controller made each one's StatefulSet, Service and pod; both are Running. A real Jupyter")
        say("   server serves each one's connect path /workspace/connect/<namespace>/<name>/jupyterlab/;")
        say("   busy's kernel runs a cell.")
        settings = load_mapping({
            "targets": ["workspaces"], "namespaces": {"include": [ns]},
            "idleMinutes": idle_seconds / 60, "warnMinutes": 0, "startupGraceMinutes": 0.1,
            "urls": {"workspace": f"{router.base}/ws/{{namespace}}/{{name}}{{path}}"}}, "demo")
        say(f"4. The culler (targets: [workspaces], idle limit {idle_seconds:g} s) runs a pass every 2 s ...")
        with build_runner(settings, api, records_namespace=ns) as runner:
            deadline = time.monotonic() + idle_seconds + TIMEOUT
            memory = None  # what each pass remembers for the next
            while True:
                result = runner.once(memory)
                memory = result.memory
                stopped = [r for r in result.results if r.verdict.action == "stop"]
                if stopped or time.monotonic() > deadline:
                    break
                time.sleep(2)
        say("\n".join("   " + line for line in table(result).splitlines()))
        if not stopped:
            say("   the idle Workspace was not paused in time")
            return 1
    ws = workspace("idle")
    ann = ws["metadata"].get("annotations") or {}
    say()
    say(f"5. idle is paused: spec.paused = {ws['spec'].get('paused')} (a JSON merge patch; the StatefulSet is the")
    say("   controller's and is never touched). What its user sees:")
    for key in (STATE_ANNOTATION, STOPPED_BY_ANNOTATION, REASON_ANNOTATION):
        say(f"   {key}: {ann.get(key)!r}")
    events = [e for e in core.list_namespaced_event(ns).items
              if e.involved_object.kind == "Workspace" and e.involved_object.name == "idle"
              and e.reason == EVENT_STOP]
    if events:
        say(f"   Event {EVENT_STOP} ({events[0].type}) on Workspace idle: {events[0].message}")
    procs.wait_until(lambda: workspace("idle").get("status", {}).get("state") == "Paused", TIMEOUT, 0.2,
                     "the controller to show the Workspace Paused")
    status = workspace("idle").get("status", {})
    say(f"6. The controller scaled its StatefulSet to 0: state {status.get('state')!r}, "
        f"stateMessage {status.get('stateMessage')!r}.")
    say(f"   busy stays: spec.paused = {workspace('busy')['spec'].get('paused')}, state "
        f"{workspace('busy').get('status', {}).get('state')!r}.")
    say()
    say("Done: the idle Workspace was paused through spec.paused, with its reason on the Workspace and in an Event.")
    core.delete_namespace(ns)
    procs.wait_until(lambda: not core.list_namespaced_pod(ns).items, TIMEOUT, 0.2, "the demo's pods to go")
    custom.delete_cluster_custom_object(GROUP, VERSION, KINDS, kind)
    return 0
