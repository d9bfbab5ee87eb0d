"""Real Jupyter servers on loopback (jupyter_server + ipykernel), as Kubeflow runs them: a base_url of
/notebook/<namespace>/<name>/ and an empty token."""

from __future__ import annotations

import json
import os
import sys
import time
import urllib.request
import uuid
from typing import Any

from kf_culler.local import procs


class JupyterServer(procs.LocalServer):
    what = "the Jupyter server"

    def __init__(self, namespace: str, name: str, terminals: bool = True, base_path: str | None = None,
                 ip: str = "127.0.0.1", port: int | None = None, remote: bool = False) -> None:
        super().__init__("kf-culler-jupyter-", "server.log")
        # Answer requests whose Host is not a loopback name (a Service's, through a proxy), as a server listening on
        # the pod's address does; on loopback Jupyter otherwise refuses them (403).
        self.remote = remote
        self.ip = ip  # another loopback address: a kwok pod's IP, where a controller looks for the server
        if port is not None:
            self.port = port
        self.namespace, self.name = namespace, name
        # Kubeflow's prefix by default; a Workspace's connect path for Kubeflow Notebooks 2.0
        self.base_path = base_path or f"/notebook/{namespace}/{name}/"
        self.url = f"http://{self.ip}:{self.port}{self.base_path}"
        self.terminals = terminals

    def __enter__(self) -> JupyterServer:
        super().__enter__()
        return self

    def environment(self) -> dict[str, str]:
        """The server's environment: its Jupyter and IPython directories inside its own directory."""
        return {**os.environ, "JUPYTER_RUNTIME_DIR": str(self.dir / "runtime"),
                "JUPYTER_DATA_DIR": str(self.dir / "data"), "JUPYTER_CONFIG_DIR": str(self.dir / "config"),
                "IPYTHONDIR": str(self.dir / "ipython"), "HOME": str(self.dir)}

    def command(self) -> list[str]:
        cmd = [sys.executable, "-m", "jupyter_server", "--no-browser", "--allow-root",
               f"--ServerApp.ip={self.ip}", f"--ServerApp.port={self.port}", "--ServerApp.port_retries=0",
               f"--ServerApp.base_url={self.base_path}", "--IdentityProvider.token=",
               "--ServerApp.password=", "--ServerApp.disable_check_xsrf=True",
               f"--ServerApp.root_dir={self.dir}",
               f"--ServerApp.terminals_enabled={self.terminals}"]
        if self.remote:
            cmd.append("--ServerApp.allow_remote_access=True")
        if self.terminals:  # enabled explicitly: a virtualenv does not see the system's extension config
            cmd.append("--ServerApp.jpserver_extensions={'jupyter_server_terminals': True}")
        return cmd

    def start(self, timeout: float = 60) -> None:
        self.launch(self.command(), self.environment(), timeout)

    def ready(self) -> bool:
        try:
            self.get("api/status")
            return True
        except OSError:
            return False

    # -- the REST API, as a user's browser would use it ----------------------------------------------
    def _req(self, method: str, path: str, body: Any = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method,
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=30) as resp:
            raw = resp.read()
        return json.loads(raw) if raw else None

    def get(self, path: str) -> Any:
        return self._req("GET", path)

    def start_kernel(self) -> str:
        """Start a kernel and open it once, as a browser does (the server then learns it is idle)."""
        kernel = self._req("POST", "api/kernels", {"name": "python3"})
        kid = str(kernel["id"])
        self._send(kid, "kernel_info_request", {}, until="idle")
        procs.wait_until(lambda: self.kernel_state(kid) == "idle", 60, 0.2, "the kernel to be idle")
        return kid

    def new_terminal(self) -> str:
        return str(self._req("POST", "api/terminals")["name"])

    def kernel_state(self, kernel_id: str) -> str:
        return str(self.get(f"api/kernels/{kernel_id}?no_track_activity=1").get("execution_state"))

    def execute(self, kernel_id: str, code: str, wait_busy: bool = True) -> None:
        """Send an execute_request over the kernel's websocket channel (the kernel protocol), then close."""
        self._send(kernel_id, "execute_request", {
            "code": code, "silent": False, "store_history": False, "user_expressions": {},
            "allow_stdin": False, "stop_on_error": True}, until="busy")
        if wait_busy:
            procs.wait_until(lambda: self.kernel_state(kernel_id) == "busy", 30, 0.1, "the kernel to be busy")

    def _send(self, kernel_id: str, msg_type: str, content: dict[str, Any], until: str) -> None:
        import asyncio

        import aiohttp

        async def send() -> None:
            ws_url = self.url.replace("http://", "ws://") + f"api/kernels/{kernel_id}/channels"
            msg = {"header": {"msg_id": uuid.uuid4().hex, "msg_type": msg_type, "username": "test",
                              "session": uuid.uuid4().hex, "date": "", "version": "5.3"},
                   "parent_header": {}, "metadata": {}, "channel": "shell", "content": content}
            async with aiohttp.ClientSession() as http, http.ws_connect(ws_url) as ws:
                await ws.send_str(json.dumps(msg))
                deadline = time.monotonic() + 60
                while time.monotonic() < deadline:
                    reply = await ws.receive(timeout=60)
                    if reply.type != aiohttp.WSMsgType.TEXT:
                        break
                    data = json.loads(reply.data)
                    if data.get("msg_type") == "status" and data["content"].get("execution_state") == until:
                        break

        asyncio.run(send())

    def interrupt(self, kernel_id: str) -> None:
        self._req("POST", f"api/kernels/{kernel_id}/interrupt")
