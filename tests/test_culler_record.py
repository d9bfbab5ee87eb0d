"""The culler's own record (rule 15) on the real API server: written before the stop it records, read by a
new culler process, imported once from the old marks, removed with its notebook, unreadable values skipped."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from kubernetes import client
from support.passes import Passes

from kf_culler.config import load_mapping
from kf_culler.kube.records import RECORDS_LABELS, bucket_names, bucket_of
from kf_culler.local import objects as obj
from kf_culler.local.jupyter import JupyterServer
from kf_culler.local.router import Router
from kf_culler.model import STOP_ANNOTATION, STOPPED_AT_ANNOTATION, STOPPED_BY_ANNOTATION, STOPPED_BY_VALUE
from kf_culler.runner import build_runner

pytestmark = pytest.mark.cluster


def stored(api: Any, culler_ns: str, uid: str) -> dict[str, Any] | None:
    try:
        cm = client.CoreV1Api(api).read_namespaced_config_map(bucket_of(uid), culler_ns)
    except client.ApiException as err:
        assert err.status == 404
        return None
    text = (cm.data or {}).get(uid)
    return None if text is None else dict(json.loads(text))


def culler(api: Any, namespace: str, culler_ns: str, router: Router) -> Passes:
    settings = load_mapping({"namespaces": {"include": [namespace]}, "idleMinutes": 0.05, "warnMinutes": 0,
                             "startupGraceMinutes": 0.5, "urls": {"jupyter": router.template()}}, "test")
    return Passes(build_runner(settings, api, records_namespace=culler_ns))


def test_a_stop_is_recorded_and_a_new_culler_honours_the_restart(api: Any, namespace: str) -> None:
    culler_ns = f"{namespace}-culler"
    obj.create_namespace(api, culler_ns)
    with Router() as router, JupyterServer(namespace, "nb") as server:
        router.add("notebook", namespace, "nb", f"http://127.0.0.1:{server.port}", strip=False)
        obj.create_notebook(api, namespace, obj.notebook("nb"))
        obj.running_pod(api, namespace, "nb", datetime.now(UTC) - timedelta(hours=2))
        uid = obj.get_notebook(api, namespace, "nb")["metadata"]["uid"]
        time.sleep(1)
        with culler(api, namespace, culler_ns, router) as first:
            deadline = time.monotonic() + 30  # the fresh server's own start is activity: 3 s idle to go
            while (r := first.once().results[0]).verdict.action != "stop" and time.monotonic() < deadline:
                time.sleep(1)
        assert r.verdict.action == "stop" and r.write is not None and r.write.outcome == "patched"
        record = stored(api, culler_ns, uid)
        assert record is not None and record["namespace"] == namespace and "name" not in record
        assert "stoppedAt" in record and "restartedAt" not in record
        cm = client.CoreV1Api(api).read_namespaced_config_map(bucket_of(uid), culler_ns)
        assert cm.metadata.labels == {**cm.metadata.labels, **RECORDS_LABELS}

        obj.patch_annotations(api, namespace, "nb", {STOP_ANNOTATION: None})  # Start, as the web app does
        time.sleep(1)
        # A new culler (a restart, a new leader): the old pod still runs and is idle for hours.
        with culler(api, namespace, culler_ns, router) as second:
            again = [second.once().results[0] for _ in range(3)]
    assert [v.verdict.rule_id for v in again] == ["3-restarted", "3-starting", "3-starting"], [v.verdict for v in again]
    record = stored(api, culler_ns, uid)
    assert record is not None and record["restartedAt"] >= record["stoppedAt"]


def test_old_marks_are_imported_once_and_only_from_a_stopped_notebook(api: Any, namespace: str) -> None:
    culler_ns = f"{namespace}-culler"
    obj.create_namespace(api, culler_ns)
    marks = {STOPPED_BY_ANNOTATION: STOPPED_BY_VALUE, STOPPED_AT_ANNOTATION: "2026-11-01T10:00:00Z"}
    obj.create_notebook(api, namespace, obj.notebook("stopped", annotations={**marks, STOP_ANNOTATION: "x"}))
    obj.create_notebook(api, namespace, obj.notebook("running", annotations=marks))
    obj.running_pod(api, namespace, "running", datetime.now(UTC) - timedelta(hours=2))
    uids = {n: obj.get_notebook(api, namespace, n)["metadata"]["uid"] for n in ("stopped", "running")}
    time.sleep(1)
    with Router() as router, culler(api, namespace, culler_ns, router) as runner:
        runner.once()
    assert stored(api, culler_ns, uids["stopped"]) == {"namespace": namespace, "stoppedAt": "2026-11-01T10:00:00Z"}
    running = stored(api, culler_ns, uids["running"])
    assert running is not None and "stoppedAt" not in running  # the marks of a running notebook mean nothing
    assert "runningSince" in running


def test_a_record_goes_with_its_notebook_and_a_bad_value_is_skipped(api: Any, namespace: str) -> None:
    culler_ns = f"{namespace}-culler"
    obj.create_namespace(api, culler_ns)
    obj.create_notebook(api, namespace, obj.notebook("nb"))
    obj.running_pod(api, namespace, "nb", datetime.now(UTC) - timedelta(hours=2))
    uid = obj.get_notebook(api, namespace, "nb")["metadata"]["uid"]
    core = client.CoreV1Api(api)
    # an admin's hand edit of a bucket: not JSON, and not a record
    bad = bucket_names()[0] if bucket_of(uid) != bucket_names()[0] else bucket_names()[1]
    core.create_namespaced_config_map(culler_ns, {"metadata": {"name": bad, "labels": RECORDS_LABELS},
                                                  "data": {"x": "not json", "y": json.dumps({"name": "a"})}})
    time.sleep(1)
    with Router() as router, culler(api, namespace, culler_ns, router) as runner:
        runner.once()
        assert stored(api, culler_ns, uid) is not None
        client.CustomObjectsApi(api).delete_namespaced_custom_object("kubeflow.org", "v1", namespace, "notebooks",
                                                                     "nb")
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and runner.cache is not None and any(
                nb["metadata"]["uid"] == uid for nb, _ in runner.cache.snapshot()):
            time.sleep(0.2)
        runner.once()
    assert stored(api, culler_ns, uid) is None
    kept = core.read_namespaced_config_map(bad, culler_ns).data
    assert {k: v for k, v in kept.items() if not k.startswith("imported-")} == {"x": "not json",
                                                                               "y": json.dumps({"name": "a"})}
