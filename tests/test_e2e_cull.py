"""End to end on a real kube-apiserver, with real Jupyter servers behind the culler's URL template."""

from __future__ import annotations

import re
import time
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from support.passes import Passes

from kf_culler.config import Settings, load_mapping
from kf_culler.local import objects as obj
from kf_culler.local.jupyter import JupyterServer
from kf_culler.local.router import Router
from kf_culler.metrics import Metrics
from kf_culler.model import (
    LAST_ACTIVITY_ANNOTATION,
    REASON_ANNOTATION,
    RESTARTED_AT_ANNOTATION,
    STATE_ANNOTATION,
    STOP_ANNOTATION,
    STOPPED_BY_ANNOTATION,
    WARNED_AT_ANNOTATION,
)
from kf_culler.plan import EVENT_RESTART, EVENT_STOP, EVENT_WARN
from kf_culler.runner import build_runner, own_namespace
from kf_culler.service import instrument
from kf_culler.timeutil import format_time, parse_time

pytestmark = pytest.mark.cluster
RFC3339_UTC = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$")


@pytest.fixture(scope="module")
def router() -> Iterator[Router]:
    with Router() as r:
        yield r


def settings_for(router: Router, namespace: str, **extra: Any) -> Settings:
    return load_mapping({
        "namespaces": {"include": [namespace]},
        "idleMinutes": 0.05, "warnMinutes": 0, "startupGraceMinutes": 10,
        "urls": {"jupyter": router.template("notebook")},
        "probe": {"timeoutSeconds": 5}, "lastActivityStepMinutes": 10, **extra}, "test")


def wait_cache(runner: Passes, ns: str, name: str, pred: Any, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert runner.cache is not None
        for nb, pod in runner.cache.snapshot():
            if nb["metadata"]["namespace"] == ns and nb["metadata"]["name"] == name and pred(nb, pod):
                return
        time.sleep(0.1)
    raise AssertionError(f"the cache never showed the expected state of {ns}/{name}")


@pytest.fixture()
def servers(router: Router, namespace: str) -> Iterator[dict[str, JupyterServer]]:
    out: dict[str, JupyterServer] = {}
    try:
        for name in ("nb-busy", "nb-idle"):
            s = JupyterServer(namespace, name)
            s.start()
            out[name] = s
            router.add("notebook", namespace, name, f"http://127.0.0.1:{s.port}", strip=False)
        kid = out["nb-busy"].start_kernel()
        out["nb-busy"].execute(kid, "import time; time.sleep(600)")
        out["nb-idle"].start_kernel()
        yield out
    finally:
        for name, s in out.items():
            router.remove("notebook", namespace, name)
            s.stop()


def make(api: Any, ns: str, name: str, annotations: dict[str, str] | None = None) -> None:
    obj.create_notebook(api, ns, obj.notebook(name, annotations=annotations))
    obj.running_pod(api, ns, name, datetime.now(UTC) - timedelta(hours=1))


def test_idle_stopped_busy_kept_foreign_stop_untouched(api: Any, namespace: str, router: Router,
                                                       servers: dict[str, JupyterServer]) -> None:
    make(api, namespace, "nb-busy")
    make(api, namespace, "nb-idle")
    make(api, namespace, "nb-locked", {STOP_ANNOTATION: "odh-notebook-controller-lock"})
    time.sleep(3.5)  # the idle kernel passes the 3-second idle limit
    runner = Passes(build_runner(settings_for(router, namespace), api))
    with runner:
        result = runner.once()
        assert runner.cache is not None
        cached = {nb["metadata"]["name"]: nb for nb, _ in runner.cache.snapshot()}
    by_name = {r.name: r for r in result.results}
    assert by_name["nb-busy"].verdict.state == "active"
    assert by_name["nb-idle"].verdict.action == "stop", by_name["nb-idle"].verdict.reason
    # The patched notebook went to the cache as it was written (Cycle.on_written), not held by the result.
    write = by_name["nb-idle"].write
    assert write is not None and write.outcome == "patched" and write.notebook is None
    assert STOP_ANNOTATION in cached["nb-idle"]["metadata"]["annotations"]
    assert "managedFields" not in cached["nb-idle"]["metadata"]

    idle = obj.get_notebook(api, namespace, "nb-idle")["metadata"]["annotations"]
    assert RFC3339_UTC.match(idle[STOP_ANNOTATION])
    assert idle[STOPPED_BY_ANNOTATION] == "kf-culler" and idle[STATE_ANNOTATION] == "idle"
    assert "idle" in idle[REASON_ANNOTATION].lower()
    events = obj.events_for(api, namespace, "nb-idle")
    assert [e.reason for e in events] == [EVENT_STOP]
    assert events[0].message.startswith(idle[REASON_ANNOTATION][:60])

    busy = obj.get_notebook(api, namespace, "nb-busy")["metadata"]["annotations"]
    assert STOP_ANNOTATION not in busy
    assert not [e for e in obj.events_for(api, namespace, "nb-busy") if e.reason == EVENT_STOP]

    locked = obj.get_notebook(api, namespace, "nb-locked")["metadata"]["annotations"]
    assert locked[STOP_ANNOTATION] == "odh-notebook-controller-lock"
    assert not [k for k in locked if k.startswith("notebook-culler.io/")]
    assert obj.events_for(api, namespace, "nb-locked") == []


def test_dry_run_writes_nothing(api: Any, namespace: str, router: Router,
                                servers: dict[str, JupyterServer]) -> None:
    make(api, namespace, "nb-idle")
    before = obj.get_notebook(api, namespace, "nb-idle")["metadata"]
    time.sleep(3.5)
    runner = Passes(build_runner(settings_for(router, namespace, dryRun=True), api))
    with runner:
        result = runner.once()
    assert result.results[0].verdict.action == "stop" and result.results[0].write is None
    after = obj.get_notebook(api, namespace, "nb-idle")["metadata"]
    assert after["resourceVersion"] == before["resourceVersion"]
    assert obj.events_for(api, namespace, "nb-idle") == []


def test_concurrent_edit_is_not_lost(api: Any, namespace: str, router: Router,
                                     servers: dict[str, JupyterServer]) -> None:
    make(api, namespace, "nb-idle")
    time.sleep(3.5)
    runner = Passes(build_runner(settings_for(router, namespace), api))

    def other_writer(now: datetime, nb: dict[str, Any], pod: Any, observations: Any, context: Any) -> None:
        # Another controller edits the notebook after the culler read it and before it writes.
        obj.patch_annotations(api, namespace, nb["metadata"]["name"], {"team.example.com/owner": "kim"})

    runner.change(on_observed=other_writer)
    with runner:
        result = runner.once()
    write = result.results[0].write
    assert write is not None and write.outcome == "patched" and write.conflicts >= 1
    ann = obj.get_notebook(api, namespace, "nb-idle")["metadata"]["annotations"]
    assert ann["team.example.com/owner"] == "kim" and STOP_ANNOTATION in ann
    assert [e.reason for e in obj.events_for(api, namespace, "nb-idle")] == [EVENT_STOP]


def test_restart_clears_our_marks_and_restarts_the_grace(api: Any, namespace: str, router: Router,
                                                          servers: dict[str, JupyterServer]) -> None:
    make(api, namespace, "nb-idle")
    time.sleep(3.5)
    runner = Passes(build_runner(settings_for(router, namespace, warnMinutes=0), api))
    with runner:
        assert runner.once().results[0].verdict.action == "stop"
        # The notebook-controller scales to 0; the user starts it again from the web app.
        obj.delete_pod(api, namespace, "nb-idle-0")
        obj.patch_annotations(api, namespace, "nb-idle", {STOP_ANNOTATION: None})
        obj.running_pod(api, namespace, "nb-idle", datetime.now(UTC))
        wait_cache(runner, namespace, "nb-idle",
                   lambda nb, pod: STOP_ANNOTATION not in nb["metadata"]["annotations"] and pod is not None
                   and pod["status"].get("phase") == "Running")
        time.sleep(3.5)  # idle past the limit again, but inside the new start-up grace
        again = runner.once().results[0]
    assert (again.verdict.action, again.verdict.state) == ("keep", "starting")
    ann = obj.get_notebook(api, namespace, "nb-idle")["metadata"]["annotations"]
    assert STOP_ANNOTATION not in ann
    # Our stop marks are gone; only the time the restart was seen stays (the grace counts from it).
    assert [k for k in ann if k.startswith("notebook-culler.io/")] == [RESTARTED_AT_ANNOTATION]
    assert parse_time(ann[RESTARTED_AT_ANNOTATION]) is not None
    assert [e.reason for e in obj.events_for(api, namespace, "nb-idle")] == [EVENT_STOP, EVENT_RESTART]


def test_warn_then_stop(api: Any, namespace: str, router: Router, servers: dict[str, JupyterServer]) -> None:
    """Idle limit 10 min with a 5-minute warning, passes at chosen times: keep, warn (one Event), warn
    again (no second Event), stop. The clock is injected, so a slow machine cannot skip the window."""
    make(api, namespace, "nb-idle")
    now = [datetime.now(UTC)]
    runner = Passes(build_runner(settings_for(router, namespace, idleMinutes=10, warnMinutes=5), api,
                           clock=lambda: now[0]))
    with runner:
        first = runner.once().results[0].verdict
        assert (first.action, first.state, first.rule_id) == ("keep", "idle", "10-idle"), first.reason
        assert first.idle_since is not None  # the Jupyter server's own last activity, seconds ago
        verdicts = [first]
        for minutes in (6, 8, 11):  # inside the warning (5..10 min idle) twice, then past the limit
            now[0] = first.idle_since + timedelta(minutes=minutes)
            verdicts.append(runner.once().results[0].verdict)
            reasons = [e.reason for e in obj.events_for(api, namespace, "nb-idle")]
            ann = obj.get_notebook(api, namespace, "nb-idle")["metadata"]["annotations"]
            if minutes < 10:
                assert reasons == [EVENT_WARN], (minutes, reasons)
                assert WARNED_AT_ANNOTATION in ann and STOP_ANNOTATION not in ann, (minutes, ann)
    assert [(v.action, v.state) for v in verdicts] == [("keep", "idle"), ("warn", "idle"), ("warn", "idle"),
                                                       ("stop", "idle")], [v.reason for v in verdicts]
    assert reasons == [EVENT_WARN, EVENT_STOP]
    assert WARNED_AT_ANNOTATION not in ann
    assert ann[STOP_ANNOTATION] == format_time(now[0])  # the stop is stamped with the pass's own time


def test_steady_passes_cost_no_writes_when_idle_one_per_step_when_active(
        api: Any, namespace: str, router: Router, servers: dict[str, JupyterServer]) -> None:
    """31 passes a minute apart (injected clock) over an idle notebook far below its warning time and an
    active one (a kernel running code), lastActivityStepMinutes 10. Every write is counted where it leaves
    the client (a PATCH of the notebook) and cross-checked with the API server's resourceVersion and the
    kf_culler_api_writes_total metric: the idle notebook costs its first pass's write and nothing after;
    the active one a write each time its activity has moved by the step (minutes 0, 10, 20, 30)."""
    make(api, namespace, "nb-idle")
    make(api, namespace, "nb-busy")
    patches: Counter[str] = Counter()
    other_writes: list[tuple[str, str]] = []
    real_request = api.rest_client.request  # every call the client makes goes through it

    record_writes: list[int] = []  # the pass of each write of the culler's own record (rule 15)

    def counting_request(method: str, url: str, *args: Any, **kwargs: Any) -> Any:
        if method != "GET":
            notebook = re.search(r"/notebooks/([^/?]+)", url)
            if method == "PATCH" and notebook:
                patches[notebook.group(1)] += 1
            elif "/configmaps" in url and f"/namespaces/{own_namespace()}/" in url:
                record_writes.append(len(per_pass))
            else:
                other_writes.append((method, url))
        return real_request(method, url, *args, **kwargs)

    api.rest_client.request = counting_request
    start = datetime.now(UTC)
    now = [start]
    runner = Passes(build_runner(settings_for(router, namespace, idleMinutes=600, warnMinutes=60,
                                        lastActivityStepMinutes=10), api, clock=lambda: now[0]))
    metrics = Metrics()
    runner.runner = instrument(runner.runner, metrics)
    versions: dict[str, list[str]] = {"nb-idle": [], "nb-busy": []}
    per_pass: list[dict[str, int]] = []
    with runner:
        for minute in range(31):
            now[0] = start + timedelta(minutes=minute)
            before = dict(patches)
            results = {r.name: r for r in runner.once().results}
            assert (results["nb-idle"].verdict.action, results["nb-idle"].verdict.state) == ("keep", "idle")
            assert (results["nb-busy"].verdict.action, results["nb-busy"].verdict.state) == ("keep", "active")
            per_pass.append({n: patches[n] - before.get(n, 0) for n in versions})
            for name in versions:
                versions[name].append(obj.get_notebook(api, namespace, name)["metadata"]["resourceVersion"])

    assert [p["nb-idle"] for p in per_pass] == [1] + [0] * 30
    busy_minutes = [m for m, p in enumerate(per_pass) if p["nb-busy"]]
    assert busy_minutes == [0, 10, 20, 30]
    assert all(p["nb-busy"] <= 1 for p in per_pass)
    # The API server saw exactly those writes: the object changed at those passes and at no other.
    for name in versions:
        changed = [m for m in range(1, 31) if versions[name][m] != versions[name][m - 1]]
        assert changed == [m for m in range(1, 31) if per_pass[m][name]], (name, changed)
    assert other_writes == []  # no Event, no other object written while nothing is due
    # The culler's record: each notebook's runningSince, once, in the first pass (one patch per record bucket,
    # and the bucket's creation when it did not exist yet), nothing after.
    assert record_writes and set(record_writes) == {0}
    assert metrics.registry.get_sample_value("kf_culler_api_writes_total", {"kind": "patch"}) == sum(patches.values())
    assert metrics.registry.get_sample_value("kf_culler_api_writes_total", {"kind": "event"}) is None
    busy = obj.get_notebook(api, namespace, "nb-busy")["metadata"]["annotations"]
    assert busy[LAST_ACTIVITY_ANNOTATION] == format_time(start + timedelta(minutes=30))
