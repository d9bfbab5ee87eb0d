"""Admins stay in control: the lifetime cap (rule 13), broken GPU notebooks (rule 14) and long-stopped
notebooks (`check`, kf_culler_long_stopped_notebooks). Pure parts first, then on the real API server."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from support.passes import Passes
from test_e2e_cull import router, servers, settings_for, wait_cache  # noqa: F401 (fixtures)

from kf_culler import cli
from kf_culler.config import load_mapping
from kf_culler.local import objects as obj
from kf_culler.local.jupyter import JupyterServer
from kf_culler.local.router import Router
from kf_culler.metrics import Metrics
from kf_culler.model import (
    REASON_ANNOTATION,
    STATE_ANNOTATION,
    STOP_ANNOTATION,
    STOPPED_AT_ANNOTATION,
    WARNED_AT_ANNOTATION,
)
from kf_culler.plan import EVENT_STOP, EVENT_WARN
from kf_culler.runner import build_runner
from kf_culler.service import instrument
from kf_culler.session import pod_trouble
from kf_culler.stopped import long_stopped, stopped_since
from kf_culler.targets.fields import pod_fields as _slim_pod
from kf_culler.timeutil import format_time

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)


def _nb(name: str, ann: dict[str, str], gpus: int = 0, claims: tuple[str, ...] = ()) -> dict[str, Any]:
    body = obj.notebook(name, gpus=gpus, annotations=ann)
    body["metadata"]["namespace"] = "team-a"
    body["spec"]["template"]["spec"]["volumes"] = [
        {"name": c, "persistentVolumeClaim": {"claimName": c}} for c in claims]
    return body


def test_stop_time_is_the_stop_annotation_timestamp_else_ours() -> None:
    assert stopped_since(_nb("a", {STOP_ANNOTATION: "2026-10-01T00:00:00Z"})) == datetime(2026, 10, 1, tzinfo=UTC)
    assert stopped_since(_nb("b", {STOP_ANNOTATION: "odh-lock", STOPPED_AT_ANNOTATION: "2026-10-02T00:00:00Z"})) \
        == datetime(2026, 10, 2, tzinfo=UTC)
    assert stopped_since(_nb("c", {STOP_ANNOTATION: "odh-lock"})) is None
    assert stopped_since(_nb("d", {STOPPED_AT_ANNOTATION: "2026-10-02T00:00:00Z"})) is None  # running again


def test_long_stopped_lists_past_the_limit_with_gpus_and_volumes() -> None:
    items = [_nb("old-gpu", {STOP_ANNOTATION: "2026-10-01T00:00:00Z"}, gpus=2, claims=("home", "data")),
             _nb("old-cpu", {STOP_ANNOTATION: "x", STOPPED_AT_ANNOTATION: "2026-10-20T00:00:00Z"}),
             _nb("recent", {STOP_ANNOTATION: "2026-11-20T00:00:00Z"}, gpus=1),
             _nb("running", {})]
    found = long_stopped(items, NOW, 30, lambda _nb: ("nvidia.com/gpu",))
    assert [(s.name, s.gpus, s.volumes) for s in found] == [("old-gpu", 2, ("home", "data")), ("old-cpu", 0, ())]
    assert found[0].days == 59.5
    metrics = Metrics()
    metrics.observe_long_stopped(found)
    text = metrics.render().decode()
    assert 'kf_culler_long_stopped_notebooks{gpu="true"} 1.0' in text
    assert 'kf_culler_long_stopped_notebooks{gpu="false"} 1.0' in text


def test_the_slim_cache_keeps_what_rule_14_reads() -> None:
    pod = {"metadata": {"name": "nb-0", "managedFields": [{}]}, "spec": {"containers": [{"name": "nb", "env": []}]},
           "status": {"phase": "Running", "startTime": "2026-11-29T04:00:00Z",
                      "conditions": [{"type": "Ready", "status": "False", "reason": "ContainersNotReady",
                                      "lastTransitionTime": "2026-11-29T11:00:00Z"},
                                     {"type": "PodScheduled", "status": "True"}],
                      "containerStatuses": [{"name": "nb", "restartCount": 4, "image": "x", "imageID": "y",
                                             "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "m"}},
                                             "lastState": {"terminated": {"exitCode": 1, "startedAt": "s",
                                                                          "finishedAt": "2026-11-29T10:30:00Z"}}}]}}
    slim = _slim_pod(json.loads(json.dumps(pod)))
    assert slim["status"]["conditions"] == [{"type": "Ready", "status": "False",
                                             "lastTransitionTime": "2026-11-29T11:00:00Z"}]
    assert slim["status"]["containerStatuses"] == [{
        "name": "nb", "restartCount": 4, "state": {"waiting": {"reason": "CrashLoopBackOff"}},
        "lastState": {"terminated": {"finishedAt": "2026-11-29T10:30:00Z", "exitCode": 1}}}]
    assert pod_trouble(slim) == pod_trouble(pod)
    trouble = pod_trouble(slim)
    assert trouble is not None and trouble.since == datetime(2026, 11, 29, 10, 30, tzinfo=UTC)


# -- on the real API server -------------------------------------------------------------------------------

@pytest.mark.cluster
def test_lifetime_cap_warns_then_stops_an_active_notebook(api: Any, namespace: str, router: Router,  # noqa: F811
                                                          servers: dict[str, JupyterServer]) -> None:  # noqa: F811
    """A kernel running code on a real Jupyter server; maxRunningMinutes 120 with a 30-minute warning; passes at
    injected times: kept (active) at 60 min, warned at 100 (one Event), stopped at 121, state active."""
    started = datetime.now(UTC).replace(microsecond=0) - timedelta(hours=1)
    obj.create_notebook(api, namespace, obj.notebook("nb-busy"))
    obj.running_pod(api, namespace, "nb-busy", started)
    now = [started + timedelta(minutes=60)]
    runner = Passes(build_runner(settings_for(router, namespace, idleMinutes=600, warnMinutes=30,
                                              maxRunningMinutes=120), api, clock=lambda: now[0]))
    verdicts = []
    with runner:
        for minutes in (60, 100, 121):
            now[0] = started + timedelta(minutes=minutes)
            verdicts.append(next(r for r in runner.once().results if r.name == "nb-busy").verdict)
            if minutes == 100:
                ann = obj.get_notebook(api, namespace, "nb-busy")["metadata"]["annotations"]
                assert WARNED_AT_ANNOTATION in ann and STOP_ANNOTATION not in ann
                assert [e.reason for e in obj.events_for(api, namespace, "nb-busy")] == [EVENT_WARN]
    assert [(v.action, v.state, v.rule_id) for v in verdicts] == [
        ("keep", "active", "5-positive-evidence"), ("warn", "active", "13-lifetime-cap"),
        ("stop", "active", "13-lifetime-cap")], [v.reason for v in verdicts]
    assert "lifetime cap" in verdicts[1].reason and "2 h" in verdicts[1].reason
    ann = obj.get_notebook(api, namespace, "nb-busy")["metadata"]["annotations"]
    assert ann[STOP_ANNOTATION] == format_time(now[0]) and ann[STATE_ANNOTATION] == "active"
    assert "lifetime cap" in ann[REASON_ANNOTATION] and "2 h 1 min" in ann[REASON_ANNOTATION]
    events = {e.reason: e for e in obj.events_for(api, namespace, "nb-busy")}  # same second: no order to check
    assert set(events) == {EVENT_WARN, EVENT_STOP} and "lifetime cap" in events[EVENT_STOP].message


@pytest.mark.cluster
def test_gpu_pod_running_but_not_ready_is_broken_reported_then_stopped(api: Any, namespace: str,
                                                                       router: Router) -> None:  # noqa: F811
    """A GPU pod Running but not Ready for 20 minutes (set through the status subresource), brokenMinutes 10:
    the pass reports it (state broken, a warning Event, kf_culler_notebooks{state="broken"}), and with
    brokenAction stop the next pass stops it."""
    from kubernetes import client

    obj.create_notebook(api, namespace, obj.notebook("nb-gpu", gpus=1))
    obj.running_pod(api, namespace, "nb-gpu", datetime.now(UTC) - timedelta(hours=2), gpus=1)
    since = format_time(datetime.now(UTC) - timedelta(minutes=20))
    client.CoreV1Api(api).patch_namespaced_pod_status("nb-gpu-0", namespace, {"status": {"conditions": [
        {"type": "Ready", "status": "False", "reason": "ContainersNotReady", "lastTransitionTime": since}]}})
    metrics = Metrics()
    runner = Passes(build_runner(settings_for(router, namespace, brokenMinutes=10), api))
    runner.runner = instrument(runner.runner, metrics)
    with runner:
        wait_cache(runner, namespace, "nb-gpu", lambda nb, pod: pod is not None and any(
            c.get("status") == "False" for c in pod["status"].get("conditions", [])))
        reported = runner.once().results[0].verdict
    assert (reported.action, reported.state, reported.rule_id) == ("warn", "broken", "14-broken"), reported.reason
    assert "not Ready" in reported.reason and "1 GPU" in reported.reason
    assert 'kf_culler_notebooks{state="broken"} 1.0' in metrics.render().decode()
    ann = obj.get_notebook(api, namespace, "nb-gpu")["metadata"]["annotations"]
    assert ann[STATE_ANNOTATION] == "broken" and STOP_ANNOTATION not in ann
    assert [e.reason for e in obj.events_for(api, namespace, "nb-gpu")] == [EVENT_WARN]

    runner = Passes(build_runner(settings_for(router, namespace, brokenMinutes=10, brokenAction="stop"), api))
    with runner:
        stopped = runner.once().results[0].verdict
    assert (stopped.action, stopped.state, stopped.rule_id) == ("stop", "broken", "14-broken"), stopped.reason
    ann = obj.get_notebook(api, namespace, "nb-gpu")["metadata"]["annotations"]
    assert STOP_ANNOTATION in ann and ann[STATE_ANNOTATION] == "broken"
    # Events carry second-resolution times: two in the same second have no order to check
    assert sorted(e.reason for e in obj.events_for(api, namespace, "nb-gpu")) == sorted([EVENT_WARN, EVENT_STOP])


@pytest.mark.cluster
def test_check_lists_long_stopped_notebooks_and_the_metric_counts_them(
        api: Any, namespace: str, kube: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    now = datetime.now(UTC)
    old = format_time(now - timedelta(days=40))
    for name, ann, gpus in (("nb-old-gpu", {STOP_ANNOTATION: old}, 1),
                            ("nb-old-lock", {STOP_ANNOTATION: "odh-notebook-controller-lock",
                                             STOPPED_AT_ANNOTATION: format_time(now - timedelta(days=35))}, 0),
                            ("nb-recent", {STOP_ANNOTATION: format_time(now - timedelta(days=2))}, 1)):
        body = obj.notebook(name, gpus=gpus, annotations=ann)
        body["spec"]["template"]["spec"]["volumes"] = [
            {"name": "home", "persistentVolumeClaim": {"claimName": f"{name}-home"}}]
        obj.create_notebook(api, namespace, body)
    cfg = tmp_path / "config.yaml"
    cfg.write_text(yaml.safe_dump({"namespaces": {"include": [namespace]}, "longStoppedDays": 30}))
    args = ["--kubeconfig", str(kube.kubeconfig), "--config", str(cfg)]
    assert cli.main(["check", *args]) == 0
    out = capsys.readouterr().out
    table, _, section = out.partition("Stopped for more than 30 days (2;")
    assert "nb-old-gpu" in table and section, out
    lines = {line.split()[1]: line.split() for line in section.splitlines()[2:] if line.strip()}
    assert set(lines) == {"nb-old-gpu", "nb-old-lock"}, out
    assert lines["nb-old-gpu"][2:] == ["1", old, "40", "nb-old-gpu-home"]
    assert lines["nb-old-lock"][2] == "0" and lines["nb-old-lock"][4] == "35"
    assert cli.main(["check", "-o", "json", *args]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [n["name"] for n in doc["longStopped"]["notebooks"]] == ["nb-old-gpu", "nb-old-lock"]


    metrics = Metrics()
    runner = Passes(build_runner(load_mapping({"namespaces": {"include": [namespace]}}, "test"), api))
    runner.runner = instrument(runner.runner, metrics)
    with runner:
        runner.once()
    text = metrics.render().decode()
    assert 'kf_culler_long_stopped_notebooks{gpu="true"} 1.0' in text
    assert 'kf_culler_long_stopped_notebooks{gpu="false"} 1.0' in text
    # nothing was deleted or changed
    assert {obj.get_notebook(api, namespace, n)["metadata"]["annotations"][STOP_ANNOTATION]
            for n in ("nb-old-gpu",)} == {old}
