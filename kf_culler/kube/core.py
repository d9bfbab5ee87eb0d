"""The requests the culler sends outside the watch cache (core/v1 and apps/v1 objects, a session's read and patch,
a Profile's read), through the kubernetes ApiClient (its configuration, credentials, connection pool and
`_request_timeout`) but without the client's generated API classes: once imported, the kubernetes package's
CoreV1Api costs about 21 MiB of resident memory, AppsV1Api 12 MiB and CustomObjectsApi 1.6 MiB
(docs/performance.md), for the dozen requests below, and the last checks every argument of every call. Answers
are the API's JSON as plain dicts (the same keys a model gives through `sanitize_for_serialization`); an answer
other than 2xx raises the client's ApiException, as the generated classes do, with its status, reason, headers (a
429's Retry-After) and body."""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import quote

JSON = "application/json"
MERGE_PATCH = "application/merge-patch+json"
# What the generated classes send for an object patch (kubernetes.client.rest: a JSON Patch content type with a
# body that is not a list becomes a strategic merge patch).
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"
JSON_PATCH = "application/json-patch+json"
Timeout = float | tuple[float, float] | None


def _path(*parts: str) -> str:
    """An API path from its segments, each name quoted as the generated classes quote path parameters."""
    return "/" + "/".join(quote(p, safe="") for p in parts)


def call(api_client: Any, method: str, path: str, body: Any = None, *, query: dict[str, str] | None = None,
         content_type: str = JSON, timeout: Timeout = None, decode: bool = True) -> Any:
    """Send one request; its answer's JSON (None when `decode` is off or the answer is empty). The answer is read
    to its end either way, so its connection goes back to the pool; without `decode` a 2xx answer is drained, never
    held (a record bucket's patch answers the whole ConfigMap)."""
    from kubernetes.client.exceptions import ApiException

    headers = {"Accept": JSON, **({"Content-Type": content_type} if body is not None else {})}
    request = api_client.param_serialize(method, path, query_params=list((query or {}).items()),
                                         header_params=headers, body=body, auth_settings=["BearerToken"])
    answer = api_client.call_api(*request, _request_timeout=timeout)
    ok = 200 <= answer.status <= 299
    try:
        if ok and not decode:
            answer.response.drain_conn()
            return None
        data = answer.read()
    finally:
        answer.response.release_conn()
    if not ok:
        raise ApiException.from_response(http_resp=answer, body=None, data=None)
    return json.loads(data) if decode and data else None


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _items(value: Any) -> list[dict[str, Any]]:
    found = _dict(value).get("items")
    return [i for i in found if isinstance(i, dict)] if isinstance(found, list) else []


def read_namespace(api_client: Any, name: str, timeout: Timeout = None) -> dict[str, Any]:
    return _dict(call(api_client, "GET", _path("api", "v1", "namespaces", name), timeout=timeout))


def read_config_map(api_client: Any, namespace: str, name: str, timeout: Timeout = None) -> dict[str, Any]:
    return _dict(call(api_client, "GET", _path("api", "v1", "namespaces", namespace, "configmaps", name),
                      timeout=timeout))


def create_config_map(api_client: Any, namespace: str, body: dict[str, Any], timeout: Timeout = None) -> None:
    call(api_client, "POST", _path("api", "v1", "namespaces", namespace, "configmaps"), body, timeout=timeout,
         decode=False)


def patch_config_map(api_client: Any, namespace: str, name: str, body: dict[str, Any],
                     content_type: str = STRATEGIC_MERGE_PATCH, timeout: Timeout = None) -> None:
    call(api_client, "PATCH", _path("api", "v1", "namespaces", namespace, "configmaps", name), body,
         content_type=content_type, timeout=timeout, decode=False)


def create_event(api_client: Any, namespace: str, body: dict[str, Any], timeout: Timeout = None) -> None:
    """Create an Event; its answer is not decoded (nothing reads it)."""
    call(api_client, "POST", _path("api", "v1", "namespaces", namespace, "events"), body, timeout=timeout,
         decode=False)


def list_events(api_client: Any, namespace: str, field_selector: str, timeout: Timeout = None) -> list[dict[str, Any]]:
    return _items(call(api_client, "GET", _path("api", "v1", "namespaces", namespace, "events"),
                       query={"fieldSelector": field_selector}, timeout=timeout))


def list_pods(api_client: Any, namespace: str, label_selector: str, timeout: Timeout = None) -> list[dict[str, Any]]:
    return _items(call(api_client, "GET", _path("api", "v1", "namespaces", namespace, "pods"),
                       query={"labelSelector": label_selector}, timeout=timeout))


def read_service_account(api_client: Any, namespace: str, name: str, timeout: Timeout = None) -> dict[str, Any]:
    return _dict(call(api_client, "GET", _path("api", "v1", "namespaces", namespace, "serviceaccounts", name),
                      timeout=timeout))


def create_service_account(api_client: Any, namespace: str, body: dict[str, Any],
                           timeout: Timeout = None) -> dict[str, Any]:
    return _dict(call(api_client, "POST", _path("api", "v1", "namespaces", namespace, "serviceaccounts"), body,
                      timeout=timeout))


def create_token(api_client: Any, namespace: str, account: str, body: dict[str, Any],
                 timeout: Timeout = None) -> dict[str, Any]:
    """A TokenRequest for the ServiceAccount `account` (its `status.token`)."""
    return _dict(call(api_client, "POST", _path("api", "v1", "namespaces", namespace, "serviceaccounts", account,
                                                "token"), body, timeout=timeout))


def list_deployments(api_client: Any, namespace: str, label_selector: str,
                     timeout: Timeout = None) -> list[dict[str, Any]]:
    return _items(call(api_client, "GET", _path("apis", "apps", "v1", "namespaces", namespace, "deployments"),
                       query={"labelSelector": label_selector}, timeout=timeout))


def patch_statefulset_scale(api_client: Any, namespace: str, name: str, ops: list[dict[str, Any]],
                            timeout: Timeout = None) -> None:
    """A JSON Patch (a list of operations) on a StatefulSet's `scale` subresource; its answer is not decoded."""
    call(api_client, "PATCH", _path("apis", "apps", "v1", "namespaces", namespace, "statefulsets", name, "scale"),
         ops, content_type=JSON_PATCH, timeout=timeout, decode=False)


def _object_path(group: str, version: str, namespace: str | None, plural: str, name: str) -> str:
    """An object's path: /apis/<group>/<version>/..., or /api/v1/... for the core group (""); a cluster-scoped
    one's when `namespace` is None."""
    api = ("apis", group, version) if group else ("api", version)
    return _path(*api, *(("namespaces", namespace) if namespace is not None else ()), plural, name)


def read_object(api_client: Any, group: str, version: str, namespace: str, plural: str, name: str,
                timeout: Timeout = None) -> dict[str, Any]:
    """A namespaced object of any kind (a session the culler writes: a Notebook, a Workspace, a Deployment)."""
    return _dict(call(api_client, "GET", _object_path(group, version, namespace, plural, name), timeout=timeout))


def read_cluster_object(api_client: Any, group: str, version: str, plural: str, name: str,
                        timeout: Timeout = None) -> dict[str, Any]:
    """A cluster-scoped object of any kind (a Profile)."""
    return _dict(call(api_client, "GET", _object_path(group, version, None, plural, name), timeout=timeout))


def patch_object(api_client: Any, group: str, version: str, namespace: str, plural: str, name: str, body: Any,
                 content_type: str, timeout: Timeout = None) -> dict[str, Any]:
    """A merge patch (a dict) or a JSON Patch (a list of operations) of a namespaced object; the object as patched.
    Through `call`, not the generated CustomObjectsApi, whose checks of every argument (pydantic) cost about
    0.05 ms of CPU a patch of the 0.7 it takes, and whose module holds 1.6 MiB once loaded (docs/performance.md)."""
    return _dict(call(api_client, "PATCH", _object_path(group, version, namespace, plural, name), body,
                      content_type=content_type, timeout=timeout))
