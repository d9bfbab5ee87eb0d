"""Notebooks slow to answer in one pass are asked first in the next (kf_culler.gather.slow_first): a
hanging endpoint's probe budget then overlaps the probing of the others instead of ending the pass.
Against the loopback fault server (tests/support/faulty.py): `hang` never answers, `ok` answers idle."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
from support.faulty import FaultyServer

from kf_culler.config import Operations
from kf_culler.gather import Gathered, Request, gather, slow_first


@pytest.fixture(scope="module")
def faulty() -> Iterator[FaultyServer]:
    with FaultyServer() as server:
        yield server


def ops(faulty: FaultyServer) -> Operations:
    return Operations.model_validate({
        "concurrency": 1, "probe": {"timeoutSeconds": 1, "connectTimeoutSeconds": 1, "retries": 0},
        "urls": {"jupyter": faulty.base + "/{name}/", "codeServer": faulty.base + "/{name}/"}})


def reqs(*names: str) -> list[Request]:
    return [Request("team-a", n, f"{n}-0", "jupyter", False) for n in names]


def test_slow_first_keeps_each_group_in_its_order() -> None:
    asked = reqs("a-ok", "b-hang", "c-ok", "d-hang")
    assert slow_first(asked, set()) == asked
    order = [r.name for r in slow_first(asked, {("team-a", "d-hang"), ("team-a", "b-hang")})]
    assert order == ["b-hang", "d-hang", "a-ok", "c-ok"]


def test_a_hanging_notebook_is_marked_slow_and_asked_first_next_pass(faulty: FaultyServer) -> None:
    asked = reqs("a-ok", "b-ok", "c-hang")

    def one_pass(slow: set[tuple[str, str]]) -> tuple[Gathered, list[str]]:
        before = len(faulty.seen)
        got = asyncio.run(gather(asked, ops(faulty), datetime.now(UTC), slow=slow))
        time.sleep(0.2)
        firsts: list[str] = []
        for seen in faulty.seen[before:]:
            name = seen.path.split("/")[1]
            if name not in firsts:
                firsts.append(name)
        return got, firsts

    first, order = one_pass(set())
    assert order == ["a-ok", "b-ok", "c-hang"]  # one worker: in the order asked
    assert first.slow == {("team-a", "c-hang")}  # a timeout took the whole 1 s budget
    assert "error" in first.observations[("team-a", "c-hang")]["jupyter"]
    second, order = one_pass(first.slow)
    assert order == ["c-hang", "a-ok", "b-ok"]
    assert second.observations[("team-a", "a-ok")]["jupyter"]["kernels"] == []
