"""`kf-culler demo`: a culling to watch, and nothing left running afterwards (Ctrl-C included)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.cluster, pytest.mark.slow]


def leftovers() -> list[str]:
    """Processes whose command line points into the launchers' temporary directories."""
    out = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if any(mark in cmd for mark in ("kf-culler-cluster-", "kf-culler-jupyter-")):
            out.append(f"{proc.name}: {cmd[:120]}")
    return out


def test_demo_stops_the_idle_notebook_and_cleans_up() -> None:
    before = set(leftovers())
    done = subprocess.run([sys.executable, "-m", "kf_culler", "demo", "--idle-seconds", "8",
                           "--warn-seconds", "4"], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = done.stdout
    assert "kubeflow-resource-stopped:" in out and "IdleNotebookStopped" in out
    assert "IdleNotebookWarning" in out
    assert "training" in out and "active" in out
    assert "Done; nothing is left running." in out
    assert set(leftovers()) <= before


def test_demo_interrupted_leaves_nothing_running() -> None:
    before = set(leftovers())
    proc = subprocess.Popen([sys.executable, "-m", "kf_culler", "demo", "--idle-seconds", "600"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    seen = []
    deadline = time.monotonic() + 300
    for line in proc.stdout:
        seen.append(line)
        if "Running the culler" in line or time.monotonic() > deadline:
            break
    assert any("Running the culler" in line for line in seen), "".join(seen)[-3000:]
    time.sleep(3)
    proc.send_signal(signal.SIGINT)
    rest, _ = proc.communicate(timeout=120)
    assert proc.returncode == 130, rest[-2000:]
    assert "nothing is left running" in rest
    assert set(leftovers()) <= before
