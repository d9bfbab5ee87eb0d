"""`replaced` (kf_culler/frozen.py) makes what `dataclasses.replace` makes: for the views, selections and verdicts a
pass copies, and for classes whose `__init__` does more than store fields (where it is `replace` itself)."""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import InitVar, dataclass, field
from datetime import UTC, datetime

import pytest

from kf_culler.config import load_mapping
from kf_culler.decide import decide_view
from kf_culler.frozen import replaced
from kf_culler.local import objects as obj
from kf_culler.policy import selection

NOW = datetime(2026, 12, 7, 12, tzinfo=UTC)


def _same(a: object, b: object) -> None:
    assert type(a) is type(b) and a == b
    assert vars(a) == vars(b)


def test_a_pass_copies_are_what_replace_makes() -> None:
    settings = load_mapping({"idleMinutes": 60}, "test")
    nb = obj.notebook("nb", gpus=1)
    nb["metadata"]["namespace"] = "team"
    pod = {"metadata": {"name": "nb-0", "namespace": "team"}, "status": {"phase": "Running",
                                                                         "startTime": "2026-12-07T09:00:00Z"}}
    sel = selection(nb, pod, settings)
    for changes in ({"pod": None}, {"record": None, "stop_deadline_seconds": 600.0}, {"pod": pod, "gpus": 3}):
        _same(replaced(sel.view, **changes), dataclasses.replace(sel.view, **changes))
    _same(replaced(sel, view=replaced(sel.view, pod=None)), dataclasses.replace(sel, view=dataclasses.replace(
        sel.view, pod=None)))
    verdict = decide_view(sel.view, {}, sel.policy, NOW)
    _same(replaced(verdict, policy_rule="rule"), dataclasses.replace(verdict, policy_rule="rule"))
    copy = replaced(sel.view, pod=None)
    assert copy is not sel.view and sel.view.pod is pod and copy.pod is None  # the original is unchanged
    with pytest.raises(dataclasses.FrozenInstanceError):
        copy.gpus = 2  # type: ignore[misc]
    with pytest.raises(TypeError, match="'pods'"):
        replaced(sel.view, pods=None)


@dataclass(frozen=True)
class _Derived:
    a: int
    twice: int = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "twice", 2 * self.a)


@dataclass(frozen=True)
class _WithInitVar:
    a: int
    scale: InitVar[int] = 1


@dataclass(frozen=True)
class _Cached:
    a: int

    @functools.cached_property
    def twice(self) -> int:
        return 2 * self.a


def test_classes_whose_init_does_more_are_copied_by_replace() -> None:
    assert replaced(_Derived(1), a=5).twice == 10
    assert replaced(_WithInitVar(1), a=5) == _WithInitVar(5)
    cached = _Cached(1)
    assert cached.twice == 2
    assert replaced(cached, a=5).twice == 10  # not the copied cache
