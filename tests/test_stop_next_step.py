"""The next step of a stop that did not take, on a real API server (kf_culler/kube/writer.py `Writer.reclaim`): the
StatefulSet the pairing named is scaled to 0 through its `scale` subresource, guarded by its uid, so one deleted and
made again under the same name (by its user) is never touched; nothing else of it changes."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes import client

from kf_culler.kube.writer import Writer
from kf_culler.rules.untaken import Reclaim

pytestmark = pytest.mark.cluster


def statefulset(name: str, replicas: int = 1) -> dict[str, Any]:
    return {"metadata": {"name": name},
            "spec": {"replicas": replicas, "serviceName": name, "selector": {"matchLabels": {"app": name}},
                     "template": {"metadata": {"labels": {"app": name}},
                                  "spec": {"containers": [{"name": "c", "image": "busybox:1"}]}}}}


def test_the_named_statefulset_is_scaled_to_0_and_nothing_else_changes(api: Any, namespace: str) -> None:
    apps = client.AppsV1Api(api)
    made = apps.create_namespaced_stateful_set(namespace, statefulset("ws-abcde"))
    outcome = Writer(api).reclaim(namespace, Reclaim("StatefulSet", "ws-abcde", made.metadata.uid))
    assert outcome == "scaled"
    after = apps.read_namespaced_stateful_set("ws-abcde", namespace)
    assert after.spec.replicas == 0
    assert after.spec.template.spec.containers[0].image == "busybox:1"
    assert after.metadata.owner_references is None and after.metadata.annotations is None


def test_a_statefulset_made_again_under_the_name_is_not_touched(api: Any, namespace: str) -> None:
    apps = client.AppsV1Api(api)
    old = apps.create_namespaced_stateful_set(namespace, statefulset("ws-abcde"))
    apps.delete_namespaced_stateful_set("ws-abcde", namespace)
    apps.create_namespaced_stateful_set(namespace, statefulset("ws-abcde", replicas=2))
    assert Writer(api).reclaim(namespace, Reclaim("StatefulSet", "ws-abcde", old.metadata.uid)) == "gone"
    assert apps.read_namespaced_stateful_set("ws-abcde", namespace).spec.replicas == 2
    assert Writer(api).reclaim(namespace, Reclaim("StatefulSet", "absent", old.metadata.uid)) == "gone"


def test_no_write_without_the_right_to_write(api: Any, namespace: str) -> None:
    apps = client.AppsV1Api(api)
    made = apps.create_namespaced_stateful_set(namespace, statefulset("ws-abcde"))
    step = Reclaim("StatefulSet", "ws-abcde", made.metadata.uid)
    assert Writer(api).reclaim(namespace, step, may_write=lambda: False) == "not-leader"
    assert Writer(api).reclaim(namespace, Reclaim("Deployment", "x", "y")).startswith("failed: ")
    assert apps.read_namespaced_stateful_set("ws-abcde", namespace).spec.replicas == 1
