"""The notices' queue, shared fairly between namespaces: one tenant's flood waits behind its own notices only.

A queue per namespace, served round-robin by the one worker; a bound on all of them together
(`notifications.queueSize`) and on any one namespace (`notifications.queuePerNamespace`); and a rate per
namespace (`notifications.perNamespacePerHour`), so a notebook that keeps re-arming its notices cannot
mail or page a team's channel without end. Thread-safe; `put_nowait` never blocks the pass.

"Namespace" here is the key the notifier gives, kf_culler/targets/coder.py `fairness_key`: a session's
namespace, but a Coder workspace's Coder owner (every Coder workspace is in the admin's one namespace), and
the owner of a namespace where one is known (kf_culler/kube/tenants.py): one user's namespaces share one queue.
"""

from __future__ import annotations

import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")
HOUR = 3600.0


class RateLimited(Exception):
    """The namespace has had its share of notices this hour."""


class FairQueue(Generic[T]):
    def __init__(self, size: int, per_namespace: int, per_hour: int,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.size, self.per_namespace, self.per_hour = size, per_namespace, per_hour
        self.clock = clock
        self._queues: dict[str, deque[T]] = {}
        self._order: deque[str] = deque()  # namespaces with notices waiting, in serving order
        self._sent: dict[str, deque[float]] = {}  # when each namespace's recent notices were taken in
        self._count = 0
        self._unfinished = 0
        self._lock = threading.Lock()
        self._ready = threading.Condition(self._lock)
        self._done = threading.Condition(self._lock)

    def put_nowait(self, namespace: str, item: T) -> None:
        """Queue one notice; queue.Full when a bound is reached, RateLimited past the hourly rate."""
        with self._lock:
            now = self.clock()
            recent = self._sent.setdefault(namespace, deque())
            while recent and now - recent[0] >= HOUR:
                recent.popleft()
            if len(recent) >= self.per_hour:
                raise RateLimited(namespace)
            mine = self._queues.get(namespace)
            if self._count >= self.size or (mine is not None and len(mine) >= self.per_namespace):
                raise queue.Full
            if mine is None:
                mine = self._queues[namespace] = deque()
                self._order.append(namespace)
            mine.append(item)
            recent.append(now)
            self._count += 1
            self._unfinished += 1
            self._ready.notify()

    def get(self, timeout: float) -> T:
        """The next notice, namespaces in turn; queue.Empty after `timeout` seconds without one."""
        with self._lock:
            if not self._ready.wait_for(lambda: self._count > 0, timeout):
                raise queue.Empty
            namespace = self._order.popleft()
            mine = self._queues[namespace]
            item = mine.popleft()
            if mine:
                self._order.append(namespace)  # its next notice after every other namespace's
            else:
                del self._queues[namespace]
            self._count -= 1
            return item

    def task_done(self) -> None:
        with self._lock:
            self._unfinished -= 1
            if self._unfinished <= 0:
                self._done.notify_all()

    def join(self) -> None:
        with self._lock:
            self._done.wait_for(lambda: self._unfinished <= 0)

    @property
    def unfinished_tasks(self) -> int:
        """Notices taken in and not yet done (queued or being delivered), as queue.Queue names it."""
        with self._lock:
            return self._unfinished

    def qsize(self) -> int:
        with self._lock:
            return self._count
