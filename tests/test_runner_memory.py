"""The Runner is built once, complete, and frozen; what a pass remembers for the next is the `Memory` it returns,
given to the next pass (kf_culler/runner.py). No cluster: the runner's watch cache is a stand-in."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime
from typing import Any

import pytest
from kubernetes.client import ApiClient

from kf_culler.brakes import BrakeState
from kf_culler.config import load_mapping
from kf_culler.cycle import Cycle, CycleResult, Memory
from kf_culler.model import STOP_ANNOTATION
from kf_culler.runner import Runner, build_runner

NOW = datetime(2026, 11, 29, 12, tzinfo=UTC)


def stopped(name: str) -> dict[str, Any]:
    return {"apiVersion": "kubeflow.org/v1", "kind": "Notebook",
            "metadata": {"name": name, "namespace": "team", "uid": f"uid-{name}",
                         "creationTimestamp": "2026-11-28T12:00:00Z",
                         "annotations": {STOP_ANNOTATION: "2026-11-29T10:00:00Z"}}}


class _Cache:
    """What a pass reads of the watch cache: two stopped notebooks, no pods, no records, no Nodes."""

    reads_nodes = False
    endpoints = False
    synced = True
    orphans: tuple[Any, ...] = ()

    def snapshot(self) -> list[tuple[dict[str, Any], dict[str, Any] | None]]:
        return [(stopped("a"), None), (stopped("b"), None)]

    def start(self) -> bool:
        return False

    def close(self) -> None:
        pass

    def record_objects(self) -> list[Any]:
        return []

    def record_notebook(self, nb: dict[str, Any]) -> None:
        pass

    def service_problem(self, nb: dict[str, Any]) -> str | None:
        return None

    def service_address(self, nb: dict[str, Any]) -> tuple[str, str] | None:
        return None

    def objects(self, name: str) -> dict[Any, Any]:
        return {}


def _runner() -> Runner:
    settings = load_mapping({"namespaces": {"include": ["team"]}}, "test")
    built = build_runner(settings, ApiClient(), dry_run=True, records_namespace="culler", clock=lambda: NOW)
    # the stand-in cache, and every namespace its own owner (no API server to read Profiles from)
    return dataclasses.replace(built, cache=_Cache(), namespace_owners=lambda _ns: None)


def test_a_built_runner_is_complete_and_frozen() -> None:
    runner = build_runner(load_mapping({}, "test"), ApiClient(), records_namespace="culler")
    for f in dataclasses.fields(runner):
        if f.name not in {"writer", "coder", "notifier", "on_cycle", "on_result", "on_event", "owns",
                          "held_shards", "on_observed"}:  # None: not asked for
            assert getattr(runner, f.name) is not None, f.name
    assert runner.writer is not None and runner.coder is None
    with pytest.raises(dataclasses.FrozenInstanceError):
        runner.on_result = lambda _r: None  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        runner.cache = None  # type: ignore[misc]
    assert build_runner(load_mapping({}, "test"), ApiClient(), one_off=True).writer is None


def test_two_passes_carry_their_memory_through_the_returned_value(monkeypatch: pytest.MonkeyPatch) -> None:
    given: list[tuple[BrakeState, frozenset[tuple[str, str]]]] = []
    run = Cycle.run

    def spied(cycle: Cycle, items: Any, lean: bool = False) -> CycleResult:
        given.append((cycle.brake_state, cycle.slow))
        return run(cycle, items, lean)

    monkeypatch.setattr(Cycle, "run", spied)
    runner = _runner()
    first = runner.once()
    assert [r.verdict.state for r in first.results] == ["stopped", "stopped"]
    assert first.memory.cycles == 1 and first.items == runner.cache.snapshot()
    assert first.brakes is not None and first.memory.brake_state is first.brakes.state
    assert set(first.memory.brake_state.last) == {("team", "a"), ("team", "b")}  # what the brakes saw
    slow = frozenset({("team", "a")})  # as if "a" had been slow to answer
    second = runner.once(dataclasses.replace(first.memory, slow=slow))
    assert given[0] == (BrakeState(), frozenset())  # a first pass remembers nothing
    assert given[1] == (first.memory.brake_state, slow)  # the second is given what the first returned
    assert second.memory.cycles == 2 and second.memory.last_cycle_end >= first.memory.last_cycle_end
    assert runner.once().memory.cycles == 1  # without the memory: a first pass again
    assert given[2] == (BrakeState(), frozenset())


def test_a_memory_is_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        Memory().cycles = 3  # type: ignore[misc]


class _Unread(list[tuple[dict[str, Any], None]]):
    """A pass's sessions that fail the test when read."""

    def __iter__(self) -> Any:
        raise AssertionError("the sessions were read")


def test_the_sessions_are_indexed_for_events_about_pods_only_when_one_is_told() -> None:
    """The Events about a GPU pod a stop cannot reach, or a contested GPU series, name the Notebook of the pod: the
    pass's sessions are indexed by name for them only when there is one to tell, not each pass."""
    from kf_culler.runner import _NamedLikePods

    _NamedLikePods(_Unread())  # made each pass: reads nothing until asked
    workspace = {"apiVersion": "kubeflow.org/v1beta1", "kind": "Workspace",
                 "metadata": {"name": "b", "namespace": "team"}}
    named = _NamedLikePods([(stopped("a"), None), (workspace, None)])
    assert named.get(("team", "a")) == stopped("a")
    assert named.get(("team", "b")) is None  # a Workspace's pods are not named like it
    with pytest.raises(AssertionError, match="read"):
        _NamedLikePods(_Unread()).get(("team", "a"))
