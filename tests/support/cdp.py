"""Headless Chromium (Debian's `chromium` package) driven over the Chrome DevTools Protocol.

A small client on websocket-client (a dependency of the kubernetes client): start the browser with
--remote-debugging-port=0, read the port it chose from its DevTools line, attach to its page target and
send commands; a reader thread keeps every event in `events` and calls the handlers set with `on`. No browser is
downloaded: the executable is `chromium` on PATH (or KF_CULLER_CHROMIUM).
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import re
import shutil
import subprocess
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import websocket


class Unavailable(Exception):
    """No Chromium executable on this machine."""


def executable() -> str:
    for candidate in (os.environ.get("KF_CULLER_CHROMIUM"), "chromium", "chromium-browser", "google-chrome"):
        if candidate and shutil.which(candidate):
            return str(shutil.which(candidate))
    raise Unavailable("no chromium on PATH (Debian: apt-get install chromium; or set KF_CULLER_CHROMIUM)")


class Chromium:
    def __init__(self, width: int = 1280, height: int = 800) -> None:
        self.exe = executable()
        self.dir = Path(tempfile.mkdtemp(prefix="kf-culler-chromium-"))
        self.size = (width, height)
        self.proc: subprocess.Popen[bytes] | None = None
        self.ws: Any = None
        self.events: list[dict[str, Any]] = []
        self.handlers: dict[str, list[Callable[[dict[str, Any]], None]]] = {}
        self.handler_errors: list[Exception] = []
        self._id = 0
        self._answers: dict[int, dict[str, Any]] = {}
        self._cv = threading.Condition()
        self._send_lock = threading.Lock()

    def __enter__(self) -> Chromium:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self, timeout: float = 60) -> None:
        log = self.dir / "chromium.log"
        cmd = [self.exe, "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
               "--no-first-run", "--no-default-browser-check", "--disable-extensions", "--mute-audio",
               "--remote-debugging-address=127.0.0.1", "--remote-debugging-port=0",
               "--remote-allow-origins=*", f"--user-data-dir={self.dir / 'profile'}",
               f"--window-size={self.size[0]},{self.size[1]}", "about:blank"]
        with log.open("wb") as out:
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        port = None
        while port is None:
            m = re.search(r"DevTools listening on ws://127\.0\.0\.1:(\d+)/", log.read_text(errors="replace"))
            if m:
                port = int(m.group(1))
            elif self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"chromium did not start: {log.read_text(errors='replace')[-2000:]}")
            else:
                time.sleep(0.1)
        page = None
        while page is None:  # the page target may be listed a moment after the DevTools line
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as r:
                page = next((t for t in json.loads(r.read()) if t.get("type") == "page"), None)
            if page is None:
                if time.monotonic() > deadline:
                    raise RuntimeError("chromium started without a page target")
                time.sleep(0.1)
        self.ws = websocket.create_connection(page["webSocketDebuggerUrl"], suppress_origin=True)
        self._reader = threading.Thread(target=self._read, name="cdp-reader", daemon=True)
        self._reader.start()
        for domain in ("Page", "Runtime", "Network"):
            self.send(f"{domain}.enable")

    def stop(self) -> None:
        if self.ws is not None:
            with contextlib.suppress(Exception):  # a socket the browser already closed
                self.ws.close()
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        shutil.rmtree(self.dir, ignore_errors=True)

    # -- the protocol ---------------------------------------------------------------------------------
    def _read(self) -> None:
        """The reader thread: answers go to their waiting command, events to `events` and the handlers."""
        while True:
            try:
                msg = json.loads(self.ws.recv())
            except Exception:  # the socket closed: the browser is stopping
                return
            if "id" in msg:
                with self._cv:
                    self._answers[msg["id"]] = msg
                    self._cv.notify_all()
                continue
            with self._cv:
                self.events.append(msg)
            for handler in list(self.handlers.get(msg.get("method", ""), [])):
                try:
                    handler(msg.get("params") or {})
                except Exception as err:  # keep reading; the test sees the error in handler_errors
                    self.handler_errors.append(err)

    def on(self, method: str, handler: Callable[[dict[str, Any]], None]) -> None:
        """Call handler(params) for every event `method` (on the reader thread: it may call `post`)."""
        self.handlers.setdefault(method, []).append(handler)

    def post(self, method: str, params: dict[str, Any] | None = None) -> int:
        """Send a command without waiting for its answer."""
        with self._send_lock:
            self._id += 1
            mine = self._id
            self.ws.send(json.dumps({"id": mine, "method": method, "params": params or {}}))
        return mine

    def send(self, method: str, params: dict[str, Any] | None = None, timeout: float = 60) -> dict[str, Any]:
        mine = self.post(method, params)
        with self._cv:
            if not self._cv.wait_for(lambda: mine in self._answers, timeout):
                raise TimeoutError(f"{method}: no answer in {timeout} s")
            msg = self._answers.pop(mine)
        if "error" in msg:
            raise RuntimeError(f"{method}: {msg['error']}")
        return dict(msg.get("result") or {})

    def navigate(self, url: str) -> None:
        self.send("Page.navigate", {"url": url})

    def evaluate(self, expression: str) -> Any:
        result = self.send("Runtime.evaluate", {"expression": expression, "returnByValue": True,
                                                "awaitPromise": True})
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression}: {result['exceptionDetails']}")
        return result.get("result", {}).get("value")

    def wait_for(self, expression: str, timeout: float = 60, what: str = "") -> Any:
        deadline = time.monotonic() + timeout
        while True:
            value = self.evaluate(expression)
            if value:
                return value
            if time.monotonic() > deadline:
                raise TimeoutError(f"{what or expression}: not true after {timeout} s")
            time.sleep(0.2)

    def click(self, selector: str) -> None:
        """A real mouse click (pressed and released) at the centre of the element."""
        box = self.evaluate(f"(() => {{ const r = document.querySelector({json.dumps(selector)})"
                            ".getBoundingClientRect(); return [r.x + r.width / 2, r.y + r.height / 2]; })()")
        x, y = box
        for kind in ("mouseMoved", "mousePressed", "mouseReleased"):
            self.send("Input.dispatchMouseEvent", {"type": kind, "x": x, "y": y, "button": "left",
                                                   "clickCount": 0 if kind == "mouseMoved" else 1})

    def screenshot(self, path: Path) -> Path:
        data = self.send("Page.captureScreenshot", {"format": "png"})["data"]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(data))
        return path

    def requests(self, url_part: str) -> list[dict[str, Any]]:
        """Requests the page sent whose URL contains url_part (from the Network events seen so far)."""
        with self._cv:
            events = list(self.events)
        return [e["params"]["request"] for e in events
                if e.get("method") == "Network.requestWillBeSent" and url_part in e["params"]["request"]["url"]]

    def responses(self, url_part: str) -> list[dict[str, Any]]:
        with self._cv:
            events = list(self.events)
        return [e["params"]["response"] for e in events
                if e.get("method") == "Network.responseReceived" and url_part in e["params"]["response"]["url"]]
