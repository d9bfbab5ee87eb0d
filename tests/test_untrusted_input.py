"""Untrusted input: notebook names, namespaces and annotations are written by users.

1. Probe URLs come only from the namespace, the name and the admin's URL templates. Notebooks whose
   annotations try to send the probe elsewhere (another host, a port, a path, credentials in a URL,
   a URL as the server type, a huge value) are probed at exactly the expected URLs, as recorded by
   the loopback server that answers them, and a second "attacker" server hears nothing at all.
2. Annotations with absurd values (a forged `notebooks.kubeflow.org/last-activity`, values of 1 MB,
   keep-until of the wrong type) change no decision (rule 11): verdicts are compared with and
   without them, for every shared scenario and on the real API server.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from support.faulty import FaultyServer
from support.passes import Passes

from kf_culler.config import load_mapping
from kf_culler.decide import decide
from kf_culler.gather import url_for
from kf_culler.local import objects as obj
from kf_culler.model import (
    EXEMPT_ANNOTATION,
    KEEP_UNTIL_ANNOTATION,
    LAST_ACTIVITY_ANNOTATION,
    PREFIX,
    SERVER_TYPE_ANNOTATION,
    STOP_ANNOTATION,
    Verdict,
)
from kf_culler.runner import build_runner
from kf_culler.scenario import verdict_for_document

ROOT = Path(__file__).resolve().parents[1]
SCENARIO_DIRS = [ROOT.parent / "shared" / "scenarios", ROOT / "tests" / "scenarios"]
SCENARIOS = sorted({p.name: p for d in SCENARIO_DIRS if d.is_dir() for p in d.glob("*.json")}.values())
MB = "x" * (1 << 20)
API_MAX = "y" * 200_000  # the API server refuses more than 256 KiB of annotations in all
NO_TRACK = "?no_track_activity=1"


@pytest.fixture(scope="module")
def home() -> Iterator[FaultyServer]:
    """Answers every probe with a Jupyter/code-server that has been idle for an hour; records requests."""
    with FaultyServer() as server:
        yield server


@pytest.fixture(scope="module")
def attacker() -> Iterator[FaultyServer]:
    """Where the hostile annotations point: it must never hear from the culler."""
    with FaultyServer() as server:
        yield server


def hostile_annotations(attacker: FaultyServer) -> dict[str, str]:
    evil = f"127.0.0.1:{attacker.port}"
    return {
        "notebooks.kubeflow.org/http-rewrite-uri": f"http://{evil}/steal",
        "notebooks.kubeflow.org/http-headers-request-set": '{"Authorization": "Bearer stolen", "Host": "evil"}',
        PREFIX + "url": f"http://{evil}/",
        PREFIX + "probe-url": f"http://user:pass@{evil}/notebook/",
        PREFIX + "host": evil,
        PREFIX + "port": str(attacker.port),
        PREFIX + "path": "/../../admin?token=x#",
        PREFIX + "base-url": f"http://{evil}/notebook/team/nb/",
        "prometheus.io/port": str(attacker.port),
        "prometheus.io/path": "/metrics",
        LAST_ACTIVITY_ANNOTATION: "2999-01-01T00:00:00Z",  # forged: "I was just used"
        PREFIX + "idle-since": "2999-01-01T00:00:00Z",
        PREFIX + "state": "active",
        "example.com/huge": API_MAX,
    }


def running_pod(api: Any, namespace: str, notebook: str, started: datetime) -> None:
    """`<name>-0`, Running since `started`, with a container name that is valid for any notebook name."""
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    from kf_culler.kube import POD_LABEL
    from kf_culler.local import objects
    from kf_culler.timeutil import format_time

    core = client.CoreV1Api(api)
    try:
        owner = objects.pod_owner(objects.notebook_statefulset(api, namespace, notebook))
    except ApiException as err:  # a name no StatefulSet may have (dots): such a notebook never runs in Kubeflow
        assert err.status == 422
        owner = []
    core.create_namespaced_pod(namespace, {
        "metadata": {"name": f"{notebook}-0", "labels": {POD_LABEL: notebook}, "ownerReferences": owner},
        "spec": {"containers": [{"name": "main", "image": "notebook:local"}]}})
    core.patch_namespaced_pod_status(f"{notebook}-0", namespace, {"status": {
        "phase": "Running", "startTime": format_time(started)}})


# -- 1. probe URLs ------------------------------------------------------------------------------------------------

@pytest.mark.cluster
def test_annotations_never_redirect_a_probe(api: Any, namespace: str, home: FaultyServer,
                                            attacker: FaultyServer) -> None:
    ns = namespace
    hostile = hostile_annotations(attacker)
    started = datetime.now(UTC) - timedelta(hours=1)
    fleet = {
        "jup-hostile": ("jupyter", hostile),
        "jup-twin": ("jupyter", {}),
        "cs-hostile": ("group-one", hostile),
        "cs-twin": ("group-one", {}),
        # The server type itself a URL: an unknown type is probed as Jupyter, at the admin's URL (rule 16).
        "type-url": (f"http://user:pass@127.0.0.1:{attacker.port}/", {}),
    }
    for name, (server_type, ann) in fleet.items():
        obj.create_notebook(api, ns, obj.notebook(name, server_type=server_type, annotations=ann))
        obj.running_pod(api, ns, name, started)
    # A notebook name may hold dots (Kubernetes allows DNS subdomains for custom objects): it would
    # change the host of the default template, so it never reaches a URL.
    dotted_name = f"nb.127.0.0.1.{attacker.port}"
    dotted_nb = obj.notebook(dotted_name)
    dotted_nb["spec"]["template"]["spec"]["containers"][0]["name"] = "main"  # container names have no dots
    obj.create_notebook(api, ns, dotted_nb)
    running_pod(api, ns, dotted_name, started)

    settings = load_mapping({
        "namespaces": {"include": [ns]}, "idleMinutes": 30, "warnMinutes": 0, "startupGraceMinutes": 0,
        "urls": {"jupyter": home.base + "/notebook/{namespace}/{name}/",
                 "codeServer": home.base + "/cs/{namespace}/{name}/"},
        "probe": {"timeoutSeconds": 5}}, "test")
    before = len(home.seen)
    runner = Passes(build_runner(settings, api))
    runner.start_cache(30)
    assert runner.cache is not None
    try:
        result = runner.once()
    finally:
        runner.cache.close()
    seen = home.seen[before:]
    by_target: dict[str, list[Any]] = {}
    for s in seen:
        by_target.setdefault(s.target, []).append(s)

    expected = {
        *(f"/notebook/{ns}/{name}/api/{part}{NO_TRACK}" for name in ("jup-hostile", "jup-twin", "type-url")
          for part in ("status", "kernels", "terminals")),
        *(f"/cs/{ns}/{name}/healthz" for name in ("cs-hostile", "cs-twin")),
    }
    assert set(by_target) == expected, sorted(set(by_target) ^ expected)
    assert all(len(v) == 1 for v in by_target.values())  # one GET each: nothing failed, nothing retried
    for s in seen:
        assert s.method == "GET"
        assert s.headers.get("host") == f"127.0.0.1:{home.port}"
        assert "authorization" not in s.headers and "cookie" not in s.headers
    assert attacker.seen == [], attacker.seen

    by_name = {r.name: r for r in result.results}
    for kind in ("jup", "cs"):
        hostile_v, twin_v = by_name[f"{kind}-hostile"].verdict, by_name[f"{kind}-twin"].verdict
        assert hostile_v.to_dict() == twin_v.to_dict()  # rule 11: the forged annotations changed nothing
        assert hostile_v.action == "stop"  # idle an hour, limit 30 min, "last-activity" says otherwise
    typed = by_name["type-url"]
    assert [c.url.split("?")[0].rsplit("/", 2)[-2:] for c in typed.calls] == [
        ["api", "status"], ["api", "kernels"], ["api", "terminals"]]
    assert (typed.verdict.action, typed.verdict.state) == ("stop", "idle")
    assert "probed as Jupyter" in typed.verdict.reason and "user:pass" in typed.verdict.reason  # named, cut short
    # A dotted name cannot be a StatefulSet's: no pod of its own, so it is not probed at all.
    dotted = by_name[dotted_name]
    assert dotted.calls == [] and dotted.observations == {}
    assert (dotted.verdict.action, dotted.verdict.state) == ("keep", "starting")

    # What the culler wrote back is the real idle time, not the forged one.
    for kind in ("jup", "cs"):
        h = obj.get_notebook(api, ns, f"{kind}-hostile")["metadata"]["annotations"]
        t = obj.get_notebook(api, ns, f"{kind}-twin")["metadata"]["annotations"]
        assert h[LAST_ACTIVITY_ANNOTATION] == t[LAST_ACTIVITY_ANNOTATION] != "2999-01-01T00:00:00Z"
        assert h["example.com/huge"] == API_MAX  # a user's annotation is left as it was


@pytest.mark.cluster
def test_the_api_server_bounds_annotation_size(api: Any, namespace: str) -> None:
    """Why the API test above uses 200 KB: a 1 MB annotation never reaches the culler from a real
    cluster (the 1 MB cases are decided in memory below)."""
    from kubernetes.client.rest import ApiException

    with pytest.raises(ApiException) as err:
        obj.create_notebook(api, namespace, obj.notebook("nb-mb", annotations={"example.com/huge": MB}))
    assert err.value.status == 422


@pytest.mark.parametrize("template", [
    "http://{name}.{namespace}.svc.{clusterDomain}/notebook/{namespace}/{name}/",
    "http://{name}.{namespace}.svc.{clusterDomain}/",
    "http://127.0.0.1:8080/notebook/{namespace}/{name}/",
])
@pytest.mark.parametrize("namespace,name", [
    ("team-a", "evil.example.com"), ("team-a", "a:b@c"), ("team-a", "nb/../../x"), ("team-a", "nb?x=1"),
    ("team-a", "nb#frag"), ("team-a", "NB"), ("team-a", "nb%2f"), ("team-a", "x" * 64), ("team-a", ""),
    ("team-a", "nb\r\nHost: evil"), ("evil.example.com", "nb"), ("ns/..", "nb"), ("team-a", "{namespace}"),
    ("team-a", "nb-ÿ"), ("team-a", "-nb"), ("team-a", "nb-"),
])
def test_names_that_are_not_dns_labels_never_reach_a_url(template: str, namespace: str, name: str) -> None:
    assert url_for(template, namespace, name, "cluster.local") is None


def test_a_dns_label_fills_only_its_place() -> None:
    url = url_for("http://{name}.{namespace}.svc.{clusterDomain}/notebook/{namespace}/{name}/",
                  "team-a", "nb-1", "cluster.local")
    assert url == "http://nb-1.team-a.svc.cluster.local/notebook/team-a/nb-1/"


# -- 2. absurd annotation values change no decision ------------------------------------------------------------

def absurd_annotations() -> list[tuple[str, Any]]:
    """(key, value) pairs a user may write that must not move a decision."""
    times = ["2999-01-01T00:00:00Z", "1970-01-01T00:00:00Z", "0001-01-01T00:00:00Z", "9999-12-31T23:59:59Z",
             "now", "", "2026-11-29T11:59:59.999999+14:00"]
    values: list[Any] = [*times, MB, 12345, None, [], {}]
    out: list[tuple[str, Any]] = [(LAST_ACTIVITY_ANNOTATION, v) for v in values]
    out += [("notebooks.kubeflow.org/last_activity_check_timestamp", v) for v in (times[0], MB)]
    for key in ("state", "reason", "idle-since", "warned-at", "stopped-at", "trace-id", "url", "last-activity"):
        out += [(PREFIX + key, v) for v in (times[0], MB, "active", 7)]
    out += [("example.com/huge", MB), ("x" * 253, MB), ("", "")]
    return out


def wrong_keep_until() -> list[Any]:
    return [12345, 1.5, True, None, [], {"until": "2999-01-01T00:00:00Z"}, ["2999-01-01T00:00:00Z"], "",
            "tomorrow", "2999-01-01", "2999-01-01T00:00:00", MB, "2999-01-01T00:00:00Z" + " " * 100]


def scenario_docs() -> list[tuple[str, dict[str, Any]]]:
    return [(p.name, json.loads(p.read_text())) for p in SCENARIOS]


def with_annotation(doc: dict[str, Any], key: str | None, value: Any = None,
                    drop: tuple[str, ...] = ()) -> dict[str, Any]:
    """A copy of the scenario with annotation `key` set to `value` (none when key is None), `drop` removed."""
    out = copy.deepcopy(doc)
    meta = out["notebook"].setdefault("metadata", {})
    ann = {k: v for k, v in (meta.get("annotations") or {}).items() if k not in drop}
    if key is not None:
        ann[key] = value
    meta["annotations"] = ann
    return out


def decision(v: Verdict) -> tuple[Any, ...]:
    """What a verdict decides (not how its sentence reads)."""
    return v.action, v.state, v.rule_id, v.idle_since, v.stop_at, v.warn_at


def test_the_shared_scenarios_are_here() -> None:
    names = {n for n, _ in scenario_docs()}
    assert len(names) >= 12, names


@pytest.mark.parametrize("scenario", [n for n, _ in scenario_docs()])
def test_absurd_annotations_change_no_verdict(scenario: str) -> None:
    doc = dict(scenario_docs())[scenario]
    base = verdict_for_document(doc)
    for key, value in absurd_annotations():
        got = verdict_for_document(with_annotation(doc, key, value))
        assert got == base, (scenario, key, str(value)[:40], got.to_dict(), base.to_dict())


@pytest.mark.parametrize("scenario", [n for n, _ in scenario_docs()])
def test_keep_until_of_the_wrong_type_changes_no_decision(scenario: str) -> None:
    """An unreadable extension request is ignored (the reason says so); the decision is the one made
    without any request."""
    doc = dict(scenario_docs())[scenario]
    base = verdict_for_document(with_annotation(doc, None, drop=(KEEP_UNTIL_ANNOTATION,)))
    for value in wrong_keep_until():
        got = verdict_for_document(with_annotation(doc, KEEP_UNTIL_ANNOTATION, value))
        assert decision(got) == decision(base), (scenario, str(value)[:40], got.to_dict(), base.to_dict())
        if got.rule_id == "10-idle" and value is not None:
            assert "was ignored" in got.reason, got.reason


def test_every_absurd_value_at_once() -> None:
    """All of them together, on an idle notebook that is due to stop and on one that is not."""
    policy = load_mapping({"idleMinutes": 60, "warnMinutes": 10, "maxExtendMinutes": 120}, "test").policy
    now = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
    pod = {"metadata": {"name": "nb-0"}, "status": {"phase": "Running", "startTime": "2026-11-29T00:00:00Z"}}
    for idle_minutes, action in ((90, "stop"), (55, "warn"), (20, "keep")):
        last = (now - timedelta(minutes=idle_minutes)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        obs = {"jupyter": {"status": {"last_activity": last, "connections": 0}, "kernels": [], "terminals": []}}
        clean: dict[str, Any] = {"metadata": {"name": "nb", "namespace": "team-a",
                              "annotations": {SERVER_TYPE_ANNOTATION: "jupyter"}}}
        dirty = copy.deepcopy(clean)
        dirty["metadata"]["annotations"].update({k or "k": v for k, v in absurd_annotations()})
        dirty["metadata"]["annotations"][KEEP_UNTIL_ANNOTATION] = {"until": "2999-01-01T00:00:00Z"}
        base = decide(clean, pod, obs, policy, now)
        got = decide(dirty, pod, obs, policy, now)
        assert base.action == action and decision(got) == decision(base), (got.to_dict(), base.to_dict())


def test_annotations_that_do_decide_are_the_documented_ones() -> None:
    """The control for the tests above: the keys that may change a verdict (stop, exempt, keep-until,
    server type) do change it, so an unchanged verdict is a real finding."""
    doc = dict(scenario_docs())["01-jupyter-idle-kernel.json"]
    base = verdict_for_document(doc)
    assert base.action == "stop"
    for key, value in ((STOP_ANNOTATION, "lock"), (EXEMPT_ANNOTATION, "true")):
        assert verdict_for_document(with_annotation(doc, key, value)).action == "keep", key
    # The server type picks the source read: code-server is not asked here, so the IDE gives no signal (and
    # the GPU idle for 4 h is stopped by rule 16, not for idleness)
    typed = verdict_for_document(with_annotation(doc, SERVER_TYPE_ANNOTATION, "group-one"))
    assert (typed.state, typed.rule_id) == ("no-signal", "16-no-signal-gpu-idle")
    cfg_doc = copy.deepcopy(doc)
    cfg_doc["config"]["maxExtendMinutes"] = 600
    until = verdict_for_document(with_annotation(cfg_doc, KEEP_UNTIL_ANNOTATION, "2999-01-01T00:00:00Z"))
    assert until.action != "stop"


# -- 3. one notebook's bad input costs only that notebook -----------------------------------------------------

def test_a_notebook_that_breaks_deciding_costs_only_itself(home: FaultyServer, monkeypatch: Any) -> None:
    """Whatever makes one notebook's decision fail (a bug, an input no rule expected), the pass goes on
    and the other notebooks are decided and planned as usual."""
    import kf_culler.cycle as cycle_module
    from kf_culler.cycle import Cycle
    from kf_culler.session import SessionView

    started = (datetime.now(UTC) - timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
    items: list[tuple[dict[str, Any], dict[str, Any] | None]] = []
    for name in ("nb-a", "nb-breaks", "nb-c"):
        nb = obj.notebook(name)
        nb["metadata"]["namespace"] = "team-a"
        items.append((nb, {"metadata": {"name": f"{name}-0"}, "status": {"phase": "Running", "startTime": started}}))
    real = cycle_module.decide_view

    def fragile(view: SessionView, *args: Any) -> Verdict:
        if view.name == "nb-breaks":
            raise RuntimeError("a rule met an input it did not expect")
        return real(view, *args)

    monkeypatch.setattr(cycle_module, "decide_view", fragile)
    settings = load_mapping({"idleMinutes": 30, "warnMinutes": 0, "startupGraceMinutes": 0,
                             "urls": {"jupyter": home.base + "/notebook/{namespace}/{name}/"}}, "test")
    result = Cycle(settings).run(items)
    assert [r.name for r in result.results] == ["nb-a", "nb-c"]
    assert all(r.verdict.action == "stop" and r.plan is not None and not r.plan.empty for r in result.results)
