"""Notices are shared fairly between namespaces and rate-limited per namespace (a hostile tenant's notices
wait behind their own, never everyone's)."""

from __future__ import annotations

import queue

import pytest

from kf_culler.notify.fairqueue import FairQueue, RateLimited


def test_namespaces_are_served_in_turn() -> None:
    q: FairQueue[str] = FairQueue(size=100, per_namespace=50, per_hour=1000)
    for i in range(5):
        q.put_nowait("flood", f"flood-{i}")
    q.put_nowait("team-a", "a-0")
    q.put_nowait("team-b", "b-0")
    order = [q.get(timeout=1) for _ in range(7)]
    assert order[:3] == ["flood-0", "a-0", "b-0"]  # a and b do not wait behind the flood
    assert order[3:] == ["flood-1", "flood-2", "flood-3", "flood-4"]
    with pytest.raises(queue.Empty):
        q.get(timeout=0.01)


def test_bounds_in_all_and_per_namespace() -> None:
    q: FairQueue[int] = FairQueue(size=5, per_namespace=3, per_hour=1000)
    for i in range(3):
        q.put_nowait("flood", i)
    with pytest.raises(queue.Full):
        q.put_nowait("flood", 3)  # its own share is full...
    q.put_nowait("team-a", 0)  # ...and the others still get in
    q.put_nowait("team-b", 0)
    with pytest.raises(queue.Full):
        q.put_nowait("team-c", 0)  # the whole queue is full


def test_rate_per_namespace_per_hour() -> None:
    now = [0.0]
    q: FairQueue[int] = FairQueue(size=100, per_namespace=100, per_hour=3, clock=lambda: now[0])
    for i in range(3):
        q.put_nowait("noisy", i)
    with pytest.raises(RateLimited):
        q.put_nowait("noisy", 3)
    q.put_nowait("quiet", 0)
    now[0] = 3600.0  # an hour later the first three have left the window
    q.put_nowait("noisy", 4)


def test_join_waits_for_every_notice() -> None:
    q: FairQueue[int] = FairQueue(size=10, per_namespace=10, per_hour=10)
    q.put_nowait("a", 1)
    assert q.unfinished_tasks == 1
    assert q.get(timeout=1) == 1
    q.task_done()
    q.join()
    assert q.unfinished_tasks == 0


def test_one_owners_namespaces_share_one_queue() -> None:
    """The notifier queues a notice under the tenant the pass gives (kf_culler/targets/coder.py `fairness_key`):
    one owner's notices from three namespaces of theirs share one queue's bound (queuePerNamespace 2), while a
    namespace with no owner known has its own."""
    from datetime import UTC, datetime

    from kf_culler.config import load_mapping
    from kf_culler.notify.message import Notice
    from kf_culler.notify.notifier import Notifier
    from kf_culler.targets.coder import fairness_key

    settings = load_mapping({"notifications": {"queuePerNamespace": 2}}, "test").operations.notifications
    notifier = Notifier(settings)  # not started: the queue keeps what is offered
    owners = {"proj-a": "mallory", "proj-b": "mallory", "proj-c": "mallory"}
    taken = {}
    for ns in ("proj-a", "proj-b", "proj-c", "team-x"):
        notice = Notice("warn", ns, "nb", None, "idle", "idle", "default", datetime(2026, 12, 1, tzinfo=UTC), None)
        taken[ns] = notifier.offer(notice, fairness_key((ns, "nb"), owners.get(ns)))
    assert taken == {"proj-a": True, "proj-b": True, "proj-c": False, "team-x": True}
