"""The trace format and the recorder: round trips, objects written only on change, errors, hashing."""

from __future__ import annotations

import copy
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from need import missing

from kf_culler.config import load_mapping
from kf_culler.decide import decide
from kf_culler.replay.recorder import TraceRecorder, minimal_notebook, minimal_pod
from kf_culler.replay.trace import TraceError, TraceHeader, TraceWriter, open_text, read_header, read_trace

SCENARIOS = Path(__file__).resolve().parents[2] / "shared" / "scenarios"
T0 = datetime(2026, 3, 2, tzinfo=UTC)


def notebook(name: str = "nb", ns: str = "team-a", **ann: str) -> dict[str, Any]:
    return {
        "apiVersion": "kubeflow.org/v1", "kind": "Notebook",
        "metadata": {"name": name, "namespace": ns, "uid": "u-1", "labels": {"owner": "alice"},
                     "managedFields": [{"manager": "kubectl"}],
                     "annotations": {"notebooks.kubeflow.org/server-type": "jupyter",
                                     "notebooks.kubeflow.org/creator": "alice@example.com", **ann}},
        "spec": {"template": {"spec": {"containers": [{
            "name": name, "image": "jupyter:1",
            "env": [{"name": "NB_PREFIX", "value": f"/notebook/{ns}/{name}"}],
            "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}},
    }


def pod(name: str = "nb", ns: str = "team-a", start: datetime = T0) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"{name}-0", "namespace": ns,
                                                            "labels": {"notebook-name": name}},
            "spec": {"containers": [{"name": name, "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
            "status": {"phase": "Running", "startTime": start.strftime("%Y-%m-%dT%H:%M:%SZ")}}


def obs(minute: int) -> dict[str, Any]:
    t = (T0 + timedelta(minutes=minute)).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {"jupyter": {"status": {"last_activity": t, "connections": 0}, "kernels": [], "terminals": []},
            "gpu": {"samples": [{"time": t, "utilPercent": 0, "memoryUsedMiB": 0}]}}


def header() -> TraceHeader:
    return TraceHeader(start=T0, check_period_seconds=300, synthetic=True)


@pytest.mark.parametrize("suffix", [".jsonl", ".jsonl.gz"])
def test_round_trip_and_objects_only_on_change(tmp_path: Path, suffix: str) -> None:
    path = tmp_path / f"t{suffix}"
    nb, p = notebook(), pod()
    stopped = notebook(**{"kubeflow-resource-stopped": "2026-03-02T00:20:00Z"})
    plan: list[tuple[int, dict[str, Any], dict[str, Any] | None, str]] = [
        (0, nb, p, "working"), (5, nb, p, "present"), (10, copy.deepcopy(nb), p, "absent"),
        (15, stopped, None, "absent"), (20, stopped, None, "absent"),
        (25, nb, pod(start=T0 + timedelta(minutes=25)), "working"),
    ]
    with open_text(path, "w") as out:
        w = TraceWriter(out, header())
        for minute, n, po, truth in plan:
            w.write(T0 + timedelta(minutes=minute), n, po, obs(minute), truth)  # type: ignore[arg-type]
        assert w.records == len(plan)
    with open_text(path, "r") as f:
        lines = [json.loads(line) for line in f]
    # the objects are written when they change, and only then (an equal copy is not a change)
    assert ["notebook" in r for r in lines[1:]] == [True, False, False, True, False, True]
    assert ["pod" in r for r in lines[1:]] == [True, False, False, True, False, True]
    assert list(lines[1])[:3] == ["time", "id", "truth"] and list(lines[1])[-1] == "observations"

    h, records = read_trace(path)
    assert h == header()
    got = list(records)
    assert [r.time for r in got] == [T0 + timedelta(minutes=m) for m, *_ in plan]
    assert [r.truth for r in got] == [t for *_, t in plan]
    assert [r.notebook for r in got] == [n for _, n, _, _ in plan]
    assert [r.pod for r in got] == [po for _, _, po, _ in plan]
    assert [r.observations for r in got] == [obs(m) for m, *_ in plan]
    assert {r.id for r in got} == {"team-a/nb"}


def test_header_round_trip_and_version(tmp_path: Path) -> None:
    h = TraceHeader(start=T0, check_period_seconds=60, synthetic=False, hashed=True,
                    end=T0 + timedelta(days=1), generator={"seed": 3})
    assert TraceHeader.from_dict(json.loads(json.dumps(h.to_dict())), "x") == h
    bad = tmp_path / "v2.jsonl"
    bad.write_text(json.dumps({**h.to_dict(), "kfCullerTrace": 2}) + "\n")
    with pytest.raises(TraceError, match="version 2 is not supported"):
        read_header(bad)


@pytest.mark.parametrize("line, message", [
    ("not json", "line 2: not JSON"),
    ('{"time": "2026-03-02T00:00:00Z", "id": "a/b", "observations": {}}',
     "first record of a/b has no 'notebook'"),
    ('{"time": "yesterday", "id": "a/b", "notebook": {}}', "'time' is not an RFC 3339"),
    ('{"time": "2026-03-02T00:00:00Z", "id": "ab", "notebook": {}}', "'id' must be"),
    ('{"time": "2026-03-02T00:00:00Z", "id": "a/b", "notebook": {}, "truth": "asleep"}', "'truth' must be"),
    ('{"time": "2026-03-02T00:00:00Z", "id": "a/b", "notebook": {}, "pod": 3}', "'pod' must be"),
])
def test_bad_records_name_the_line(tmp_path: Path, line: str, message: str) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(header().to_dict()) + "\n" + line + "\n")
    _, records = read_trace(path)
    with pytest.raises(TraceError, match=message):
        list(records)


def test_time_must_not_go_back_for_a_notebook(tmp_path: Path) -> None:
    path = tmp_path / "back.jsonl"
    with open_text(path, "w") as out:
        w = TraceWriter(out, header())
        w.write(T0 + timedelta(minutes=10), notebook(), pod(), obs(10))
        w.write(T0 + timedelta(minutes=5), notebook(name="other"), pod(), obs(5))  # another notebook: fine
        w.write(T0 + timedelta(minutes=5), notebook(), pod(), obs(5))
    _, records = read_trace(path)
    with pytest.raises(TraceError, match="line 4: team-a/nb goes back in time"):
        list(records)


def test_unreadable_observations_are_reported_when_used(tmp_path: Path) -> None:
    path = tmp_path / "lazy.jsonl"
    with open_text(path, "w") as out:
        w = TraceWriter(out, header())
        w.write(T0, notebook(), pod(), obs(0))
        out.write('{"time":"2026-03-02T00:05:00Z","id":"team-a/nb","observations":{"jupyter":}\n')
    _, records = read_trace(path)
    got = list(records)
    assert len(got) == 2
    with pytest.raises(TraceError, match="line 3: 'observations' is not JSON"):
        got[1].observations  # noqa: B018


def test_empty_or_foreign_files_are_not_traces(tmp_path: Path) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(TraceError, match="empty"):
        read_header(empty)
    other = tmp_path / "other.jsonl"
    other.write_text('{"hello": 1}\n')
    with pytest.raises(TraceError, match="not a kf-culler trace header"):
        read_header(other)


def test_recorder_appends_and_writes_one_header(tmp_path: Path) -> None:
    path = tmp_path / "rec.jsonl"
    with TraceRecorder(path, check_period_seconds=60) as rec:
        rec.record(T0, notebook(), pod(), obs(0))
        rec.record(T0 + timedelta(minutes=1), notebook(), pod(), obs(1))
    with TraceRecorder(path) as rec:  # a restarted culler appends to the same trace
        rec.record(T0 + timedelta(minutes=2), notebook(), pod(), obs(2))
    lines = path.read_text().splitlines()
    assert sum("kfCullerTrace" in line for line in lines) == 1
    h, records = read_trace(path)
    assert not h.synthetic and h.check_period_seconds == 60 and h.start == T0
    got = list(records)
    assert [r.time for r in got] == [T0 + timedelta(minutes=m) for m in (0, 1, 2)]
    assert all(r.truth is None for r in got)
    assert "notebook" not in json.loads(lines[2])  # unchanged object not repeated
    assert "notebook" in json.loads(lines[3])  # a new recorder writes it again
    # minimized by default: no managedFields, env, or annotations the decision does not read; the labels
    # stay (a policy rule's notebookSelector reads them)
    nb = got[0].notebook
    assert nb["metadata"]["labels"] == {"owner": "alice"} and "managedFields" not in nb["metadata"]
    assert "env" not in nb["spec"]["template"]["spec"]["containers"][0]
    assert "notebooks.kubeflow.org/creator" not in nb["metadata"]["annotations"]


def test_recorder_refuses_to_append_to_a_foreign_file(tmp_path: Path) -> None:
    path = tmp_path / "notes.jsonl"
    path.write_text('{"not": "a trace"}\n')
    rec = TraceRecorder(path)
    with pytest.raises(TraceError):
        rec.record(T0, notebook(), pod(), obs(0))
    assert path.read_text() == '{"not": "a trace"}\n'


def test_recorder_hashes_names_everywhere(tmp_path: Path) -> None:
    path = tmp_path / "hashed.jsonl.gz"
    o = {"jupyter": {"error": "GET http://secret-nb.secret-team.svc.cluster.local/notebook/secret-team/"
                              "secret-nb/api/status: connection refused"},
         "gpu": {"error": "no series for pod secret-nb-0"}}
    labelled = notebook("secret-nb", "secret-team")
    labelled["metadata"]["labels"]["tier"] = "gpu-a"
    context = {"namespaceLabels": {"kubernetes.io/metadata.name": "secret-team", "team": "vision"}}
    with TraceRecorder(path, hash_key=b"k1", label_keys=frozenset({"tier", "team"})) as rec:
        rec.record(T0, labelled, pod("secret-nb", "secret-team"), o, context)
    with open_text(path, "r") as f:
        text = f.read()
    assert "secret" not in text and "alice" not in text
    # only the label keys the rules select on are kept, in clear, so a replay chooses the same policies
    first = next(iter(read_trace(path)[1]))
    assert first.notebook["metadata"]["labels"] == {"tier": "gpu-a"}
    assert first.context == {"namespaceLabels": {"team": "vision"}}
    h, records = read_trace(path)
    assert h.hashed
    r = next(iter(records))
    ns, name = r.id.split("/")
    assert ns.startswith("ns-") and name.startswith("nb-")
    assert r.pod is not None and r.pod["metadata"]["name"] == f"{name}-0"
    error = r.observations["jupyter"]["error"]
    assert name in error and "connection refused" in error
    # the same key gives the same names; another key other names
    path2 = tmp_path / "hashed2.jsonl"
    with TraceRecorder(path2, hash_key="k1") as rec:
        rec.record(T0, notebook("secret-nb", "secret-team"), None, {})
    with TraceRecorder(tmp_path / "hashed3.jsonl", hash_key=b"k2") as rec:
        rec.record(T0, notebook("secret-nb", "secret-team"), None, {})
    assert next(iter(read_trace(path2)[1])).id == r.id
    assert next(iter(read_trace(tmp_path / "hashed3.jsonl")[1])).id != r.id
    # appending with a different hashing setting is refused
    with pytest.raises(ValueError, match="hashed=True"):
        TraceRecorder(path).record(T0, notebook(), None, {})


@pytest.mark.parametrize("scenario", sorted(SCENARIOS.glob("*.json")) or [None],
                         ids=lambda p: p.stem if p is not None else "no-scenarios")
def test_minimal_objects_keep_every_decision(scenario: Path | None) -> None:
    """Recording cuts objects down; the verdicts on the cut-down objects are the same (over the shared decision
    scenarios: without them the test fails in CI and is skipped elsewhere, tests/need.py)."""
    if scenario is None:
        missing("the shared decision scenarios", f"no scenario file in {SCENARIOS}")
    doc = json.loads(scenario.read_text())
    policy = load_mapping(doc.get("config"), "config").policy
    now = datetime.fromisoformat(doc["now"].replace("Z", "+00:00"))
    full = decide(doc["notebook"], doc.get("pod"), doc.get("observations") or {}, policy, now)
    cut = decide(minimal_notebook(doc["notebook"]), minimal_pod(doc["pod"]) if doc.get("pod") else None,
                 doc.get("observations") or {}, policy, now)
    assert (cut.action, cut.state, cut.reason) == (full.action, full.state, full.reason)
