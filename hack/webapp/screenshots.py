"""Screenshots of Kubeflow's own Jupyter web app (v1.11.0, its Angular front end and Flask backend) showing a
notebook that kf-culler warned and then stopped.

    bash hack/webapp/install.sh                                             # the backend's virtualenv
    KF_CULLER_WEBAPP_FRONTEND_SRC=/path/to/notebooks bash hack/webapp/frontend.sh   # the front end
    python3 hack/webapp/screenshots.py [--out docs/img]

Everything on the way is the real thing, on loopback: a local cluster in "full" mode (etcd,
kube-apiserver, kube-controller-manager, kube-scheduler, kwok playing the node's kubelet), Kubeflow's
notebook-controller v1.11.0 (which scales the StatefulSet to 0 on the stop annotation and copies its
StatefulSet's and pod's Events onto the Notebook), a real Jupyter server with one idle kernel behind
the culler's URL template (the loopback router stands in for the Service), kf-culler's Runner
(warning, then stop), the web app's backend from the unmodified upstream source serving the built front
end, and Debian's Chromium, headless, driven over the DevTools protocol. kwok pulls no image and runs no
container: the pod is Running on paper, Jupyter runs beside it on loopback. With --controller played
only etcd and kube-apiserver run, and the script writes what the notebook-controller and a kubelet would
(the pod Running, the Notebook's readyReplicas; after the stop the pod deleted and readyReplicas 0): the
same list and details page, without the controller's Events.

The Notebook is made as the web app's form makes it (a home volume on a PersistentVolumeClaim, /dev/shm),
in namespace kubeflow-user, the one the web app shows when it runs outside the Central Dashboard. A
minimal PodDefault CRD is created: the details page lists PodDefaults and shows a 404 error without it.

The idle limit is short (--idle-minutes, default 1; the warning --warn-minutes before it), so the reasons
say "1 min" where a cluster's say hours. Writes, into --out:
  webapp-list-warned.png     the notebook list after the warning, before the stop
  webapp-list-stopped.png    the list after the stop, the pointer on the status icon (its tooltip)
  webapp-details-stopped.png the notebook's details page (Overview)
  webapp-events.png          its Events tab
  webapp-events-reason.png   the Events tab with the pointer on the stop's message (its tooltip)
Exit status 2 when a component cannot be had here (the reason is printed); this is not a test.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))

from support import cdp  # noqa: E402
from support.webapp import VERSION, Unavailable, start_webapp, virtualenv  # noqa: E402

from kf_culler.config import load_mapping  # noqa: E402
from kf_culler.kube import GROUP, PLURAL  # noqa: E402
from kf_culler.kube import VERSION as NB_VERSION  # noqa: E402
from kf_culler.local import objects  # noqa: E402
from kf_culler.local.cluster import (  # noqa: E402
    ClusterError,
    LocalCluster,
    NotebookControllerUnavailable,
    wait_established,
)
from kf_culler.local.handoff import notebook_body  # noqa: E402
from kf_culler.local.jupyter import JupyterServer  # noqa: E402
from kf_culler.local.router import Router  # noqa: E402
from kf_culler.model import Verdict  # noqa: E402
from kf_culler.runner import Runner  # noqa: E402
from kf_culler.timeutil import format_time  # noqa: E402

CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "kf-culler" / "webapp" / VERSION
FRONTEND = CACHE / "frontend"
ON_TIMEOUT: list[Callable[[], Any]] = []  # what to show when a wait fails (the page, its answers)


def say(msg: str) -> None:
    print(f"webapp-screenshots: {msg}", file=sys.stderr, flush=True)


def wait(pred: Callable[[], Any], what: str, timeout: float = 120) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = pred()
        if value:
            return value
        if time.monotonic() > deadline:
            for show in ON_TIMEOUT:
                with contextlib.suppress(Exception):
                    show()
            raise TimeoutError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(0.25)


def js_text(selector: str) -> str:
    """A JavaScript expression: the text of every element matching selector, joined by newlines."""
    return f"[...document.querySelectorAll({json.dumps(selector)})].map(e => e.innerText).join('\\n')"


def row_of(name: str) -> str:
    """A JavaScript expression: the text of the table row that names `name`, or ''."""
    return (f"([...document.querySelectorAll('tr')].find(r => r.innerText.split(/\\s+/).includes({json.dumps(name)}))"
            " || {innerText: ''}).innerText")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "img", help="where to write the PNGs")
    parser.add_argument("--frontend", type=Path, default=FRONTEND,
                        help=f"the built front end (hack/webapp/frontend.sh; default {FRONTEND})")
    parser.add_argument("--namespace", default="kubeflow-user",
                        help="the namespace (default kubeflow-user: the one the web app shows outside the "
                             "Central Dashboard)")
    parser.add_argument("--name", default="analysis")
    parser.add_argument("--idle-minutes", type=float, default=1.0)
    parser.add_argument("--warn-minutes", type=float, default=0.5)
    parser.add_argument("--controller", choices=("real", "played"), default="real",
                        help="real (default): the full local cluster with Kubeflow's notebook-controller; "
                             "played: etcd and kube-apiserver only, the script sets the pod and the Notebook's "
                             "status as the controller and a kubelet would (no controller Events)")
    parser.add_argument("--width", type=int, default=1280)
    parser.add_argument("--height", type=int, default=720)
    args = parser.parse_args()

    if not (args.frontend / "index.html").is_file():
        say(f"no built front end in {args.frontend}: run KF_CULLER_WEBAPP_FRONTEND_SRC=<a kubeflow/notebooks "
            f"{VERSION} tree> bash hack/webapp/frontend.sh first")
        return 2
    try:
        cdp.executable()
        venv = virtualenv()
    except (Unavailable, cdp.Unavailable) as why:
        say(f"cannot run here: {why}")
        return 2
    played = args.controller == "played"
    try:
        cluster = LocalCluster(mode="apiserver" if played else "full", quiet=False)
        cluster.start()
    except ClusterError as why:
        say(f"cannot start the local cluster: {why}")
        return 2
    try:
        try:
            if played:
                cluster.apply_notebook_crd()
            else:
                cluster.start_notebook_controller()
        except NotebookControllerUnavailable as why:
            say(f"cannot run Kubeflow's notebook-controller here: {why} (--controller played runs without it)")
            return 2
        return scenario(cluster, venv, args)
    finally:
        cluster.stop()


def form_notebook(core: Any, namespace: str, name: str) -> dict[str, Any]:
    """A Notebook as the web app's form makes it (its table reads the volume mounts): a home volume, a
    PersistentVolumeClaim made here and bound in advance to a PersistentVolume of its own, and /dev/shm."""
    claim = f"{name}-volume"
    core.create_persistent_volume({
        "metadata": {"name": f"{namespace}-{claim}"},
        "spec": {"capacity": {"storage": "5Gi"}, "accessModes": ["ReadWriteOnce"], "storageClassName": "",
                 "hostPath": {"path": f"/var/lib/notebooks/{namespace}/{name}"},
                 "claimRef": {"namespace": namespace, "name": claim}}})
    core.create_namespaced_persistent_volume_claim(namespace, {
        "metadata": {"name": claim},
        "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "", "volumeName": f"{namespace}-{claim}",
                 "resources": {"requests": {"storage": "5Gi"}}}})
    body = notebook_body(namespace, name, gpus=0)
    spec = body["spec"]["template"]["spec"]
    spec["containers"][0]["volumeMounts"] = [{"name": claim, "mountPath": "/home/jovyan"},
                                             {"name": "dshm", "mountPath": "/dev/shm"}]
    spec["volumes"] = [{"name": claim, "persistentVolumeClaim": {"claimName": claim}},
                       {"name": "dshm", "emptyDir": {"medium": "Memory"}}]
    return body


def apply_poddefault_crd(api: Any) -> None:
    """A minimal PodDefault CRD (kubeflow.org/v1alpha1, Kubeflow's admission webhook's kind; any fields): the
    details page lists a namespace's PodDefaults, and without the kind it shows a 404 error."""
    from kubernetes import client

    body = {
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": "poddefaults.kubeflow.org"},
        "spec": {"group": "kubeflow.org", "scope": "Namespaced",
                 "names": {"kind": "PodDefault", "plural": "poddefaults", "singular": "poddefault",
                           "listKind": "PodDefaultList"},
                 "versions": [{"name": "v1alpha1", "served": True, "storage": True,
                               "schema": {"openAPIV3Schema": {"type": "object",
                                                              "x-kubernetes-preserve-unknown-fields": True}}}]}}
    ext = client.ApiextensionsV1Api(api)
    ext.create_custom_resource_definition(body)
    wait_established(ext, ["poddefaults.kubeflow.org"], 60, "the PodDefault CRD")


def set_ready_replicas(api: Any, namespace: str, name: str, ready: int) -> None:
    """--controller played: the Notebook's status as the notebook-controller mirrors it from its pod."""
    from kubernetes import client

    state: dict[str, Any] = {"running": {"startedAt": format_time(datetime.now(UTC))}} if ready else {}
    client.CustomObjectsApi(api).patch_namespaced_custom_object_status(
        GROUP, NB_VERSION, namespace, PLURAL, name,
        {"status": {"readyReplicas": ready, "containerState": state, "conditions": []}})


def scenario(cluster: LocalCluster, venv: Path, args: argparse.Namespace) -> int:
    from kubernetes import client

    played = args.controller == "played"
    api = cluster.api_client()
    core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
    ns, name = args.namespace, args.name
    core.create_namespace({"metadata": {"name": ns}})
    apply_poddefault_crd(api)
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)

    def notebook() -> dict[str, Any]:
        nb: dict[str, Any] = custom.get_namespaced_custom_object(GROUP, NB_VERSION, ns, PLURAL, name)
        return nb

    with Router() as router, JupyterServer(ns, name) as server:
        router.add("notebook", ns, name, f"http://127.0.0.1:{server.port}", strip=False)
        server.start_kernel()
        custom.create_namespaced_custom_object(GROUP, NB_VERSION, ns, PLURAL, form_notebook(core, ns, name))
        if played:
            objects.running_pod(api, ns, name, datetime.now(UTC))
            set_ready_replicas(api, ns, name, 1)
        wait(lambda: (notebook().get("status") or {}).get("readyReplicas") == 1,
             "the notebook-controller to report the notebook's pod ready")
        say(f"{ns}/{name} Running ({'played' if played else 'kwok'}), Jupyter idle on 127.0.0.1:{server.port}")
        settings = load_mapping({
            "namespaces": {"include": [ns]},
            "idleMinutes": args.idle_minutes, "warnMinutes": args.warn_minutes, "startupGraceMinutes": 0,
            "checkPeriodSeconds": 1, "urls": {"jupyter": router.template("notebook")},
            "probe": {"timeoutSeconds": 5}}, "screenshots")
        with start_webapp(cluster.kubeconfig, venv=venv, frontend=args.frontend) as app, \
                cdp.Chromium(args.width, args.height) as browser, Runner(settings, api) as runner:
            say(f"web app on {app.url}")
            ON_TIMEOUT.append(lambda: say(f"the web app's log:\n{app.log_tail(40)}"))

            def until(action: str) -> Verdict:
                while True:
                    verdict = runner.once().results[0].verdict
                    if verdict.action == action:
                        return verdict
                    time.sleep(1)

            ON_TIMEOUT.append(lambda: (browser.screenshot(out / "failed.png"),
                                       say(f"the page when a wait failed ({out / 'failed.png'}):\n"
                                           f"{browser.evaluate('document.body.innerText')}\nanswers: "
                                           f"{[(r['url'], r['status']) for r in browser.responses('/api/')]}")))
            warned = until("warn")
            say(f"warned: {warned.reason}")
            browser.navigate(app.url)
            wait(lambda: browser.evaluate(row_of(name)), "the notebook list to show the notebook", 60)
            time.sleep(1)  # the table's status icons and fonts settle
            shot(browser, out / "webapp-list-warned.png", row_of(name))

            stopped = until("stop")
            say(f"stopped: {stopped.reason}")
            if played:  # the controller scales the StatefulSet to 0, the pod goes, the status follows
                objects.delete_pod(api, ns, f"{name}-0")
                set_ready_replicas(api, ns, name, 0)
            wait(lambda: (notebook().get("status") or {}).get("readyReplicas", 0) == 0
                 and not core.list_namespaced_pod(ns).items,
                 "the notebook-controller to scale the notebook to 0 and its pod to go")
            with app.client() as ui:
                wait(lambda: ui.notebook_row(ns, name)["status"]["phase"] == "stopped",
                     "the web app to show the notebook stopped")
            # The list polls with a growing interval: load it afresh.
            browser.navigate(app.url)
            wait(lambda: "stopped" in browser.evaluate(
                "[...document.querySelectorAll('lib-status-icon')].map(e => e.outerHTML).join(' ')").lower()
                or "No Pods" in browser.evaluate("document.body.innerHTML"),
                "the list to show the stopped status", 60)
            # The status column is an icon; its tooltip says what the status is.
            hover(browser, "[...document.querySelectorAll('tr')].find(r => r.innerText.split(/\\s+/)"
                           f".includes({json.dumps(name)})).querySelector('lib-status-icon')")
            wait(lambda: browser.evaluate(js_text(".mat-tooltip")), "the status icon's tooltip", 30)
            time.sleep(0.5)
            shot(browser, out / "webapp-list-stopped.png", row_of(name) + " + ' | ' + " + js_text(".mat-tooltip"))

            details = f"{app.url}notebook/details/{ns}/{name}"
            browser.navigate(details)
            wait(lambda: browser.evaluate(js_text("lib-status-info")), "the details page's status", 60)
            time.sleep(1)
            shot(browser, out / "webapp-details-stopped.png", js_text("lib-status-info"))

            browser.navigate(f"{details}?tab=events")
            wait(lambda: "IdleNotebookStopped" in browser.evaluate(js_text("app-events tr")),
                 "the Events tab to list the stop", 60)
            time.sleep(1)
            shot(browser, out / "webapp-events.png", js_text("app-events tr"))

            # The Message column is cut to its width; its tooltip holds the whole message.
            cell = ("[...document.querySelectorAll('app-events tr')].find(r => r.innerText.includes("
                    "'IdleNotebookStopped')).querySelector('td.mat-column-message')")
            hover(browser, cell)
            wait(lambda: browser.evaluate(js_text(".mat-tooltip")), "the message's tooltip", 30)
            time.sleep(0.5)
            shot(browser, out / "webapp-events-reason.png", js_text(".mat-tooltip"))

            with app.client() as ui:
                for e in ui.events(ns, name):
                    say(f"event: {e['type']} {e['reason']}: {e['message']}")
    with contextlib.suppress(Exception):
        core.delete_namespace(ns)
        core.delete_persistent_volume(f"{ns}-{name}-volume")
    say(f"done at {datetime.now(UTC):%H:%M:%S} UTC")
    return 0


def hover(browser: cdp.Chromium, element_expr: str) -> None:
    """Move the mouse onto the element (a JavaScript expression), as a user pointing at it."""
    box = browser.evaluate(f"(() => {{ const r = ({element_expr}).getBoundingClientRect(); "
                           "return [r.x + Math.min(r.width / 2, 200), r.y + r.height / 2]; })()")
    browser.send("Input.dispatchMouseEvent", {"type": "mouseMoved", "x": box[0], "y": box[1]})


def shot(browser: cdp.Chromium, path: Path, text_expr: str) -> None:
    browser.screenshot(path)
    say(f"{path.name}: {browser.evaluate(text_expr)!r}")


if __name__ == "__main__":
    sys.exit(main())
