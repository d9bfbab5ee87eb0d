"""The code stays typed, lint-clean and layered: mypy --strict, ruff over the package, tests and benchmarks,
and import-linter's contracts (pyproject.toml [tool.importlinter]; docs/architecture.md)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_mypy_strict() -> None:
    done = subprocess.run([sys.executable, "-m", "mypy", "kf_culler"], cwd=ROOT, capture_output=True, text=True,
                          timeout=900)
    assert done.returncode == 0, done.stdout[-5000:]


def test_ruff() -> None:
    ruff = shutil.which("ruff") or "ruff"
    targets = [p for p in ("kf_culler", "tests", "bench") if (ROOT / p).exists()]
    done = subprocess.run([ruff, "check", *targets], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-5000:]


def test_import_layers() -> None:
    """The rules import no client and no adapter; only kf_culler.kube (and the demo's local components)
    import kubernetes; sources never import kube; no import cycles."""
    lint = shutil.which("lint-imports") or "lint-imports"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}  # this checkout's kf_culler, whatever is installed
    done = subprocess.run([lint, "--no-cache"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-5000:] + done.stderr[-2000:]
    assert "BROKEN" not in done.stdout
