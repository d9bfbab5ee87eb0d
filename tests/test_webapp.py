"""What a user sees of kf-culler in Kubeflow's own Jupyter web app, and what its Start button does.

Real here:
- Kubeflow's Jupyter web app backend v1.11.0 (Flask), the unmodified upstream source
  (../shared/vendor/kubeflow-jupyter-web-app-v1.11.0, run from a copy), in a virtualenv of its own made by
  hack/webapp/install.sh (its pinned kubernetes==34.1.0 client), served by gunicorn with gevent workers in
  its dev mode (no authentication or SubjectAccessReviews; the XSRF cookie and header are still checked).
  The frontend is not part of it: the tests call the routes the frontend calls.
- kube-apiserver and etcd (the session's cluster, tests/conftest.py), the Notebook CRD, Events.
- Jupyter servers (jupyter_server + ipykernel) answering the culler's probes, and kf-culler's own code
  (Passes: cache, probes, decide, plan, writer).

Played by the tests: the notebook-controller's part (the notebook's pod and the readyReplicas it reports,
set as the controller and a kubelet would) and the user's browser (support.webapp.WebAppClient).

If the web app cannot be installed here the tests are skipped, and fail in CI (CI=true), where
hack/setup.sh installs it; a web app that is installed but does not start always fails them.
"""

from __future__ import annotations

import contextlib
import re
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import requests
from need import missing
from support.passes import Passes
from support.target import KubeTarget
from support.webapp import CSRF_COOKIE, Unavailable, WebApp, WebAppClient, start_webapp, virtualenv
from test_e2e_cull import settings_for

from kf_culler.kube import GROUP, PLURAL, VERSION
from kf_culler.local import objects as obj
from kf_culler.local.jupyter import JupyterServer
from kf_culler.local.router import Router
from kf_culler.model import LAST_ACTIVITY_ANNOTATION, STOP_ANNOTATION, Verdict
from kf_culler.plan import EVENT_STOP, EVENT_WARN
from kf_culler.runner import build_runner
from kf_culler.timeutil import format_time

pytestmark = pytest.mark.cluster
RFC3339_UTC = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$")
NAME = "nb-idle"


@pytest.fixture(scope="module")
def webapp(kube: KubeTarget) -> Iterator[WebApp]:
    """Kubeflow's Jupyter web app backend against the session's API server (admin kubeconfig)."""
    try:
        venv = virtualenv()
    except Unavailable as why:
        missing("Kubeflow's Jupyter web app backend v1.11.0", why)
    with start_webapp(kube.kubeconfig, venv=venv) as app:  # fails the tests if it does not start
        yield app


@pytest.fixture()
def ui(webapp: WebApp) -> Iterator[WebAppClient]:
    with webapp.client() as client:
        yield client


@pytest.fixture(scope="module")
def router() -> Iterator[Router]:
    with Router() as r:
        yield r


@contextlib.contextmanager
def fresh_namespace(api: Any) -> Iterator[str]:
    from kubernetes import client

    name = f"t-{uuid.uuid4().hex[:10]}"
    core = client.CoreV1Api(api)
    core.create_namespace({"metadata": {"name": name}})
    try:
        yield name
    finally:
        with contextlib.suppress(Exception):
            core.delete_namespace(name)


@contextlib.contextmanager
def idle_jupyter(router: Router, namespace: str, name: str) -> Iterator[JupyterServer]:
    """A real Jupyter server behind the culler's URL template, with one idle kernel."""
    server = JupyterServer(namespace, name)
    try:
        server.start()
        router.add("notebook", namespace, name, f"http://127.0.0.1:{server.port}", strip=False)
        server.start_kernel()
        yield server
    finally:
        router.remove("notebook", namespace, name)
        server.stop()


def make_running(api: Any, namespace: str, name: str, started: datetime) -> None:
    """A Notebook as the web app's form creates it (a home volume mounted), its pod Running since started,
    and the status the notebook-controller reports for it."""
    body = obj.notebook(name)
    spec = body["spec"]["template"]["spec"]
    spec["containers"][0]["volumeMounts"] = [{"name": f"{name}-volume", "mountPath": "/home/jovyan"},
                                             {"name": "dshm", "mountPath": "/dev/shm"}]
    spec["volumes"] = [{"name": f"{name}-volume", "persistentVolumeClaim": {"claimName": f"{name}-volume"}},
                       {"name": "dshm", "emptyDir": {"medium": "Memory"}}]
    obj.create_notebook(api, namespace, body)
    obj.running_pod(api, namespace, name, started)
    set_ready_replicas(api, namespace, name, 1)


def set_ready_replicas(api: Any, namespace: str, name: str, ready: int) -> None:
    """The Notebook's status as the notebook-controller mirrors it from the StatefulSet and its pod."""
    from kubernetes import client

    state: dict[str, Any] = {"running": {"startedAt": format_time(datetime.now(UTC))}} if ready else {}
    client.CustomObjectsApi(api).patch_namespaced_custom_object_status(
        GROUP, VERSION, namespace, PLURAL, name,
        {"status": {"readyReplicas": ready, "containerState": state, "conditions": []}})


def poll(get: Callable[[], Any], until: Callable[[Any], bool], what: str, timeout: float = 90) -> Any:
    """get() until until(answer); the deadline only bounds a wait that never ends."""
    deadline = time.monotonic() + timeout
    answer = get()
    while not until(answer):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}; last answer: {answer!r}")
        time.sleep(0.5)
        answer = get()
    return answer


def wait_cache(runner: Passes, namespace: str, name: str, pred: Callable[[dict[str, Any], Any], bool],
               what: str, timeout: float = 60) -> None:
    def seen() -> bool:
        assert runner.cache is not None
        return any(nb["metadata"]["namespace"] == namespace and nb["metadata"]["name"] == name and pred(nb, pod)
                   for nb, pod in runner.cache.snapshot())

    poll(seen, bool, f"the culler's cache to show {what}", timeout)


@dataclass
class Culled:
    api: Any
    namespace: str
    name: str
    warned: Verdict
    stopped: Verdict
    row_before: dict[str, Any]


@pytest.fixture(scope="module")
def culled(kube: KubeTarget, router: Router, webapp: WebApp) -> Iterator[Culled]:
    """An idle notebook that kf-culler warned and then stopped, and that the controller then scaled to 0."""
    api = kube.api_client()
    with fresh_namespace(api) as ns, idle_jupyter(router, ns, NAME), webapp.client() as client:
        make_running(api, ns, NAME, datetime.now(UTC) - timedelta(hours=1))
        row_before = poll(lambda: client.notebook_row(ns, NAME), lambda r: r["status"]["phase"] == "ready",
                          "the web app to show the running notebook as ready")
        # Idle past 3 s: warned; past 30 s: stopped. Passes every half second in between.
        runner = Passes(build_runner(settings_for(router, ns, idleMinutes=0.5, warnMinutes=0.45), api))
        verdicts: list[Verdict] = []
        with runner:
            deadline = time.monotonic() + 180
            while not verdicts or verdicts[-1].action != "stop":
                assert time.monotonic() < deadline, f"never stopped: {[v.action for v in verdicts]}"
                verdicts.append(runner.once().results[0].verdict)
                time.sleep(0.5)
        warned = [v for v in verdicts if v.action == "warn"]
        assert warned, f"no warning before the stop: {[(v.action, v.state) for v in verdicts]}"
        # The notebook-controller sees the stop annotation, scales the StatefulSet to 0, the pod goes.
        obj.delete_pod(api, ns, f"{NAME}-0")
        set_ready_replicas(api, ns, NAME, 0)
        yield Culled(api, ns, NAME, warned[0], verdicts[-1], row_before)


def test_notebook_list_shows_the_stop_and_our_last_activity(culled: Culled, ui: WebAppClient) -> None:
    assert culled.row_before["status"]["phase"] == "ready"
    ann = obj.get_notebook(culled.api, culled.namespace, culled.name)["metadata"]["annotations"]
    assert RFC3339_UTC.match(ann[STOP_ANNOTATION])
    assert RFC3339_UTC.match(ann[LAST_ACTIVITY_ANNOTATION])
    row = poll(lambda: ui.notebook_row(culled.namespace, culled.name),
               lambda r: r["status"]["phase"] == "stopped", "the web app to show the notebook stopped")
    assert row["status"]["message"] == "No Pods are currently running for this Notebook Server."
    # The table's "Last activity" column (apps/common/utils.py: notebook_dict_from_k8s_obj).
    assert row["last_activity"] == ann[LAST_ACTIVITY_ANNOTATION]
    assert culled.stopped.idle_since is not None
    assert row["last_activity"] == format_time(culled.stopped.idle_since)
    assert row["metadata"]["annotations"][STOP_ANNOTATION] == ann[STOP_ANNOTATION]
    # The details page agrees.
    detail = ui.notebook(culled.namespace, culled.name)
    assert detail["processed_status"]["phase"] == "stopped"


def test_events_tab_shows_the_warning_and_the_stop(culled: Culled, ui: WebAppClient) -> None:
    events = ui.events(culled.namespace, culled.name)
    by_reason: dict[str, list[dict[str, Any]]] = {}
    for e in events:
        by_reason.setdefault(e["reason"], []).append(e)
    assert len(by_reason.get(EVENT_WARN, [])) == 1, events
    assert len(by_reason.get(EVENT_STOP, [])) == 1, events
    warn, stop = by_reason[EVENT_WARN][0], by_reason[EVENT_STOP][0]
    assert warn["type"] == "Warning" and stop["type"] == "Warning"
    assert warn["message"].startswith(culled.warned.reason), (warn["message"], culled.warned.reason)
    assert stop["message"].startswith(culled.stopped.reason), (stop["message"], culled.stopped.reason)
    for e in (warn, stop):
        assert e["involvedObject"]["kind"] == "Notebook" and e["involvedObject"]["name"] == culled.name
    # The same Events as the API server lists for the notebook.
    api_events = {e.reason: e.message for e in obj.events_for(culled.api, culled.namespace, culled.name)}
    assert api_events[EVENT_WARN] == warn["message"] and api_events[EVENT_STOP] == stop["message"]


def test_patch_needs_the_xsrf_cookie_and_header(webapp: WebApp, culled: Culled) -> None:
    """The web app refuses a state change without its XSRF cookie and header, even in dev mode."""
    path = f"{webapp.url}api/namespaces/{culled.namespace}/notebooks/{culled.name}"
    bare = requests.patch(path, json={"stopped": False}, timeout=60)
    assert bare.status_code == 403 and CSRF_COOKIE in bare.json()["log"], bare.text
    mismatched = requests.patch(path, json={"stopped": False}, timeout=60,
                                cookies={CSRF_COOKIE: "a"}, headers={"X-XSRF-TOKEN": "b"})
    assert mismatched.status_code == 403, mismatched.text
    ann = obj.get_notebook(culled.api, culled.namespace, culled.name)["metadata"]["annotations"]
    assert STOP_ANNOTATION in ann


def test_start_from_the_web_app_is_not_stopped_again(kube: KubeTarget, router: Router, ui: WebAppClient) -> None:
    """The user presses Start right after the stop: the stop annotation goes, the old pod is still there
    and Running since long ago, and Jupyter still answers idle. The next pass must keep it (starting)."""
    api = kube.api_client()
    with fresh_namespace(api) as ns, idle_jupyter(router, ns, NAME) as server:
        make_running(api, ns, NAME, datetime.now(UTC) - timedelta(hours=1))
        time.sleep(3.5)  # the idle kernel passes the 3-second idle limit
        runner = Passes(build_runner(settings_for(router, ns), api))
        with runner:
            first = runner.once().results[0]
            assert first.verdict.action == "stop", first.verdict.reason
            assert STOP_ANNOTATION in obj.get_notebook(api, ns, NAME)["metadata"]["annotations"]
            poll(lambda: ui.notebook_row(ns, NAME), lambda r: STOP_ANNOTATION in r["metadata"]["annotations"],
                 "the web app to list the stop annotation")

            answer = ui.set_stopped(ns, NAME, False)  # the Start button
            assert answer["success"] is True
            assert STOP_ANNOTATION not in obj.get_notebook(api, ns, NAME)["metadata"]["annotations"]
            assert STOP_ANNOTATION not in ui.notebook_row(ns, NAME)["metadata"]["annotations"]

            wait_cache(runner, ns, NAME,
                       lambda nb, pod: STOP_ANNOTATION not in nb["metadata"]["annotations"] and pod is not None
                       and pod["status"].get("phase") == "Running",
                       "the stop annotation gone and the old pod Running")
            assert server.kernel_state(_kernel_id(server)) == "idle"  # Jupyter still answers idle
            passes: list[Any] = []
            for _ in range(3):  # right after the start, and again a little later: still within the grace
                passes.append(runner.once().results[0])
                time.sleep(1)
        for again in passes:
            assert (again.verdict.action, again.verdict.state) == ("keep", "starting"), again.verdict.reason
        # What the API server and the web app show after those passes.
        ann = obj.get_notebook(api, ns, NAME)["metadata"]["annotations"]
        assert STOP_ANNOTATION not in ann
        assert STOP_ANNOTATION not in ui.notebook_row(ns, NAME)["metadata"]["annotations"]
        assert [e["reason"] for e in ui.events(ns, NAME)].count(EVENT_STOP) == 1


def _kernel_id(server: JupyterServer) -> str:
    kernels = server.get("api/kernels?no_track_activity=1")
    assert len(kernels) == 1, kernels
    return str(kernels[0]["id"])
