"""Three routes under the Jupyter server's base_url:

    GET  <base>kf-culler/verdict   the culler's latest verdict on this notebook, small; never counts as activity
    POST <base>kf-culler/keep      "Keep working": counts as activity, like any API request a user makes
    POST <base>kf-culler/extend    {"minutes": N}: asks the culler for more time (it writes keep-until, within
                                   the admin's bound); the culler's answer, passed on

Where the verdict comes from (environment of the notebook's container):

    KF_CULLER_VERDICT_URL   the culler's verdict API, e.g. http://kf-culler.kubeflow.svc.cluster.local:9091
                            (set by an admin through a Kubeflow PodDefault); unset: nothing is shown
    NB_PREFIX               /notebook/<namespace>/<name> (set by Kubeflow), or a Kubeflow Notebooks 2.0
                            Workspace's /workspace/connect/<namespace>/<name>/<portId>; else the base_url
    KF_CULLER_TOKEN_FILE    a projected ServiceAccount token for the audience kf-culler
                            (default: /var/run/secrets/kf-culler/token, where the PodDefault mounts it)
    KF_CULLER_POLL_SECONDS  how often the page asks (default 30)
    KF_CULLER_TIMEOUT_SECONDS  how long one question to the culler may take (default 3)
"""

from __future__ import annotations

import json
import os
import re
from datetime import datetime, timezone
from typing import Any

from jupyter_server.base.handlers import APIHandler
from jupyter_server.utils import url_path_join
from tornado import web
from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest

TOKEN_FILE = "/var/run/secrets/kf-culler/token"  # docs/ide-extension.md: a projected token, audience kf-culler
DNS = r"[a-z0-9](?:[-a-z0-9.]{0,251}[a-z0-9])?"
# (the prefix, the verdict API's resource for it): a Notebook's, a Workspace's connect path (docs/targets.md)
PREFIXES = ((re.compile(rf"^/?notebook/({DNS})/({DNS})/?$"), "notebooks"),
            (re.compile(rf"^/?workspace/connect/({DNS})/({DNS})/[^/]+/?$"), "workspaces"))
MAX_REASON = 1000


def _now() -> datetime:
    return datetime.now(timezone.utc)


def _iso(t: datetime) -> str:
    return t.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _float_env(name: str, default: float, low: float, high: float) -> float:
    try:
        return min(max(float(os.environ.get(name, default)), low), high)
    except ValueError:
        return default


def notebook_identity(base_url: str) -> tuple[str, str, str] | None:
    """(namespace, name, the verdict API's resource) from NB_PREFIX, else from the server's base_url (Kubeflow
    makes them the same)."""
    for candidate in (os.environ.get("NB_PREFIX", ""), base_url):
        for prefix, resource in PREFIXES:
            m = prefix.match(candidate.strip())
            if m:
                return m.group(1), m.group(2), resource
    return None


def _token() -> str | None:
    try:
        with open(os.environ.get("KF_CULLER_TOKEN_FILE") or TOKEN_FILE, encoding="utf-8") as f:
            return f.read().strip()  # read every time: the kubelet rotates projected tokens
    except OSError:
        return None


class VerdictHandler(APIHandler):
    """Asks the culler; looking must never keep the notebook alive, so this request is not activity."""

    _track_activity = False  # APIHandler.finish would otherwise set settings["api_last_activity"]

    def _answer(self, doc: dict[str, Any]) -> None:
        doc.setdefault("now", _iso(_now()))
        doc["pollSeconds"] = _float_env("KF_CULLER_POLL_SECONDS", 30, 1, 3600)
        self.set_header("Cache-Control", "no-store")
        self.finish(json.dumps(doc))

    def _unavailable(self, why: str) -> None:
        self.log.debug("kf-culler verdict unavailable: %s", why)
        self._answer({"available": False, "why": why})

    @web.authenticated
    async def get(self) -> None:
        base = os.environ.get("KF_CULLER_VERDICT_URL", "").strip().rstrip("/")
        if not base:
            return self._unavailable("KF_CULLER_VERDICT_URL is not set")
        who = notebook_identity(self.base_url)
        if who is None:
            return self._unavailable("NB_PREFIX is neither /notebook/<namespace>/<name> nor a Workspace's "
                                     "/workspace/connect/<namespace>/<name>/<portId>")
        token = _token()
        if token is None:
            return self._unavailable("no ServiceAccount token")
        timeout = _float_env("KF_CULLER_TIMEOUT_SECONDS", 3, 0.1, 30)
        request = HTTPRequest(f"{base}/api/v1/namespaces/{who[0]}/{who[2]}/{who[1]}",
                              headers={"Authorization": f"Bearer {token}", "Accept": "application/json"},
                              connect_timeout=timeout, request_timeout=timeout, follow_redirects=False)
        try:
            response = await AsyncHTTPClient().fetch(request)
            doc = json.loads(response.body)
            verdict = doc["verdict"]
        except HTTPClientError as err:  # 401, 403, 404, 503, ... and time-outs (599)
            return self._unavailable(f"the culler answered {err.code}")
        except (OSError, ValueError, KeyError, TypeError) as err:
            return self._unavailable(f"the culler cannot be reached: {type(err).__name__}")
        if not isinstance(verdict, dict):
            return self._unavailable("the culler's answer has no verdict")
        self._answer({
            "available": True,
            "state": verdict.get("state"),
            "action": verdict.get("action"),
            "reason": str(verdict.get("reason") or "")[:MAX_REASON],
            "stopAt": verdict.get("stopAt"),
            "warnAt": verdict.get("warnAt"),
            "extendUntil": verdict.get("extendUntil"),
            "passTime": doc.get("passTime"),
        })


class KeepHandler(APIHandler):
    """"Keep working": a user's request, so it is activity (the culler reads it at its next pass)."""

    # Not through APIHandler.finish, which would also count a refused request (a POST without the
    # page's XSRF token fails in prepare, and its error response is finished like any other): only a
    # POST that reaches post() counts.
    _track_activity = False

    @web.authenticated
    def post(self) -> None:
        now = _now()
        # What APIHandler.finish does for a tracked request: the server's last_activity moves to now.
        self.settings["api_last_activity"] = now
        self.finish(json.dumps({"kept": True, "at": _iso(now)}))


class ExtendHandler(APIHandler):
    """"Keep for N more hours": the culler writes keep-until on this notebook, within the admin's bound. Not
    activity by itself (the time asked for is what keeps the notebook)."""

    _track_activity = False

    def _answer(self, code: int, doc: dict[str, Any]) -> None:
        self.set_status(code)
        self.set_header("Cache-Control", "no-store")
        self.finish(json.dumps(doc))

    @web.authenticated
    async def post(self) -> None:
        try:
            minutes = json.loads(self.request.body or b"null")["minutes"]
        except (ValueError, KeyError, TypeError):
            return self._answer(400, {"message": 'the body must be {"minutes": N}'})
        if isinstance(minutes, bool) or not isinstance(minutes, int):
            return self._answer(400, {"message": "minutes must be a whole number"})
        base = os.environ.get("KF_CULLER_VERDICT_URL", "").strip().rstrip("/")
        who = notebook_identity(self.base_url)
        token = _token()
        if not base or who is None or token is None:
            return self._answer(503, {"message": "the culler cannot be asked from this notebook"})
        timeout = _float_env("KF_CULLER_TIMEOUT_SECONDS", 3, 0.1, 30)
        request = HTTPRequest(f"{base}/api/v1/namespaces/{who[0]}/{who[2]}/{who[1]}/extend", method="POST",
                              body=json.dumps({"minutes": minutes}),
                              headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json",
                                       "Accept": "application/json"},
                              connect_timeout=timeout, request_timeout=max(timeout, 10), follow_redirects=False)
        try:
            response = await AsyncHTTPClient().fetch(request, raise_error=False)
            doc = json.loads(response.body) if response.body else {}
        except (OSError, ValueError) as err:
            return self._answer(503, {"message": f"the culler cannot be reached: {type(err).__name__}"})
        if not isinstance(doc, dict):
            doc = {}
        code = response.code if 200 <= response.code < 600 else 503
        out = {"message": str(doc.get("message") or f"the culler answered {response.code}")[:MAX_REASON]}
        if code == 200:
            out["keepUntil"] = doc.get("keepUntil")
            out["clamped"] = bool(doc.get("clamped"))
        elif "retryAfter" in doc:
            out["retryAfter"] = doc["retryAfter"]
        return self._answer(code, out)


def setup_handlers(web_app: Any, log: Any = None) -> None:
    base_url = web_app.settings["base_url"]
    web_app.add_handlers(".*$", [
        (url_path_join(base_url, "kf-culler", "verdict"), VerdictHandler),
        (url_path_join(base_url, "kf-culler", "keep"), KeepHandler),
        (url_path_join(base_url, "kf-culler", "extend"), ExtendHandler),
    ])
    if log is not None:
        url = os.environ.get("KF_CULLER_VERDICT_URL") or "(KF_CULLER_VERDICT_URL unset: nothing shown)"
        log.info("kf-culler: %skf-culler/verdict asks %s", base_url, url)
