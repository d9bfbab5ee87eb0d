"""The code-server extension (extensions/code-server, docs/ide-extension.md) against a real culler and a
real code-server.

Everything is real: the .vsix that `hack/codeserver/extension.sh` builds from npm, installed with
`code-server --install-extension` into code-server 4.139.1 (hack/codeserver/install.sh); the culler's
verdict API filled by dry-run passes of a Passes on the local API server, run as the culler's own
ServiceAccount with the shipped RBAC, probing that code-server's /healthz through a loopback router as
through a Service; a token minted for the notebook pod's ServiceAccount and the audience kf-culler; and
the editor in Debian's headless Chromium, driven over the DevTools protocol.

code-server's heartbeat counts every HTTP request but /healthz, and an open editor tab keeps it alive
(docs/signals.md): a warning reaches a code-server user when they come back to an editor they had
closed, and that is the scenario here.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import time
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from need import missing
from support.codeserver import CodeServer, Unavailable, executable
from support.passes import Passes
from test_rbac import apply, bounded_writes, rbac_objects
from test_verdict_api import CULLER_NS, EDITOR, call, ensure, notebook_pod, pod_token

from kf_culler.config import load_mapping
from kf_culler.cycle import CycleResult
from kf_culler.extend import Extender
from kf_culler.kube.tokens import TokenReviewer
from kf_culler.kube.writer import Writer
from kf_culler.local import objects as obj
from kf_culler.local.router import Router
from kf_culler.metrics import ApiServer, Metrics
from kf_culler.model import KEEP_UNTIL_ANNOTATION
from kf_culler.runner import build_runner
from kf_culler.service import instrument
from kf_culler.timeutil import parse_time
from kf_culler.verdict_api import VerdictApi
from kf_culler.verdicts import VerdictStore

ROOT = Path(__file__).resolve().parents[1]
BUILD = ROOT / "hack" / "codeserver" / "extension.sh"
NAME = "nb-code"
SCREENSHOTS = os.environ.get("KF_CULLER_SCREENSHOT_DIR")


@pytest.fixture(scope="module")
def code_server_exe() -> Path:
    try:
        return executable()
    except Unavailable as why:
        missing("code-server", why)


@pytest.fixture(scope="module")
def vsix() -> Path:
    done = subprocess.run(["bash", str(BUILD)], cwd=ROOT, capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        missing("the code-server extension (bash hack/codeserver/extension.sh)",
                f"exited {done.returncode}: {done.stderr[-3000:]}")
    return Path(done.stdout.strip().splitlines()[-1])


def node_for(exe: Path) -> str:
    """The Node that runs code-server (hack/codeserver/install.sh puts it beside), else node on PATH."""
    beside = exe.parent.parent / "node" / "node_modules" / ".bin" / "node"
    found = str(beside) if beside.exists() else shutil.which("node")
    assert found, "no node"
    return found


@pytest.mark.slow
def test_keep_working_is_a_beat_of_code_servers_heart(code_server_exe: Path, vsix: Path,
                                                      tmp_path: Path) -> None:
    """The extension's "Keep working" request, run from the .vsix's own code with Node, against a
    code-server no client has talked to: /healthz goes from expired (never) to alive, beaten at the
    request."""
    with zipfile.ZipFile(vsix) as z:
        z.extractall(tmp_path / "vsix")
    culler_js = tmp_path / "vsix" / "extension" / "out" / "culler.js"
    assert culler_js.is_file()
    with CodeServer(code_server_exe) as cs:
        before = cs.healthz()
        assert before == {"status": "expired", "lastHeartbeat": 0}, before
        t0 = time.time() * 1000
        script = ("require(process.argv[1]).keep({KF_CULLER_CODE_SERVER_URL: process.argv[2]})"
                  ".then(s => console.log(s), e => { console.error(e); process.exit(1); })")
        done = subprocess.run([node_for(code_server_exe), "-e", script, str(culler_js), cs.url],
                              capture_output=True, text=True, timeout=60, check=False)
        t1 = time.time() * 1000
        assert done.returncode == 0, done.stderr
        assert int(done.stdout.strip()) in (200, 302), done.stdout
        after = cs.healthz()
        assert after["status"] == "alive" and t0 - 5 <= after["lastHeartbeat"] <= t1 + 5, (after, t0, t1)


@dataclass
class Stack:
    namespace: str
    code: CodeServer
    router: Router
    runner: Passes
    http: ApiServer
    token_file: Path

    def pass_(self, ahead: timedelta = timedelta(0)) -> CycleResult:
        self.runner.change(clock=lambda: datetime.now(UTC) + ahead)
        return self.runner.once()

    def culler_verdict(self) -> dict[str, Any]:
        code, _, body = call(self.http.port, f"/api/v1/namespaces/{self.namespace}/notebooks/{NAME}",
                             self.token_file.read_text())
        assert code == 200, body
        return dict(json.loads(body))


@contextlib.contextmanager
def stack(kube: Any, api: Any, namespace: str, exe: Path, vsix: Path, tmp_path: Path,
          policy: dict[str, Any], writes: bool = False) -> Iterator[Stack]:
    """writes: the culler writes (keep-until on a request to extend), under the shipped bound on its writes
    in `namespace` (kustomize/base/writes-policy.yaml), as tests/test_extend.py sets it up."""
    core = client.CoreV1Api(api)
    ensure(lambda: core.create_namespace({"metadata": {"name": CULLER_NS}}))
    objs = rbac_objects(CULLER_NS, cluster_wide=True, writes_in=[namespace] if writes else None)
    apply(api, objs)
    culler_api = kube.api_client(kube.service_account_kubeconfig(CULLER_NS, "kf-culler"))
    ensure(lambda: core.create_namespaced_service_account(namespace, {"metadata": {"name": EDITOR}}))
    obj.create_notebook(api, namespace, obj.notebook(NAME, server_type="group-one"))
    pod = notebook_pod(api, namespace, NAME)
    token_file = tmp_path / "token"
    token_file.write_text(pod_token(api, pod))

    store = VerdictStore()
    extender = Extender(store, Writer(culler_api)) if writes else None
    http = ApiServer("127.0.0.1:0", VerdictApi(store, TokenReviewer(culler_api), extender))
    http.start()
    with contextlib.ExitStack() as bound, Router() as router:
        if writes:
            bound.enter_context(bounded_writes(api, objs))
        # Keep working goes to code-server through the router (as a request through the pod's Service
        # would), so that the test can count it.
        env = {"KF_CULLER_VERDICT_URL": f"http://127.0.0.1:{http.port}", "KF_CULLER_TOKEN_FILE": str(token_file),
               "KF_CULLER_POLL_SECONDS": "1", "KF_CULLER_TIMEOUT_SECONDS": "3",
               "NB_PREFIX": f"/notebook/{namespace}/{NAME}",
               "KF_CULLER_CODE_SERVER_URL": f"{router.base}/keep/{namespace}/{NAME}/"}
        settings = {"security.workspace.trust.enabled": False, "workbench.startupEditor": "none",
                    "workbench.tips.enabled": False, "update.mode": "none", "chat.disableAIFeatures": True,
                    "workbench.secondarySideBar.defaultVisibility": "hidden"}
        with CodeServer(exe, env=env, extensions=(vsix,), settings=settings) as code:
            router.add("cs", namespace, NAME, code.url, strip=True)
            router.add("keep", namespace, NAME, code.url, strip=True)
            culler = load_mapping({**policy, "urls": {"codeServer": router.template("cs")},
                                   "namespaces": {"include": [namespace]}}, "test")
            runner = Passes(build_runner(culler, culler_api, dry_run=not writes, records_namespace=CULLER_NS))
            runner.runner = instrument(runner.runner, Metrics(), None, store)
            try:
                with runner:
                    yield Stack(namespace, code, router, runner, http, token_file)
            finally:
                http.stop()
                runner.close()


TOAST = "the kf-culler notification"
FIND_TOAST = """(() => { for (const t of document.querySelectorAll('.notification-toast')) {
  if (t.textContent.includes('will be stopped soon')) return t.textContent; } return ''; })()"""
STATUS = """(() => { for (const e of document.querySelectorAll('.statusbar-item')) {
  if (e.textContent.includes('Idle stop in') && e.getBoundingClientRect().width > 0) return e.textContent; }
  return ''; })()"""
MARK_STATUS = """(() => { for (const e of document.querySelectorAll('.statusbar-item')) {
  if (e.textContent.includes('Idle stop in')) { const a = e.querySelector('a') || e;
    a.id = 'kf-culler-test-status'; return true; } } return false; })()"""
MARK_KEEP = """(() => { for (const t of document.querySelectorAll('.notification-toast')) {
  if (!t.textContent.includes('will be stopped soon')) continue;
  for (const b of t.querySelectorAll('.monaco-button')) {
    if (b.textContent.trim() === 'Keep working') { b.id = 'kf-culler-test-keep'; return true; } } }
  return false; })()"""


def toast(browser: Any) -> str:
    """The notification's text; if VS Code has put the toast away into its notification centre, the
    status bar item (a real click) shows it again."""
    shown = str(browser.evaluate(FIND_TOAST))
    if not shown:
        assert browser.evaluate(MARK_STATUS), "no status bar item"
        browser.click("#kf-culler-test-status")
        shown = str(browser.wait_for(FIND_TOAST, 20, TOAST))
    return shown


@pytest.mark.cluster
@pytest.mark.slow
def test_warning_in_code_server_in_chromium_and_keep_working(
        kube: Any, api: Any, namespace: str, code_server_exe: Path, vsix: Path, tmp_path: Path) -> None:
    """The user closed the editor an hour ago; the culler warns. They open it again: a notification
    with the culler's reason, the stop time and Keep working; a status bar item counting down. Keep
    working sends one request to code-server and hides both; the culler's next pass keeps the notebook
    (the editor is connected), and nothing comes back."""
    from support.cdp import Chromium
    from support.cdp import Unavailable as NoChromium
    from support.cdp import executable as chromium

    try:
        chromium()
    except NoChromium as err:
        missing("Chromium (hack/setup.sh installs Debian's chromium)", err)
    # The pod has run for an hour and no editor is connected: idle since its start.
    policy = {"idleMinutes": 70, "warnMinutes": 15}
    with stack(kube, api, namespace, code_server_exe, vsix, tmp_path, policy) as s, Chromium() as browser:
        assert s.code.healthz()["status"] == "expired"
        s.pass_()
        v = s.culler_verdict()["verdict"]
        assert (v["action"], v["state"]) == ("warn", "idle"), v
        stop_at = parse_time(v["stopAt"])
        assert stop_at is not None

        browser.navigate(s.code.url)
        browser.wait_for("!!document.querySelector('.monaco-workbench .part.statusbar')", 180, "the workbench")
        shown = browser.wait_for(FIND_TOAST, 120, TOAST)
        assert v["reason"] in shown, (shown, v["reason"])
        assert f"Stops at {stop_at.strftime('%H:%M UTC')}" in shown, shown
        browser.wait_for(STATUS, 10, "the status bar countdown")
        # The countdown is the time to stopAt (the extension host's clock, this machine's): it shows it
        # (the status bar is redrawn over code-server's websocket, late on a loaded machine), and moves.
        stop_ms = int(stop_at.timestamp() * 1000)
        agrees = (f"(() => {{ const m = ({STATUS}).match(/(\\d{{2,}}):(\\d{{2}})/); if (!m) return null;"
                  f" const left = (+m[1]) * 60 + (+m[2]); const want = ({stop_ms} - Date.now()) / 1000;"
                  " return Math.abs(left - want) <= 3 ? left : null; })()")
        first = browser.wait_for(agrees, 30, "the countdown to agree with stopAt")
        browser.wait_for(f"(() => {{ const left = {agrees}; return left !== null && left < {first}; }})()", 30,
                         "the countdown to move")
        # The editor is open: code-server counts the tab.
        assert s.code.healthz()["status"] == "alive"
        toast(browser)
        assert browser.evaluate(MARK_KEEP), "no Keep working button on the notification"
        shot = browser.screenshot(Path(SCREENSHOTS or tmp_path) / "ide-extension-code-server.png")
        assert shot.stat().st_size > 10_000

        # Keep working: one request to code-server (through the router's keep route, nothing else
        # uses it), the notification and the countdown go.
        before = s.router.requests
        browser.click("#kf-culler-test-keep")
        browser.wait_for(f"!{FIND_TOAST} && !{STATUS}", 10, "the notification and the countdown to go")
        assert s.router.requests == before + 1, (before, s.router.requests)
        health = s.code.healthz()
        assert health["status"] == "alive"

        # The culler's next pass: code-server alive, the editor connected: kept. Nothing comes back.
        s.pass_()
        v = s.culler_verdict()["verdict"]
        assert (v["action"], v["state"]) == ("keep", "connected"), v
        time.sleep(3)
        assert not browser.evaluate(FIND_TOAST) and not browser.evaluate(STATUS)
        assert not browser.handler_errors


MARK_MORE = """(() => { for (const t of document.querySelectorAll('.notification-toast')) {
  if (!t.textContent.includes('will be stopped soon')) continue;
  for (const b of t.querySelectorAll('.monaco-button')) {
    if (b.textContent.trim().startsWith('Keep for ')) { b.id = 'kf-culler-test-more'; return b.textContent.trim(); } } }
  return ''; })()"""
FIND_KEPT = """(() => { for (const t of document.querySelectorAll('.notification-toast')) {
  if (t.textContent.includes('Kept until')) return t.textContent; } return ''; })()"""


@pytest.mark.cluster
@pytest.mark.slow
def test_keep_for_more_hours_in_code_server_in_chromium(
        kube: Any, api: Any, namespace: str, code_server_exe: Path, vsix: Path, tmp_path: Path) -> None:
    """The policy allows two hours more (maxExtendMinutes 120): the notification offers "Keep for 2 more
    hours"; a click asks the culler, which writes keep-until on the Notebook (the planned stop plus two
    hours, extendUntil), and the notification says until when."""
    from support.cdp import Chromium
    from support.cdp import Unavailable as NoChromium
    from support.cdp import executable as chromium

    try:
        chromium()
    except NoChromium as err:
        missing("Chromium (hack/setup.sh installs Debian's chromium)", err)
    policy = {"idleMinutes": 70, "warnMinutes": 15, "maxExtendMinutes": 120}
    with stack(kube, api, namespace, code_server_exe, vsix, tmp_path, policy, writes=True) as s, \
            Chromium() as browser:
        s.pass_()
        v = s.culler_verdict()["verdict"]
        assert (v["action"], v["state"]) == ("warn", "idle"), v
        stop_at, latest = parse_time(v["stopAt"]), parse_time(v["extendUntil"])
        assert stop_at is not None and latest == stop_at + timedelta(minutes=120), v

        browser.navigate(s.code.url)
        browser.wait_for("!!document.querySelector('.monaco-workbench .part.statusbar')", 180, "the workbench")
        browser.wait_for(FIND_TOAST, 120, TOAST)
        toast(browser)
        label = browser.wait_for(MARK_MORE, 20, "the Keep for ... button")
        assert label == "Keep for 2 more hours", label
        browser.click("#kf-culler-test-more")
        kept = str(browser.wait_for(FIND_KEPT, 30, "the culler's answer"))
        written = obj.get_notebook(api, s.namespace, NAME)["metadata"]["annotations"]
        until = parse_time(written[KEEP_UNTIL_ANNOTATION])
        assert until == latest, (written, v)
        assert f"Kept until {until.strftime('%H:%M UTC')}" in kept, kept
        assert not browser.handler_errors
