"""Writes for Coder workspaces (`targets: [coder]`, docs/targets.md, "Coder workspaces"): a stop is a stop build
through Coder's API, never a patch; the reason goes on a Kubernetes Event on the workspace's Deployment.

`CoderWriter` is the kube `Writer` with one more kind of session: a plan for a Coder workspace sends the stop
build when it stops (`POST /api/v2/workspaces/{id}/builds {"transition":"stop"}`, with the admin's token), writes
nothing on Coder when it only warns, and writes no annotation anywhere (the synthetic session object is
nobody's to patch; the culler's own record, kf_culler/kube/records.py, keeps its state as for every target).
The Event's object is the Deployment labelled `com.coder.workspace.id=<id>` in the admin's Coder namespace,
else the pod so labelled, else the reason is only logged. Every other session goes to the kube Writer.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from datetime import datetime
from typing import Any

from kf_culler.kube import core
from kf_culler.kube.backoff import with_backoff
from kf_culler.kube.writer import REQUEST_TIMEOUT, Writer, WriteResult, _may_pass
from kf_culler.model import STOP_ANNOTATION, WARNED_AT_ANNOTATION
from kf_culler.plan import EventSpec, Plan
from kf_culler.sources.coder import CoderClient
from kf_culler.targets import CODER, target_of
from kf_culler.targets.coder import WORKSPACE_ID_LABEL
from kf_culler.timeutil import format_time

log = logging.getLogger(__name__)
NO_OBJECT = "failed: no Deployment or pod of the workspace"
UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")


class CoderWriter(Writer):
    def __init__(self, api_client: Any, coder: CoderClient, component: str = "kf-culler",
                 instance: str | None = None) -> None:
        super().__init__(api_client, component, instance)
        self.coder = coder
        self.stop_builds = 0

    def apply(self, notebook: dict[str, Any], first: Plan, replan: Callable[[dict[str, Any]], Plan],
              now: datetime, may_write: Callable[[], bool] = lambda: True, defer_event: bool = False) -> WriteResult:
        if target_of(notebook) is not CODER:
            return super().apply(notebook, first, replan, now, may_write, defer_event)
        return self._apply_coder(notebook, first, now, may_write, defer_event)

    def send_event(self, result: WriteResult) -> None:
        """A Coder workspace's Event goes to its Deployment (found when it is sent); the others' as the Writer's."""
        pending = result.pending
        if pending is None or pending[0].get("kind") != CODER.kind:
            super().send_event(result)
            return
        about, spec, now = pending
        meta = about.get("metadata") or {}
        result.event = self.coder_event(str(meta.get("namespace")), str(meta.get("name")), str(meta.get("uid")),
                                        spec, now)
        if not _may_pass(result.event) or result.event == NO_OBJECT:
            result.pending = None  # sent, refused, or nothing to put it on: not sent again

    def _apply_coder(self, session: dict[str, Any], todo: Plan, now: datetime,
                     may_write: Callable[[], bool], defer_event: bool) -> WriteResult:
        result = WriteResult("unchanged", plan=todo)  # notebook stays None: nothing for the k8s cache
        stop = todo.annotations.get(STOP_ANNOTATION) is not None
        marked = todo.annotations.get(WARNED_AT_ANNOTATION) is not None
        if not stop and not marked and todo.event is None:
            return result  # the plan's annotations only: the culler's own record keeps its state
        if not may_write():
            result.outcome = "not-leader"
            return result
        meta = session.get("metadata") or {}
        ns, name, ws_id = str(meta.get("namespace")), str(meta.get("name")), str(meta.get("uid") or "")
        if not UUID.match(ws_id):
            result.outcome, result.error = "failed", "the Coder workspace's id is not a UUID; not written"
            return result
        if stop:
            result.attempts = 1
            answer = self.coder.stop(ws_id)
            if answer.status == 201:
                with self._count:
                    self.stop_builds += 1
            else:
                result.outcome = "failed"
                if answer.status in (403, 404):
                    result.error = (f"Coder refused the stop build (HTTP {answer.status}: {answer.message}): the "
                                    "token in coder.tokenFile may not stop this workspace; it must be a Coder "
                                    "Owner's (docs/targets.md, \"Coder workspaces\")")
                elif answer.status == 409:
                    result.conflicts = 1
                    result.error = (f"Coder answered 409 ({answer.message}): another build is in progress; the "
                                    "next pass decides again")
                else:
                    result.error = (f"the stop build failed: HTTP {answer.status}: {answer.message}"
                                    if answer.status is not None else f"the stop build failed: {answer.message}")
                log.warning("stop build of Coder workspace %s/%s failed: %s", ns, name, result.error)
                return result
        result.outcome = "patched"  # the stop build made, or a warning (nothing to write on Coder)
        if todo.event is not None and defer_event:
            about = {"kind": CODER.kind, "metadata": {"namespace": ns, "name": name, "uid": ws_id}}
            result.pending, result.event = (about, todo.event, now), "queued"
        elif todo.event is not None:
            result.event = self.coder_event(ns, name, ws_id, todo.event, now)
        return result

    def coder_event(self, ns: str, name: str, ws_id: str, spec: EventSpec, now: datetime) -> str:
        """The Event on the workspace's Deployment (else its pod), in the admin's namespace; best effort."""
        selector = f"{WORKSPACE_ID_LABEL}={ws_id}"
        try:
            deployments = with_backoff(lambda: core.list_deployments(self.api_client, ns, selector,
                                                                     timeout=REQUEST_TIMEOUT))
            if deployments:
                found = min(deployments, key=_name)
                found.update({"apiVersion": "apps/v1", "kind": "Deployment"})
                return self.event(found, spec, now)
            pods = with_backoff(lambda: core.list_pods(self.api_client, ns, selector, timeout=REQUEST_TIMEOUT))
            if pods:
                return self._pod_event(ns, min(pods, key=_name), spec, now)
        except Exception as err:  # the RBAC to list them missing, the API server away: told in the log
            log.warning("Event for Coder workspace %s/%s failed: %s: %s", ns, name, type(err).__name__,
                        str(err)[:200])
            return f"failed: {type(err).__name__}"
        log.warning("Coder workspace %s/%s has no Deployment or pod labelled %s in %s; its %s: %s", ns, name,
                    selector, ns, spec.reason, spec.message[:500])
        return NO_OBJECT

    def _pod_event(self, ns: str, pod: dict[str, Any], spec: EventSpec, now: datetime) -> str:
        from kubernetes.client.rest import ApiException

        meta = pod.get("metadata") or {}
        stamp = format_time(now)
        body = {
            "metadata": {"generateName": f"{meta.get('name')}.", "namespace": ns},
            "involvedObject": {"apiVersion": "v1", "kind": "Pod", "name": meta.get("name"), "namespace": ns,
                               "uid": meta.get("uid"), "resourceVersion": meta.get("resourceVersion")},
            "type": spec.type, "reason": spec.reason, "message": spec.message[:1024],
            "source": {"component": self.component}, "reportingComponent": self.component,
            "reportingInstance": self.instance[:128], "firstTimestamp": stamp, "lastTimestamp": stamp, "count": 1,
            "action": spec.reason,
        }
        try:
            with_backoff(lambda: core.create_event(self.api_client, ns, body, timeout=REQUEST_TIMEOUT))
        except ApiException as err:
            return f"failed: HTTP {err.status}"
        with self._count:
            self.events += 1
        return "created"


def _name(obj: dict[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("name"))
