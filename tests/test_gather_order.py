"""Notebooks slow to answer in one pass get workers of their own in the next (kf_culler.gather): a hanging
endpoint's probe budget then never holds a worker the answering notebooks need.
Against the loopback fault server (tests/support/faulty.py): `hang` never answers, `ok` answers idle."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
from support.faulty import FaultyServer

from kf_culler.config import Operations
from kf_culler.gather import Gathered, Request, gather, split_slow


@pytest.fixture(scope="module")
def faulty() -> Iterator[FaultyServer]:
    with FaultyServer() as server:
        yield server


def ops(faulty: FaultyServer) -> Operations:
    return Operations.model_validate({
        "concurrency": 1, "probe": {"timeoutSeconds": 3, "connectTimeoutSeconds": 1, "retries": 0},
        "urls": {"jupyter": faulty.base + "/{name}/", "codeServer": faulty.base + "/{name}/"}})


def reqs(*names: str) -> list[Request]:
    return [Request("team-a", n, f"{n}-0", "jupyter", False) for n in names]


def test_split_slow_keeps_each_group_in_its_order() -> None:
    asked = reqs("a-ok", "b-hang", "c-ok", "d-hang")
    assert split_slow(asked, set()) == ([], asked)
    slow, others = split_slow(asked, {("team-a", "d-hang"), ("team-a", "b-hang")})
    assert [r.name for r in slow] == ["b-hang", "d-hang"] and [r.name for r in others] == ["a-ok", "c-ok"]


def test_a_hanging_notebook_is_marked_slow_and_holds_no_worker_next_pass(faulty: FaultyServer) -> None:
    """One worker (`concurrency: 1`): in the first pass the answering notebooks wait behind the hanging
    one; once it is known slow, both answering notebooks are asked while it still hangs."""
    asked = reqs("c-hang", "a-ok", "b-ok")

    async def one_pass(slow: set[tuple[str, str]]) -> tuple[Gathered, bool]:
        before = len(faulty.seen)
        task = asyncio.ensure_future(gather(asked, ops(faulty), datetime.now(UTC), slow=slow))
        # every request of the pass but the hanging one's: c-hang's api/status, then 3 for each ok notebook
        while len(faulty.seen) - before < 7 and not task.done():
            await asyncio.sleep(0.02)
        others_while_hanging = not task.done()
        return await task, others_while_hanging

    first, overlapped = asyncio.run(one_pass(set()))
    assert not overlapped  # the ok notebooks were asked only after the hanging probe gave up
    assert first.slow == {("team-a", "c-hang")}  # a timeout took the whole budget
    assert "error" in first.observations[("team-a", "c-hang")]["jupyter"]
    second, overlapped = asyncio.run(one_pass(first.slow))
    assert overlapped  # both ok notebooks were read while the hanging one was still being waited for
    assert second.observations[("team-a", "a-ok")]["jupyter"]["kernels"] == []
    assert "error" in second.observations[("team-a", "c-hang")]["jupyter"]
    assert second.slow == {("team-a", "c-hang")}


def test_ctrl_c_during_a_gather_leaves_it_at_once(faulty: FaultyServer) -> None:
    """SIGINT while a pass waits on a hanging endpoint raises KeyboardInterrupt out of the pass's loop (the
    demo's Ctrl-C), and the loop is closed with nothing of the gather left running."""
    import os
    import signal
    import threading

    from kf_culler.cycle import run_async

    loops: list[asyncio.AbstractEventLoop] = []

    async def probe_hanging() -> Gathered:
        loops.append(asyncio.get_running_loop())
        return await gather(reqs("z-hang"), ops(faulty), datetime.now(UTC))

    # SIGINT as in a terminal (a background test run may have inherited it ignored)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    timer = threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGINT))
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            run_async(probe_hanging())  # the hang lasts the 3 s budget; Ctrl-C comes after 0.5 s
    finally:
        timer.cancel()
        signal.signal(signal.SIGINT, previous)
    assert loops and loops[0].is_closed()


def test_a_pass_returns_its_slow_notebooks_and_the_next_pass_given_them_does_not_wait_behind_them(
        faulty: FaultyServer) -> None:
    """(A pass asks in name order, so the hanging notebook comes first.) The cycle keeps no memory of its own:
    a pass's CycleResult carries the notebooks that were slow, and the
    next Cycle, given them (as the Runner does), asks the answering notebooks while the hanging one is waited for."""
    import threading

    from kf_culler.config import load_mapping
    from kf_culler.cycle import Cycle, CycleResult
    from kf_culler.local import objects as obj

    budget = 5  # the hanging probe holds its worker this long
    settings = load_mapping({
        "namespaces": {"include": ["team-a"]}, "idleMinutes": 1, "warnMinutes": 0, "startupGraceMinutes": 0,
        "concurrency": 1, "probe": {"timeoutSeconds": budget, "connectTimeoutSeconds": 1, "retries": 0},
        "urls": {"jupyter": faulty.base + "/{name}/", "codeServer": faulty.base + "/{name}/"}}, "test")
    started = "2026-01-01T00:00:00Z"
    items: list[tuple[dict[str, object], dict[str, object] | None]] = []
    for name in ("a-hang", "b-ok", "c-ok"):
        nb = obj.notebook(name)
        nb["metadata"]["namespace"] = "team-a"
        items.append((nb, {"metadata": {"name": f"{name}-0", "namespace": "team-a"},
                           "status": {"phase": "Running", "startTime": started}}))

    def one_pass(slow: frozenset[tuple[str, str]]) -> tuple[CycleResult, bool]:
        """The pass, and whether all 7 requests but the hanging one's came while that probe still held its
        worker (one worker: in a pass that puts the hanging notebook first, they can only come after it)."""
        before = len(faulty.seen)
        done: list[CycleResult] = []
        worker = threading.Thread(target=lambda: done.append(Cycle(settings, slow=slow).run(items)))
        t0 = time.monotonic()
        worker.start()
        while len(faulty.seen) - before < 7 and worker.is_alive():
            time.sleep(0.02)
        overlapped = len(faulty.seen) - before >= 7 and time.monotonic() - t0 < budget
        worker.join()
        return done[0], overlapped

    first, overlapped = one_pass(frozenset())
    assert not overlapped and first.slow == {("team-a", "a-hang")}
    second, overlapped = one_pass(first.slow)
    assert overlapped  # the answering notebooks were read while the hanging one was still waited for
    assert second.slow == {("team-a", "a-hang")}
    assert {r.name: r.verdict.state for r in second.results}["b-ok"] == "idle"
