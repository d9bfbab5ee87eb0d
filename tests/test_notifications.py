"""Notices of warnings and stops, against real servers: an SMTP server (aiosmtpd) and an HTTP receiver in
this process, the Profile CRD on the real API server, real Jupyter servers, passes at injected times.

Delivered once per event, also across a culler restart; never on the pass's thread; bounded attempts
(counted at the servers); failures in metrics, in a NotificationFailed Event and in `kf-culler explain`.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import socket
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from email import message_from_bytes
from email import policy as email_policy
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException
from need import missing
from support.passes import Passes
from test_e2e_cull import make, router  # noqa: F401  (router: a module fixture)

from kf_culler.config import ConfigError, load_mapping
from kf_culler.local import objects as obj
from kf_culler.local.jupyter import JupyterServer
from kf_culler.local.router import Router
from kf_culler.metrics import Metrics
from kf_culler.model import STOP_ANNOTATION, WARNED_AT_ANNOTATION
from kf_culler.notify.notifier import FAILED_EVENT, Notifier
from kf_culler.runner import build_runner

pytestmark = pytest.mark.cluster
ROOT = Path(__file__).resolve().parents[1]
OWNER = "alice@example.com"
ADMIN = "culler-admin@example.com"
CAPTURE = Path("/tmp/kf-culler-notifications")


# --- the servers ---------------------------------------------------------------------------------


class Smtp:
    """aiosmtpd on loopback. `hold`: each DATA waits for `release` (a slow server); `reply`: its answer."""

    def __init__(self) -> None:
        try:
            from aiosmtpd.controller import Controller
        except ImportError:
            missing("aiosmtpd", "not installed (pip install aiosmtpd)")
        self.messages: list[tuple[list[str], bytes]] = []
        self.data_calls = 0
        self.rcpts: list[list[str]] = []
        self.hold = False
        self.reply = "250 OK"
        self.entered = threading.Event()
        self.release = threading.Event()
        outer = self

        class Handler:
            async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
                outer.data_calls += 1
                outer.rcpts.append(sorted(envelope.rcpt_tos))
                outer.entered.set()
                if outer.hold:
                    await asyncio.get_running_loop().run_in_executor(None, outer.release.wait, 30)
                    return "451 too slow"
                if outer.reply.startswith("250"):
                    outer.messages.append((list(envelope.rcpt_tos), bytes(envelope.content)))
                return outer.reply

        self.controller = Controller(Handler(), hostname="127.0.0.1", port=free_port())
        self.controller.start()
        self.port = int(self.controller.port)

    def close(self) -> None:
        self.release.set()
        self.controller.stop()


class Receiver:
    """An HTTP receiver: each path answers `modes[path]` — 200, an error code, or 'hang' (until release)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.modes: dict[str, int | str] = {}
        self.entered = threading.Event()
        self.release = threading.Event()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                outer.calls.append((self.path, json.loads(body)))
                mode = outer.modes.get(self.path, 200)
                if mode == "hang":
                    outer.entered.set()
                    outer.release.wait(30)
                    mode = 200
                self.send_response(int(mode))
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.port = int(self.server.server_address[1])

    def on(self, path: str) -> list[dict[str, Any]]:
        return [body for p, body in self.calls if p == path]

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture()
def smtp() -> Iterator[Smtp]:
    s = Smtp()
    try:
        yield s
    finally:
        s.close()


@pytest.fixture()
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    try:
        yield r
    finally:
        r.close()


# --- the cluster -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def profiles(kube: Any) -> None:
    """The Profile CRD (tests/crds: our own minimal, permissive one), Established."""
    api = kube.api_client()
    ext = client.ApiextensionsV1Api(api)
    body = yaml.safe_load((ROOT / "tests" / "crds" / "profiles.kubeflow.org.yaml").read_text())
    with contextlib.suppress(ApiException):
        ext.create_custom_resource_definition(body)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        crd = ext.read_custom_resource_definition("profiles.kubeflow.org")
        if any(c.type == "Established" and c.status == "True" for c in (crd.status.conditions or [])):
            # the discovery cache of a fresh client may lag the Established condition: ask until served
            with contextlib.suppress(ApiException):
                client.CustomObjectsApi(api).list_cluster_custom_object("kubeflow.org", "v1", "profiles")
                return
        time.sleep(0.2)
    raise AssertionError("the Profile CRD was not served within 60 s")


def profile(api: Any, namespace: str, owner: str) -> None:
    client.CustomObjectsApi(api).create_cluster_custom_object("kubeflow.org", "v1", "profiles", {
        "apiVersion": "kubeflow.org/v1", "kind": "Profile", "metadata": {"name": namespace},
        "spec": {"owner": {"kind": "User", "name": owner}}})


@pytest.fixture()
def idle(router: Router, namespace: str) -> Iterator[JupyterServer]:  # noqa: F811
    """A real Jupyter server with one idle kernel, behind the culler's URL template, as nb-idle."""
    s = JupyterServer(namespace, "nb-idle")
    s.start()
    try:
        router.add("notebook", namespace, "nb-idle", f"http://127.0.0.1:{s.port}", strip=False)
        s.start_kernel()
        yield s
    finally:
        router.remove("notebook", namespace, "nb-idle")
        s.stop()


def config(router: Router, namespace: str, smtp_port: int, receiver: Receiver, tmp: Path,  # noqa: F811
           hooks: dict[str, str], **notify: Any) -> dict[str, Any]:
    """idle 10 min, warning 5 min before, extensions up to 60 min; mail and the given webhooks."""
    webhooks = []
    for name, fmt in hooks.items():
        (tmp / f"webhook-{name}").write_text(f"http://127.0.0.1:{receiver.port}/{name}\n")
        webhooks.append({"name": name, "format": fmt, "urlFile": str(tmp / f"webhook-{name}")})
    return {
        "namespaces": {"include": [namespace]}, "idleMinutes": 10, "warnMinutes": 5, "startupGraceMinutes": 0,
        "maxExtendMinutes": 60, "lastActivityStepMinutes": 600, "urls": {"jupyter": router.template("notebook")},
        "notifications": {
            "attempts": 3, "backoffSeconds": 0.05, "maxBackoffSeconds": 0.2, "timeoutSeconds": 1,
            "email": {"enabled": True, "host": "127.0.0.1", "port": smtp_port, "tls": "none",
                      "from": "kf-culler@example.com", "cc": [ADMIN]},
            "webhooks": webhooks, **notify}}


class Culler:
    """One culler process: a runner with its own notifier and metrics; `restart()` makes a new one."""

    def __init__(self, api: Any, raw: dict[str, Any], records_namespace: str | None = None) -> None:
        self.api, self.raw, self.records_namespace = api, raw, records_namespace
        self.now = datetime.now(UTC)
        self._new()

    def _new(self) -> None:
        self.settings = load_mapping(self.raw, "test")
        self.metrics = Metrics()
        self.notifier = Notifier.for_settings(self.settings, self.api, self.metrics)
        assert self.notifier is not None
        self.runner = Passes(build_runner(self.settings, self.api, notifier=self.notifier, clock=lambda: self.now,
                             records_namespace=self.records_namespace))
        self.runner.start_cache(30)

    def restart(self) -> None:
        self.close()
        self._new()

    def pass_at(self, minutes: float, t0: datetime) -> Any:
        self.now = t0 + timedelta(minutes=minutes)
        result = self.runner.once()
        return result.results[0]

    def count(self, channel: str, kind: str, outcome: str) -> float:
        value = self.metrics.registry.get_sample_value(
            "kf_culler_notifications_total", {"channel": channel, "kind": kind, "outcome": outcome})
        return value or 0.0

    def close(self) -> None:
        self.runner.close()
        self.notifier.close()


# --- once per event --------------------------------------------------------------------------------


def test_one_mail_and_one_call_per_sink_per_warning_and_stop_also_across_a_restart(
        api: Any, namespace: str, router: Router, idle: JupyterServer, profiles: None,  # noqa: F811
        smtp: Smtp, receiver: Receiver, tmp_path: Path) -> None:
    profile(api, namespace, OWNER)
    make(api, namespace, "nb-idle")
    raw = config(router, namespace, smtp.port, receiver, tmp_path,
                 {"generic": "generic", "slack": "slack", "teams": "teams"})
    raw["notifications"]["webhooks"][2]["namespaces"] = {"exclude": [namespace]}  # teams: not this namespace
    t0 = datetime.now(UTC)
    culler = Culler(api, raw)
    try:
        assert culler.pass_at(2, t0).verdict.action == "keep"
        r = culler.pass_at(6, t0)  # 6 min idle: the warning (stop at 10)
        assert r.verdict.action == "warn" and r.write.outcome == "patched" and r.write.event == "created"
        assert culler.notifier.wait_idle(20)
        assert culler.pass_at(8, t0).verdict.action == "warn"  # the warning stands: nothing new
        culler.restart()  # a new process (or a new leader) on the same cluster
        assert culler.pass_at(8.5, t0).verdict.action == "warn"
        assert culler.notifier.wait_idle(20)
        assert len(smtp.messages) == 1 and len(receiver.on("/generic")) == 1
        r = culler.pass_at(11, t0)  # the stop
        assert r.verdict.action == "stop" and r.write.outcome == "patched"
        assert culler.notifier.wait_idle(20)
        culler.pass_at(12, t0)
        culler.restart()
        culler.pass_at(13, t0)
        assert culler.notifier.wait_idle(20)
        stop_count = culler.count("email", "stop", "sent")  # the restarted culler sent nothing
    finally:
        culler.close()
    assert stop_count == 0

    assert [json.loads(json.dumps(b))["kind"] for b in receiver.on("/generic")] == ["warn", "stop"]
    assert len(receiver.on("/slack")) == 2 and receiver.on("/teams") == []
    assert smtp.data_calls == 2 and len(smtp.messages) == 2
    nb = obj.get_notebook(api, namespace, "nb-idle")["metadata"]["annotations"]
    assert STOP_ANNOTATION in nb and WARNED_AT_ANNOTATION not in nb

    (warn_rcpt, warn_raw), (stop_rcpt, stop_raw) = smtp.messages
    assert sorted(warn_rcpt) == sorted(stop_rcpt) == sorted([OWNER, ADMIN])  # the Profile's owner, the cc
    warn, stop = (message_from_bytes(m, policy=email_policy.default) for m in (warn_raw, stop_raw))
    assert warn["To"] == OWNER and warn["Cc"] == ADMIN
    assert warn["Subject"].startswith(f"Notebook {namespace}/nb-idle will be stopped at 20")
    text = warn.get_content()
    keep = f"kubectl annotate notebook nb-idle -n {namespace} notebook-culler.io/keep-until="
    assert keep in text and "--overwrite" in text and "at most 60 minutes" in text
    assert "Use it:" in text and "Why: " in text
    assert stop["Subject"] == f"Notebook {namespace}/nb-idle was stopped"
    stop_text = stop.get_content()
    assert f"kubectl annotate notebook nb-idle -n {namespace} kubeflow-resource-stopped-" in stop_text
    assert "Notebooks page" in stop_text and "Start" in stop_text

    generic_warn, generic_stop = receiver.on("/generic")
    assert generic_warn["version"] == "kf-culler.notification/v1"
    assert generic_warn["notebook"]["namespace"] == namespace and generic_warn["notebook"]["name"] == "nb-idle"
    assert generic_warn["notebook"]["uid"] == obj.get_notebook(api, namespace, "nb-idle")["metadata"]["uid"]
    assert generic_warn["keepCommand"].startswith(keep) and generic_warn["stopAt"] and generic_warn["reason"]
    assert generic_stop["startCommand"].endswith("kubeflow-resource-stopped-") and generic_stop["howToKeep"] is None
    slack_warn = receiver.on("/slack")[0]
    assert slack_warn["text"] == warn["Subject"] and slack_warn["blocks"][0]["type"] == "header"
    assert keep in slack_warn["blocks"][1]["text"]["text"]

    CAPTURE.mkdir(exist_ok=True)  # pasted into docs/notifications.md
    (CAPTURE / "warn.eml").write_bytes(warn_raw)
    (CAPTURE / "stop.eml").write_bytes(stop_raw)
    (CAPTURE / "warn-generic.json").write_text(json.dumps(generic_warn, indent=2))
    (CAPTURE / "stop-generic.json").write_text(json.dumps(generic_stop, indent=2))
    (CAPTURE / "warn-slack.json").write_text(json.dumps(slack_warn, indent=2))


# --- failures never hold the pass -------------------------------------------------------------------


def test_slow_smtp_and_hanging_or_failing_webhooks_never_hold_the_pass(
        api: Any, kube: Any, namespace: str, router: Router, idle: JupyterServer,  # noqa: F811
        profiles: None, smtp: Smtp, receiver: Receiver, tmp_path: Path) -> None:
    profile(api, namespace, OWNER)
    make(api, namespace, "nb-idle")
    smtp.hold = True  # every DATA waits for the latch
    receiver.modes = {"/hang": "hang", "/err": 500, "/gone": 404, "/busy": 429}
    raw = config(router, namespace, smtp.port, receiver, tmp_path,
                 {"hang": "generic", "err": "generic", "gone": "slack", "busy": "teams"}, kinds=["stop"])
    raw["notifications"]["timeoutSeconds"] = 2
    t0 = datetime.now(UTC)
    culler = Culler(api, raw)
    try:
        r = culler.pass_at(11, t0)
        # The pass has returned, and the notice is still being worked on: the SMTP server holds the first
        # attempt until the latch is released (it never is before the end), and 3 attempts x 2 s timeouts
        # for the mail, then the webhooks, are still ahead. Had the pass sent it, nothing would be left.
        assert culler.notifier.queue.unfinished_tasks == 1
        assert r.verdict.action == "stop" and r.write.outcome == "patched" and r.write.event == "created"
        assert STOP_ANNOTATION in obj.get_notebook(api, namespace, "nb-idle")["metadata"]["annotations"]
        assert smtp.entered.wait(20) and not smtp.release.is_set()
        assert receiver.entered.wait(30)  # the mail gave up, the webhooks are tried: the first one hangs
        assert culler.notifier.wait_idle(60)
        smtp.release.set()
        receiver.release.set()
        assert smtp.data_calls == 3 and smtp.messages == []  # three attempts, no more
        assert len(receiver.on("/hang")) == 3 and len(receiver.on("/err")) == 3 and len(receiver.on("/busy")) == 3
        assert len(receiver.on("/gone")) == 1  # 404 is permanent: asked once
        for channel in ("email", "webhook:hang", "webhook:err", "webhook:gone", "webhook:busy"):
            assert culler.count(channel, "stop", "failed") == 1, channel
            assert culler.count(channel, "stop", "sent") == 0
        last = culler.notifier.last_failure[(namespace, "nb-idle")]
        assert "webhook:busy" in last and "HTTP 429" in last and "after 3 attempt(s)" in last
        assert "127.0.0.1" not in last  # a webhook's URL (it may hold a token) is never shown
    finally:
        culler.close()
    events = [e for e in obj.events_for(api, namespace, "nb-idle") if e.reason == FAILED_EVENT]
    assert len(events) == 5
    assert any("email failed after 3 attempt(s): SMTP" in e.message for e in events)

    # `kf-culler explain` shows the last failure (a separate process would read the same Events).
    from kf_culler.cli import main

    cfg = tmp_path / "config.yaml"
    cfg.write_text(yaml.safe_dump(raw))
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["explain", f"{namespace}/nb-idle", "--config", str(cfg),
                     "--kubeconfig", str(kube.kubeconfig)]) == 0
    (line,) = [ln for ln in out.getvalue().splitlines() if ln.startswith("Notifications:")]
    assert "last failure" in line and "failed after" in line


def test_smtp_down_and_a_refused_mail(api: Any, namespace: str, router: Router,  # noqa: F811
                                      idle: JupyterServer, profiles: None, smtp: Smtp, receiver: Receiver,
                                      tmp_path: Path) -> None:
    """A closed port: three connection attempts, then failed; the stop happens. A 550: asked once."""
    make(api, namespace, "nb-idle")
    closed = free_port()  # nothing listens here
    raw = config(router, namespace, closed, receiver, tmp_path, {}, kinds=["warn", "stop"])
    t0 = datetime.now(UTC)
    culler = Culler(api, raw)
    try:
        # No Profile for this namespace: an admin's annotation names the owner.
        client.CoreV1Api(api).patch_namespace(namespace, {"metadata": {"annotations": {
            "notebook-culler.io/notify-email": "bob@example.com"}}})
        r = culler.pass_at(11, t0)
        assert r.verdict.action == "stop" and r.write.outcome == "patched"
        assert culler.notifier.wait_idle(30)
        assert culler.count("email", "stop", "failed") == 1
        assert "after 3 attempt(s): SMTP ConnectionRefusedError" in culler.notifier.last_failure[
            (namespace, "nb-idle")]
    finally:
        culler.close()

    # The same notebook started again and idle again, with a server that refuses the mail for good.
    client.CustomObjectsApi(api).patch_namespaced_custom_object(
        "kubeflow.org", "v1", namespace, "notebooks", "nb-idle", {"metadata": {"annotations": {
            STOP_ANNOTATION: None}}}, _content_type="application/merge-patch+json")
    smtp.reply = "550 5.1.1 mailbox unavailable"
    raw = config(router, namespace, smtp.port, receiver, tmp_path, {}, kinds=["warn", "stop"])
    culler = Culler(api, raw)
    try:
        culler.pass_at(12, t0)  # the restart is seen (no notice: kinds has no 'restart')
        r = culler.pass_at(18, t0)  # idle 6 min since the restart: the warning
        assert r.verdict.action == "warn" and r.write.event == "created", r.verdict.reason
        assert culler.notifier.wait_idle(30)
        assert culler.count("email", "warn", "failed") == 1
        assert "SMTP 550" in culler.notifier.last_failure[(namespace, "nb-idle")]
    finally:
        culler.close()
    assert smtp.data_calls == 1  # 5xx is permanent: asked once
    assert smtp.rcpts == [sorted(["bob@example.com", ADMIN])]  # the namespace annotation named the owner


def test_inline_credentials_are_refused_with_the_key_named() -> None:
    with pytest.raises(ConfigError, match=r"key 'notifications.email.password'.*passwordFile"):
        load_mapping({"notifications": {"email": {"password": "hunter2"}}}, "config.yaml")
    with pytest.raises(ConfigError, match=r"key 'notifications.webhooks\[0\].url'.*urlFile"):
        load_mapping({"notifications": {"webhooks": [{"name": "a", "url": "https://x"}]}}, "config.yaml")
    assert not load_mapping({}, "defaults").operations.notifications.enabled


# --- RBAC: the shipped ClusterRole is enough ------------------------------------------------------------


def test_the_shipped_cluster_role_reads_the_owner_as_the_service_account(
        kube: Any, api: Any, namespace: str, router: Router, idle: JupyterServer,  # noqa: F811
        profiles: None, smtp: Smtp, receiver: Receiver, tmp_path: Path) -> None:
    """A stop and its mail as exactly the culler's ServiceAccount (kustomize/base's ClusterRole): the
    Profile and the namespace are read; nothing about them can be changed."""
    from support.kustomize import render
    from test_rbac import apply

    base = render(ROOT / "kustomize" / "base")
    role = next(o for o in base if o["kind"] == "ClusterRole")
    role["metadata"]["name"] = f"kf-culler-{namespace}"
    records = [{**o, "metadata": {**o["metadata"], "namespace": namespace}} for o in base
               if o["kind"] in ("Role", "RoleBinding") and o["metadata"]["name"] == "kf-culler-records"]
    for o in records:
        for subject in o.get("subjects", []):
            subject["namespace"] = namespace
    apply(api, [role, *records, {"apiVersion": "v1", "kind": "ServiceAccount",
                       "metadata": {"name": "kf-culler", "namespace": namespace}},
                {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                 "metadata": {"name": f"kf-culler-{namespace}"},
                 "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                             "name": f"kf-culler-{namespace}"},
                 "subjects": [{"kind": "ServiceAccount", "name": "kf-culler", "namespace": namespace}]}])
    sa_api = kube.api_client(kube.service_account_kubeconfig(namespace, "kf-culler"))
    profile(api, namespace, OWNER)
    make(api, namespace, "nb-idle")
    time.sleep(1)  # the RBAC authorizer's cache
    culler = Culler(sa_api, config(router, namespace, smtp.port, receiver, tmp_path, {}), records_namespace=namespace)
    try:
        r = culler.pass_at(11, datetime.now(UTC))
        assert r.verdict.action == "stop" and r.write.outcome == "patched" and r.write.event == "created"
        assert culler.notifier.wait_idle(20)
    finally:
        culler.close()
    assert [sorted(rcpt) for rcpt, _ in smtp.messages] == [sorted([OWNER, ADMIN])]

    custom, core = client.CustomObjectsApi(sa_api), client.CoreV1Api(sa_api)

    def status(call: Any) -> int:
        try:
            call()
        except ApiException as err:
            return int(err.status)
        return 200

    # The owner's Profile is read by name; the Profiles (every user's email) are never listed.
    assert custom.get_cluster_custom_object("kubeflow.org", "v1", "profiles", namespace)["spec"]["owner"]
    assert status(lambda: custom.list_cluster_custom_object("kubeflow.org", "v1", "profiles")) == 403

    assert status(lambda: custom.patch_cluster_custom_object(
        "kubeflow.org", "v1", "profiles", namespace, {"spec": {"owner": {"name": "x@example.com"}}})) == 403
    assert status(lambda: core.patch_namespace(namespace, {"metadata": {"annotations": {"a": "b"}}})) == 403
    assert status(lambda: core.list_namespace()) == 403
