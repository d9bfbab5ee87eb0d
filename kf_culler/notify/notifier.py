"""The queue between the pass and the senders: a bounded queue and one worker thread.

The pass only calls `offer`, which never blocks (a full queue drops the notice and counts it). The worker
expands a notice into deliveries (email to the owner, each webhook whose namespaces select the notebook)
and tries each a bounded number of times (tenacity: exponential back-off, capped; only transient failures
are tried again). A delivery that fails for good is counted, logged, kept as the notebook's last failure,
and told on the Notebook as a `NotificationFailed` Event, which `kf-culler explain` shows.

At most once: a notice is queued only by the pass whose patch added the mark (`warned-at`, the stop
annotation, `restarted-at`) — see `notice_for` and docs/notifications.md.
"""

from __future__ import annotations

import logging
import queue
import threading
from datetime import UTC, datetime
from typing import Any

from tenacity import Retrying, retry_if_exception, stop_after_attempt, stop_when_event_set, wait_exponential

from kf_culler.config import Notifications, Settings
from kf_culler.model import RESTARTED_AT_ANNOTATION, STOP_ANNOTATION, WARNED_AT_ANNOTATION
from kf_culler.notify import SendError
from kf_culler.notify import email as smtp
from kf_culler.notify import webhook as hooks
from kf_culler.notify.fairqueue import FairQueue, RateLimited
from kf_culler.notify.message import Notice, payload, render
from kf_culler.plan import EVENT_RESTART, EVENT_STOP, EVENT_WARN
from kf_culler.targets import fairness_key, for_key
from kf_culler.timeutil import format_time

log = logging.getLogger("kf_culler.notify")
FAILED_EVENT = "NotificationFailed"
# The event a pass planned, the mark its patch must have added, and the notice's kind.
MARKS = {EVENT_WARN: (WARNED_AT_ANNOTATION, "warn"), EVENT_STOP: (STOP_ANNOTATION, "stop"),
         EVENT_RESTART: (RESTARTED_AT_ANNOTATION, "restart")}


def notice_for(result: Any, max_extend_minutes: float = 0) -> Notice | None:
    """The notice a pass's NotebookResult gives, or None.

    Only a write that is `patched` with a plan that carries an Event *and* sets the mark gives one: the
    patch carried the notebook's resourceVersion, so of two cullers (a restarted one, a new leader, a
    stale cache) only one patch can add the mark; the other gets 409, re-reads, re-plans with the mark
    present, and plans no Event.
    """
    w = getattr(result, "write", None)
    if w is None or w.outcome != "patched" or w.plan is None or w.plan.event is None:
        return None
    mark_kind = MARKS.get(w.plan.event.reason)
    if mark_kind is None or w.plan.annotations.get(mark_kind[0]) is None:
        return None
    v = result.verdict
    meta = (w.notebook or {}).get("metadata") or {}
    ann = meta.get("annotations") or {}
    at = _parse(ann.get(mark_kind[0])) or datetime.now(UTC)
    stop_at = v.stop_at if mark_kind[1] == "warn" else at if mark_kind[1] == "stop" else None
    return Notice(mark_kind[1], result.namespace, result.name, meta.get("uid"), v.reason, v.state, v.rule_id, at,
                  stop_at, v.idle_since, max_extend_minutes, result.server_type, result.gpus, result.trace_id)


def _parse(value: object) -> datetime | None:
    from kf_culler.timeutil import parse_time

    return parse_time(value)


class Notifier:
    def __init__(self, settings: Notifications, owners: Any = None, metrics: Any = None, api_client: Any = None
                 ) -> None:
        self.settings = settings
        self.owners = owners  # kf_culler.kube.owners.OwnerLookup, for email
        self.metrics = metrics  # kf_culler.metrics.Metrics (duck-typed: .notifications counter)
        self.events: Any = None  # kf_culler.kube.events.EventRecorder, for failed notices
        if api_client is not None:
            from kf_culler.kube.events import EventRecorder

            self.events = EventRecorder(api_client)
        self.queue: FairQueue[Notice] = FairQueue(settings.queue_size, settings.queue_per_namespace,
                                                  settings.per_namespace_per_hour)
        self.last_failure: dict[tuple[str, str], str] = {}
        self.sent: list[tuple[str, Notice]] = []  # (channel, notice), for the demo and tests
        self._closing = threading.Event()
        self._thread = threading.Thread(target=self._work, name="kf-culler-notify", daemon=True)
        self._session: Any = None

    @classmethod
    def for_settings(cls, settings: Settings, api_client: Any, metrics: Any = None) -> Notifier | None:
        """The notifier the configuration asks for, started; None when notifications are off."""
        n = settings.operations.notifications
        if not n.enabled:
            return None
        owners = None
        if n.email.enabled:
            from kf_culler.kube.owners import OwnerLookup

            owners = OwnerLookup(api_client, n.email.owner_cache_seconds, n.email.profile_owner)
        notifier = cls(n, owners, metrics, api_client)
        notifier.start()
        return notifier

    # -- the pass's side: never blocks --------------------------------------------------------------
    def offer_result(self, result: Any, max_extend_minutes: float = 0.0, tenant: str | None = None) -> bool:
        """A pass's result (kf_culler.cycle.NotebookResult), with its policy's maxExtendMinutes and whose share
        of the queue it takes (kf_culler/targets/coder.py `fairness_key`; None: the key's own)."""
        notice = notice_for(result, max_extend_minutes)
        return notice is not None and self.offer(notice, tenant)

    def offer(self, notice: Notice, tenant: str | None = None) -> bool:
        if notice.kind not in self.settings.kinds:
            return False
        try:
            self.queue.put_nowait(tenant or fairness_key(notice.key), notice)
            return True
        except queue.Full:
            outcome, why = "dropped", "notification queue full (in all, or for this namespace)"
        except RateLimited:
            outcome, why = "rate-limited", (f"namespace over notifications.perNamespacePerHour "
                                            f"({self.settings.per_namespace_per_hour})")
        for channel in self._channels(notice):
            self._count(channel, notice.kind, outcome)
        log.warning("%s: %s notice for %s/%s not sent", why, notice.kind, *notice.key)
        return False

    # -- the worker ---------------------------------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    def close(self, timeout: float = 5.0) -> None:
        """Stop: the delivery under way gets no further attempt; queued notices are not sent."""
        self._closing.set()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def wait_idle(self, timeout: float) -> bool:
        """True once every queued notice has been delivered or given up (for tests and the demo)."""
        done = threading.Event()

        def join() -> None:
            self.queue.join()
            done.set()

        threading.Thread(target=join, daemon=True).start()
        return done.wait(timeout)

    def _channels(self, n: Notice) -> list[str]:
        out = ["email"] if self.settings.email.enabled else []
        return out + [f"webhook:{h.name}" for h in self.settings.webhooks if h.namespaces.selects(n.namespace)]

    def _work(self) -> None:
        import requests

        self._session = requests.Session()
        while not self._closing.is_set():
            try:
                notice = self.queue.get(timeout=0.5)
            except queue.Empty:
                continue
            try:
                for channel in self._channels(notice):
                    if self._closing.is_set():
                        break
                    self._deliver(channel, notice)
            except Exception:  # a bug must cost this notice, not the worker
                log.exception("notifying %s/%s failed", *notice.key)
            finally:
                self.queue.task_done()

    def _deliver(self, channel: str, notice: Notice) -> None:
        attempts = 0

        def once() -> str:
            nonlocal attempts
            attempts += 1
            return self._send(channel, notice)

        s = self.settings
        retrying = Retrying(
            stop=stop_after_attempt(s.attempts) | stop_when_event_set(self._closing),
            wait=wait_exponential(multiplier=s.backoff_seconds, max=s.max_backoff_seconds),
            retry=retry_if_exception(lambda e: isinstance(e, SendError) and e.transient),
            sleep=self._pause, reraise=True)
        try:
            outcome = retrying(once)
        except SendError as err:
            self._failed(channel, notice, attempts, str(err))
            return
        except Exception as err:  # an unexpected error is a failure, never a crash of the worker
            self._failed(channel, notice, attempts, f"{type(err).__name__}")
            return
        self._count(channel, notice.kind, outcome)
        if outcome == "sent":
            self.sent.append((channel, notice))
            log.info("%s notice for %s/%s sent by %s", notice.kind, *notice.key, channel)

    def _pause(self, seconds: float) -> None:
        self._closing.wait(seconds)  # a close ends the back-off at once

    def _send(self, channel: str, notice: Notice) -> str:
        s = self.settings
        if channel == "email":
            to = self._owner(notice.namespace)
            recipients = [to] if to else []
            recipients += [c for c in s.email.cc if c not in recipients]
            if not recipients:
                return "no-recipient"
            subject, body = render(notice, s.templates, s.dashboard_url)
            msg = smtp.build(s.email, recipients[0], subject, body)
            smtp.send(s.email, msg, s.timeout_seconds)
            return "sent"
        hook = next(h for h in s.webhooks if f"webhook:{h.name}" == channel)
        hooks.send(hook, payload(notice, hook.format, s.templates, s.dashboard_url), s.timeout_seconds,
                   self._session)
        return "sent"

    def _owner(self, namespace: str) -> str | None:
        if self.owners is None:
            return None
        try:
            found: str | None = self.owners.email_for(namespace)
            return found
        except Exception as err:  # the API server unreachable: worth another attempt
            raise SendError(f"owner lookup for {namespace}: {type(err).__name__}", transient=True) from None

    def _failed(self, channel: str, notice: Notice, attempts: int, error: str) -> None:
        self._count(channel, notice.kind, "failed")
        text = (f"{format_time(datetime.now(UTC))}: {notice.kind} notice by {channel} failed after "
                f"{attempts} attempt(s): {error}")
        self.last_failure[notice.key] = text
        log.warning("%s/%s: %s", *notice.key, text)
        if self.events is not None:
            self._failure_event(notice, text)

    def _failure_event(self, notice: Notice, text: str) -> None:
        stamp = format_time(datetime.now(UTC))
        target = for_key(notice.key)
        name = notice.key.object_name
        body = {
            "metadata": {"generateName": f"{name}.", "namespace": notice.namespace},
            "involvedObject": {"apiVersion": target.api_version, "kind": target.kind,
                               "name": name, "namespace": notice.namespace, "uid": notice.uid},
            "type": "Warning", "reason": FAILED_EVENT, "message": text[:1024],
            "source": {"component": "kf-culler"}, "reportingComponent": "kf-culler",
            "reportingInstance": "kf-culler", "firstTimestamp": stamp, "lastTimestamp": stamp, "count": 1,
            "action": "Notify",
        }
        try:
            self.events.create(notice.namespace, body)
        except Exception as err:
            log.warning("could not record the failed notice on %s/%s: %s", *notice.key, type(err).__name__)

    def _count(self, channel: str, kind: str, outcome: str) -> None:
        if self.metrics is not None:
            self.metrics.notifications.labels(channel, kind, outcome).inc()


def last_failure(api_client: Any, namespace: str, name: str) -> str | None:
    """The newest `NotificationFailed` Event on the notebook (what `kf-culler explain` shows)."""
    from kf_culler.kube.events import newest_message

    return newest_message(api_client, namespace, name, FAILED_EVENT)
