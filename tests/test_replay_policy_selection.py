"""`kf-culler replay` chooses each notebook's policy as `kf-culler run` does (kf_culler/policy.py):
namespaceOverrides, then `rules` in order (with the namespace labels the trace recorded), then the top level.

On a synthetic fleet trace (`kf-culler fleet`), with namespace labels added to the records of some
namespaces as `kf-culler run --record` writes them (`context.namespaceLabels`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kf_culler.cli import main
from kf_culler.config import load_mapping
from kf_culler.replay.contenders import ConfiguredPolicy
from kf_culler.replay.simulate import ReplayResult, replay
from kf_culler.replay.trace import open_text

TOP = {"idleMinutes": 30, "warnMinutes": 0, "startupGraceMinutes": 5}


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("selection") / "fleet.jsonl"
    assert main(["fleet", "--notebooks", "24", "--days", "3", "--seed", "11", "--out", str(path)]) == 0
    return path


def labelled(fleet: Path, out: Path, labels: dict[str, dict[str, str]]) -> Path:
    """The trace with `context.namespaceLabels` on each notebook's first record, for the namespaces given."""
    seen: set[str] = set()
    with open_text(fleet, "r") as src, open_text(out, "w") as dst:
        for line in src:
            doc = json.loads(line)
            key = doc.get("id")
            if isinstance(key, str) and key not in seen:
                seen.add(key)
                ns = key.split("/", 1)[0]
                if ns in labels:
                    doc["context"] = {"namespaceLabels": labels[ns]}
                    line = json.dumps(doc, separators=(",", ":")) + "\n"
            dst.write(line)
    return out


def stops_by_namespace(result: ReplayResult, rule: int) -> dict[str, list[tuple[str, str]]]:
    """Each namespace's stops: (time, notebook). Not the reasons: how far back a reason says the GPU was
    idle depends on the GPU query's window, which the configuration's longest limit widens."""
    out: dict[str, list[tuple[str, str]]] = {}
    for s in result.stops[rule]:
        out.setdefault(s.id.split("/", 1)[0], []).append((s.time.isoformat(), s.id))
    return out


def test_top_level_keys_and_the_same_policy_as_a_catch_all_rule_replay_alike(fleet: Path) -> None:
    as_rule = {"idleMinutes": 600, "warnMinutes": 20, "startupGraceMinutes": 60,
               "rules": [{"name": "everyone", "match": {}, "policy": TOP}]}
    result = replay(fleet, [ConfiguredPolicy("top", load_mapping(TOP, "top")),
                            ConfiguredPolicy("rule", load_mapping(as_rule, "rule"))])
    assert result.stops[0], "the fleet must have stops for the comparison to mean something"
    assert [(s.time, s.id) for s in result.stops[0]] == [(s.time, s.id) for s in result.stops[1]]
    for key, tally in result.tallies[0].items():
        assert tally == result.tallies[1][key], key
    assert [s.reason.split(" (")[0] for s in result.stops[0]] == [s.reason.split(" (")[0] for s in result.stops[1]]
    # and the rule's own top level (600 min) would have answered differently: the rule is what was replayed
    loose = replay(fleet, [ConfiguredPolicy("loose", load_mapping({k: v for k, v in as_rule.items() if k != "rules"},
                                                                   "loose"))])
    assert len(loose.stops[0]) < len(result.stops[0])


def test_a_rule_for_one_labelled_namespace_changes_only_that_namespaces_stops(fleet: Path, tmp_path: Path) -> None:
    base = replay(fleet, [ConfiguredPolicy("top", load_mapping(TOP, "top"))])
    by_ns = stops_by_namespace(base, 0)
    targets = sorted(by_ns)[:2]
    assert len(targets) == 2, by_ns
    trace = labelled(fleet, tmp_path / "labelled.jsonl", {ns: {"tier": "long"} for ns in targets})
    ruled = {**TOP, "rules": [{"name": "long-tier", "match": {"namespaceSelector": {"matchLabels": {"tier": "long"}}},
                               "policy": {"idleMinutes": 100000}}]}
    overridden = {**TOP, "namespaceOverrides": {targets[0]: {"idleMinutes": 100000}}}
    result = replay(trace, [ConfiguredPolicy("top", load_mapping(TOP, "top")),
                            ConfiguredPolicy("ruled", load_mapping(ruled, "ruled")),
                            ConfiguredPolicy("overridden", load_mapping(overridden, "overridden"))])
    top, rule, override = (stops_by_namespace(result, i) for i in range(3))
    assert top == by_ns  # the labels alone change nothing
    for ns in set(top) | set(rule):
        if ns in targets:
            assert ns not in rule, ns  # 100,000 minutes: no stop in three days
        else:
            assert rule.get(ns) == top.get(ns), ns
    for ns in set(top) | set(override):
        assert override.get(ns) == (None if ns == targets[0] else top.get(ns)), ns
