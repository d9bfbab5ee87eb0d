"""Untrusted text stays text: what a profile user writes (annotations, their server's answers, and through
them parts of the verdict reason) reaches Slack, Teams, the admin's terminal and error texts, and there it
neither formats, links, pings nor repaints, and it is cut to a documented length (kf_culler/text.py).
Configured URLs never carry credentials and never appear in a notebook's reason. Pure and fast.
"""

from __future__ import annotations

import copy
import json
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

from kf_culler import text
from kf_culler.config import ConfigError, PrometheusSettings, load_mapping
from kf_culler.cycle import CycleResult, NotebookResult
from kf_culler.model import KEEP_UNTIL_ANNOTATION, SERVER_TYPE_ANNOTATION, Verdict
from kf_culler.notify.message import Notice, payload, render, slack_escape, teams_escape
from kf_culler.report import explain, table
from kf_culler.report import render as report
from kf_culler.scenario import verdict_for_document
from kf_culler.sources.gpu import PrometheusGpu
from kf_culler.sources.http import Call
from kf_culler.sources.prometheus import url_problem, without_url
from kf_culler.stopped import LongStopped

ROOT = Path(__file__).resolve().parents[1]
NOW = datetime(2026, 12, 1, 12, tzinfo=UTC)
MARKUP = ("<!channel> <https://x|y> & *bold* <@U123> <!here> _it_ [click](https://evil) `code` "
          "{{DATE(2017-02-14T06:00:00Z)}}")
TERMINAL = "\x1b[2J\x1b]0;pwned\x07\r\x08\x9b31m\x7f\u202e\u2028"
RAW_CONTROLS = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069\u2028\u2029]")


def notice(kind: str = "warn", reason: str = MARKUP, **kw: Any) -> Notice:
    base: dict[str, Any] = {"kind": kind, "namespace": "team-a", "name": "nb-1", "uid": "u-1", "reason": reason,
                            "state": "idle", "rule_id": "9-idle", "at": NOW, "stop_at": NOW + timedelta(minutes=10),
                            "max_extend_minutes": 60}
    return Notice(**{**base, **kw})


def doc(n: Notice, fmt: str, dashboard: str | None = None) -> dict[str, Any]:
    out: dict[str, Any] = json.loads(payload(n, fmt, dashboard_url=dashboard))
    return out


def strings(node: object) -> list[str]:
    """Every string in a decoded JSON document."""
    if isinstance(node, str):
        return [node]
    if isinstance(node, dict):
        return [s for v in node.values() for s in strings(v)]
    if isinstance(node, list):
        return [s for v in node for s in strings(v)]
    return []


# --- kf_culler/text.py ---------------------------------------------------------------------------


def test_clean_cuts_and_makes_controls_visible() -> None:
    assert text.clean("a\x1b[2Jb\tc\x07\r\x9b", 100) == "a\\x1b[2Jb c\\x07\\x0d\\x9b"
    assert text.clean("one\ntwo", 100) == "one\\x0atwo" and text.clean("one\ntwo", 100, newlines=True) == "one\ntwo"
    assert text.clean("\u202eevil\u2028", 100) == "\\u202eevil\\u2028"
    assert text.clean("x" * 50, 40) == "x" * 39 + "…" and len(text.cut("y" * 5000, text.REASON)) == text.REASON
    assert text.clean("plain – ünïcode ✓", 100) == "plain – ünïcode ✓"
    assert text.clean(None, 10) == "None"
    assert RAW_CONTROLS.search(text.visible("".join(map(chr, range(0x100))))) is None


# --- Slack and Teams -------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["warn", "stop"])
def test_slack_payload_escapes_user_text(kind: str) -> None:
    d = doc(notice(kind), "slack")
    texts = [d["text"], d["blocks"][0]["text"]["text"], d["blocks"][1]["text"]["text"],
             d["blocks"][2]["elements"][0]["text"]]
    for t in texts:
        assert "<" not in t and ">" not in t, t
        assert re.search(r"&(?!amp;|lt;|gt;)", t) is None, t  # every & is an entity
    body = d["blocks"][1]["text"]["text"]
    assert "&lt;!channel&gt; &lt;https://x|y&gt; &amp; *bold* &lt;@U123&gt; &lt;!here&gt;" in body
    # mrkdwn texts are verbatim: no automatic links, channel names or mentions
    assert d["blocks"][1]["text"]["verbatim"] is True and d["blocks"][2]["elements"][0]["verbatim"] is True


def test_slack_admin_dashboard_is_the_only_link_and_templates_stay() -> None:
    d = doc(notice("stop"), "slack", dashboard="https://kf.example/_/jupyter/?a=1&b=2")
    body = d["blocks"][1]["text"]["text"]
    assert re.findall(r"<[^>]*>", body) == ["<https://kf.example/_/jupyter/?a=1&amp;b=2>"]
    assert "kubectl annotate notebook nb-1 -n team-a kubeflow-resource-stopped-" in body


def test_teams_payload_escapes_user_text() -> None:
    d = doc(notice(), "teams")
    card = d["attachments"][0]["content"]["body"]
    body = card[2]["text"]
    assert ("\\<!channel\\> \\<https://x|y\\> & \\*bold\\* \\<@U123\\> \\<!here\\> \\_it\\_ \\[click\\](https://evil) "
            "\\`code\\` \\{\\{DATE(2017-02-14T06:00:00Z)\\}\\}") in body
    for t in (card[0]["text"], body, *(f["value"] for f in card[1]["facts"])):
        # every Markdown character of a user's is escaped: none stands alone
        assert re.search(r"(?<!\\)[*_`\[\]<>{}]", t) is None, t
        assert "{{DATE" not in t
    # the admin's text and the commands stay as written (names hold no Markdown character)
    assert "kubectl annotate notebook nb-1 -n team-a notebook-culler.io/keep-until=" in body
    assert card[1]["facts"][0]["value"] == "team-a/nb-1"


def test_escapers_round_trip_what_users_see() -> None:
    assert slack_escape("a<b>&c\x1b") == "a&lt;b&gt;&amp;c\\x1b"
    assert teams_escape("a*b_c\\d") == "a\\*b\\_c\\\\d"


def test_generic_payload_keeps_raw_values_and_mail_shows_no_controls() -> None:
    reason = MARKUP + TERMINAL
    d = doc(notice(reason=reason), "generic")
    assert d["reason"] == reason and d["notebook"]["name"] == "nb-1"
    subject, body = render(notice(reason=reason))
    assert RAW_CONTROLS.search(subject + body) is None and MARKUP in body and "\\x1b[2J" in body
    for fmt in ("slack", "teams"):
        assert all(RAW_CONTROLS.search(s) is None for s in strings(doc(notice(reason=reason), fmt)))


def test_a_huge_reason_is_cut_in_every_format() -> None:
    n = notice(reason="<" * 50_000)
    assert len(doc(n, "generic")["reason"]) == text.REASON
    assert doc(n, "slack")["blocks"][1]["text"]["text"].count("&lt;") < text.REASON
    assert len(doc(n, "slack")["blocks"][1]["text"]["text"]) <= 3000
    assert doc(n, "teams")["attachments"][0]["content"]["body"][2]["text"].count("\\<") == text.REASON - 1
    assert len(render(n)[1]) < text.REASON + 2000


# --- the terminal: check and explain ---------------------------------------------------------------


def hostile_result() -> NotebookResult:
    verdict = Verdict("keep", "no-signal", f"No signal: could not read jupyter: {TERMINAL} (a server's words)",
                      "6-no-signal", server_type="jupyter", policy_rule=f"default{TERMINAL}")
    observations = {"jupyter": {"error": f"HTTP 500: {TERMINAL}", TERMINAL: [TERMINAL]},
                    f"gpu{TERMINAL}": {"samples": []}}
    calls = [Call(f"http://nb.team-a.svc/notebook/team-a/nb/{TERMINAL}", status=500, error=f"boom {TERMINAL}")]
    return NotebookResult(f"team-a{TERMINAL}", f"nb{TERMINAL}", f"group-x{TERMINAL}", 1, verdict, observations,
                          calls)


def test_check_and_explain_print_no_control_character() -> None:
    result = CycleResult(NOW, NOW, 0.1, [hostile_result()])
    outputs = [report(result, "table", [f"warning {TERMINAL}"]), report(result, "wide"), table(result),
               explain(hostile_result(), notifications=f"last failure {TERMINAL}")]
    for out in outputs:
        assert "\x1b" not in out and "\x07" not in out and "\r" not in out and "\x9b" not in out
        assert RAW_CONTROLS.search(out) is None, repr(out)
        assert "\\x1b[2J" in out
    assert len(report(result, "table").splitlines()) == 2  # a header and one line: no injected line break


@pytest.mark.parametrize("fmt", ["json", "yaml"])
def test_json_and_yaml_escape_control_characters_themselves(fmt: str) -> None:
    out = report(CycleResult(NOW, NOW, 0.1, [hostile_result()]), fmt)
    assert RAW_CONTROLS.search(out) is None, repr(out)
    loaded = json.loads(out) if fmt == "json" else yaml.safe_load(out)
    assert loaded["notebooks"][0]["reason"] == hostile_result().verdict.reason  # escaped, not lost


def test_the_long_stopped_section_prints_no_control_character() -> None:
    from kf_culler.report import with_long_stopped

    stopped = LongStopped(f"ns{TERMINAL}", f"nb{TERMINAL}", 1, NOW - timedelta(days=40), 40.0,
                          (f"pvc{TERMINAL}",), None)
    out = with_long_stopped("table", "table", [stopped], 30)
    assert RAW_CONTROLS.search(out) is None and "\\x1b" in out


def scenario(name: str) -> dict[str, Any]:
    found: dict[str, Any] = json.loads((ROOT / "tests" / "scenarios" / name).read_text())
    return found


def test_hostile_annotations_reach_the_reason_cut_and_the_terminal_escaped() -> None:
    doc_ = copy.deepcopy(scenario("09-warn-before-stop.json"))
    annotations = doc_["notebook"]["metadata"].setdefault("annotations", {})
    annotations[KEEP_UNTIL_ANNOTATION] = TERMINAL + "x" * 10_000
    annotations[SERVER_TYPE_ANNOTATION] = "\x1b]0;pwned\x07" + "y" * 10_000
    verdict = verdict_for_document(doc_)
    assert len(verdict.reason) < text.REASON
    result = NotebookResult("team-a", "nb", verdict.server_type or "-", 0, verdict, {})
    out = explain(result) + report(CycleResult(NOW, NOW, 0.1, [result]), "wide")
    assert RAW_CONTROLS.search(out) is None and "x" * 41 not in out and "y" * 41 not in out


# --- no credential, no URL -------------------------------------------------------------------------


@pytest.mark.parametrize(("cfg", "key"), [
    ({"prometheus": {"url": "http://u:p@127.0.0.1:9090"}}, "prometheus.url"),
    ({"notifications": {"dashboardUrl": "https://admin:hunter2@kf.example/"}}, "notifications.dashboardUrl"),
    ({"dcgm": {"endpoints": ["http://node-a:9400/metrics", "http://u:p@node-b:9400/metrics"]}}, "dcgm.endpoints[1]"),
    ({"urls": {"jupyter": "http://tok@{name}.{namespace}.svc.{clusterDomain}/"}}, "urls.jupyter"),
    ({"urls": {"codeServer": "u:p@{name}.{namespace}/"}}, "urls.codeServer"),
])
def test_urls_with_userinfo_are_refused_naming_the_key(cfg: dict[str, Any], key: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_mapping(cfg, "test.yaml")
    message = str(err.value)
    assert f"key '{key}'" in message and ("bearerTokenFile" in message if key == "prometheus.url" else
                                          "Secret" in message)
    assert "hunter2" not in message and "u:p" not in message and "tok@" not in message


def test_urls_without_userinfo_still_load() -> None:
    settings = load_mapping({"prometheus": {"url": "https://prom.example:9090/p@th?q=a@b"},
                             "dcgm": {"endpoints": ["http://node:9400/metrics"]},
                             "notifications": {"dashboardUrl": "https://kf.example/_/jupyter/"}}, "test")
    assert settings.operations.prometheus.url == "https://prom.example:9090/p@th?q=a@b"


BAD_URLS = ["not a url/tok-SECRET", "prom.example/tok-SECRET", "http://[::1/tok-SECRET",
            "http://127.0.0.1:99999/tok-SECRET", "ftp://127.0.0.1/tok-SECRET", "http://exa mple/tok-SECRET",
            "http://ex%ample/tok-SECRET", "http://a_b..c/tok-SECRET", "http://:80/tok-SECRET",
            "http://u:SECRET@127.0.0.1:1/", "http://ex\x1bample/tok-SECRET"]


@pytest.mark.parametrize("url", BAD_URLS)
def test_a_bad_prometheus_url_is_never_in_a_pod_error(url: str) -> None:
    gpu = PrometheusGpu(PrometheusSettings(url=url, timeoutSeconds=2))
    pods = [("team-a", "nb-0"), ("team-b", "nb-0")]
    answers, _ = gpu.samples(pods, NOW)
    for pod in pods:
        error = answers[pod]["error"]
        assert error.startswith("prometheus: the Prometheus URL (prometheus.url) is not usable: "), error
        assert url not in error and url.rstrip("/") not in error and "SECRET" not in error, error
    assert url_problem(url) is not None or "%" in url or "_" in url


def test_the_no_signal_reason_names_the_key_not_the_url() -> None:
    url = "http://prom.example:99999/tok-SECRET"
    answers, _ = PrometheusGpu(PrometheusSettings(url=url)).samples([("team-a", "nb-dark-0")], NOW)
    doc_ = copy.deepcopy(scenario("06-unreachable-no-metrics.json"))  # a GPU notebook
    doc_["observations"]["jupyter"] = scenario("01-jupyter-idle-kernel.json")["observations"]["jupyter"]
    doc_["observations"]["gpu"] = answers[("team-a", "nb-dark-0")]
    verdict = verdict_for_document(doc_)
    assert verdict.state == "no-signal"
    assert "no GPU metrics (prometheus: the Prometheus URL (prometheus.url) is not usable: " in verdict.reason
    everything = json.dumps(verdict.to_dict())
    assert "SECRET" not in everything and "prom.example" not in everything


def test_without_url_replaces_the_configured_url() -> None:
    assert without_url("Invalid URL 'http://p:9/x/api/v1/query': bad", "http://p:9/x/") == (
        "Invalid URL 'prometheus.url/api/v1/query': bad")
    assert without_url("nothing here", None) == "nothing here"
    assert url_problem("https://prometheus.monitoring.svc:9090/") is None


@pytest.mark.parametrize("endpoint", ["http://127.0.0.1:99999/tok-SECRET", "http://127.0.0.1:9/tok-SECRET"])
def test_a_dcgm_endpoint_is_never_in_a_pod_error(endpoint: str) -> None:
    from datetime import UTC, datetime

    from kf_culler.config import load_mapping as load
    from kf_culler.sources.dcgm import DcgmScraper

    scraper = DcgmScraper(load({"dcgm": {"endpoints": [endpoint], "timeoutSeconds": 2}}, "t").operations.dcgm)
    answers, _ = scraper.samples([("ns", "p-0")], datetime.now(UTC))
    assert "SECRET" not in str(answers) and "error" in answers[("ns", "p-0")]
