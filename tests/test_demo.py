"""`kf-culler demo`: a culling to watch, and nothing left running afterwards (Ctrl-C included)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def leftovers(mark: str) -> list[str]:
    """Processes that inherited the environment variable KF_CULLER_TEST_RUN=mark: everything one demo
    run started (its components run in sessions of their own, so they are not its descendants once it
    is gone), and nothing another test running at the same time started."""
    needle = f"KF_CULLER_TEST_RUN={mark}".encode()
    out = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            if needle not in (proc / "environ").read_bytes().split(b"\0"):
                continue
            cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        out.append(f"{proc.name}: {cmd[:120]}")
    return out


def demo_env() -> tuple[str, dict[str, str]]:
    mark = uuid.uuid4().hex
    return mark, {**os.environ, "KF_CULLER_TEST_RUN": mark}


@pytest.mark.parametrize("blocked", ["cryptography", "jupyter_server", "kf_culler.local"])
@pytest.mark.parametrize("gpu", [False, True])
def test_demo_without_its_extra_says_what_to_install(blocked: str, gpu: bool) -> None:
    """`pip install kf-culler` without `[demo]` (or the container image, which has no kf_culler.local):
    one line naming what to install, exit 2, no traceback."""
    argv = ["demo", "--gpu"] if gpu else ["demo"]
    code = f"import sys; sys.modules[{blocked!r}] = None\nfrom kf_culler.cli import main\nsys.exit(main({argv!r}))"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env,
                          cwd=ROOT)
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert blocked in lines[0] and "pip install -e '.[demo]'" in lines[0]
    assert "Traceback" not in done.stderr


@pytest.mark.cluster
@pytest.mark.slow
def test_demo_stops_the_idle_notebook_and_cleans_up() -> None:
    mark, env = demo_env()
    done = subprocess.run([sys.executable, "-m", "kf_culler", "demo", "--idle-seconds", "8",
                           "--warn-seconds", "4"], capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = done.stdout
    assert "kubeflow-resource-stopped:" in out and "IdleNotebookStopped" in out
    assert "IdleNotebookWarning" in out
    # The notices reached the user: a mail and a webhook call for the warning and for the stop.
    assert "-> mail to user@example.com: Notebook kubeflow-user-example-com/forgotten will be stopped" in out
    assert "-> mail to user@example.com: Notebook kubeflow-user-example-com/forgotten was stopped" in out
    for kind in ("warn", "stop"):
        assert f"kind={kind} notebook=kubeflow-user-example-com/forgotten" in out, out[-3000:]
    assert "training" in out and "active" in out
    assert "Done; nothing is left running." in out
    assert leftovers(mark) == []


@pytest.mark.cluster
@pytest.mark.slow
def test_demo_interrupted_leaves_nothing_running() -> None:
    mark, env = demo_env()
    # Ctrl-C as in a terminal: a test run started in the background (`nohup ... &`, no job control)
    # inherits SIGINT ignored, and so would the demo; give it SIGINT's default back.
    proc = subprocess.Popen([sys.executable, "-m", "kf_culler", "demo", "--idle-seconds", "600"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert proc.stdout is not None
    seen = []
    deadline = time.monotonic() + 300
    for line in proc.stdout:
        seen.append(line)
        if "Running the culler" in line or time.monotonic() > deadline:
            break
    assert any("Running the culler" in line for line in seen), "".join(seen)[-3000:]
    time.sleep(3)
    assert any("jupyter_server" in p for p in leftovers(mark)), "the check below could not see the demo's servers"
    proc.send_signal(signal.SIGINT)
    rest, _ = proc.communicate(timeout=120)
    assert proc.returncode == 130, rest[-2000:]
    assert "nothing is left running" in rest
    assert leftovers(mark) == []


@pytest.mark.cluster
@pytest.mark.slow
def test_demo_gpu_hands_the_idle_notebooks_gpu_to_the_waiting_one() -> None:
    """`kf-culler demo --gpu` end to end: the full local cluster, Kubeflow's notebook-controller (built by
    hack/setup.sh), a's idle GPU read from Prometheus, a stopped, b Running on the GPU, nothing left."""
    mark, env = demo_env()
    done = subprocess.run([sys.executable, "-m", "kf_culler", "demo", "--gpu"], capture_output=True, text=True,
                          timeout=600, env=env)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-3000:]
    evidence = next(line for line in out.splitlines() if "a's GPU evidence:" in line)
    samples = int(evidence.split("a's GPU evidence:")[1].split()[0])
    assert samples >= 2 and "the latest 0.0 % and 0.0 MiB" in evidence, evidence
    assert "kubeflow-resource-stopped: '" in out and "b is Running on gpu-node" in out
    assert "The culler keeps a while it waits (starting)" in out
    assert leftovers(mark) == []


@pytest.mark.cluster
@pytest.mark.slow
def test_demo_target_workspaces_pauses_the_idle_workspace() -> None:
    """`kf-culler demo --target workspaces` end to end: the full local cluster, Kubeflow's Workspace controller
    (built on first use, or by hack/background-builds.sh beside the tests), the idle Workspace paused with its
    reason, the busy one kept, nothing left."""
    mark, env = demo_env()
    done = subprocess.run([sys.executable, "-m", "kf_culler", "demo", "--target", "workspaces"],
                          capture_output=True, text=True, timeout=600, env=env)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-3000:]
    assert "idle is paused: spec.paused = True" in out
    assert "Event IdleNotebookStopped (Warning) on Workspace idle: Stopped after" in out
    assert "state 'Paused'" in out and "busy stays: spec.paused = False" in out
    assert leftovers(mark) == []
