"""Notebook and pod objects as Kubeflow creates them, for local clusters (tests, demo, benchmark).

On an API-server-only cluster nothing runs pods: `running_pod` creates the pod the notebook-controller's
StatefulSet would create and records through the status subresource that it runs, as a kubelet would.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from kf_culler.kube import GROUP, PLURAL, POD_LABEL, VERSION
from kf_culler.model import SERVER_TYPE_ANNOTATION
from kf_culler.timeutil import format_time


def notebook(name: str, server_type: str = "jupyter", gpus: int = 0, annotations: dict[str, str] | None = None,
             image: str = "kubeflownotebookswg/jupyter-scipy:v1.10.0") -> dict[str, Any]:
    resources: dict[str, Any] = {"requests": {"cpu": "100m", "memory": "128Mi"}}
    if gpus:
        resources["limits"] = {"nvidia.com/gpu": str(gpus)}
    return {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "Notebook",
        "metadata": {"name": name, "annotations": {SERVER_TYPE_ANNOTATION: server_type, **(annotations or {})},
                     "labels": {"app": name}},
        "spec": {"template": {"spec": {"containers": [{"name": name, "image": image, "resources": resources}]}}},
    }


def create_namespace(api: Any, name: str, annotations: dict[str, str] | None = None) -> None:
    from kubernetes import client

    client.CoreV1Api(api).create_namespace({"metadata": {"name": name, "annotations": annotations or {}}})


def create_notebook(api: Any, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
    from kubernetes import client

    created: dict[str, Any] = client.CustomObjectsApi(api).create_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, body)
    return created


def get_notebook(api: Any, namespace: str, name: str) -> dict[str, Any]:
    from kubernetes import client

    nb: dict[str, Any] = client.CustomObjectsApi(api).get_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, name)
    return nb


def patch_annotations(api: Any, namespace: str, name: str, annotations: dict[str, str | None]) -> dict[str, Any]:
    """A JSON merge patch of annotations (None removes a key), as Kubeflow's web app sends."""
    from kubernetes import client

    nb: dict[str, Any] = client.CustomObjectsApi(api).patch_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, name, {"metadata": {"annotations": annotations}},
        _content_type="application/merge-patch+json")
    return nb


def notebook_statefulset(api: Any, namespace: str, notebook_name: str) -> dict[str, Any]:
    """The StatefulSet `<name>` the notebook-controller makes for a Notebook (controlled by it, by uid), made
    if missing: the culler pairs a notebook with its pod through this ownership chain."""
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    apps = client.AppsV1Api(api)
    try:
        found: dict[str, Any] = client.ApiClient().sanitize_for_serialization(
            apps.read_namespaced_stateful_set(notebook_name, namespace))
        return found
    except ApiException as err:
        if err.status != 404:
            raise
    nb = get_notebook(api, namespace, notebook_name)
    labels = {"statefulset": notebook_name}
    body = {"metadata": {"name": notebook_name, "ownerReferences": [{
                "apiVersion": f"{GROUP}/{VERSION}", "kind": "Notebook", "name": notebook_name,
                "uid": nb["metadata"]["uid"], "controller": True, "blockOwnerDeletion": True}]},
            "spec": {"replicas": 1, "serviceName": "", "selector": {"matchLabels": labels},
                     "template": {"metadata": {"labels": labels},
                                  "spec": {"containers": [{"name": notebook_name, "image": "notebook:local"}]}}}}
    made: dict[str, Any] = client.ApiClient().sanitize_for_serialization(
        apps.create_namespaced_stateful_set(namespace, body))
    return made


def pod_owner(statefulset: dict[str, Any]) -> list[dict[str, Any]]:
    """The ownerReferences of a pod the StatefulSet controls."""
    meta = statefulset["metadata"]
    return [{"apiVersion": "apps/v1", "kind": "StatefulSet", "name": meta["name"], "uid": meta["uid"],
             "controller": True, "blockOwnerDeletion": True}]


def running_pod(api: Any, namespace: str, notebook_name: str, started: datetime, gpus: int = 0) -> dict[str, Any]:
    """Create `<name>-0` for the notebook, controlled by its StatefulSet (made if missing, controlled by the
    Notebook), and mark it Running since `started`. On an API-server-only cluster no controller acts on
    either: they stand for what the notebook-controller and the StatefulSet controller make."""
    from kubernetes import client

    core = client.CoreV1Api(api)
    resources: dict[str, Any] = {"requests": {"cpu": "100m"}}
    if gpus:
        resources["limits"] = {"nvidia.com/gpu": str(gpus)}
        resources["requests"]["nvidia.com/gpu"] = str(gpus)
    pod_name = f"{notebook_name}-0"
    sts = notebook_statefulset(api, namespace, notebook_name)
    core.create_namespaced_pod(namespace, {
        "metadata": {"name": pod_name, "labels": {POD_LABEL: notebook_name, "statefulset": notebook_name},
                     "ownerReferences": pod_owner(sts)},
        "spec": {"containers": [{"name": notebook_name, "image": "notebook:local", "resources": resources}]}})
    pod = core.patch_namespaced_pod_status(pod_name, namespace, {"status": {
        "phase": "Running", "startTime": format_time(started),
        "conditions": [{"type": "Ready", "status": "True"}]}})
    out: dict[str, Any] = client.ApiClient().sanitize_for_serialization(pod)
    return out


def delete_pod(api: Any, namespace: str, name: str) -> None:
    from kubernetes import client

    client.CoreV1Api(api).delete_namespaced_pod(name, namespace, grace_period_seconds=0)


def events_for(api: Any, namespace: str, name: str) -> list[Any]:
    """The Notebook's Events, oldest first (the API lists them by their generated names, in no time order)."""
    from kubernetes import client

    evs = client.CoreV1Api(api).list_namespaced_event(
        namespace, field_selector=f"involvedObject.name={name},involvedObject.kind=Notebook").items
    return sorted(evs, key=lambda e: (e.first_timestamp or e.metadata.creation_timestamp,
                                      e.metadata.creation_timestamp))
