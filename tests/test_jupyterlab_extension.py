"""The JupyterLab extension (extensions/jupyterlab, docs/ide-extension.md) against a real culler.

Everything is real: the culler's verdict API (ApiServer + VerdictApi) filled by dry-run passes of a
Passes on the local API server, run as the culler's own ServiceAccount with the shipped RBAC; a token
minted for the notebook pod's ServiceAccount (as the kubelet projects it); JupyterLab with the extension
from the virtualenv `hack/jupyterlab/build.sh` builds, under Kubeflow's base_url and NB_PREFIX; and the
banner in Debian's headless Chromium, driven over the DevTools protocol.

Passes read an injected clock: "22 minutes later" is a pass whose clock is 22 minutes ahead, so the
notebook looks idle long enough to be warned without waiting for it.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from need import missing
from support.jupyterlab import BuildFailed, LabServer, build
from support.passes import Passes
from test_rbac import apply, rbac_objects
from test_verdict_api import CULLER_NS, EDITOR, call, ensure, notebook_pod, pod_token

from kf_culler.config import load_mapping
from kf_culler.cycle import CycleResult, NotebookResult
from kf_culler.extend import EVENT_REASON, Extender
from kf_culler.kube.tokens import TokenReviewer
from kf_culler.kube.writer import Writer
from kf_culler.local import objects as obj
from kf_culler.local.router import Router
from kf_culler.metrics import ApiServer, Metrics
from kf_culler.model import KEEP_UNTIL_ANNOTATION, Verdict
from kf_culler.runner import build_runner
from kf_culler.service import instrument
from kf_culler.timeutil import parse_time
from kf_culler.verdict_api import VerdictApi
from kf_culler.verdicts import VerdictStore

pytestmark = [pytest.mark.cluster, pytest.mark.slow]
NAME = "nb-lab"
SCREENSHOTS = os.environ.get("KF_CULLER_SCREENSHOT_DIR")


@pytest.fixture(scope="module")
def lab_python() -> str:
    try:
        return build()
    except BuildFailed as err:
        missing("the JupyterLab extension (bash hack/jupyterlab/build.sh)", err)
    except FileNotFoundError as err:  # no bash
        missing("the JupyterLab extension (bash hack/jupyterlab/build.sh)", err)


@dataclass
class Stack:
    namespace: str
    lab: LabServer
    runner: Passes
    http: ApiServer
    token_file: Path
    api: Any
    store: VerdictStore

    def pass_(self, ahead: timedelta = timedelta(0)) -> CycleResult:
        """One dry-run pass of the culler, its clock `ahead` of now."""
        self.runner.change(clock=lambda: datetime.now(UTC) + ahead)
        return self.runner.once()

    def culler_verdict(self) -> dict[str, Any]:
        token = self.token_file.read_text()
        code, _, body = call(self.http.port, f"/api/v1/namespaces/{self.namespace}/notebooks/{NAME}", token)
        assert code == 200, body
        return dict(json.loads(body))

    def banner_doc(self) -> dict[str, Any]:
        return dict(self.lab.get("kf-culler/verdict"))


def settled(lab: LabServer, quiet: float = 3, timeout: float = 60) -> datetime:
    """The server's last_activity once it has not moved for `quiet` seconds (a page still loading)."""
    deadline = time.monotonic() + timeout
    last, since = activity(lab), time.monotonic()
    while time.monotonic() - since < quiet:
        assert time.monotonic() < deadline, "the server's last_activity keeps moving"
        time.sleep(0.5)
        now = activity(lab)
        if now != last:
            last, since = now, time.monotonic()
    return last


def activity(lab: LabServer) -> datetime:
    t = parse_time(lab.last_activity())
    assert t is not None
    return t


@contextlib.contextmanager
def stack(kube: Any, api: Any, namespace: str, python: str, tmp_path: Path, poll: str,
          policy: dict[str, Any] | None = None, lab_env: dict[str, str] | None = None,
          writes: bool = False) -> Iterator[Stack]:
    """`writes`: the culler writes (its passes' marks, and keep-until when the banner asks for more time);
    else dry-run passes and no requests to extend."""
    core = client.CoreV1Api(api)
    ensure(lambda: core.create_namespace({"metadata": {"name": CULLER_NS}}))
    apply(api, rbac_objects(CULLER_NS, cluster_wide=True))
    culler_api = kube.api_client(kube.service_account_kubeconfig(CULLER_NS, "kf-culler"))
    ensure(lambda: core.create_namespaced_service_account(namespace, {"metadata": {"name": EDITOR}}))
    obj.create_notebook(api, namespace, obj.notebook(NAME))
    pod = notebook_pod(api, namespace, NAME)
    token_file = tmp_path / "token"
    token_file.write_text(pod_token(api, pod))

    store = VerdictStore()
    extender = Extender(store, Writer(culler_api)) if writes else None
    http = ApiServer("127.0.0.1:0", VerdictApi(store, TokenReviewer(culler_api), extender))
    http.start()
    env = {"KF_CULLER_VERDICT_URL": f"http://127.0.0.1:{http.port}", "KF_CULLER_TOKEN_FILE": str(token_file),
           "KF_CULLER_POLL_SECONDS": poll, "KF_CULLER_TIMEOUT_SECONDS": "3", **(lab_env or {})}
    with Router() as router, LabServer(python, namespace, NAME, env) as lab:
        router.add("notebook", namespace, NAME, f"http://127.0.0.1:{lab.port}", strip=False)
        settings = load_mapping({**(policy or {"idleMinutes": 30, "warnMinutes": 10}),
                                 "urls": {"jupyter": router.template()},
                                 "namespaces": {"include": [namespace]}}, "test")
        runner = Passes(build_runner(settings, culler_api, dry_run=not writes, records_namespace=CULLER_NS))
        runner.runner = instrument(runner.runner, Metrics(), None, store)
        try:
            with runner:
                yield Stack(namespace, lab, runner, http, token_file, api, store)
        finally:
            http.stop()
            runner.close()


def test_in_a_workspace_the_banner_asks_for_the_workspaces_verdict(
        kube: Any, api: Any, namespace: str, lab_python: str, tmp_path: Path) -> None:
    """Under a Kubeflow Notebooks 2.0 Workspace's connect path (NB_PREFIX /workspace/connect/<ns>/<name>/<portId>)
    the server part asks the verdict API for the Workspace (`.../workspaces/<name>`, docs/targets.md), not for a
    Notebook of the same name."""
    prefix = f"/workspace/connect/{namespace}/{NAME}/jupyterlab"
    with stack(kube, api, namespace, lab_python, tmp_path, poll="5", lab_env={"NB_PREFIX": prefix}) as s:
        now = datetime.now(UTC)
        verdicts = [NotebookResult(namespace, name, "jupyter", 0, Verdict("warn", "idle", why, "10-idle"), {})
                    for name, why in ((f"Workspace/{NAME}", "the Workspace's reason"), (NAME, "the Notebook's"))]
        s.store.update(CycleResult(now, now, 1.0, verdicts))
        doc = s.banner_doc()
        assert doc["available"] is True and doc["reason"] == "the Workspace's reason", doc
        assert (doc["action"], doc["state"]) == ("warn", "idle")


def test_server_part_relays_the_verdict_and_only_keep_counts_as_activity(
        kube: Any, api: Any, namespace: str, lab_python: str, tmp_path: Path) -> None:
    with stack(kube, api, namespace, lab_python, tmp_path, poll="7") as s:
        # No pass yet: the culler answers 503; the page is told nothing is available, nothing alarming.
        doc = s.banner_doc()
        assert doc["available"] is False and doc["pollSeconds"] == 7, doc
        assert "503" in doc["why"]

        # A pass at the real time: an idle Jupyter server far from its stop is kept.
        s.pass_()
        doc, culler = s.banner_doc(), s.culler_verdict()
        v = culler["verdict"]
        assert doc["available"] is True and (doc["action"], doc["state"]) == ("keep", "idle"), doc
        assert (doc["reason"], doc["stopAt"], doc["warnAt"], doc["passTime"]) == \
            (v["reason"], v["stopAt"], v["warnAt"], culler["passTime"])
        assert abs((parse_time(doc["now"]) - datetime.now(UTC)).total_seconds()) < 5
        assert doc["extendUntil"] == v["extendUntil"] is None  # the policy allows no extension
        assert set(doc) == {"available", "state", "action", "reason", "stopAt", "warnAt", "extendUntil", "passTime",
                            "now", "pollSeconds"}

        # Polling never counts as activity: 30 polls, and the server's last_activity has not moved.
        # (A tracked API request does move it: the measurement can see a move.)
        first = activity(s.lab)
        time.sleep(0.05)
        s.lab.get("api/contents")
        before = activity(s.lab)
        assert before > first
        time.sleep(1.1)
        for _ in range(30):
            assert s.banner_doc()["available"] is True
        assert activity(s.lab) == before

        # 22 minutes later in the culler's eyes: warned, stop 30 minutes after the last activity.
        warned = s.pass_(timedelta(minutes=22))
        doc = s.banner_doc()
        assert (doc["action"], doc["state"]) == ("warn", "idle"), doc
        assert parse_time(doc["stopAt"]) - before <= timedelta(minutes=30, seconds=1)
        assert parse_time(doc["stopAt"]) > warned.now > parse_time(doc["warnAt"])

        # Another site cannot press the button: a POST without the page's XSRF token is refused, and
        # does not count.
        forged = urllib.request.Request(s.lab.url + "kf-culler/keep", data=b"{}", method="POST",
                                        headers={"Content-Type": "application/json"})
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(forged, timeout=30)
        assert refused.value.code == 403
        assert activity(s.lab) == before

        # Keep working: a POST that counts, at the time it was made.
        t0 = datetime.now(UTC)
        kept = s.lab.post("kf-culler/keep")
        assert kept["kept"] is True
        after = activity(s.lab)
        assert after >= t0 - timedelta(seconds=1) and after > before
        # The culler's next pass sees it: idle since the click, kept, the stop pushed back.
        result = s.pass_(timedelta(seconds=30))
        mine = next(r for r in result.results if r.name == NAME)
        assert (mine.verdict.action, mine.verdict.state) == ("keep", "idle"), mine.verdict
        doc = s.banner_doc()
        assert doc["action"] == "keep" and parse_time(doc["stopAt"]) >= t0 + timedelta(minutes=30) - \
            timedelta(seconds=2), doc

        # Whatever goes wrong with the culler, the page gets {"available": false} quickly.
        good = s.token_file.read_text()
        s.token_file.write_text("garbage")
        doc = s.banner_doc()
        assert doc["available"] is False and "401" in doc["why"], doc
        s.token_file.unlink()
        doc = s.banner_doc()
        assert doc["available"] is False and "token" in doc["why"], doc
        s.token_file.write_text(good)
        obj_api = client.CustomObjectsApi(api)
        obj_api.delete_namespaced_custom_object("kubeflow.org", "v1", namespace, "notebooks", NAME)
        deadline = time.monotonic() + 20
        while any(r.name == NAME for r in s.pass_().results) and time.monotonic() < deadline:
            time.sleep(0.5)
        doc = s.banner_doc()
        assert doc["available"] is False and "404" in doc["why"], doc
        s.http.stop()
        t = time.monotonic()
        doc = s.banner_doc()
        assert doc["available"] is False and time.monotonic() - t < 5, doc


# JupyterLab's own requests (api/kernels, api/sessions, api/terminals, api/contents, lab/api/workspaces
# every ~10 s while the tab is visible, and jupyter-lsp's lsp/status) are tracked API requests: an open,
# visible JupyterLab tab moves last_activity by itself. The browser test has the browser add
# ?no_track_activity=1 to them (DevTools Fetch domain, invisible to the page), so that the only requests
# that can count are the extension's, and their effect on the server's activity can be measured. The
# extension's own are left as they are.
def untrack_lab_requests(browser: Any) -> None:
    def paused(params: dict[str, Any]) -> None:
        url = params["request"]["url"]
        if "/kf-culler/" not in url and "no_track_activity" not in url:
            url += ("&" if "?" in url else "?") + "no_track_activity=1"
        browser.post("Fetch.continueRequest", {"requestId": params["requestId"], "url": url})

    browser.on("Fetch.requestPaused", paused)
    browser.send("Fetch.enable", {"patterns": [{"urlPattern": "*/api/*", "requestStage": "Request"},
                                               {"urlPattern": "*/lsp/*", "requestStage": "Request"}]})


BANNER = "#kf-culler-banner"
VISIBLE = ("(() => { const b = document.querySelector('" + BANNER + "'); return !!b && "
           "getComputedStyle(b).display !== 'none' && b.getBoundingClientRect().height > 0; })()")
DISMISS_NEWS = """(() => { for (const b of document.querySelectorAll('.jp-toast-button, .Toastify button')) {
  if (b.textContent.trim() === 'No') { b.click(); return true; } } return false; })()"""
# Where things are on the page: the banner, JupyterLab's menu bar and the area below it (launcher, file
# browser), and the menu bar's items that something else covers (what is drawn at an item's centre is
# not that item).
LAYOUT = """(() => {
  const box = e => { if (!e) return null; const r = e.getBoundingClientRect();
    return {top: r.top, bottom: r.bottom, left: r.left, right: r.right, height: r.height, width: r.width}; };
  const menu = document.querySelector('#jp-top-panel .lm-MenuBar');
  const items = menu ? [...menu.querySelectorAll('.lm-MenuBar-item')] : [];
  const covered = items.filter(i => { const r = i.getBoundingClientRect();
    const at = document.elementFromPoint(r.left + r.width / 2, r.top + r.height / 2);
    return !at || !i.contains(at); }).map(i => i.textContent);
  return {banner: box(document.querySelector('BANNER')), menu: box(menu), items: items.map(i => i.textContent),
          main: box(document.querySelector('#jp-main-content-panel')), covered,
          width: window.innerWidth};
})()""".replace("BANNER", BANNER)


def layout(browser: Any) -> dict[str, Any]:
    return dict(browser.evaluate(LAYOUT))


def press(browser: Any, key: str) -> None:
    """One key pressed and released, as a keyboard does (Tab moves the focus, Enter presses a button)."""
    codes = {"Tab": ("Tab", 9, ""), "Enter": ("Enter", 13, "\r")}
    code, vk, typed = codes[key]
    down = {"type": "keyDown", "key": key, "code": code, "windowsVirtualKeyCode": vk, "nativeVirtualKeyCode": vk}
    browser.send("Input.dispatchKeyEvent", {**down, **({"text": typed} if typed else {})})
    browser.send("Input.dispatchKeyEvent", {**down, "type": "keyUp"})


def tab_to(browser: Any, selector: str, most: int = 40) -> list[str]:
    """Tab (from wherever the focus is, round the page) until `selector` has the focus; what the focus
    passed through."""
    seen = []
    for _ in range(most):
        press(browser, "Tab")
        seen.append(str(browser.evaluate("(() => { const e = document.activeElement; "
                                         "return e ? e.tagName + '.' + e.className : ''; })()")))
        if browser.evaluate(f"document.activeElement === document.querySelector('{BANNER} {selector}')"):
            return seen
    raise AssertionError(f"{selector} not reached with {most} Tabs: {seen}")


def text(browser: Any, selector: str) -> str:
    return str(browser.evaluate(f"document.querySelector('{BANNER} {selector}').textContent"))


def mmss(value: str) -> int:
    m = re.fullmatch(r"(\d{2,}):(\d{2})", value)
    assert m, value
    return int(m.group(1)) * 60 + int(m.group(2))


def test_banner_in_chromium_and_keep_working(kube: Any, api: Any, namespace: str, lab_python: str,
                                             tmp_path: Path) -> None:
    """A warning shows as a banner with the culler's reason, the stop time and a live countdown, docked
    in JupyterLab's header area: the menu bar and the work area move down by its height, nothing of them
    is covered. Dismiss (by keyboard) hides it for that warning; the next warning (another stop time)
    shows it again; "Keep working" posts, hides it, and the culler's next pass keeps the notebook.

    Policy: stopped after 2 min idle, warned 1 min before (at 60 s idle), so the warning comes from
    real idleness and the countdown in the screenshot agrees with the reason; a page that takes long to
    settle on a loaded machine still leaves time to watch it poll before the warning."""
    from support.cdp import Chromium, Unavailable, executable

    try:
        executable()
    except Unavailable as err:
        missing("Chromium (hack/setup.sh installs Debian's chromium)", err)
    policy = {"idleMinutes": 2, "warnMinutes": 1}
    with stack(kube, api, namespace, lab_python, tmp_path, poll="1", policy=policy) as s, Chromium() as browser:
        untrack_lab_requests(browser)
        browser.navigate(s.lab.url + "lab")
        browser.wait_for("!!document.querySelector('#jp-main-dock-panel .jp-Launcher')", 120, "JupyterLab's launcher")
        browser.wait_for(f"!!document.querySelector('{BANNER}')", 60, "the extension's banner element")
        with contextlib.suppress(TimeoutError):
            browser.wait_for(DISMISS_NEWS, 5, "JupyterLab's news question")
        # The banner lives in JupyterLab's header area, not over the page.
        assert browser.evaluate(f"document.querySelector('#jp-header-panel > {BANNER}') !== null")
        plain = layout(browser)
        assert plain["menu"] is not None and "File" in plain["items"] and "Help" in plain["items"], plain
        assert plain["covered"] == [], plain

        # Once the page has settled, the culler's pass: kept, far from the stop: nothing shown, over
        # many polls; and with the page open and polling, the server's activity stands still.
        idle_from = settled(s.lab)
        s.pass_()
        first_warn_at = parse_time(s.culler_verdict()["verdict"]["warnAt"])
        assert first_warn_at is not None
        polled = len(browser.requests("kf-culler/verdict"))
        while datetime.now(UTC) < first_warn_at - timedelta(seconds=1.5):
            assert not browser.evaluate(VISIBLE)
            time.sleep(0.5)
        # (How many polls fit before warnAt depends on how long the page took to settle: on a loaded
        # machine, a few.)
        assert len(browser.requests("kf-culler/verdict")) >= polled + 3
        assert len(browser.requests("api/sessions")) >= 1  # Lab's own polls went on (untracked)
        assert activity(s.lab) == idle_from, "the page's requests moved the server's last_activity"
        # Its warning time passed: the banner comes even before the culler's next pass warns.
        browser.wait_for(VISIBLE, 10, "the banner once warnAt has passed")

        # The culler's pass: a warning. The banner shows its reason, the stop time, a live countdown.
        # (Its clock 2 s ahead: warnAt is given in whole seconds, the idle time is not.)
        s.pass_(timedelta(seconds=2))
        v = s.culler_verdict()["verdict"]
        assert (v["action"], v["state"]) == ("warn", "idle"), v
        browser.wait_for(f"document.querySelector('{BANNER} .kf-culler-reason').textContent === "
                         f"{json.dumps(v['reason'])}", 10, "the banner with the culler's reason")
        assert browser.evaluate(VISIBLE)
        stop_at = parse_time(v["stopAt"])
        assert stop_at is not None
        assert text(browser, ".kf-culler-stop-time") == stop_at.strftime("%H:%M UTC")
        first = mmss(text(browser, ".kf-culler-countdown"))
        expected = (stop_at - datetime.now(UTC)).total_seconds()
        assert abs(first - expected) <= 3, (first, expected)
        time.sleep(2.2)
        assert 1 <= first - mmss(text(browser, ".kf-culler-countdown")) <= 4  # it counts down
        assert text(browser, ".kf-culler-keep") == "Keep working"

        # It covers nothing: a full-width strip above the menu bar, which moved down by its height, as
        # did the work area; every menu is still where a click lands on it.
        shown = layout(browser)
        banner, menu, main = shown["banner"], shown["menu"], shown["main"]
        assert banner["height"] >= 20 and banner["width"] >= shown["width"] - 1, shown
        assert banner["bottom"] <= menu["top"] + 0.5, ("the banner overlaps the menu bar", shown)
        assert abs((menu["top"] - plain["menu"]["top"]) - banner["height"]) <= 1, (plain, shown)
        assert abs((main["top"] - plain["main"]["top"]) - banner["height"]) <= 1, (plain, shown)
        assert shown["covered"] == [] and shown["items"] == plain["items"], shown
        shot = browser.screenshot(Path(SCREENSHOTS or tmp_path) / "ide-extension-banner.png")
        assert shot.stat().st_size > 10_000

        # By keyboard: Tab reaches Keep working, then Dismiss; Enter on Dismiss hides the banner and the
        # page takes its height back.
        tab_to(browser, ".kf-culler-keep")
        press(browser, "Tab")
        assert browser.evaluate(f"document.activeElement === document.querySelector('{BANNER} .kf-culler-dismiss')")
        press(browser, "Enter")
        browser.wait_for(f"!{VISIBLE}", 10, "the banner to go on Dismiss")
        back = layout(browser)
        assert abs(back["menu"]["top"] - plain["menu"]["top"]) <= 0.5, (plain, back)
        assert not browser.requests("kf-culler/keep"), "Dismiss is not Keep working"
        # The same warning again (the culler's next pass, the same stop time): it stays dismissed.
        s.pass_(timedelta(seconds=3))
        again = s.culler_verdict()["verdict"]
        assert (again["action"], again["stopAt"]) == ("warn", v["stopAt"]), again
        polled = len(browser.requests("kf-culler/verdict"))
        deadline = time.monotonic() + 30
        while len(browser.requests("kf-culler/verdict")) < polled + 3:
            assert time.monotonic() < deadline, "the page stopped polling"
            time.sleep(0.3)
        assert not browser.evaluate(VISIBLE)

        # The next warning: the user did something (a tracked request), the culler's pass saw it (kept,
        # a new stop time), and they idled again past its warning time: the banner is back by itself,
        # and with the culler's next pass (its clock 2 s ahead, as above) it is a warning.
        s.lab.get("api/contents")
        s.pass_()
        kept = s.culler_verdict()["verdict"]
        assert kept["action"] == "keep" and kept["stopAt"] != again["stopAt"], kept
        browser.wait_for(VISIBLE, 120, "the banner for the next warning")
        warned = s.pass_(timedelta(seconds=2))
        v = s.culler_verdict()["verdict"]
        assert v["action"] == "warn" and v["stopAt"] == kept["stopAt"], v
        stop_at = parse_time(v["stopAt"])
        assert stop_at is not None
        browser.wait_for(f"document.querySelector('{BANNER} .kf-culler-stop-time').title === "
                         f"{json.dumps(v['stopAt'])}", 10, "the next warning's stop time")
        # (The click must come after the pass's time, which the injected clock put 2 s ahead.)
        while datetime.now(UTC) <= warned.now + timedelta(seconds=1):
            time.sleep(0.2)

        # Keep working: one POST, answered; the banner goes, and stays away while the culler's latest
        # verdict is older than the click.
        clicked = datetime.now(UTC)
        browser.click(f"{BANNER} .kf-culler-keep")
        browser.wait_for(f"!{VISIBLE}", 10, "the banner to go")
        posts = [r for r in browser.requests("kf-culler/keep") if r["method"] == "POST"]
        assert len(posts) == 1, posts
        assert [r["status"] for r in browser.responses("kf-culler/keep")] == [200]
        time.sleep(3)
        assert not browser.evaluate(VISIBLE)
        moved = activity(s.lab)
        assert moved >= clicked - timedelta(seconds=1), (idle_from, moved, clicked)

        # The culler's next pass (its clock 5 s after now) reads the click as activity: kept, idle
        # since the click, the stop pushed back.
        result = s.pass_(timedelta(seconds=5))
        mine = next(r for r in result.results if r.name == NAME)
        assert mine.verdict.action == "keep", mine.verdict
        after = mine.verdict.to_dict()
        assert parse_time(after["idleSince"]) >= clicked - timedelta(seconds=1)  # type: ignore[operator]
        assert parse_time(after["stopAt"]) > stop_at  # type: ignore[operator]
        time.sleep(3)
        assert not browser.evaluate(VISIBLE)

        # The culler gone: still nothing alarming.
        s.http.stop()
        time.sleep(3)
        assert not browser.evaluate(VISIBLE)
        assert not browser.handler_errors


def test_keep_for_more_hours_from_the_banner(kube: Any, api: Any, namespace: str, lab_python: str,
                                             tmp_path: Path) -> None:
    """With maxExtendMinutes 120 the warning offers "Keep for 2 more hours"; a click posts once, the culler
    writes keep-until (the planned stop plus 2 hours, its bound) with an Event, the banner says until when,
    and the culler's next pass keeps the notebook until then: no warning, the banner goes.

    Policy: stopped after 2 min idle, warned 1 min before; the passes' clock is 70 s ahead, so the notebook
    is warned without waiting."""
    from support.cdp import Chromium, Unavailable, executable

    try:
        executable()
    except Unavailable as err:
        missing("Chromium (hack/setup.sh installs Debian's chromium)", err)
    policy = {"idleMinutes": 2, "warnMinutes": 1, "maxExtendMinutes": 120}
    ahead = timedelta(seconds=70)
    with stack(kube, api, namespace, lab_python, tmp_path, poll="1", policy=policy, writes=True) as s, \
            Chromium() as browser:
        untrack_lab_requests(browser)
        browser.navigate(s.lab.url + "lab")
        browser.wait_for("!!document.querySelector('#jp-main-dock-panel .jp-Launcher')", 120, "JupyterLab's launcher")
        browser.wait_for(f"!!document.querySelector('{BANNER}')", 60, "the extension's banner element")
        with contextlib.suppress(TimeoutError):
            browser.wait_for(DISMISS_NEWS, 5, "JupyterLab's news question")
        settled(s.lab)
        s.pass_(ahead)
        v = s.culler_verdict()["verdict"]
        assert v["action"] == "warn", v
        stop_at, latest = parse_time(v["stopAt"]), parse_time(v["extendUntil"])
        assert stop_at is not None and latest == stop_at + timedelta(minutes=120), v
        browser.wait_for(VISIBLE, 30, "the warning")
        extend = f"document.querySelector('{BANNER} .kf-culler-extend')"
        browser.wait_for(f"!{extend}.hidden && {extend}.textContent === 'Keep for 2 more hours'", 10,
                         "the button Keep for 2 more hours")
        if SCREENSHOTS:
            browser.screenshot(Path(SCREENSHOTS) / "ide-extension-extend-offer.png")

        browser.click(f"{BANNER} .kf-culler-extend")
        note = f"document.querySelector('{BANNER} .kf-culler-banner-note').textContent"
        browser.wait_for(f"{note}.startsWith('Kept until')", 30, "the culler's answer in the banner")
        posts = [r for r in browser.requests("kf-culler/extend") if r["method"] == "POST"]
        assert len(posts) == 1 and [r["status"] for r in browser.responses("kf-culler/extend")] == [200], posts
        print("ANSWER", browser.evaluate(note))
        assert latest.strftime("%H:%M UTC") in str(browser.evaluate(note))
        assert text(browser, ".kf-culler-stop-time") == latest.strftime("%H:%M UTC")
        if SCREENSHOTS:
            browser.screenshot(Path(SCREENSHOTS) / "ide-extension-extend.png")
        written = obj.get_notebook(api, s.namespace, NAME)["metadata"]["annotations"]
        assert parse_time(written[KEEP_UNTIL_ANNOTATION]) == latest, written
        events = [e for e in client.CoreV1Api(api).list_namespaced_event(s.namespace).items
                  if e.reason == EVENT_REASON]
        assert len(events) == 1 and f"pod {NAME}-0" in events[0].message, events

        # The culler's next pass keeps it until then: no warning, and the banner goes.
        s.pass_(ahead + timedelta(seconds=2))
        after = s.culler_verdict()["verdict"]
        assert after["action"] == "keep" and parse_time(after["stopAt"]) == latest, after
        browser.wait_for(f"!{VISIBLE}", 30, "the banner to go once the culler keeps the notebook")
        assert not browser.handler_errors
