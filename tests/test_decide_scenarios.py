"""Every scenario file (shared/scenarios when present, and the copies in tests/scenarios) through
`kf-culler decide`, in-process and through the real command line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kf_culler.scenario import verdict_for_document

HERE = Path(__file__).resolve().parent
SHARED = HERE.parent.parent / "shared" / "scenarios"
FILES = sorted({p.name: p for d in (HERE / "scenarios", SHARED) if d.is_dir() for p in d.glob("*.json")}.values())


def test_scenarios_are_found() -> None:
    assert len(FILES) >= 12


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_scenario(path: Path) -> None:
    doc = json.loads(path.read_text())
    verdict = verdict_for_document(doc, path.name).to_dict()
    for key, value in doc["expect"].items():
        assert verdict[key] == value, f"{path.name}: {key} = {verdict[key]!r}, expected {value!r}: {verdict['reason']}"
    if verdict["action"] in ("warn", "stop"):
        assert verdict["reason"].strip()


def _cli(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kf_culler", "decide", *args], input=stdin,
                          capture_output=True, text=True, timeout=60)


def test_cli_prints_one_json_verdict() -> None:
    path = next(p for p in FILES if p.stem.startswith("01"))
    done = _cli("--input", str(path))
    assert done.returncode == 0, done.stderr
    verdict = json.loads(done.stdout)
    assert (verdict["action"], verdict["state"]) == ("stop", "idle")


def test_cli_reads_stdin() -> None:
    path = next(p for p in FILES if p.stem.startswith("04"))
    done = _cli("--input", "-", stdin=path.read_text())
    assert done.returncode == 0 and json.loads(done.stdout)["state"] == "connected"


@pytest.mark.parametrize("text,needle", [
    ("not json", "not valid JSON"),
    ("[]", "must be a JSON object"),
    ('{"notebook": {}}', "'now'"),
    ('{"now": "2026-11-29T12:00:00Z"}', "'notebook'"),
    ('{"now": "yesterday", "notebook": {}}', "'now'"),
    ('{"now": "2026-11-29T12:00:00Z", "notebook": {}, "config": {"idleMinutez": 5}}', "idleMinutez"),
    ('{"now": "2026-11-29T12:00:00Z", "notebook": {}, "config": {"idleMinutes": "60"}}', "idleMinutes"),
    ('{"now": "2026-11-29T12:00:00Z", "notebook": {}, "config": {"gpu": {"utilPercent": true}}}', "gpu.utilPercent"),
    ('{"now": "2026-11-29T12:00:00Z", "notebook": {}, "config": {"noSignal": {"action": "drop"}}}', "noSignal"),
    ('{"now": "2026-11-29T12:00:00Z", "notebook": "nb"}', "'notebook'"),
])
def test_cli_bad_input_is_one_line_and_exit_2(text: str, needle: str) -> None:
    done = _cli("--input", "-", stdin=text)
    assert done.returncode == 2
    assert done.stdout == ""
    assert needle in done.stderr
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1


def test_cli_missing_file_is_exit_2(tmp_path: Path) -> None:
    done = _cli("--input", str(tmp_path / "nope.json"))
    assert done.returncode == 2 and "cannot read" in done.stderr
