"""The Coder target without a server (`targets: [coder]`, docs/targets.md, "Coder workspaces"): the synthetic session
object made from Coder's workspace JSON (the shapes in tests/data/coder-workspaces-v2.36.0.json were answered by a
real Coder v2.36.0, see its `_about`), the Coder reading, stopped and starting, keep-until from a user's deadline
extension bounded by maxExtendMinutes, the configuration, and the API client's bounds."""

from __future__ import annotations

import copy
import json
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import pytest

from kf_culler.config import ConfigError, Policy, load_mapping
from kf_culler.decide import decide
from kf_culler.model import KEEP_UNTIL_ANNOTATION, SERVER_TYPE_ANNOTATION
from kf_culler.readings import Unreadable, parse_coder
from kf_culler.session import SessionView
from kf_culler.sources.coder import CoderClient, CoderError
from kf_culler.targets import CODER, is_stopped, session_key, target_of
from kf_culler.targets.coder import (
    CONNECTED_SECONDS,
    WORKSPACE_ID_LABEL,
    coder_items,
    coder_session,
    user_extension,
)
from kf_culler.timeutil import format_time, parse_time

SHAPES = json.loads((Path(__file__).parent / "data" / "coder-workspaces-v2.36.0.json").read_text())
NS = "coder"


def shape(name: str) -> dict[str, Any]:
    return copy.deepcopy(SHAPES[name])


def t(value: str) -> datetime:
    found = parse_time(value)
    assert found is not None
    return found


def pod_of(ws: dict[str, Any], phase: str = "Running", gpus: int = 1, started: datetime | None = None,
           name: str = "coder-ws-0") -> dict[str, Any]:
    status: dict[str, Any] = {"phase": phase}
    if phase == "Running":
        status["startTime"] = format_time(started or t(ws["latest_build"]["job"]["completed_at"]))
    return {"metadata": {"name": name, "namespace": NS, "labels": {WORKSPACE_ID_LABEL: ws["id"]}},
            "spec": {"containers": [{"name": "dev", "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}]},
            "status": status}


def gpu(now: datetime, util: float, seconds: int = 600) -> dict[str, Any]:
    return {"samples": [{"time": format_time(now - timedelta(seconds=s)), "utilPercent": util,
                         "memoryUsedMiB": 1024.0 if util else 0.0} for s in range(seconds, -1, -60)]}


def test_the_recorded_shapes_make_sessions() -> None:
    ws = shape("running_no_agent")
    now = t(ws["latest_build"]["job"]["completed_at"])
    s = coder_session(ws, NS, now)
    assert s["kind"] == CODER.kind and s["apiVersion"] == "coder.com/v2" and target_of(s) is CODER
    assert s["metadata"] == {"namespace": NS, "name": f"{ws['owner_name']}.{ws['name']}", "uid": ws["id"],
                             "annotations": {SERVER_TYPE_ANNOTATION: CODER.name}}
    assert session_key(s) == (NS, f"CoderWorkspace/{ws['owner_name']}.{ws['name']}")
    assert s["spec"] == {"transition": "start"} and not is_stopped(s)
    reading = s["status"][CODER.name]
    assert reading["connected"] is False and reading["build"] == "running"  # the agent is only `connecting`
    assert parse_coder(reading).connected_at == t(ws["last_used_at"]).replace(microsecond=0)


def test_connected_is_an_agent_connected_and_recent_use() -> None:
    ws = shape("after_usage")  # `coder agent` connected, then POST /usage: last_used_at moved
    used = t(ws["last_used_at"])
    assert coder_session(ws, NS, used + timedelta(seconds=10))["status"][CODER.name]["connected"] is True
    late = used + timedelta(seconds=CONNECTED_SECONDS + 1)
    assert coder_session(ws, NS, late)["status"][CODER.name]["connected"] is False
    ws["latest_build"]["resources"][0]["agents"][0]["status"] = "disconnected"
    assert coder_session(ws, NS, used)["status"][CODER.name]["connected"] is False
    # the agent alone (connected, no use since the start) is the pod running, not someone using it
    agent_only = shape("running_agent")
    later = t(agent_only["last_used_at"]) + timedelta(seconds=CONNECTED_SECONDS + 5)
    assert coder_session(agent_only, NS, later)["status"][CODER.name]["connected"] is False


def test_stop_builds_are_stopped() -> None:
    for name in ("stopping", "stopped"):
        s = coder_session(shape(name), NS, datetime.now(UTC))
        assert is_stopped(s), name
        v = decide(s, None, {}, Policy(), datetime.now(UTC))
        assert (v.action, v.state, v.rule_id) == ("keep", "stopped", "1-stopped")
    deleted = shape("stopped")
    deleted["latest_build"]["transition"] = "delete"
    assert is_stopped(coder_session(deleted, NS, datetime.now(UTC)))


def test_a_pending_pod_or_a_starting_build_is_starting() -> None:
    ws = shape("running_no_agent")  # the build says running; its pod waits for a GPU
    now = t(ws["latest_build"]["job"]["completed_at"]) + timedelta(hours=2)
    pending = pod_of(ws, phase="Pending")
    [(s, pod)] = coder_items([ws], NS, [pending], now)
    assert pod is pending
    v = decide(s, pod, {CODER.name: s["status"][CODER.name], "gpu": gpu(now, 0)}, Policy(idleMinutes=1), now)
    assert (v.action, v.state, v.rule_id) == ("keep", "starting", "3-starting"), v
    # a build still pending or starting: no pod is the session's yet, even a Running one of an earlier build
    for status in ("pending", "starting"):
        ws["latest_build"]["status"] = status
        [(s, pod)] = coder_items([ws], NS, [pod_of(ws)], now)
        assert pod is None
        assert decide(s, pod, {}, Policy(idleMinutes=1), now).state == "starting"


def test_pods_are_paired_by_label_in_the_coder_namespace_only() -> None:
    ws = shape("running_no_agent")
    now = datetime.now(UTC)
    elsewhere = pod_of(ws, name="decoy", gpus=8)
    elsewhere["metadata"]["namespace"] = "team-a"  # a user can label their own pods anything
    small, big = pod_of(ws, name="a", gpus=0), pod_of(ws, name="b", gpus=2)
    [(_, pod)] = coder_items([ws], NS, [elsewhere, small, big], now)
    assert pod is big  # the Running one asking for the most GPUs


def decide_at(ws: dict[str, Any], now: datetime, util: float, policy: Policy, started: datetime) -> Any:
    [(s, pod)] = coder_items([ws], NS, [pod_of(ws, started=started)], now)
    return decide(s, pod, {CODER.name: s["status"][CODER.name], "gpu": gpu(now, util)}, policy, now)


def test_the_rules_over_coder_signals() -> None:
    policy = Policy(idleMinutes=30, warnMinutes=0, startupGraceMinutes=0, connectedGpuIdleMinutes=10)
    # GPU busy, no connection: kept (what Coder's autostop gets wrong: it sees only connections)
    ws = shape("running_no_agent")
    start = t(ws["last_used_at"])
    v = decide_at(ws, start + timedelta(hours=3), 90, policy, start)
    assert (v.action, v.state) == ("keep", "active"), v
    # GPU idle, no connection: idle since the last use (or the pod's start), stopped after idleMinutes
    v = decide_at(ws, start + timedelta(minutes=31), 0, policy, start)
    assert (v.action, v.state, v.rule_id) == ("stop", "idle", "10-idle"), v
    assert decide_at(ws, start + timedelta(minutes=20), 0, policy, start).action == "keep"
    # connected, GPU idle: connectedGpuIdleMinutes from the last GPU work, never the connection
    used = shape("after_usage")
    now = t(used["last_used_at"]) + timedelta(seconds=30)
    v = decide_at(used, now, 0, policy, now - timedelta(minutes=11))
    assert (v.action, v.state, v.rule_id) == ("stop", "connected", "9-connected-gpu-idle"), v
    v = decide_at(used, now, 0, policy, now - timedelta(minutes=5))
    assert (v.action, v.state) == ("keep", "connected"), v
    # no GPU source for a GPU workspace: no signal, kept
    [(s, pod)] = coder_items([ws], NS, [pod_of(ws, started=start)], start + timedelta(hours=5))
    v = decide(s, pod, {CODER.name: s["status"][CODER.name], "gpu": {"error": "Prometheus down"}}, policy,
               start + timedelta(hours=5))
    assert v.action == "keep" and v.state == "no-signal"


def test_the_users_deadline_extension_is_keep_until_bounded_by_max_extend() -> None:
    assert user_extension(shape("running_ttl")) is None  # the workspace's own autostop is no extension
    assert user_extension(shape("running_no_agent")) is None  # no autostop, no deadline
    ws = shape("running_extended")  # PUT /extend, 3 hours on
    s = coder_session(ws, NS, datetime.now(UTC))
    assert s["metadata"]["annotations"][KEEP_UNTIL_ANNOTATION] == format_time(t(ws["latest_build"]["deadline"]))
    start = t(ws["latest_build"]["job"]["completed_at"])
    idle_stop = start + timedelta(minutes=30)
    for max_extend, stop_at in ((0, idle_stop), (60, idle_stop + timedelta(minutes=60)),
                                (600, t(ws["latest_build"]["deadline"]))):
        policy = Policy(idleMinutes=30, warnMinutes=0, startupGraceMinutes=0, maxExtendMinutes=max_extend)
        v = decide_at(ws, start + timedelta(minutes=31), 0, policy, start)
        assert v.stop_at is not None and abs((v.stop_at - stop_at).total_seconds()) < 2, (max_extend, v)
        assert v.action == ("stop" if max_extend == 0 else "keep"), v


def test_parse_coder_is_all_or_nothing() -> None:
    good = {"connected": True, "lastUsedAt": "2026-12-01T18:33:37Z", "build": "running", "agents": "main: connected"}
    assert parse_coder(good).connected
    for bad in ({**good, "connected": "yes"}, {**good, "lastUsedAt": "yesterday"}, {**good, "build": "dancing"},
                {k: v for k, v in good.items() if k != "lastUsedAt"}, {"error": "Coder could not be read"}, []):
        with pytest.raises(Unreadable):
            parse_coder(bad)


def test_only_a_coder_workspace_is_coder() -> None:
    """A Notebook's user can write the server-type annotation: `coder` there would leave it without a probe."""
    nb = {"kind": "Notebook", "metadata": {"namespace": "a", "name": "n", "annotations": {
        SERVER_TYPE_ANNOTATION: CODER.name}}}
    view = SessionView.of(nb, None, Policy())
    assert view.server_type == "jupyter" and view.unknown_server_type == CODER.name


def test_configuration() -> None:
    base = {"targets": ["coder"], "coder": {"url": "http://coder.coder.svc", "tokenFile": "/t", "namespace": NS}}
    ops = load_mapping(base, "c.yaml").operations
    assert ops.coder is not None and ops.coder.page_size == 100
    for raw, says in (({"targets": ["coder"]}, "targets: coder needs a `coder:` section"),
                      ({**base, "coder": {**base["coder"], "tokenfile": "/t"}}, "key 'coder.tokenfile'"),
                      ({**base, "coder": {**base["coder"], "url": "http://u:p@coder"}}, "key 'coder.url'"),
                      ({**base, "namespaces": {"include": ["team-a"]}}, "not in namespaces.include")):
        with pytest.raises(ConfigError) as err:
            load_mapping(raw, "c.yaml")
        assert says in str(err.value)


class _Stub(BaseHTTPRequestHandler):
    pages: ClassVar[list[dict[str, Any]]] = []
    seen: ClassVar[list[str]] = []

    def do_GET(self) -> None:
        self.seen.append(f"{self.path} {self.headers.get('Coder-Session-Token')}")
        if self.path.startswith("/api/v2/workspaces?limit=2&offset="):
            offset = int(self.path.rsplit("=", 1)[1])
            body = json.dumps({"workspaces": self.pages[offset:offset + 2], "count": len(self.pages)}).encode()
            self.send_response(200)
        else:
            body = json.dumps({"message": "Internal error"}).encode()
            self.send_response(500)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture()
def stub() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Stub)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_the_client_pages_and_never_says_the_token(stub: str, tmp_path: Path) -> None:
    from kf_culler.config import CoderSettings

    token = tmp_path / "token"
    token.write_text("s3cret-token-value\n")
    _Stub.pages = [{"id": str(i)} for i in range(5)]
    _Stub.seen = []
    settings = CoderSettings.model_validate({"url": stub, "tokenFile": str(token), "namespace": NS, "pageSize": 2})
    listing = CoderClient(settings).list_workspaces()
    assert [w["id"] for w in listing.workspaces] == ["0", "1", "2", "3", "4"]
    assert listing.unjudged == 0 and listing.complete
    assert [s.split(" ")[0].rsplit("=", 1)[1] for s in _Stub.seen] == ["0", "2", "4"]
    assert all(s.endswith(" s3cret-token-value") for s in _Stub.seen)
    with pytest.raises(CoderError) as err:
        CoderClient(settings).me()  # 500, asked once
    assert "s3cret" not in str(err.value)
    closed = CoderSettings.model_validate({"url": "http://127.0.0.1:9", "tokenFile": str(token), "namespace": NS,
                                           "timeoutSeconds": 1})
    with pytest.raises(CoderError) as err:
        CoderClient(closed).list_workspaces()
    assert "cannot reach Coder" in str(err.value) and "s3cret" not in str(err.value)
    answer = CoderClient(closed).stop("0")
    assert answer.status is None and "s3cret" not in answer.message
    missing = CoderSettings.model_validate({"url": stub, "tokenFile": str(tmp_path / "none"), "namespace": NS})
    with pytest.raises(CoderError, match=r"cannot read coder\.tokenFile"):
        CoderClient(missing).list_workspaces()


def many(owners: dict[str, int]) -> list[dict[str, Any]]:
    """Workspaces of the recorded shape `running_agent`, `n` for each owner, with ids and names of their own, in
    the order Coder lists them (running first, then by owner and name: here a shuffle of owners)."""
    out = []
    for owner, n in owners.items():
        for i in range(n):
            ws = shape("running_agent")
            ws.update({"owner_name": owner, "name": f"ws-{i}", "id": f"00000000-0000-4000-8000-{len(out):012d}"})
            out.append(ws)
    return out[::-1]


def test_more_workspaces_than_max_judges_the_first_in_a_stable_order(stub: str, tmp_path: Path) -> None:
    """Over coder.maxWorkspaces the listing no longer fails: it keeps the first maxWorkspaces by owner and name,
    whatever order Coder answers in, and counts the others. The Coder API is a stand-in HTTP listing of the
    recorded shape (a real Coder needs hack/coder/build.sh, which the end-to-end tests use)."""
    from kf_culler.config import CoderSettings

    token = tmp_path / "token"
    token.write_text("t")
    settings = CoderSettings.model_validate({"url": stub, "tokenFile": str(token), "namespace": NS, "pageSize": 2,
                                             "maxWorkspaces": 4})
    _Stub.pages = many({"carol": 2, "alice": 3, "bob": 2})
    listing = CoderClient(settings).list_workspaces()
    assert [(w["owner_name"], w["name"]) for w in listing.workspaces] == [
        ("alice", "ws-0"), ("alice", "ws-1"), ("alice", "ws-2"), ("bob", "ws-0")]
    assert listing.unjudged == 3 and listing.complete
    _Stub.pages = _Stub.pages[::-1]  # Coder's order moved (running first): the same four are kept
    again = CoderClient(settings).list_workspaces()
    assert [w["id"] for w in again.workspaces] == [w["id"] for w in listing.workspaces]
    # What is kept makes sessions as ever; the left-out workspaces make none (never idle: not judged).
    items = coder_items(listing.workspaces, NS, [], t(shape("running_agent")["last_used_at"]))
    assert [s["metadata"]["name"] for s, _ in items] == ["alice.ws-0", "alice.ws-1", "alice.ws-2", "bob.ws-0"]
    # Reading stops after READ_FACTOR x maxWorkspaces: the count is then a lower bound.
    from kf_culler.sources.coder import READ_FACTOR

    _Stub.pages = many({"dave": READ_FACTOR * 4 + 5})
    capped = CoderClient(settings).list_workspaces()
    assert len(capped.workspaces) == 4 and capped.unjudged == READ_FACTOR * 4 - 4 and not capped.complete


def test_fairness_is_keyed_by_the_coder_owner() -> None:
    """Every Coder workspace is in the admin's one namespace: the notices' queue and the brakes take each Coder
    owner as a tenant of its own, so one Coder user's flood waits behind their own notices only."""
    from kf_culler.notify.fairqueue import FairQueue
    from kf_culler.targets.coder import fairness_key

    alice, bob = many({"alice": 1, "bob": 1})[::-1]
    now = t(alice["last_used_at"])
    ka, kb = session_key(coder_session(alice, NS, now)), session_key(coder_session(bob, NS, now))
    assert (fairness_key(ka), fairness_key(kb)) == (f"{NS}/alice", f"{NS}/bob")
    assert fairness_key(("team-a", "nb")) == "team-a" and fairness_key(("team-a", "Workspace/ws")) == "team-a"
    fair: FairQueue[str] = FairQueue(size=100, per_namespace=3, per_hour=100)
    for i in range(3):
        fair.put_nowait(fairness_key(ka), f"alice-{i}")
    fair.put_nowait(fairness_key(kb), "bob-0")  # alice's queue is full; bob's notice still goes in
    assert [fair.get(0.1) for _ in range(4)] == ["alice-0", "bob-0", "alice-1", "alice-2"]


def test_the_brakes_weigh_coder_owners_as_tenants() -> None:
    """One Coder user's ten workspaces turning idle are one tenant among four, not the whole of one namespace."""
    from kf_culler.brakes import BrakeLimits, BrakeState, Seen, apply_brakes
    from kf_culler.targets.coder import fairness_key

    now = datetime(2026, 12, 1, tzinfo=UTC)
    owners = many({"mallory": 10, "alice": 1, "bob": 1, "carol": 1})
    keys = [session_key(coder_session(ws, NS, now)) for ws in owners]

    def seen(idle: str) -> list[Seen]:
        return [Seen(ns, name, True, True, "idle" if f"/{idle}." in name else "active", "keep", None,
                     fairness_key((ns, name))) for ns, name in keys]

    first = apply_brakes(seen(""), BrakeState(), BrakeLimits(), now)
    out = apply_brakes(seen("mallory"), first.state, BrakeLimits(), now + timedelta(minutes=1))
    assert out.shares["newly-idle:gpu"] == pytest.approx(1 / 4) and out.trips == ()


@pytest.mark.cluster
def test_the_runner_judges_the_first_and_reports_the_rest(kube: Any, namespace: str, stub: str,
                                                          tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The runner over a listing past coder.maxWorkspaces: the first maxWorkspaces become sessions, the rest are
    counted in `coder_unjudged` (the metric kf_culler_coder_workspaces_unjudged) and logged; before, the whole
    list failed and, after a restart, no Coder workspace was judged. The pods come from a real API server (the
    test namespace stands for coder.namespace); Coder is the stand-in HTTP listing of the recorded shape."""
    from support.passes import Passes

    from kf_culler.metrics import Metrics
    from kf_culler.runner import build_runner
    from kf_culler.service import instrument

    token = tmp_path / "token"
    token.write_text("t")
    _Stub.pages = many({"carol": 2, "alice": 3, "bob": 2})
    settings = load_mapping({"targets": ["coder"], "namespaces": {"include": [namespace]},
                             "coder": {"url": stub, "tokenFile": str(token), "namespace": namespace,
                                       "pageSize": 2, "maxWorkspaces": 4}}, "test")
    metrics = Metrics()
    with Passes(build_runner(settings, kube.api_client(), records_namespace=namespace)) as runner, \
            caplog.at_level("WARNING"):
        runner.runner = instrument(runner.runner, metrics)
        items, seen = runner.coder_items()
        runner.once()
    assert [s["metadata"]["name"] for s, _ in items] == ["alice.ws-0", "alice.ws-1", "alice.ws-2", "bob.ws-0"]
    assert seen.unjudged == 3 and seen.problem is None
    assert runner.memory.coder.unjudged == 3 and runner.memory.coder.problem is None
    assert "3 more than coder.maxWorkspaces (4)" in caplog.text
    assert b"kf_culler_coder_workspaces_unjudged 3.0" in metrics.render()
