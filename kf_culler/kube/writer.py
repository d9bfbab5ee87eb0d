"""Writes: one JSON merge patch per notebook (carrying resourceVersion, re-planned on 409) and Events; every
request backs off on 429 (kf_culler/kube/backoff.py). Safe to call from several threads at once."""

from __future__ import annotations

import functools
import logging
import os
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from kf_culler.kube import core
from kf_culler.kube.backoff import with_backoff
from kf_culler.model import EXEMPT_ANNOTATION, KEEP_UNTIL_ANNOTATION, SERVER_TYPE_ANNOTATION, STOP_ANNOTATION
from kf_culler.plan import EventSpec, Plan
from kf_culler.rules.untaken import Reclaim
from kf_culler.targets import Target, target_of
from kf_culler.timeutil import format_time

log = logging.getLogger(__name__)
MAX_CONFLICT_RETRIES = 5
# (connect, read) seconds for each write: an API server that hangs costs a failed write, not a stuck pass.
REQUEST_TIMEOUT = (5.0, 30.0)


# What became of a notebook's write: written, nothing to write, the notebook gone, 409 on every try, an
# error, or this replica no longer the one allowed to write.
WriteOutcome = Literal["patched", "unchanged", "gone", "conflict-exhausted", "failed", "not-leader"]


@dataclass
class WriteResult:
    outcome: WriteOutcome
    attempts: int = 0
    conflicts: int = 0
    event: str | None = None  # created | failed: ... | None
    notebook: dict[str, Any] | None = None
    plan: Plan | None = None
    error: str | None = None
    # An Event left for later (`apply(..., defer_event=True)`): what it is about and what it says; sent by
    # `send_event`, which sets `event`.
    pending: tuple[dict[str, Any], EventSpec, datetime] | None = None


class Writer:
    def __init__(self, api_client: Any, component: str = "kf-culler", instance: str | None = None) -> None:
        self.api_client = api_client
        self.component = component
        self.instance = instance or os.environ.get("POD_NAME") or socket.gethostname()
        self.patches = 0
        self.events = 0
        self._count = threading.Lock()  # apply() runs in several threads at once

    def apply(self, notebook: dict[str, Any], first: Plan, replan: Callable[[dict[str, Any]], Plan],
              now: datetime, may_write: Callable[[], bool] = lambda: True, defer_event: bool = False) -> WriteResult:
        """Patch `notebook` with `first`; on 409 re-read it, re-plan, and try again. The plan's Event goes out
        after the patch; with `defer_event`, it is left in `pending` (`event` "queued") for `send_event`."""
        from kubernetes.client.rest import ApiException

        meta = notebook.get("metadata") or {}
        ns, name = str(meta.get("namespace")), str(meta.get("name"))
        target = target_of(notebook)
        result = WriteResult("unchanged", plan=first)
        current, todo = notebook, first
        # A 409 means the notebook changed since we read it: re-read it, re-plan from what it is now and
        # patch again at once (the re-read is the wait), at most MAX_CONFLICT_RETRIES times. (A plain loop: a
        # retry library's set-up for every write cost more CPU than the loop, and a write rarely conflicts.)
        for attempt in range(1, MAX_CONFLICT_RETRIES + 2):
            if attempt > 1:  # the previous patch conflicted
                try:
                    current = with_backoff(lambda: self.get_object(target, ns, name))
                except ApiException as gone:
                    result.outcome = "gone" if gone.status == 404 else "failed"
                    result.error = None if gone.status == 404 else f"HTTP {gone.status}: {gone.reason}"
                    return result
                except Exception as err:  # the API server unreachable: this write fails, the pass goes on
                    return _unreachable(result, ns, name, err)
                todo = replan(current)
                result.plan = todo
            if todo.empty:
                break
            if not may_write():
                result.outcome = "not-leader"
                return result
            result.attempts += 1
            body = target.stop_body(current, todo.annotations)  # a Workspace's stop is spec.paused
            body["metadata"]["resourceVersion"] = (current.get("metadata") or {}).get("resourceVersion")
            try:
                if todo.annotations:
                    current = with_backoff(functools.partial(
                        core.patch_object, self.api_client, target.group, target.version, ns,
                        target.plural, name, body, core.MERGE_PATCH, REQUEST_TIMEOUT),
                        give_up=lambda: not may_write())
                    with self._count:
                        self.patches += 1
            except ApiException as err:
                if err.status == 404:
                    result.outcome = "gone"
                    return result
                if err.status != 409:
                    result.outcome, result.error = "failed", f"HTTP {err.status}: {err.reason}"
                    return result
                result.conflicts += 1
                continue
            except Exception as err:  # connection refused/reset, timeout, TLS: never raise into the pass
                return _unreachable(result, ns, name, err)
            result.outcome, result.notebook, result.plan = "patched", current, todo
            break
        else:  # no break: every try answered 409
            last = self._guarded(target.kind, ns, name, replan, may_write, result)
            if last is None:
                result.outcome = "conflict-exhausted"
                return result
            current = last
        if result.plan is not None and result.plan.event is not None and result.outcome in ("patched", "unchanged"):
            if defer_event:
                result.pending, result.event = (_about(current), result.plan.event, now), "queued"
            else:
                result.event = self.event(current, result.plan.event, now)
        return result

    def get_object(self, target: Target, namespace: str, name: str) -> dict[str, Any]:
        """A session's object as the API server has it now (the client's ApiException when it answers otherwise)."""
        return core.read_object(self.api_client, target.group, target.version, namespace, target.plural, name,
                                REQUEST_TIMEOUT)

    def read(self, kind: str, namespace: str, name: str) -> tuple[dict[str, Any] | None, str | None]:
        """A session's object as the API server has it now: (object, None), (None, None) when there is none, or
        (None, why) when it cannot be read. Never raises."""
        from kubernetes.client.rest import ApiException

        target = target_of({"kind": kind})
        try:
            found: dict[str, Any] = with_backoff(lambda: self.get_object(target, namespace, name))
            return found, None
        except ApiException as err:
            return None, None if err.status == 404 else f"HTTP {err.status}"
        except Exception as err:
            return None, type(err).__name__

    def reclaim(self, namespace: str, step: Reclaim, may_write: Callable[[], bool] = lambda: True) -> str:
        """Take a stop's next step (kf_culler/rules/untaken.py): scale the session's own StatefulSet to 0 through
        its `scale` subresource (nothing but the replica count can change), as a JSON Patch that first tests the
        uid the pairing read, so a StatefulSet made again under that name is never touched. "scaled", "gone" (no
        such StatefulSet, or another one of that name), "not-leader", or "failed: <why>"; never raises."""
        from kubernetes.client.rest import ApiException

        if step.kind != "StatefulSet":
            return f"failed: no next step for a {step.kind[:40]}"
        if not may_write():
            return "not-leader"
        ops: list[dict[str, Any]] = [{"op": "test", "path": "/metadata/uid", "value": step.uid},
                                     {"op": "replace", "path": "/spec/replicas", "value": 0}]

        def scale() -> None:
            core.patch_statefulset_scale(self.api_client, namespace, step.name, ops, timeout=REQUEST_TIMEOUT)

        try:
            with_backoff(scale, give_up=lambda: not may_write())
        except ApiException as err:
            if err.status in (404, 409, 422):  # gone, or the test of the uid failed: another object now
                return "gone"
            log.warning("scaling statefulset %s/%s to 0 refused: HTTP %s %s", namespace, step.name, err.status,
                        err.reason)
            return f"failed: HTTP {err.status}"
        except Exception as err:
            log.warning("scaling statefulset %s/%s to 0 failed: %s", namespace, step.name, err)
            return f"failed: {type(err).__name__}"
        with self._count:
            self.patches += 1
        log.info("scaled statefulset %s/%s to 0: its session's stop did not take", namespace, step.name)
        return "scaled"

    def send_event(self, result: WriteResult) -> None:
        """Send the Event `apply` left in `result.pending`, and say in `result.event` how it went. One that
        failed for a reason that may pass (the API server unreachable, 5xx, 429 after the backoff) stays
        pending, for the next pass to send again; one the API server refused (4xx) does not."""
        if result.pending is not None:
            about, spec, now = result.pending
            result.event = self.event(about, spec, now)
            if not _may_pass(result.event):
                result.pending = None

    def _guarded(self, kind: str, ns: str, name: str, replan: Callable[[dict[str, Any]], Plan],
                 may_write: Callable[[], bool], result: WriteResult) -> dict[str, Any] | None:
        """After MAX_CONFLICT_RETRIES 409s (a user's write loop on their own Notebook can make every
        resourceVersion-guarded patch lose): re-read, re-plan, and send the plan once as a JSON Patch that
        does not depend on the resourceVersion but `test`s what the decision read — the uid and every
        annotation that can change a verdict — so unrelated writes cannot starve it and a changed decision
        input still refuses it (422). The patched notebook, or None."""
        from kubernetes.client.rest import ApiException

        target = target_of({"kind": kind})  # the kind of a session this pass read: one a target handles
        try:
            fresh = with_backoff(lambda: self.get_object(target, ns, name))
        except Exception:
            return None
        todo = replan(fresh)
        result.plan = todo
        if not todo.annotations or not may_write():
            return None
        meta = fresh.get("metadata") or {}
        ann = meta.get("annotations") if isinstance(meta.get("annotations"), dict) else None
        ops: list[dict[str, Any]] = [{"op": "test", "path": "/metadata/uid", "value": meta.get("uid")}]
        if ann is None:
            ops.append({"op": "add", "path": "/metadata/annotations", "value": {}})
            ann = {}
        found_spec = fresh.get("spec")
        spec: dict[str, Any] = found_spec if isinstance(found_spec, dict) else {}
        # What "stopped" is read from is a decision input too (rule 1): a Workspace's paused, a workload's replicas
        stop_field = target.stop_field
        if stop_field is not None and stop_field in spec:
            ops.append({"op": "test", "path": f"/spec/{stop_field}", "value": spec[stop_field]})
        for key in DECISION_ANNOTATIONS:
            if key in ann:
                ops.append({"op": "test", "path": _pointer(key), "value": ann[key]})
        body = target.stop_body(fresh, todo.annotations)
        for key, value in body["metadata"]["annotations"].items():
            if value is not None:
                ops.append({"op": "add", "path": _pointer(key), "value": value})
            elif key in ann:
                ops.append({"op": "remove", "path": _pointer(key)})
        for key, value in body.get("spec", {}).items():  # a Workspace's or a workload's stop (spec exists)
            ops.append({"op": "add", "path": f"/spec/{key}", "value": value})
        result.attempts += 1
        try:
            patched: dict[str, Any] = with_backoff(lambda: core.patch_object(
                self.api_client, target.group, target.version, ns, target.plural, name, ops, core.JSON_PATCH,
                REQUEST_TIMEOUT), give_up=lambda: not may_write())
        except ApiException as err:
            if err.status in (409, 422):  # a decision input changed meanwhile: the next pass decides again
                result.conflicts += 1
            return None
        except Exception:
            return None
        with self._count:
            self.patches += 1
        result.outcome, result.notebook = "patched", patched
        return patched

    def event(self, notebook: dict[str, Any], spec: EventSpec, now: datetime) -> str:
        """Best effort: a failed Event is reported, never raised."""
        from kubernetes.client.rest import ApiException

        meta = notebook.get("metadata") or {}
        ns = str(meta.get("namespace"))
        stamp = format_time(now)
        body = {
            "metadata": {"generateName": f"{meta.get('name')}.", "namespace": ns},
            "involvedObject": {"apiVersion": (target := target_of(notebook)).api_version, "kind": target.kind,
                               "name": meta.get("name"),
                               "namespace": ns, "uid": meta.get("uid"),
                               "resourceVersion": meta.get("resourceVersion")},
            "type": spec.type, "reason": spec.reason, "message": spec.message[:1024],
            "source": {"component": self.component},
            "reportingComponent": self.component, "reportingInstance": self.instance[:128],
            "firstTimestamp": stamp, "lastTimestamp": stamp, "count": 1, "action": spec.reason,
        }

        def create() -> None:  # the answer is not decoded (nothing reads it)
            core.create_event(self.api_client, ns, body, timeout=REQUEST_TIMEOUT)

        try:
            with_backoff(create)
            with self._count:
                self.events += 1
            return "created"
        except ApiException as err:
            log.warning("event for %s/%s refused: HTTP %s %s", ns, meta.get("name"), err.status, err.reason)
            return f"failed: HTTP {err.status}"
        except Exception as err:
            log.warning("event for %s/%s failed: %s", ns, meta.get("name"), err)
            return f"failed: {type(err).__name__}"


# The annotations a verdict reads (docs/decisions.md); the guarded patch tests each one present.
DECISION_ANNOTATIONS = (STOP_ANNOTATION, EXEMPT_ANNOTATION, KEEP_UNTIL_ANNOTATION, SERVER_TYPE_ANNOTATION)


def _may_pass(outcome: str) -> bool:
    """Whether an Event's failure (`Writer.event`'s answer) may pass if it is sent again later."""
    if not outcome.startswith("failed: "):
        return False
    code = outcome.removeprefix("failed: HTTP ")
    return code == outcome or not code.isdigit() or int(code) >= 500 or int(code) == 429


def _about(obj: dict[str, Any]) -> dict[str, Any]:
    """What an Event names of the object it is about (kept until the Event is sent; not the whole object)."""
    meta = obj.get("metadata") or {}
    kept = ("name", "namespace", "uid", "resourceVersion")
    return {"kind": obj.get("kind"), "metadata": {k: meta.get(k) for k in kept}}


def _pointer(key: str) -> str:
    """The JSON Pointer (RFC 6901) of an annotation."""
    return "/metadata/annotations/" + key.replace("~", "~0").replace("/", "~1")


def _unreachable(result: WriteResult, ns: str, name: str, err: Exception) -> WriteResult:
    result.outcome = "failed"
    result.error = f"{type(err).__name__}: {err}"[:300]
    log.warning("write to %s/%s failed: %s", ns, name, result.error)
    return result
