"""Small helpers shared by the local component launchers: free ports, process groups, log tails."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from pathlib import Path


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def start(cmd: list[str], log: Path, env: dict[str, str] | None = None,
          cwd: Path | None = None) -> subprocess.Popen[bytes]:
    """Start cmd in its own process group, output to log."""
    fh = open(log, "ab")  # noqa: SIM115 - the child owns it
    try:
        return subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=env, cwd=cwd, start_new_session=True)
    finally:
        fh.close()


def stop(proc: subprocess.Popen[bytes] | None, grace: float = 10.0) -> None:
    """SIGTERM the process group, SIGKILL it after grace seconds, and reap."""
    if proc is None or proc.poll() is not None:
        if proc is not None:
            _kill_group(proc.pid, signal.SIGKILL)
        return
    _kill_group(proc.pid, signal.SIGTERM)
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        _kill_group(proc.pid, signal.SIGKILL)
        proc.wait(5)
    _kill_group(proc.pid, signal.SIGKILL)  # stragglers in the group


def stop_all(running: list[subprocess.Popen[bytes]], grace: float = 5.0) -> None:
    """SIGTERM every process group at once, SIGKILL what is left after `grace` seconds in all, and reap:
    shutting down a whole local cluster costs one grace period, not one per component."""
    for proc in running:
        if proc.poll() is None:
            _kill_group(proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    for proc in running:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(max(0.0, deadline - time.monotonic()))
    for proc in running:
        _kill_group(proc.pid, signal.SIGKILL)  # what did not end in time, and stragglers in the groups
    for proc in running:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(5)


def _kill_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def wait_until(pred: object, timeout: float, interval: float = 0.1, what: str = "condition") -> None:
    """Poll pred() until true; raise TimeoutError naming what was awaited."""
    assert callable(pred)
    deadline = time.monotonic() + timeout
    while True:
        if pred():
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(interval)
