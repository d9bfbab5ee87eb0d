"""A real code-server on loopback, as Kubeflow runs it (`--auth none`, served at `/`).

code-server and the Node.js it needs come from the npm registry through hack/codeserver/install.sh,
which keeps them in a cache outside the repository. `executable()` runs that script (a no-op once
installed) and raises `Unavailable` only when code-server cannot be had here: not installed, and no npm.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import urllib.request
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp

from kf_culler.local import procs

VERSION = "4.139.1"
ROOT = Path(__file__).resolve().parents[2]
INSTALL_SCRIPT = ROOT / "hack" / "codeserver" / "install.sh"
NO_NPM = 3  # the install script's exit status when npm is missing


class Unavailable(Exception):
    """code-server cannot be installed on this machine (the reason says why)."""


def executable(install_timeout: float = 1800) -> Path:
    """The code-server executable: $KF_CULLER_CODE_SERVER, else the cached install (made if missing)."""
    given = os.environ.get("KF_CULLER_CODE_SERVER")
    if given:
        path = Path(given)
        if not os.access(path, os.X_OK):
            raise RuntimeError(f"KF_CULLER_CODE_SERVER={given} is not an executable")
        return path
    if not INSTALL_SCRIPT.is_file():
        raise RuntimeError(f"{INSTALL_SCRIPT} is missing; "
                           "set KF_CULLER_CODE_SERVER to a code-server executable")
    env = {**os.environ, "KF_CULLER_CODE_SERVER_VERSION": os.environ.get("KF_CULLER_CODE_SERVER_VERSION",
                                                                          VERSION)}
    # A first install takes minutes; its progress (stderr) is kept for the error message. The executable's
    # path is the last line of stdout.
    done = subprocess.run(["bash", str(INSTALL_SCRIPT)], env=env, capture_output=True, text=True,
                          timeout=install_timeout, check=False)
    if done.returncode == NO_NPM:
        raise Unavailable("npm is not installed and code-server is not installed yet: code-server "
                          "comes from the npm registry (see hack/codeserver/install.sh)")
    if done.returncode != 0:
        raise RuntimeError(f"{INSTALL_SCRIPT} failed (exit {done.returncode}):\n{done.stderr[-4000:]}")
    lines = done.stdout.strip().splitlines()
    if not lines or not os.access(lines[-1], os.X_OK):
        raise RuntimeError(f"{INSTALL_SCRIPT} printed no executable path: {done.stdout[-500:]!r}")
    return Path(lines[-1])


class CodeServer(procs.LocalServer):
    """One code-server process in its own process group, with its own temporary directories.

    `url` is the server root (ending in '/'), the address the culler's probe is given.
    """

    what = "code-server"

    def __init__(self, exe: Path | None = None, env: dict[str, str] | None = None,
                 extensions: tuple[Path, ...] = (), settings: dict[str, Any] | None = None) -> None:
        """`env`: added to code-server's environment (its extension host inherits it); `extensions`:
        .vsix files installed (`--install-extension`) into its own extensions directory before it starts;
        `settings`: the user's VS Code settings (settings.json)."""
        self.exe = exe if exe is not None else executable()
        self.extra_env = dict(env or {})
        self.extensions = extensions
        self.settings = settings
        super().__init__("kf-culler-code-server-", "code-server.log")
        self.url = f"http://127.0.0.1:{self.port}/"

    def __enter__(self) -> CodeServer:
        super().__enter__()
        return self

    def start(self, timeout: float = 120) -> None:
        home = self.dir / "home"
        for sub in ("home", "config", "data", "cache", "user-data", "extensions", "workspace"):
            (self.dir / sub).mkdir()
        # code-server writes its config file, heartbeat file and logs under the XDG directories.
        env = {**os.environ, "HOME": str(home), "XDG_CONFIG_HOME": str(self.dir / "config"),
               "XDG_DATA_HOME": str(self.dir / "data"), "XDG_CACHE_HOME": str(self.dir / "cache"),
               **self.extra_env}
        env.pop("PASSWORD", None)
        env.pop("HASHED_PASSWORD", None)
        dirs = ["--user-data-dir", str(self.dir / "user-data"), "--extensions-dir", str(self.dir / "extensions")]
        if self.settings is not None:
            (self.dir / "user-data" / "User").mkdir(parents=True)
            (self.dir / "user-data" / "User" / "settings.json").write_text(json.dumps(self.settings))
        for vsix in self.extensions:
            done = subprocess.run([str(self.exe), *dirs, "--install-extension", str(vsix)], env=env,
                                  capture_output=True, text=True, timeout=300, check=False)
            if done.returncode != 0:
                raise RuntimeError(f"code-server --install-extension {vsix} exited {done.returncode}: "
                                   f"{(done.stdout + done.stderr)[-2000:]}")
        cmd = [str(self.exe), "--auth", "none", "--bind-addr", f"127.0.0.1:{self.port}",
               "--disable-telemetry", "--disable-update-check", *dirs, str(self.dir / "workspace")]
        self.launch(cmd, env, timeout)

    def ready(self) -> bool:
        try:
            self.healthz()
            return True
        except OSError:
            return False

    def healthz(self) -> Any:
        """GET /healthz on a connection of its own that is closed at once (urllib sends Connection: close).

        /healthz itself never beats the heart, and a closed connection is not counted by it.
        """
        with urllib.request.urlopen(self.url + "healthz", timeout=10) as resp:
            return json.loads(resp.read())

    @asynccontextmanager
    async def client(self) -> AsyncIterator[aiohttp.ClientWebSocketResponse]:
        """Hold a websocket to code-server open, as an open editor tab does, until the block ends.

        The upgrade request at `/` goes through code-server's request handling (which beats the heart
        unless the path is /healthz) and is handed to VS Code's server; while the connection stays open
        code-server's minute timer counts it as an active connection and beats again.
        """
        ws_url = self.url.replace("http://", "ws://") + "?reconnectionToken=kf-culler-test&reconnection=false"
        async with aiohttp.ClientSession() as session, session.ws_connect(
                ws_url, origin=self.url.rstrip("/"), heartbeat=None, autoping=True) as ws:
            reader = asyncio.ensure_future(_drain(ws))
            try:
                yield ws
            finally:
                # Stop reading before closing: close() waits for a pending receive() to end.
                reader.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await reader
                # A socket that VS Code's server has not taken over yet may never answer the close
                # frame; leaving the session then drops the TCP connection all the same.
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(5):
                        await ws.close()


async def _drain(ws: aiohttp.ClientWebSocketResponse) -> None:
    """Read and drop whatever the server sends, so the connection never stalls."""
    async for _ in ws:
        pass
