"""A pass's Events, sent after its patches: a storm's stops are all written before the first of their Events.

Half of a storm pass's writes were its Events (7,109 stops, 7,109 Events), sent by the same writers as the
patches, so the last stop waited for the Events of the others. A pass now leaves each Event in its write
(`Writer.apply(..., defer_event=True)`) and hands them all here once its patches are done; they go out
`writesInFlight` at once, in a thread of their own, while the culler waits for its next pass (the Runner waits
for the previous pass's Events before it starts one: two passes' Events never race).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Generic, Protocol, TypeVar

from kf_culler.kube.writer import Writer, WriteResult

log = logging.getLogger(__name__)


class _Written(Protocol):
    """What the tail reads of a pass's result (kf_culler/cycle.py `NotebookResult`)."""

    namespace: str
    name: str
    write: WriteResult | None


R = TypeVar("R", bound=_Written)


# At most this many Events wait for a later pass after failing (the oldest are given up, with a log line).
MAX_UNSENT = 10_000


class EventTail(Generic[R]):
    """Sends the pending Events of a pass's results, and first those of earlier passes that could not be sent
    (`resend`); `wait` until they are all sent (or tried). Those that failed for a reason that may pass (the API
    server down) are `unsent` then, for the next pass."""

    def __init__(self, writer: Writer, results: Sequence[R], workers: int,
                 on_event: Callable[[R], None] | None = None,
                 resend: Sequence[R] = ()) -> None:
        self.pending = [r for r in (*resend, *results) if r.write is not None and r.write.pending is not None]
        if len(self.pending) > MAX_UNSENT:
            log.warning("giving up %d Events that could not be sent", len(self.pending) - MAX_UNSENT)
            self.pending = self.pending[-MAX_UNSENT:]
        self._writer, self._workers, self._on_event = writer, max(1, workers), on_event
        self._done = threading.Event()
        self.seconds: float | None = None  # how long sending took, once done
        if not self.pending:
            self.seconds = 0.0
            self._done.set()
            return
        threading.Thread(target=self._send_all, name="events", daemon=True).start()

    def _send_one(self, r: R) -> None:
        try:
            if r.write is not None:
                self._writer.send_event(r.write)
            if self._on_event is not None:
                self._on_event(r)
        except Exception:  # one Event's failure is reported by its result, never the others'
            log.exception("the Event for %s/%s failed", r.namespace, r.name)

    def _send_all(self) -> None:
        t0 = time.monotonic()
        try:
            if self._workers == 1:
                for r in self.pending:
                    self._send_one(r)
            else:
                with ThreadPoolExecutor(max_workers=self._workers, thread_name_prefix="event") as pool:
                    list(pool.map(self._send_one, self.pending))
        finally:
            self.seconds = time.monotonic() - t0
            # keep only the results to send again: a pass's memory holds this tail through the next pass
            self.pending = [r for r in self.pending if r.write is not None and r.write.pending is not None]
            self._done.set()

    def wait(self, timeout: float | None = None) -> bool:
        """Whether every Event was sent (or tried) within `timeout` seconds (None: however long it takes)."""
        return self._done.wait(timeout)

    @property
    def done(self) -> bool:
        return self._done.is_set()

    @property
    def unsent(self) -> list[R]:
        """Once done: the results whose Event failed for a reason that may pass, to be sent again."""
        return [r for r in self.pending if r.write is not None and r.write.pending is not None] if self.done else []
