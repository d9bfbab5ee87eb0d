"""The sweep's shortcuts give exactly the figures of the plain replay.

A sweep chooses a notebook's policy once and keeps it while the notebook, its pod and its context stay the
same (kf_culler/replay/sweep.py `SweptPolicy.check`). The plain replay here chooses it again at every check.
Both run the same `decide` over generated fleets (several seeds, every behaviour) and over a small trace
converted from a NotebookOS-shaped template; every policy's figures must be equal, group by group.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from test_replay_convert import template

from kf_culler.cli import main
from kf_culler.config import load_mapping
from kf_culler.replay import sweep as sw
from kf_culler.replay.contenders import Check, Contender
from kf_culler.replay.simulate import replay

GRID = ["idleMinutes=15,60", "warnMinutes=0,10", "connectedGpuIdleMinutes=off,30", "busyKernelGpuIdleMinutes=off,60"]


class PlainPolicy(sw.SweptPolicy):
    """The sweep's policy with nothing kept between checks: the policy is chosen again at every check."""

    def check(self, memo: dict[str, Any], notebook: dict[str, Any], pod: dict[str, Any] | None,
              observations: dict[str, Any], now: datetime, started: datetime, context: Any) -> Check:
        memo.clear()
        return super().check(memo, notebook, pod, observations, now, started, context)


def figures(trace: Path, kind: type[sw.SweptPolicy], grouping: str | None) -> list[dict[str, Any]]:
    configs = [("current", {})] + [(sw.label(p), sw.with_point({}, p)) for p in sw.points(sw.parse_grid(GRID))]
    rules: list[Contender] = [kind(name, load_mapping(raw, name)) for name, raw in configs]
    result = replay(trace, rules, restart_delay_minutes=5)
    out = []
    for i, rule in enumerate(rules):
        assert isinstance(rule, sw.SweptPolicy)
        out.append({g: asdict(f) for g, f in sw.figures_of(result, i, rule, grouping).items()})
    return out


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_generated_fleets(tmp_path: Path, seed: int) -> None:
    trace = tmp_path / "fleet.jsonl.gz"
    assert main(["fleet", "--notebooks", "12", "--days", "2", "--seed", str(seed), "--out", str(trace)]) == 0
    fast = figures(trace, sw.SweptPolicy, "namespace")
    assert fast == figures(trace, PlainPolicy, "namespace")
    assert any(sum(f["stops"] for f in point.values()) for point in fast)  # the policies did stop notebooks


def test_a_converted_notebookos_template(tmp_path: Path) -> None:
    src, trace = tmp_path / "template.json", tmp_path / "trace.jsonl.gz"
    src.write_text(json.dumps(template()))
    assert main(["convert", str(src), "--out", str(trace), "--namespace", "adobe"]) == 0
    fast = figures(trace, sw.SweptPolicy, None)
    assert fast == figures(trace, PlainPolicy, None)
    assert any(sum(f["stops"] for f in point.values()) for point in fast)
