"""Kubeflow's real Jupyter web app backend (v1.11.0, Flask) on loopback, pointed at a local API server.

    with start_webapp(kubeconfig) as app:
        ui = app.client()
        ui.notebooks("team-a")                      # GET /api/namespaces/team-a/notebooks
        ui.set_stopped("team-a", "nb", False)       # PATCH {"stopped": false}: what "Start" sends

The backend is the unmodified upstream source (`../shared/vendor/kubeflow-jupyter-web-app-v1.11.0/`, or
$KF_CULLER_WEBAPP_SRC). hack/webapp/install.sh puts its dependencies and `common-backend` (the `kubeflow`
package) into a virtualenv of its own (it pins kubernetes==34.1.0); `virtualenv()` runs that script (a
no-op once installed) and raises `Unavailable` when it cannot be had. The app (`jupyter-backend/`) runs
from a fresh copy, as upstream's `make run-dev` does: gunicorn with gevent workers, `BACKEND_MODE=dev`,
`APP_PREFIX=/`, `APP_SECURE_COOKIES=false`, the API server given by `KUBECONFIG`.

What the dev mode means for a client (crud_backend/authn.py, authz.py, csrf.py):
- authentication and authorization are skipped: no `kubeflow-userid` header is needed, and no
  SubjectAccessReview is made (the backend acts with the kubeconfig's identity). A given header is
  echoed back as "user" in every answer.
- CSRF is checked in every mode: a request with a method other than GET/HEAD/OPTIONS/TRACE needs the
  `XSRF-TOKEN` cookie and an `X-XSRF-TOKEN` header with the same value, else 403. The backend sets the
  cookie when it serves the index page (`/`), as a browser loads it before the app's requests; the
  built frontend is not part of the backend's source, so the copy gets a stand-in `index.html`.

`WebApp(..., frontend=DIR)` serves a built Angular front end instead (hack/webapp/frontend.sh builds it
from upstream's source into ~/.cache/kf-culler/webapp/v1.11.0/frontend): DIR is copied into the app's
static folder as upstream's Dockerfile does (`/src/apps/default/static/`); the backend serves its
index.html for every path that is not an API route, with `<base href>` set to APP_PREFIX, and the
bundles under /static/. hack/webapp/screenshots.py uses it; the tests do not (CI has no front end).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import requests

from kf_culler.local import procs

VERSION = "v1.11.0"
ROOT = Path(__file__).resolve().parents[2]
INSTALL_SCRIPT = ROOT / "hack" / "webapp" / "install.sh"
SOURCE_ENV = "KF_CULLER_WEBAPP_SRC"
CSRF_COOKIE = "XSRF-TOKEN"  # crud_backend/csrf.py
CSRF_HEADER = "X-XSRF-TOKEN"
USER_HEADER = "kubeflow-userid"  # crud_backend/settings.py (USERID_HEADER), not checked in dev mode
# The stand-in for the built Angular frontend that the backend serves as its index page.
INDEX_HTML = """<!doctype html>
<html><head><meta charset="utf-8"><base href="/"><title>Jupyter Web App (backend only)</title></head>
<body>The Jupyter web app's frontend is not part of this test run.</body></html>
"""


class Unavailable(Exception):
    """The web app backend cannot be installed here (the reason says why)."""


class WebAppError(RuntimeError):
    """The backend answered a request with an error status; carries the status and its answer."""

    def __init__(self, method: str, path: str, status: int, body: str) -> None:
        super().__init__(f"{method} {path}: HTTP {status}: {body[:2000]}")
        self.status = status
        self.body = body


def source_dir() -> Path:
    """The unmodified upstream tree: $KF_CULLER_WEBAPP_SRC, else ../shared/vendor/... beside the repo."""
    given = os.environ.get(SOURCE_ENV)
    if given:
        return Path(given)
    return ROOT.parent / "shared" / "vendor" / f"kubeflow-jupyter-web-app-{VERSION}"


def virtualenv(install_timeout: float = 1800) -> Path:
    """The backend's virtualenv, installed by hack/webapp/install.sh if it is not yet (a minute, once)."""
    if not INSTALL_SCRIPT.is_file():
        raise Unavailable(f"{INSTALL_SCRIPT} is missing")
    env = {**os.environ, SOURCE_ENV: str(source_dir())}
    try:
        done = subprocess.run(["bash", str(INSTALL_SCRIPT)], env=env, capture_output=True, text=True,
                              timeout=install_timeout, check=False)
    except subprocess.TimeoutExpired:
        raise Unavailable(f"{INSTALL_SCRIPT} did not finish within {install_timeout:g}s") from None
    if done.returncode != 0:
        raise Unavailable(f"{INSTALL_SCRIPT} failed (exit {done.returncode}):\n{done.stderr[-4000:]}")
    lines = done.stdout.strip().splitlines()
    if not lines or not (Path(lines[-1]) / "bin" / "python").is_file():
        raise Unavailable(f"{INSTALL_SCRIPT} printed no virtualenv path: {done.stdout[-500:]!r}")
    return Path(lines[-1])


class WebAppClient:
    """What the web app's frontend does over HTTP, on one requests.Session (which keeps the cookies).

    Answers are the backend's JSON envelopes ({"success": true, "status": 200, "user": ..., <field>: ...});
    an error status raises WebAppError.
    """

    def __init__(self, url: str, user: str | None = None, timeout: float = 60) -> None:
        self.url = url.rstrip("/") + "/"
        self.timeout = timeout
        self.http = requests.Session()
        if user is not None:
            self.http.headers[USER_HEADER] = user

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> WebAppClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def csrf_token(self) -> str:
        """The XSRF cookie's value, loading the index page first if the backend has not set it yet."""
        token = self.http.cookies.get(CSRF_COOKIE)
        if not token:
            resp = self.http.get(self.url, timeout=self.timeout)
            if resp.status_code != 200:
                raise WebAppError("GET", "/", resp.status_code, resp.text)
            token = self.http.cookies.get(CSRF_COOKIE)
            if not token:
                raise RuntimeError(f"the web app's index page set no {CSRF_COOKIE} cookie "
                                   f"(Set-Cookie: {resp.headers.get('Set-Cookie')!r})")
        return str(token)

    def request(self, method: str, path: str, body: Any = None) -> dict[str, Any]:
        headers: dict[str, str] = {}
        if method.upper() not in ("GET", "HEAD", "OPTIONS", "TRACE"):
            headers[CSRF_HEADER] = self.csrf_token()
        resp = self.http.request(method, self.url + path.lstrip("/"), json=body, headers=headers,
                                 timeout=self.timeout)
        if resp.status_code >= 400:
            raise WebAppError(method, path, resp.status_code, resp.text)
        out: dict[str, Any] = resp.json()
        return out

    def get(self, path: str) -> dict[str, Any]:
        return self.request("GET", path)

    def patch(self, path: str, body: Any) -> dict[str, Any]:
        return self.request("PATCH", path, body)

    # -- the routes the Jupyter web app's notebook table and details page use ---------------------------
    def notebooks(self, namespace: str) -> list[dict[str, Any]]:
        """The notebook table's rows (apps/common/utils.py notebook_dict_from_k8s_obj)."""
        rows: list[dict[str, Any]] = self.get(f"api/namespaces/{namespace}/notebooks")["notebooks"]
        return rows

    def notebook_row(self, namespace: str, name: str) -> dict[str, Any]:
        for row in self.notebooks(namespace):
            if row.get("name") == name:
                return row
        raise KeyError(f"the web app lists no notebook {namespace}/{name}")

    def notebook(self, namespace: str, name: str) -> dict[str, Any]:
        """The Notebook object with the web app's "processed_status" added (the details page)."""
        nb: dict[str, Any] = self.get(f"api/namespaces/{namespace}/notebooks/{name}")["notebook"]
        return nb

    def events(self, namespace: str, name: str) -> list[dict[str, Any]]:
        """The Notebook's Events as the details page's Events tab gets them (camelCase API objects)."""
        evs: list[dict[str, Any]] = self.get(f"api/namespaces/{namespace}/notebooks/{name}/events")["events"]
        return evs

    def set_stopped(self, namespace: str, name: str, stopped: bool) -> dict[str, Any]:
        """What the table's Start/Stop button sends (apps/common/routes/patch.py)."""
        return self.patch(f"api/namespaces/{namespace}/notebooks/{name}", {"stopped": stopped})


class WebApp(procs.LocalServer):
    """One backend process (gunicorn) in its own process group, running from a copy of the source.

    `url` is the app's root ending in '/', on 127.0.0.1 only.
    """

    what = "the Jupyter web app backend"
    log_lines = 60

    def __init__(self, kubeconfig: Path, venv: Path | None = None, source: Path | None = None,
                 frontend: Path | None = None) -> None:
        self.kubeconfig = Path(kubeconfig)
        self.frontend = frontend
        self.venv = venv if venv is not None else virtualenv()
        self.source = source if source is not None else source_dir()
        super().__init__("kf-culler-webapp-", "webapp.log")
        self.url = f"http://127.0.0.1:{self.port}/"

    def __enter__(self) -> WebApp:
        super().__enter__()
        return self

    def start(self, timeout: float = 120) -> None:
        backend = self.source / "jupyter-backend"
        if not (backend / "entrypoint.py").is_file():
            raise RuntimeError(f"{backend}/entrypoint.py is missing: not the Jupyter web app source")
        app = self.dir / "jupyter-backend"
        shutil.copytree(backend, app)  # the source is read-only (CI); the copy gets the stand-in index
        for path in (app, *app.rglob("*")):
            path.chmod(path.stat().st_mode | 0o200)
        static = app / "apps" / "default" / "static"
        if self.frontend is not None:
            if not (self.frontend / "index.html").is_file():
                raise RuntimeError(f"{self.frontend} holds no built front end (index.html is missing)")
            shutil.rmtree(static, ignore_errors=True)
            shutil.copytree(self.frontend, static)
        static.mkdir(parents=True, exist_ok=True)
        if not (static / "index.html").exists():
            (static / "index.html").write_text(INDEX_HTML)

        env = {**os.environ, "BACKEND_MODE": "dev", "UI_FLAVOR": "default", "APP_PREFIX": "/",
               "APP_SECURE_COOKIES": "false", "KUBECONFIG": str(self.kubeconfig),
               "PYTHONUNBUFFERED": "1", "PYTHONDONTWRITEBYTECODE": "1",
               "HOME": str(self.dir)}
        # In a pod the backend would use the pod's service account before KUBECONFIG.
        for var in ("KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT", "VIRTUAL_ENV", "PYTHONPATH",
                    "PYTHONHOME", "APP_DISABLE_AUTH", "USERID_HEADER", "USERID_PREFIX", "PROMETHEUS_MULTIPROC_DIR"):
            env.pop(var, None)
        env["PATH"] = f"{self.venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
        cmd = [str(self.venv / "bin" / "python"), "-m", "gunicorn",
               "--bind", f"127.0.0.1:{self.port}", "--workers", "1", "--worker-class", "gevent",
               "--timeout", "120", "--graceful-timeout", "5",
               "--access-logfile", "-", "--error-logfile", "-", "entrypoint:app"]
        self.launch(cmd, env, timeout, cwd=app, interval=0.25)

    def ready(self) -> bool:
        try:
            resp = requests.get(self.url + "healthz/readiness", timeout=5)
        except requests.RequestException:
            return False
        return resp.status_code == 200

    def client(self, user: str | None = None) -> WebAppClient:
        return WebAppClient(self.url, user=user)

    def log_tail(self, lines: int = 60) -> str:
        return procs.tail(self.log, lines)


@contextmanager
def start_webapp(kubeconfig_path: Path | str, venv: Path | None = None,
                 frontend: Path | None = None) -> Iterator[WebApp]:
    """Run the backend against the API server of kubeconfig_path until the block ends (serving the built
    front end in `frontend`, if given, else a stand-in index page).

    Raises Unavailable if the backend cannot be installed, RuntimeError (with its log's tail) if it is
    installed but does not start.
    """
    with WebApp(Path(kubeconfig_path), venv=venv, frontend=frontend) as app:
        yield app
