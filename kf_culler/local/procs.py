"""Small helpers shared by the local component launchers: free ports, process groups, log tails."""

from __future__ import annotations

import abc
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
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


class LocalServer(abc.ABC):
    """A server this process runs on loopback: a free port, a directory of its own (removed on stop) with
    its log, and a context manager that stops it, also when its start fails. A subclass builds its
    command in `start` and hands it to `launch`, and says in `ready` whether one look found it answering."""

    what = "the server"  # for messages
    log_lines = 30  # how much of the log a failure shows

    def __init__(self, prefix: str, log_name: str) -> None:
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix=prefix))
        self.log = self.dir / log_name
        self.proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> LocalServer:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @abc.abstractmethod
    def start(self, timeout: float = 120) -> None:
        """Build the command and hand it to `launch`."""

    @abc.abstractmethod
    def ready(self) -> bool:
        """One look: True when the server answers."""

    def launch(self, cmd: list[str], env: dict[str, str], timeout: float, cwd: Path | None = None,
               interval: float = 0.2) -> None:
        """Start `cmd` in its own process group and wait until `ready`; a process that exits or never
        answers raises RuntimeError with the tail of its log."""
        self.proc = start(cmd, self.log, env=env, cwd=cwd or self.dir)
        proc = self.proc

        def up() -> bool:
            if proc.poll() is not None:
                raise RuntimeError(f"{self.what} exited with {proc.returncode}:\n{tail(self.log, self.log_lines)}")
            return self.ready()

        try:
            wait_until(up, timeout, interval, self.what)
        except TimeoutError as err:
            raise RuntimeError(f"{err}:\n{tail(self.log, self.log_lines)}") from None

    def stop(self) -> None:
        stop(self.proc)
        shutil.rmtree(self.dir, ignore_errors=True)
