"""JupyterLab with kf-culler's extension (extensions/jupyterlab), from the virtualenv that
hack/jupyterlab/build.sh builds, run as Kubeflow runs a notebook: base_url /notebook/<ns>/<name>/,
NB_PREFIX set, an empty token, XSRF checks on (as in a notebook image)."""

from __future__ import annotations

import http.cookiejar
import json
import subprocess
import urllib.request
from pathlib import Path
from typing import Any

from kf_culler.local.jupyter import JupyterServer

ROOT = Path(__file__).resolve().parents[2]
BUILD = ROOT / "hack" / "jupyterlab" / "build.sh"


class BuildFailed(Exception):
    pass


def build() -> str:
    """The build venv's python (building the extension first if its sources changed)."""
    done = subprocess.run(["bash", str(BUILD)], cwd=ROOT, capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        raise BuildFailed(f"bash {BUILD.relative_to(ROOT)} exited {done.returncode}: {done.stderr[-3000:]}")
    return done.stdout.strip().splitlines()[-1]


class LabServer(JupyterServer):
    """`python -m jupyterlab` from the build venv, with the extension's environment."""

    def __init__(self, python: str, namespace: str, name: str, env: dict[str, str]) -> None:
        super().__init__(namespace, name, terminals=False)
        self.python = python
        self.extra_env = env
        self.cookies = http.cookiejar.CookieJar()
        self.opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(self.cookies))

    what = "JupyterLab"

    def environment(self) -> dict[str, str]:
        env = {**super().environment(), "NB_PREFIX": self.base_path.rstrip("/"), **self.extra_env}
        env.pop("PYTHONPATH", None)
        return env

    def command(self) -> list[str]:
        return [self.python, "-m", "jupyterlab", "--no-browser", "--allow-root",
                "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={self.port}", "--ServerApp.port_retries=0",
                f"--ServerApp.base_url={self.base_path}", "--IdentityProvider.token=",
                "--ServerApp.password=", f"--ServerApp.root_dir={self.dir}",
                "--LabApp.news_url=", "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate"]

    def start(self, timeout: float = 90) -> None:
        super().start(timeout)

    def _req(self, method: str, path: str, body: Any = None) -> Any:
        """As the page does: the _xsrf cookie the server sets, echoed in X-XSRFToken for writes."""
        if method != "GET" and not any(c.name == "_xsrf" for c in self.cookies):
            with self.opener.open(self.url + "lab", timeout=30) as r:
                r.read()
        xsrf = next((c.value or "" for c in self.cookies if c.name == "_xsrf"), "")
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method,
                                     headers={"Content-Type": "application/json", "X-XSRFToken": xsrf})
        with self.opener.open(req, timeout=30) as resp:
            raw = resp.read()
        return json.loads(raw) if raw else None

    def post(self, path: str, body: Any = None) -> Any:
        return self._req("POST", path, body if body is not None else {})

    def last_activity(self) -> str:
        return str(self.get("api/status?no_track_activity=1")["last_activity"])
