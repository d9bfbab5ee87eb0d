"""`kf-culler check --compare-config FILE` (kf_culler/compare_verdicts.py): each notebook of one pass decided again
with another configuration, from the same objects and observations; its table, JSON, and a bad file's error.

The pass here is a real `Cycle` over notebooks of the scenario files, with the observations the scenarios give
(what a gather would have found); the command against a real API server is in tests/test_cli_commands.py.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from kf_culler import cli
from kf_culler.compare_verdicts import UNPROBED, compare, render, warnings_for
from kf_culler.config import load_mapping
from kf_culler.config_layers import load_layered
from kf_culler.cycle import Cycle, CycleResult, NotebookResult
from kf_culler.decide import decide
from kf_culler.replay import sweep as sw
from kf_culler.timeutil import parse_time

HERE = Path(__file__).resolve().parent
CURRENT = {"idleMinutes": 60, "warnMinutes": 10, "startupGraceMinutes": 10, "maxExtendMinutes": 0}
OTHER = {"idleMinutes": 15, "warnMinutes": 0, "startupGraceMinutes": 10, "maxExtendMinutes": 0,
         "namespaceOverrides": {"team-b": {"idleMinutes": 600}}}
SCENARIOS = ["01-jupyter-idle-kernel", "02-busy-kernel-gpu-working", "05-codeserver-closed-idle",
             "07-already-stopped", "09-warn-before-stop", "10-cpu-only-idle"]


def _scenario(name: str, namespace: str) -> dict[str, Any]:
    doc = json.loads((HERE / "scenarios" / f"{name}.json").read_text())
    doc["notebook"]["metadata"]["namespace"] = namespace
    doc["notebook"]["metadata"]["name"] = name
    return doc


def _pass(docs: list[dict[str, Any]], current: dict[str, Any]) -> tuple[CycleResult, list[Any], Cycle]:
    """A pass of the running configuration over the scenarios' notebooks at one time, as `Cycle.run` decides
    (select, then decide_view on the gathered observations)."""
    now = parse_time(docs[0]["now"])
    assert now is not None
    cycle = Cycle(load_mapping(current, "running"))
    items, results = [], []
    for doc in docs:
        nb, pod = doc["notebook"], doc.get("pod")
        sel = cycle.select(nb, pod, now)
        assert sel is not None
        verdict = decide(nb, pod, doc.get("observations") or {}, sel.policy, now)
        items.append((nb, pod))
        results.append(NotebookResult(sel.view.namespace or "", sel.view.name or "", sel.view.server_type,
                                      sel.view.gpus, dataclasses.replace(verdict, policy_rule=sel.policy_rule),
                                      doc.get("observations") or {}))
    return CycleResult(now, now, 0.1, results), items, cycle


def _docs() -> list[dict[str, Any]]:
    docs = [_scenario(n, "team-a") for n in SCENARIOS] + [_scenario("01-jupyter-idle-kernel", "team-b")]
    now = docs[0]["now"]
    assert all(d["now"] == now for d in docs)  # one pass, one time
    return docs


def test_the_other_verdict_is_decide_with_the_other_policy() -> None:
    docs = _docs()
    result, items, cycle = _pass(docs, CURRENT)
    other = load_mapping(OTHER, "other")
    rows = compare(result, items, cycle, other)
    assert len(rows) == len(docs)
    for doc, row in zip(docs, rows, strict=True):
        ns = doc["notebook"]["metadata"]["namespace"]
        policy = other.overrides.get(ns, other.policy)
        expected = decide(doc["notebook"], doc.get("pod"), doc.get("observations") or {}, policy, result.now)
        assert row.other is not None
        assert dataclasses.replace(row.other, policy_rule=None) == expected, doc["notebook"]["metadata"]["name"]
    by_name = {(r.result.namespace, r.result.name): r for r in rows}
    assert by_name[("team-a", "09-warn-before-stop")].result.verdict.action == "warn"
    assert by_name[("team-a", "09-warn-before-stop")].other.action == "stop"  # type: ignore[union-attr]
    assert by_name[("team-a", "09-warn-before-stop")].differs
    assert not by_name[("team-a", "07-already-stopped")].differs
    team_b = by_name[("team-b", "01-jupyter-idle-kernel")]
    assert team_b.other is not None and team_b.other.action == "keep"
    assert team_b.other.policy_rule == "namespaceOverrides.team-b"


def test_the_other_configurations_namespace_rules_read_the_namespaces_labels() -> None:
    """The running configuration reads no namespace labels; the other one's rule selects by them: the pass's
    cycle has no labels to give, so the comparison is given the runner's."""
    docs = _docs()
    result, items, cycle = _pass(docs, CURRENT)
    assert cycle.namespace_labels is None
    other = load_mapping({**CURRENT, "rules": [
        {"name": "research", "match": {"namespaceSelector": {"matchLabels": {"tier": "research"}}},
         "policy": {"idleMinutes": 600}}]}, "other")
    labels = {"team-a": {"tier": "research"}, "team-b": {"tier": "course"}}
    rows = compare(result, items, cycle, other, labels.get)
    assert {(r.result.namespace, r.other.policy_rule) for r in rows if r.other is not None} == {
        ("team-a", "research"), ("team-b", "default")}


def test_the_table_and_json_show_both_verdicts() -> None:
    result, items, cycle = _pass(_docs(), CURRENT)
    rows = compare(result, items, cycle, load_mapping(OTHER, "other"))
    text = render(rows, result, "table", "rec.yaml", ["a warning"])
    lines = text.splitlines()
    assert lines[0] == "# warning: a warning"
    assert lines[1].split() == ["NAMESPACE", "NAME", "GPUS", "STATE", "NEXT", "STATE", "(rec.yaml)", "NEXT",
                                "(rec.yaml)", "REASON"]
    warn = next(line for line in lines if "09-warn-before-stop" in line)
    assert "warn, stop 12:05 UTC" in warn and "stop now" in warn and " * " in warn
    assert lines[-1] == f"# {sum(r.differs for r in rows)} of {len(rows)} notebooks get another verdict with rec.yaml"
    doc = json.loads(render(rows, result, "json", "rec.yaml"))
    assert doc["compared"] == "rec.yaml"
    first = doc["notebooks"][0]
    assert set(first) == {"namespace", "name", "gpus", "differs", "current", "compared", "note"}
    assert first["current"]["action"] and first["compared"]["action"]
    assert yaml.safe_load(render(rows, result, "yaml", "rec.yaml"))["notebooks"][0]["name"] == first["name"]


def test_notebooks_the_other_configuration_leaves_out_or_would_have_probed() -> None:
    docs = [_scenario("07-already-stopped", "team-a"), _scenario("01-jupyter-idle-kernel", "team-c"),
            _scenario("08-startup-grace", "team-a")]
    for d in docs:
        d["now"] = docs[0]["now"]
    result, items, cycle = _pass(docs, {"startupGraceMinutes": 600})
    rows = compare(result, items, cycle, load_mapping({"namespaces": {"exclude": ["team-c"]},
                                                       "startupGraceMinutes": 0}, "other"))
    assert rows[1].other is None and rows[1].note == "not selected: namespaces.include/exclude" and rows[1].differs
    assert rows[2].result.verdict.state == "starting" and rows[2].other is not None
    assert rows[2].other.state != "starting" and rows[2].note == UNPROBED


def test_warnings_say_what_the_gather_did_not_cover() -> None:
    running = load_mapping({"prometheus": {"url": "http://prometheus:9090"}}, "running")
    longer = load_mapping({"prometheus": {"url": "http://prometheus:9090"}, "idleMinutes": 600}, "other")
    [gpu] = warnings_for(running, longer, "rec.yaml")
    assert "queried for 130 minutes, it needs 1210" in gpu
    other_ops = load_mapping({"prometheus": {"url": "http://other:9090"}}, "other")
    assert "other operations" in warnings_for(running, other_ops, "rec.yaml")[0]
    assert warnings_for(running, running, "rec.yaml") == []


def test_a_bad_file_names_its_key(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "rec.yaml"
    bad.write_text("idleMinutes: 30\nidleMinutse: 20\n")
    assert cli.main(["check", "--compare-config", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "kf-culler check: --compare-config:" in err and "idleMinutse" in err
    assert cli.main(["check", "--compare-config", str(tmp_path / "absent.yaml")]) == 2
    assert "absent.yaml" in capsys.readouterr().err


def test_the_sweeps_written_configuration_is_read_with_the_fragments_beside_it(tmp_path: Path) -> None:
    """What `replay --sweep --write-config` writes is a whole configuration: read as `run --config` reads it."""
    (tmp_path / "gpu.fragment.yaml").write_text("gpu:\n  utilPercent: 20\n")
    written = tmp_path / "recommended.yaml"
    sw.write_yaml(sw.with_point({"warnMinutes": 5}, {"idleMinutes": 30}), written, "a recommendation")
    settings = load_layered(written)
    assert (settings.policy.idle_minutes, settings.policy.warn_minutes) == (30, 5)
    assert settings.policy.gpu.util_percent == 20
