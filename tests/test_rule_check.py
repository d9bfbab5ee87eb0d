"""Policy rules any user can opt into (kf_culler/rule_check.py): a rule that loosens the top-level policy
and matches only on keys a notebook's owner can write is warned about by `check` and at `run`'s start
(docs/configuration.md, "Who controls a match key")."""

from __future__ import annotations

import argparse
import logging
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from kf_culler import cli, service
from kf_culler.config import load_mapping
from kf_culler.cycle import CycleResult
from kf_culler.rule_check import loosened_keys, loosening_rule_warnings

LABELLED = {"notebookSelector": {"matchLabels": {"example.com/keep-long": "true"}}}
NAMESPACE = {"namespaceSelector": {"matchLabels": {"culler.example.com/tier": "research"}}}


def warnings_for(match: dict[str, Any], policy: dict[str, Any], top: dict[str, Any] | None = None) -> list[str]:
    cfg = {"idleMinutes": 60, **(top or {}), "rules": [{"name": "long-for-labelled", "match": match, "policy": policy}]}
    return loosening_rule_warnings(load_mapping(cfg, "test"))


def test_loosening_rule_on_notebook_labels_only_is_named() -> None:
    assert warnings_for(LABELLED, {"idleMinutes": 600}, {"noSignalGpuIdleMinutes": 120}) == [
        "rule 'long-for-labelled' loosens idleMinutes (600 > 60) and matches only on keys a notebook's owner can "
        "write (notebookSelector): any user can opt into it; add a namespaceSelector"]


def test_derived_no_signal_limit_is_named_as_derived() -> None:
    [warning] = warnings_for(LABELLED, {"idleMinutes": 600})
    assert "idleMinutes (600 > 60), noSignalGpuIdleMinutes (1200 > 120, twice idleMinutes)" in warning


def test_a_namespace_selector_makes_it_admin_controlled() -> None:
    assert warnings_for({**LABELLED, **NAMESPACE}, {"idleMinutes": 600}) == []


def test_a_stricter_rule_is_fine() -> None:
    assert warnings_for(LABELLED, {"idleMinutes": 30}) == []


def test_server_types_only() -> None:
    [warning] = warnings_for({"serverTypes": ["group-one"]}, {"allowExempt": True})
    assert warning.startswith("rule 'long-for-labelled' loosens allowExempt (true, top level false) and matches "
                              "only on keys a notebook's owner can write (serverTypes):")


def test_gpu_models_are_not_owner_writable() -> None:
    assert warnings_for({"gpuModels": ["NVIDIA-A100*"]}, {"idleMinutes": 600}) == []
    assert warnings_for({**LABELLED, "gpu": True}, {"idleMinutes": 600}) == []


def test_an_empty_match_is_an_admin_choice() -> None:
    assert warnings_for({}, {"idleMinutes": 600}) == []


def test_null_max_running_where_top_level_has_a_number() -> None:
    [warning] = warnings_for({**LABELLED, "gpuResources": ["nvidia.com/mig-1g.5gb"]},
                             {"maxRunningMinutes": None}, {"maxRunningMinutes": 480})
    assert warning == (
        "rule 'long-for-labelled' loosens maxRunningMinutes (null: off, top level 480) and matches only on keys a "
        "notebook's owner can write (notebookSelector, gpuResources): any user can opt into it; add a "
        "namespaceSelector")


@pytest.mark.parametrize(("top", "rule", "expected"), [
    ({"connectedGpuIdleMinutes": 60}, {"connectedGpuIdleMinutes": 90}, "connectedGpuIdleMinutes (90 > 60)"),
    ({"busyKernelGpuIdleMinutes": 60}, {"busyKernelGpuIdleMinutes": None},
     "busyKernelGpuIdleMinutes (null: off, top level 60)"),
    ({"noSignalGpuIdleMinutes": 120}, {"noSignalGpuIdleMinutes": None},
     "noSignalGpuIdleMinutes (null: off, top level 120)"),
    ({"brokenMinutes": 30}, {"brokenMinutes": 45}, "brokenMinutes (45 > 30)"),
    ({"brokenMinutes": 30, "brokenAction": "stop"}, {"brokenAction": "report"},
     "brokenAction (report, top level stop)"),
    ({}, {"maxExtendMinutes": 60}, "maxExtendMinutes (60 > 0)"),
    ({}, {"startupGraceMinutes": 30}, "startupGraceMinutes (30 > 10)"),
    ({"noSignal": {"action": "stop", "afterMinutes": 120}}, {"noSignal": {"action": "keep"}},
     "noSignal.action (keep, top level stop)"),
    ({"noSignal": {"action": "stop", "afterMinutes": 120}}, {"noSignal": {"action": "stop", "afterMinutes": 240}},
     "noSignal.afterMinutes (240 > 120)"),
    ({"gpuWithoutMetrics": "ide-only"}, {"gpuWithoutMetrics": "keep"}, "gpuWithoutMetrics (keep, top level ide-only)"),
    ({}, {"gpu": {"utilPercent": 1}}, "gpu.utilPercent (1 < 5)"),
    ({}, {"gpu": {"memoryMiB": 64}}, "gpu.memoryMiB (64 < 256)"),
])
def test_each_loosened_key(top: dict[str, Any], rule: dict[str, Any], expected: str) -> None:
    settings = load_mapping({**top, "rules": [{"name": "r", "policy": rule}]}, "test")
    assert loosened_keys(settings.rules[0].policy, settings.policy) == [expected]


@pytest.mark.parametrize(("top", "rule"), [
    ({}, {"maxRunningMinutes": 480}),  # a cap where there was none
    ({}, {"connectedGpuIdleMinutes": None}),  # off at both
    ({"noSignalGpuIdleMinutes": None}, {"warnMinutes": 30, "noSignalGpuIdleMinutes": None}),
    ({"noSignalGpuIdleMinutes": 120}, {"idleMinutes": 30}),  # an explicit limit is not twice idleMinutes
    ({}, {"gpu": {"utilPercent": 20, "memoryMiB": 1024}}),  # less counts as work
    ({"noSignal": {"action": "keep", "afterMinutes": 60}}, {"noSignal": {"action": "keep", "afterMinutes": 600}}),
    ({}, {"warnMinutes": 60}),
])
def test_not_looser(top: dict[str, Any], rule: dict[str, Any]) -> None:
    settings = load_mapping({**top, "rules": [{"name": "r", "policy": rule}]}, "test")
    assert loosened_keys(settings.rules[0].policy, settings.policy) == []


CONFIG = {"prometheus": {"url": "http://prometheus:9090"}, "noSignalGpuIdleMinutes": 120,
          "rules": [{"name": "long-for-labelled", "match": LABELLED, "policy": {"idleMinutes": 600}}]}


class _FakeRunner:
    def __init__(self) -> None:
        self.settings = load_mapping(CONFIG, "test")
        self.cache = None

    def once(self) -> CycleResult:
        now = datetime(2026, 11, 29, 12, tzinfo=UTC)
        return CycleResult(now, now, 0.1, [])

    def close(self) -> None:
        pass

    def policy_of(self, notebook: dict[str, Any]) -> Any:
        return self.settings.policy


def test_check_prints_the_warnings(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(cli, "_synced_runner", lambda args: _FakeRunner())
    assert cli.cmd_check(argparse.Namespace(output="table", compare_config=None)) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith("# warning: rule 'long-for-labelled' loosens idleMinutes (600 > 60)")


class _Stop(Exception):
    pass


def test_run_logs_the_warnings_at_start(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    def stop() -> None:
        raise _Stop

    monkeypatch.setattr(service, "setup_logging", lambda json_logs: None)
    monkeypatch.setattr(service, "setup_tracing", stop)  # right after the start-up warnings
    with caplog.at_level(logging.WARNING, logger="kf_culler"), pytest.raises(_Stop):
        service.serve(load_mapping(CONFIG, "test"), None, service.Options())
    [warning] = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warning.startswith("rule 'long-for-labelled' loosens idleMinutes (600 > 60) and matches only on keys")


def test_the_documented_example_warns_about_nothing() -> None:
    text = (Path(__file__).resolve().parents[1] / "docs" / "configuration.md").read_text()
    example = text.split("### Policy rules", 1)[1].split("```yaml\n", 1)[1].split("```", 1)[0]
    assert "rules:" in example
    assert loosening_rule_warnings(load_mapping(yaml.safe_load(example), "docs")) == []
