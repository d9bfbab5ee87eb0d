"""The Grafana dashboard reads the metrics the culler really exports, with PromQL that Prometheus accepts
and that computes what the panel titles say (evaluated by `promtool test rules` on synthetic series)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from need import missing

from kf_culler.metrics import Metrics

ROOT = Path(__file__).resolve().parent.parent
DASHBOARD = ROOT / "kustomize" / "grafana-dashboard.json"
# The metric families the culler exports (issue 5), as they appear in queries.
FAMILIES = {
    "kf_culler_notebooks": "gauge", "kf_culler_stops_total": "counter", "kf_culler_warnings_total": "counter",
    "kf_culler_probe_seconds": "histogram", "kf_culler_probe_errors_total": "counter",
    "kf_culler_cycle_seconds": "histogram", "kf_culler_api_writes_total": "counter",
    "kf_culler_gpu_hours_reclaimed_total": "counter", "kf_culler_leader": "gauge",
}


def promtool() -> str:
    """promtool's path; without it the test skips, or fails in CI (hack/setup.sh installs it)."""
    path = shutil.which("promtool")
    if path is None:
        missing("promtool", "not on PATH (it comes with the Debian package prometheus)")
    return path


def dashboard() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    return data


def panels() -> list[dict[str, Any]]:
    return [p for p in dashboard()["panels"] if p["type"] != "row"]


def exprs() -> list[str]:
    return [t["expr"] for p in panels() for t in p["targets"]]


def concrete(expr: str) -> str:
    """Grafana's variables replaced by values Prometheus understands."""
    return (expr.replace("$__rate_interval", "5m").replace("$__range", "1h")
            .replace('"$namespace"', '".*"'))


def series_names(expr: str) -> set[str]:
    return set(re.findall(r"\bkf_culler_[a-z_]+", expr))


def test_dashboard_is_valid_grafana_json() -> None:
    d = dashboard()
    assert d["uid"] == "kf-culler" and d["title"]
    ids = [p["id"] for p in d["panels"]]
    assert len(ids) == len(set(ids))
    for p in d["panels"]:
        g = p["gridPos"]
        assert g["x"] >= 0 and g["x"] + g["w"] <= 24 and g["h"] > 0
    variables = {v["name"] for v in d["templating"]["list"]}
    assert {"datasource", "namespace"} <= variables
    for p in panels():
        assert p["targets"], p["title"]
        assert p["datasource"]["uid"] == "${datasource}"


def test_every_query_uses_exported_metric_names() -> None:
    allowed = set()
    for name, kind in FAMILIES.items():
        allowed |= {f"{name}_bucket", f"{name}_sum", f"{name}_count"} if kind == "histogram" else {name}
    used = set().union(*(series_names(e) for e in exprs()))
    assert used <= allowed, used - allowed
    for name in FAMILIES:  # every metric has a panel
        assert any(u == name or u.startswith(name + "_") for u in used), name


def test_metric_names_match_what_the_culler_exposes() -> None:
    from prometheus_client.parser import text_string_to_metric_families

    m = Metrics()
    m.notebooks.labels("idle").set(1)
    m.stops.labels("idle").inc()
    m.warnings.labels("idle").inc()
    m.probe_seconds.labels("jupyter").observe(0.1)
    m.probe_errors.labels("jupyter").inc()
    m.cycle_seconds.observe(1.0)
    m.api_writes.labels("patch").inc()
    m.gpu_hours.inc(0.5)
    m.leader.set(1)
    exposed: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(m.render().decode()):
        for s in family.samples:
            exposed.setdefault(s.name, set()).update(s.labels)
    for expr in exprs():
        for name in series_names(expr):
            assert name in exposed, f"{name} is not exported"
            for label in re.findall(r"by \(([^)]*)\)", expr):
                for key in (k.strip() for k in label.split(",")):
                    if key not in ("le", "pod", "namespace") and any(
                            n in exposed and key not in exposed[n] for n in series_names(expr)):
                        pytest.fail(f"{expr}: {name} has no label {key}")


def promtool_test(tmp_path: Path, tests: list[dict[str, Any]]) -> subprocess.CompletedProcess[str]:
    tool = promtool()
    path = tmp_path / "dashboard_test.yaml"
    path.write_text(yaml.safe_dump({"rule_files": [], "evaluation_interval": "1m", "tests": tests}))
    return subprocess.run([tool, "test", "rules", str(path)], capture_output=True, text=True, timeout=120)


def test_every_query_parses(tmp_path: Path) -> None:
    tool = promtool()
    rules = {"groups": [{"name": "dashboard", "rules": [
        {"record": f"dashboard:query_{i}", "expr": concrete(e)} for i, e in enumerate(exprs())]}]}
    path = tmp_path / "rules.yaml"
    path.write_text(yaml.safe_dump(rules))
    proc = subprocess.run([tool, "check", "rules", str(path)], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def panel_expr(title: str) -> str:
    """The panel's query, rounded to 1/1000 (promtool compares floats exactly)."""
    (panel,) = [p for p in panels() if p["title"] == title]
    (target,) = panel["targets"]
    return f"round({concrete(target['expr'])}, 0.001)"


def test_queries_compute_what_their_panels_say(tmp_path: Path) -> None:
    promtool()  # before building the series: a missing promtool says so first
    ns = 'namespace="kubeflow"'
    series = [
        # Two replicas: only the leader says 1; both report the same state counts.
        {"series": f'kf_culler_leader{{{ns}, pod="a"}}', "values": "1x70"},
        {"series": f'kf_culler_leader{{{ns}, pod="b"}}', "values": "0x70"},
        {"series": f'kf_culler_notebooks{{{ns}, pod="a", state="idle"}}', "values": "4x70"},
        {"series": f'kf_culler_notebooks{{{ns}, pod="b", state="idle"}}', "values": "4x70"},
        # 2 stops per 10 minutes for one rule: 12 in the last hour.
        {"series": f'kf_culler_stops_total{{{ns}, pod="a", reason_rule="idle"}}', "values": "0+0.2x70"},
        # 1 probe in 10 answers nothing.
        {"series": f'kf_culler_probe_seconds_count{{{ns}, pod="a", source="jupyter"}}', "values": "0+600x70"},
        {"series": f'kf_culler_probe_errors_total{{{ns}, pod="a", source="jupyter"}}', "values": "0+60x70"},
        # Three GPUs kept stopped the whole time: 3 GPU-hours per hour.
        {"series": f'kf_culler_gpu_hours_reclaimed_total{{{ns}, pod="a"}}', "values": "0+0.05x70"},
    ]
    checks = [
        (panel_expr("Leaders"), 1),
        (panel_expr("Idle notebooks now"), 4),
        (panel_expr("Notebooks stopped"), 12),
        (panel_expr("GPU-hours reclaimed"), 3),
        (panel_expr("GPUs held back from idle notebooks"), 3),
    ]
    expr_tests: list[dict[str, Any]] = [
        {"expr": e, "eval_time": "65m", "exp_samples": [{"labels": "{}", "value": v}]} for e, v in checks]
    expr_tests.append({
        "expr": panel_expr("Probe errors by source"), "eval_time": "65m",
        "exp_samples": [{"labels": '{source="jupyter"}', "value": 0.1}]})
    expr_tests.append({
        "expr": panel_expr("Notebooks by state"), "eval_time": "65m",
        "exp_samples": [{"labels": '{state="idle"}', "value": 4}]})
    proc = promtool_test(tmp_path, [{"interval": "1m", "input_series": series,
                                     "promql_expr_test": expr_tests}])
    assert proc.returncode == 0, proc.stdout + proc.stderr
