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


def running_pod(api: Any, namespace: str, notebook_name: str, started: datetime, gpus: int = 0) -> dict[str, Any]:
    """Create `<name>-0` for the notebook and mark it Running since `started`."""
    from kubernetes import client

    core = client.CoreV1Api(api)
    resources: dict[str, Any] = {"requests": {"cpu": "100m"}}
    if gpus:
        resources["limits"] = {"nvidia.com/gpu": str(gpus)}
        resources["requests"]["nvidia.com/gpu"] = str(gpus)
    pod_name = f"{notebook_name}-0"
    core.create_namespaced_pod(namespace, {
        "metadata": {"name": pod_name, "labels": {POD_LABEL: notebook_name, "statefulset": notebook_name}},
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
