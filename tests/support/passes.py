"""A runner's passes as `run`'s loop runs them (kf_culler/runner.py `Runner.loop`): each pass is given the memory the
last one returned. Everything else is the runner's (`Passes(build_runner(...)).cache` is the runner's cache)."""

from __future__ import annotations

import dataclasses
from typing import Any

from kf_culler.cycle import CycleResult, Memory
from kf_culler.runner import Runner


class Passes:
    def __init__(self, runner: Runner) -> None:
        self.runner = runner
        self.last: CycleResult | None = None  # the last pass's result

    @property
    def memory(self) -> Memory:
        """What the last pass remembers for the next (Memory() before a first pass)."""
        return self.last.memory if self.last is not None else Memory()

    def change(self, **changes: Any) -> None:
        """The same runner with `changes` (a Runner is frozen: a new value, the same collaborators); the memory is
        kept."""
        self.runner = dataclasses.replace(self.runner, **changes)

    def once(self, wait_events: bool = True) -> CycleResult:
        self.last = self.runner.once(self.memory, wait_events)
        return self.last

    def __getattr__(self, name: str) -> Any:
        return getattr(self.runner, name)

    def __enter__(self) -> Passes:
        self.runner.start_cache()
        return self

    def __exit__(self, *exc: object) -> None:
        self.runner.close()
