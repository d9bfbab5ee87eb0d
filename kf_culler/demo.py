"""`kf-culler demo`: a local control plane, two real Jupyter servers, and a culling you can watch."""

from __future__ import annotations

import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from kf_culler.config import load_mapping
from kf_culler.kube.owners import NOTIFY_EMAIL_ANNOTATION
from kf_culler.local import objects as obj
from kf_culler.local import procs
from kf_culler.local.cluster import LocalCluster
from kf_culler.local.jupyter import JupyterServer
from kf_culler.local.router import Router
from kf_culler.model import STOP_ANNOTATION
from kf_culler.notify.notifier import Notifier
from kf_culler.report import table
from kf_culler.runner import Runner, build_runner

if TYPE_CHECKING:
    from kf_culler.local.inbox import Inbox

NAMESPACE = "kubeflow-user-example-com"
USER_EMAIL = "user@example.com"


def run_demo(out: TextIO, idle_seconds: float = 30.0, warn_seconds: float = 15.0, max_seconds: float = 180) -> int:
    lock = threading.Lock()  # the notices arrive on other threads: one whole line at a time

    def say(text: str = "") -> None:
        with lock:
            out.write(text + "\n")
            out.flush()

    cluster = LocalCluster(quiet=False)
    router = Router()
    servers: list[JupyterServer] = []
    runner: Runner | None = None
    inbox: Inbox | None = None
    notifier: Notifier | None = None
    workdir = Path(tempfile.mkdtemp(prefix="kf-culler-demo-"))
    try:
        say("1. Starting a local Kubernetes control plane (etcd + kube-apiserver, built from upstream) ...")
        t0 = time.monotonic()
        cluster.start()
        api = cluster.api_client()
        cluster.apply_notebook_crd()
        say(f"   API server {cluster.server} ready in {time.monotonic() - t0:.1f} s; Notebook CRD installed.")
        router.start()

        say("2. Starting two real Jupyter servers on loopback, as Kubeflow runs them ...")
        obj.create_namespace(api, NAMESPACE, {NOTIFY_EMAIL_ANNOTATION: USER_EMAIL})
        started = datetime.now(UTC) - timedelta(hours=1)
        for name in ("training", "forgotten"):
            s = JupyterServer(NAMESPACE, name)
            s.start()
            servers.append(s)
            router.add("notebook", NAMESPACE, name, f"http://127.0.0.1:{s.port}", strip=False)
            obj.create_notebook(api, NAMESPACE, obj.notebook(name))
            obj.running_pod(api, NAMESPACE, name, started)
        training, forgotten = servers
        kid = training.start_kernel()
        training.execute(kid, "import time\nwhile True:\n    sum(i * i for i in range(10**6)); time.sleep(0.1)")
        forgotten.start_kernel()
        say(f"   {NAMESPACE}/training: a kernel running a loop (busy)")
        say(f"   {NAMESPACE}/forgotten: a kernel opened once and left idle")

        inbox = _start_inbox(say)
        notices = {"notifications": inbox.settings(workdir)} if inbox is not None else {}
        settings = load_mapping({
            "idleMinutes": idle_seconds / 60, "warnMinutes": warn_seconds / 60, "startupGraceMinutes": 0,
            "checkPeriodSeconds": 3, "lastActivityStepMinutes": 60,
            "namespaces": {"include": [NAMESPACE]}, "urls": {"jupyter": router.template("notebook")},
            **notices,
        }, "demo")
        say(f"3. Running the culler: idle limit {idle_seconds:g} s, a warning {warn_seconds:g} s before the "
            "stop, a pass every 3 s.")
        say()
        if inbox is not None:
            say(f"   Notices go by mail to {USER_EMAIL} (the namespace's {NOTIFY_EMAIL_ANNOTATION}) and to a "
                "webhook, both served on loopback by the demo.")
            say()
            notifier = Notifier.for_settings(settings, api)
        runner = build_runner(settings, api, notifier=notifier)
        runner.start_cache(30)
        last_table = ""
        stopped_at: float | None = None
        deadline = time.monotonic() + max_seconds
        warned = False
        memory = None  # what each pass remembers for the next
        while time.monotonic() < deadline:
            result = runner.once(memory)
            memory = result.memory
            shown = table(result)
            if shown != last_table:
                say(f"[{datetime.now(UTC):%H:%M:%S}]")
                say(shown)
                say()
                last_table = shown
            for r in result.results:
                if r.verdict.action == "warn" and r.write and r.write.event == "created" and not warned:
                    warned = True
                    say(f"   -> warning Event on {r.namespace}/{r.name}: {r.verdict.reason}")
                    say()
                if r.verdict.action == "stop" and r.write and r.write.outcome == "patched":
                    stopped_at = time.monotonic()
                    _show_stop(say, api, r.namespace, r.name)
            if stopped_at is not None and time.monotonic() - stopped_at > 3:
                break
            time.sleep(settings.operations.check_period_seconds)
        if notifier is not None:
            notifier.wait_idle(15)  # the stop's notices, sent off the pass's thread
        if stopped_at is None:
            say("The idle notebook was not stopped in time; see the table above.")
            return 1
        say("The busy notebook kept running; the idle one is stopped, with its reason on the object and in an "
            "Event. Kubeflow's notebook-controller would now scale its StatefulSet to 0 (home volume kept).")
        return 0
    finally:
        say()
        say("Cleaning up: stopping the culler, the Jupyter servers and the control plane ...")
        if runner is not None:
            runner.cache.close()
        if notifier is not None:
            notifier.close()
        if inbox is not None:
            inbox.close()
        shutil.rmtree(workdir, ignore_errors=True)
        procs.stop_all([s.proc for s in servers if s.proc is not None])
        for s in servers:
            s.stop()  # already ended: removes its directory
        router.stop()
        cluster.stop()
        say("Done; nothing is left running.")


def _start_inbox(say: Callable[[str], None]) -> Inbox | None:
    """The demo's loopback mail server and webhook receiver, when aiosmtpd (the demo extra) is installed."""
    try:
        from kf_culler.local.inbox import Inbox
    except ImportError:
        say("   (aiosmtpd is not installed, so the demo shows no mail or webhook notices: "
            "pip install -e '.[demo]')")
        return None
    return Inbox(say).start()


def _show_stop(say: Any, api: Any, namespace: str, name: str) -> None:
    nb = obj.get_notebook(api, namespace, name)
    ann = nb["metadata"].get("annotations") or {}
    say(f"   -> {namespace}/{name} stopped. Annotations now on the Notebook:")
    for key in sorted(ann):
        if key == STOP_ANNOTATION or key.startswith("notebook-culler.io/") or "last-activity" in key:
            say(f"        {key}: {ann[key]}")
    for e in sorted(obj.events_for(api, namespace, name), key=lambda e: e.metadata.creation_timestamp):
        say(f"   -> Event  type={e.type} reason={e.reason}")
        say(f"        {e.message}")
    say()
