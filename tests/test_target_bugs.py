"""What the target registry fixed: each target's own notice hints (a Coder workspace's notice told its user to
`kubectl annotate notebook CoderWorkspace/...`), a verdict API route for every target (Coder's had none), and an
object of a kind no target handles refused (it was taken as a Notebook, and a stop's patch for it fell through to
`spec.replicas: 0`). The Coder workspace is the one a real Coder v2.36.0 answered (tests/data/)."""

from __future__ import annotations

import copy
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from kf_culler.config import Policy
from kf_culler.decide import decide
from kf_culler.errors import InputError
from kf_culler.model import STOP_ANNOTATION
from kf_culler.notify.message import Notice, fields
from kf_culler.session import SessionView
from kf_culler.targets import SessionKey, UnknownKind, session_key, stop_body, target_of
from kf_culler.targets.coder import coder_session
from kf_culler.verdict_api import route_key

SHAPES = json.loads((Path(__file__).parent / "data" / "coder-workspaces-v2.36.0.json").read_text())
NOW = datetime(2026, 1, 1, tzinfo=UTC)


def coder_ws() -> dict[str, Any]:
    return coder_session(copy.deepcopy(SHAPES["running_agent"]), "coder", NOW)


def notice(kind: str, key: tuple[str, str]) -> Notice:
    return Notice(kind, key[0], key[1], "uid", "idle", "idle", "idle", NOW, NOW + timedelta(minutes=30),
                  max_extend_minutes=60)


def test_a_coder_notice_gives_coders_own_hints() -> None:
    ws = coder_ws()
    key = session_key(ws)
    owner, workspace = key.object_name.split(".", 1)
    stop, warn = fields(notice("stop", key)), fields(notice("warn", key))
    assert stop["startCommand"] == f"coder start {owner}/{workspace}"
    assert "Coder's dashboard" in stop["howToStart"]
    for text in (stop["howToStart"], stop["startCommand"], warn["howToKeep"], warn["keepCommand"]):
        assert "kubectl" not in text and "CoderWorkspace" not in text, text
    assert warn["keepCommand"] == ""  # its user extends it in Coder; no command to give


def test_a_notebook_notice_is_unchanged() -> None:
    stop = fields(notice("stop", ("team", "nb")))
    assert stop["startCommand"] == f"kubectl annotate notebook nb -n team {STOP_ANNOTATION}-"
    assert fields(notice("warn", ("team", "nb")))["keepCommand"].startswith("kubectl annotate notebook nb -n team ")


def test_the_verdict_api_has_a_route_for_coder_workspaces() -> None:
    ws = coder_ws()
    key = session_key(ws)
    assert route_key(f"/api/v1/namespaces/coder/coderworkspaces/{key.object_name}") == key
    assert route_key("/api/v1/namespaces/team/notebooks/nb") == ("team", "nb")
    assert route_key("/api/v1/namespaces/team/workspaces/ws") == ("team", "Workspace/ws")
    assert route_key("/api/v1/namespaces/team/pods/nb") is None
    # Coder allows capitals in user and workspace names; the route takes them as they are
    assert route_key("/api/v1/namespaces/coder/coderworkspaces/Alice.Dev-1") == \
        SessionKey.of("coder", "CoderWorkspace", "Alice.Dev-1")
    assert route_key("/api/v1/namespaces/Team/notebooks/nb") is None  # a namespace never has capitals


def test_an_unknown_kind_is_refused_not_taken_as_a_notebook() -> None:
    pod_like = {"apiVersion": "v1", "kind": "ReplicationController",
                "metadata": {"namespace": "team", "name": "rc", "uid": "u"}, "spec": {"replicas": 1}}
    with pytest.raises(UnknownKind, match="ReplicationController"):
        target_of(pod_like)
    with pytest.raises(UnknownKind):  # no patch at all: before, this scaled the object to 0
        stop_body(pod_like, {STOP_ANNOTATION: "2026-01-01T00:00:00Z"})
    with pytest.raises(InputError):  # a pass skips it, saying why (kf_culler/cycle.py catches InputError)
        SessionView.of(pod_like, None, Policy())
    with pytest.raises(InputError):
        decide(pod_like, None, {}, Policy(), NOW)
    assert target_of({"metadata": {"name": "nb"}}).kind == "Notebook"  # no kind at all: a scenario's notebook


def test_a_coder_workspace_is_never_patched() -> None:
    with pytest.raises(InputError):
        stop_body(coder_ws(), {STOP_ANNOTATION: "2026-01-01T00:00:00Z"})
