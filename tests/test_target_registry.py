"""The target registry (kf_culler/targets/) is the one place a kind of session is named: every target has
every hook the rest of the culler asks for (a verdict API route, a start command, an RBAC component, a
configuration name, a way its IDE is reached), and outside the targets' package and the modules listed below,
no module names a target, compares kinds or asks `target_of(...) is X`."""

from __future__ import annotations

import re
from pathlib import Path
from typing import get_args

from kf_culler.config import Operations
from kf_culler.targets import ALL, KINDS, ROUTES, TARGETS, SessionKey
from kf_culler.targets.base import Reach
from kf_culler.verdict_api import ONE

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "kf_culler"
# Modules that may still name a target: the local components (demo and tests' clusters), the synthetic fleet,
# trace recorder and NotebookOS converter (they make Notebook objects), the Coder target's stopper (its I/O
# beside the writer), and
# the one that still chooses by target: the runner's Coder client.
ALLOWED = ("targets/", "local/", "demo", "replay/fleet.py", "replay/recorder.py",
           "replay/notebookos.py", "kube/coder.py",
           "runner.py")
CONSTANTS = re.compile(r"\b(NOTEBOOKS|WORKSPACES|DEPLOYMENTS|STATEFULSETS|WORKLOADS|CODER)\b")
KIND_LITERAL = re.compile(r"kind\W.*[\"'](Notebook|Workspace|CoderWorkspace)[\"']")
CHAINS = re.compile(r"target_of\([^)]*\)\s+(is|in|not in)\b|\.kind\s*[!=]=\s*[A-Za-z_.]*\.kind\b")


def test_every_target_has_every_hook() -> None:
    configured = set(get_args(get_args(Operations.model_fields["targets"].annotation)[0]))
    assert set(TARGETS) == configured  # every name configuration accepts has a target, and no other
    for t in ALL:
        assert ONE.match(f"/api/v1/namespaces/ns/{t.route}/name"), t  # a verdict API route
        assert ROUTES[t.route] is t and KINDS[t.kind] is t, t
        assert t.reach in get_args(Reach), t
        assert t.rbac is None or (ROOT / "kustomize" / "components" / t.rbac / "kustomization.yaml").is_file(), t
        assert t.where_to_start, t
        start = t.start_command("ns", "alice.dev")
        assert "alice" in start and start.split()[0] in ("kubectl", "coder"), t
        keep = t.keep_command("ns", "alice.dev", "2026-01-01T00:00:00Z")
        assert keep is None or "2026-01-01T00:00:00Z" in keep, t
        assert isinstance(t.is_stopped({"kind": t.kind, "metadata": {}, "spec": {}}), bool), t
        key = SessionKey.of("ns", t.kind, "x")
        assert SessionKey.parse(str(key)) == key and key.kind == t.kind and key.object_name == "x", t


def test_no_other_module_names_a_target() -> None:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if rel.startswith(ALLOWED):
            continue
        for n, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#", 1)[0]
            if CONSTANTS.search(code) or KIND_LITERAL.search(code) or CHAINS.search(code):
                found.append(f"{rel}:{n}: {line.strip()}")
    assert not found, "targets named outside kf_culler/targets/:\n" + "\n".join(found)
