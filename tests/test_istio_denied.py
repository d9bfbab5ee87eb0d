"""A probe refused by the notebook's Istio sidecar (HTTP 403, body exactly `RBAC: access denied`) is named
as such, with the fix, in the source error, the no-signal reason, `check` and `explain`; any other 403 stays
a plain "HTTP 403". Against a real loopback HTTP server (support.faulty, behaviour `rbac`)."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from support.faulty import FaultyServer
from support.target import KubeTarget

from kf_culler.config import ProbeSettings
from kf_culler.local import objects as obj
from kf_culler.sources import codeserver, jupyter
from kf_culler.sources.http import ISTIO_DENIED, Call, Fetcher

PROBE = ProbeSettings.model_validate({"timeoutSeconds": 5, "connectTimeoutSeconds": 2, "retries": 1})
FIX = ("HTTP 403 from the Istio sidecar (RBAC: access denied): kf-culler is not allowed to probe this namespace; "
       "apply kustomize/overlays/kubeflow/profile-namespace or turn on istio.manageAuthorizationPolicies")


@pytest.fixture(scope="module")
def faulty() -> Iterator[FaultyServer]:
    with FaultyServer() as server:
        yield server


def get(url: str) -> tuple[Any, Call]:
    async def go() -> tuple[Any, Call]:
        fetcher = Fetcher.open(PROBE, 1)
        try:
            return await fetcher.get_json(url)
        finally:
            await fetcher.close()

    return asyncio.run(go())


def test_the_sidecars_403_is_named_with_the_fix(faulty: FaultyServer) -> None:
    answer, call = get(faulty.url("x-rbac") + "api/status")
    assert ISTIO_DENIED == FIX
    assert answer == {"error": FIX}
    assert (call.status, call.attempts) == (403, 1)  # permanent: asked once


def test_another_403_stays_plain(faulty: FaultyServer) -> None:
    answer, call = get(faulty.url("x-e403") + "api/status")
    assert answer == {"error": "HTTP 403"} and call.status == 403


@pytest.mark.parametrize("kind", ["jupyter", "codeServer"])
def test_both_probes_carry_it(faulty: FaultyServer, kind: str) -> None:
    async def go() -> Any:
        fetcher = Fetcher.open(PROBE, 1)
        try:
            if kind == "jupyter":
                return (await jupyter.probe(fetcher, faulty.url("jup-rbac")))[0]
            return (await codeserver.probe(fetcher, faulty.url("cs-rbac")))[0]
        finally:
            await fetcher.close()

    answer = asyncio.run(go())
    assert set(answer) == {"error"} and FIX in answer["error"], answer


# --- check and explain, on the real API server ------------------------------------------------------


@pytest.mark.cluster
def test_check_and_explain_show_the_reason_and_the_fix(kube: KubeTarget, api: Any, namespace: str,
                                                        faulty: FaultyServer, tmp_path: Path) -> None:
    from kf_culler.cli import main

    obj.create_notebook(api, namespace, obj.notebook("nb-rbac"))
    obj.running_pod(api, namespace, "nb-rbac", datetime.now(UTC) - timedelta(hours=2))
    cfg = tmp_path / "config.yaml"
    cfg.write_text(yaml.safe_dump({
        "idleMinutes": 1, "urls": {"jupyter": f"{faulty.base}/{{name}}/"},
        "namespaces": {"include": [namespace]}, "probe": {"timeoutSeconds": 5, "retries": 0}}))
    common = ["--config", str(cfg), "--kubeconfig", str(kube.kubeconfig)]

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["check", *common, "-o", "json"]) == 0
    (row,) = json.loads(out.getvalue())["notebooks"]
    assert (row["action"], row["state"]) == ("keep", "no-signal")
    assert row["reason"].startswith("No signal: could not read Jupyter: api/status: " + FIX), row["reason"]

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["explain", f"{namespace}/nb-rbac", *common]) == 0
    text = out.getvalue()
    assert "Verdict: keep / no-signal" in text
    (reason,) = [ln for ln in text.splitlines() if ln.startswith("Reason:")]
    assert FIX in reason
    assert "-> 403 in" in text and f"({FIX})" in text  # the GET line names the sidecar's refusal too
