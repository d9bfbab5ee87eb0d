"""Probes reach only the notebook's own pod: a probe through the notebook's Service goes out only when that
Service is the one Kubeflow's notebook-controller made for this Notebook (controlled by it, ClusterIP,
selecting `statefulset: <name>`). A user can edit their Services: an ExternalName or a selector-less
Service (Endpoints of their choosing) would point the probe at another host, whose answer would be taken
for the notebook's (another user's heartbeat, an internal service's status: a port-scan oracle)."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from kubernetes import client
from support.passes import Passes

from kf_culler.config import load_mapping
from kf_culler.local import objects as obj
from kf_culler.runner import build_runner
from kf_culler.targets.pairing import service_problem


def _nb(name: str = "nb", uid: str = "u1") -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "ns", "uid": uid}}


def _svc(spec: dict[str, Any], owner_uid: str = "u1", kind: str = "Notebook") -> dict[str, Any]:
    return {"metadata": {"name": "nb", "namespace": "ns",
                         "ownerReferences": [{"kind": kind, "name": "nb", "uid": owner_uid, "controller": True}]},
            "spec": spec}


@pytest.mark.parametrize("service,why", [
    (_svc({"selector": {"statefulset": "nb"}}), None),
    (_svc({"type": "ClusterIP", "selector": {"statefulset": "nb"}}), None),
    (None, "no Service"),
    (_svc({"type": "ExternalName", "selector": {"statefulset": "nb"}}), "of type ExternalName"),
    (_svc({}), "does not select"),
    (_svc({"selector": {"app": "other"}}), "does not select"),
    (_svc({"selector": {"statefulset": "nb"}}, owner_uid="someone-else"), "not controlled"),
])
def test_only_the_controllers_service_is_trusted(service: dict[str, Any] | None, why: str | None) -> None:
    found = service_problem(_nb(), service)
    assert (found is None) if why is None else (found is not None and why in found), found


def _service(api: Any, ns: str, name: str, spec: dict[str, Any], owned: bool = True) -> None:
    nb = obj.get_notebook(api, ns, name)
    owners = [{"apiVersion": "kubeflow.org/v1", "kind": "Notebook", "name": name, "uid": nb["metadata"]["uid"],
               "controller": True}] if owned else []
    client.CoreV1Api(api).create_namespaced_service(ns, {"metadata": {"name": name, "ownerReferences": owners},
                                                         "spec": spec})


@pytest.mark.cluster
def test_a_redirected_service_is_not_probed(api: Any, namespace: str) -> None:
    """With the default URL templates (through the Service): the controller's Service is probed (here nothing
    listens at its ClusterIP, a loopback address, so the probe fails: it was made); an ExternalName, a selector-less
    Service, one made by hand and a missing one are not probed at all, and say why (no signal, rule 16 applies)."""
    port = [{"port": 80, "targetPort": 8888}]
    started = datetime.now(UTC) - timedelta(hours=2)
    for name in ("own", "external", "no-selector", "by-hand", "missing"):
        obj.create_notebook(api, namespace, obj.notebook(name))
        obj.running_pod(api, namespace, name, started)
    _service(api, namespace, "own", {"selector": {"statefulset": "own"}, "ports": port})
    _service(api, namespace, "external", {"type": "ExternalName", "externalName": "nb.other-team.svc.cluster.local"})
    _service(api, namespace, "no-selector", {"ports": port})
    _service(api, namespace, "by-hand", {"selector": {"statefulset": "by-hand"}, "ports": port}, owned=False)
    time.sleep(1)
    settings = load_mapping({"namespaces": {"include": [namespace]}, "idleMinutes": 600,
                             "probe": {"timeoutSeconds": 2, "connectTimeoutSeconds": 1, "retries": 0}}, "test")
    with Passes(build_runner(settings, api)) as runner:
        by = {r.name: r for r in runner.once().results}
    assert by["own"].calls, "the controller's Service is probed"
    assert "not probed" not in str(by["own"].observations["jupyter"])
    for name, why in (("external", "of type ExternalName"), ("no-selector", "does not select"),
                      ("by-hand", "not controlled by this Notebook"), ("missing", "no Service")):
        r = by[name]
        assert r.calls == [], name
        error = r.observations["jupyter"]["error"]
        assert error.startswith("not probed") and why in error, (name, error)
        assert (r.verdict.action, r.verdict.state) == ("keep", "no-signal") and why in r.verdict.reason
