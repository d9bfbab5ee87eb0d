"""The code stays typed and lint-clean: mypy --strict and ruff over the package, tests and benchmarks."""

from __future__ import annotations

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
