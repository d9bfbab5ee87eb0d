"""A lean pass (`Cycle.run(items, lean=True)`, what `run`'s loop does) decides exactly as a full one, takes its
items over, holds each notebook and its pod encoded from its select phase on, and lets go of each session once it
acted on it: when a result is reported, no notebook or pod object is held, nor any session reported before it,
and the results keep no observations or probe calls; its gather keeps each probe's answer and calls encoded
from the moment they are complete. No cluster: the probes go to a loopback port where nothing
listens (a connection refused is no signal)."""

from __future__ import annotations

import gc
import marshal
import types
from datetime import UTC, datetime, timedelta
from typing import Any

from kf_culler.config import load_mapping
from kf_culler.cycle import Cycle, Judged, NotebookResult, run_async
from kf_culler.gather import Request, gather
from kf_culler.kube.cache import PackedPair, packed_pair, unpacked_pairs
from kf_culler.kube.records import RecordStore, bucket_of, record_text
from kf_culler.local import objects as obj
from kf_culler.model import STOP_ANNOTATION
from kf_culler.record import CullerRecord
from kf_culler.rules.untaken import Reclaim
from kf_culler.timeutil import format_time

NOW = datetime(2026, 12, 7, 12, tzinfo=UTC)
SETTINGS = load_mapping({"namespaces": {"include": ["team"]}, "idleMinutes": 60,
                         "urls": {"jupyter": "http://127.0.0.1:9/notebook/{namespace}/{name}/"},
                         "probe": {"retries": 0, "timeoutSeconds": 2}}, "test")


def _held(obj: object, mine: object) -> bool:
    """Whether anything but the test's own container `mine` (and running frames) holds `obj`, a plain dict as the
    cache decodes them (no weak reference to one can be made)."""
    return any(r is not mine and not isinstance(r, types.FrameType) for r in gc.get_referrers(obj))


def _items(n: int) -> list[tuple[dict[str, Any], dict[str, Any] | None]]:
    out: list[tuple[dict[str, Any], dict[str, Any] | None]] = []
    for i in range(n):
        nb = obj.notebook(f"nb-{i}", gpus=i % 2, annotations={STOP_ANNOTATION: format_time(NOW)} if i == 3 else None)
        nb["metadata"].update(namespace="team", uid=f"uid-{i}", creationTimestamp=format_time(NOW - timedelta(days=1)))
        pod = None if i == 3 else {
            "metadata": {"name": f"nb-{i}-0", "namespace": "team", "uid": f"pod-{i}"},
            "spec": {"containers": [{"name": "nb", "resources": {"limits": {"nvidia.com/gpu": "1"}} if i % 2 else {}}]},
            "status": {"phase": "Running", "startTime": format_time(NOW - timedelta(hours=3))}}
        out.append((nb, pod))
    return out


def _verdicts(results: list[NotebookResult]) -> list[tuple[str, str, str, str]]:
    return [(r.name, r.verdict.action, r.verdict.state, str(r.verdict.rule_id)) for r in results]


def test_a_lean_pass_decides_as_a_full_one_and_lets_go_of_each_notebook_once_acted_on() -> None:
    full_items = _items(6)
    full = Cycle(SETTINGS, clock=lambda: NOW).run(full_items)
    assert len(full_items) == 6 and len(full.results) == 6  # a full pass leaves its items as they were
    assert any(r.observations for r in full.results) and any(r.calls for r in full.results)

    items = _items(6)
    notebooks = [nb for nb, _pod in items]
    pods = {nb["metadata"]["name"]: pod for nb, pod in items if pod is not None}
    # (name, its observations given, notebook objects held by the pass, pod objects held, sessions judged and not
    # yet let go of)
    seen: list[tuple[str, bool, int, int, int]] = []

    def on_result(r: NotebookResult) -> None:
        held_notebooks = [i for i in range(len(notebooks)) if _held(notebooks[i], notebooks)]
        held_pods = [name for name in pods if _held(pods[name], pods)]
        judged = sum(1 for o in gc.get_objects() if isinstance(o, Judged))
        seen.append((r.name, bool(r.observations) or r.verdict.state == "stopped", len(held_notebooks),
                     len(held_pods), judged))

    lean = Cycle(SETTINGS, clock=lambda: NOW, on_result=on_result).run(items, lean=True)
    assert items == []  # taken over
    assert _verdicts(lean.results) == _verdicts(full.results)
    assert [(name, given) for name, given, *_ in seen] == [(f"nb-{i}", True) for i in range(6)]
    assert all(held == 0 for _, _, held, *_ in seen), seen  # encoded since the select phase
    assert all(pods_held == 0 for *_, pods_held, _ in seen), seen  # the pods too
    assert [judged for *_, judged in seen] == [6, 5, 4, 3, 2, 1]  # each session let go of once acted on, not before
    assert all(r.observations == {} and r.calls == [] for r in lean.results)
    assert [i for i in range(len(notebooks)) if _held(notebooks[i], notebooks)] == []
    assert [name for name in pods if _held(pods[name], pods)] == []


def test_a_lean_pass_over_the_caches_bytes_holds_those_bytes_and_decides_as_a_full_one() -> None:
    """The pairs as the cache gives a lean pass (kf_culler/kube/cache.py `UnpackedPairs`): each the bytes the cache
    holds for its notebook and pod. The pass holds those very bytes from its select phase on (no encoded copy) and
    decides as a full pass over the same objects; a pair the pass was given encoded whole is encoded for it."""
    full = Cycle(SETTINGS, clock=lambda: NOW).run(_items(6))
    raws: list[PackedPair] = [(marshal.dumps(nb), None if pod is None else marshal.dumps(pod)) for nb, pod in _items(6)]
    raws[5] = packed_pair(_items(6)[5])  # as Coder's workspaces come, made by the runner
    given = list(raws)
    cycle = Cycle(SETTINGS, clock=lambda: NOW)
    chosen = cycle._select_all(unpacked_pairs(list(raws)), NOW, lean=True).chosen
    assert [c.session for c in chosen[:5]] == [r[0] for r in given[:5]]
    assert all(c.session is r[0] and c.pod is r[1] for c, r in zip(chosen[:5], given, strict=False)), "copies held"
    assert isinstance(chosen[5].session, bytes) and chosen[5].session not in given  # encoded for the pass
    assert chosen[3].pod is None  # nb-3 has no pod
    lean = Cycle(SETTINGS, clock=lambda: NOW).run(unpacked_pairs(raws), lean=True)
    assert raws == [] and _verdicts(lean.results) == _verdicts(full.results)


def test_a_lean_gather_keeps_each_answer_encoded_and_reads_back_what_a_full_one_holds() -> None:
    requests = [Request("team", f"nb-{i}", f"nb-{i}-0", "jupyter", False) for i in range(4)]
    ops = SETTINGS.operations
    full = run_async(gather(requests, ops, NOW))
    lean = run_async(gather(requests, ops, NOW, pack=True))
    keys = [("team", f"nb-{i}") for i in range(4)]
    assert all(type(lean.packed[k]) is bytes for k in keys) and lean.observations == {} and lean.calls == {}
    for k in keys:
        observations, calls = lean.found(k)
        assert observations.keys() == {"jupyter"} and "error" in observations["jupyter"]  # nothing listens there
        assert observations == full.found(k)[0]
        assert [(c.url, c.status, c.attempts) for c in calls] == [(c.url, c.status, c.attempts)
                                                                   for c in full.found(k)[1]]
        assert calls and all(c.error for c in calls)
    lean.observations[keys[0]] = {"gpu": {"error": "no gpu answer"}}  # a bulk answer beside the probe's
    assert lean.found(keys[0])[0] == {**full.found(keys[0])[0], "gpu": {"error": "no gpu answer"}}
    assert lean.found(("team", "never")) == ({}, [])
    lean.clear()
    assert lean.packed == {} and lean.found(keys[0]) == ({}, [])


def _not_taken_workspace() -> tuple[dict[str, Any], dict[str, Any]]:
    """A Workspace whose stop (`spec.paused`) did not take: its pod still runs, owned by the StatefulSet that
    the culler's next step scales to 0 (kf_culler/rules/untaken.py)."""
    ws = {"apiVersion": "kubeflow.org/v1beta1", "kind": "Workspace",
          "metadata": {"name": "ws", "namespace": "team", "uid": "ws-uid"}, "spec": {"paused": True}}
    pod = {"metadata": {"name": "ws-abcde-0", "namespace": "team", "uid": "pod-ws",
                        "ownerReferences": [{"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "ws-abcde",
                                             "uid": "sts-uid", "controller": True}]},
           "spec": {"containers": [{"name": "nb", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
           "status": {"phase": "Running", "startTime": format_time(NOW - timedelta(hours=3))}}
    return ws, pod


def test_a_lean_pass_takes_the_next_step_of_a_stop_that_did_not_take_as_a_full_one_does() -> None:
    """A lean pass holds each pod apart from its view; planning a stop that did not take reads the pod (the
    StatefulSet its next step scales), so the lean pass's plan names the same step, and its result the pod's uid."""
    store = RecordStore(None, "culler")
    stopped = CullerRecord(stopped_at=NOW - timedelta(minutes=30))
    store.load([{"metadata": {"name": bucket_of("ws-uid")}, "data": {"ws-uid": record_text(stopped, "team")}}])
    results = {}
    for lean in (False, True):
        ws, pod = _not_taken_workspace()
        items: Any = unpacked_pairs([packed_pair((ws, pod))]) if lean else [(ws, pod)]
        [result] = Cycle(SETTINGS, clock=lambda: NOW, records=store).run(items, lean).results
        assert result.verdict.rule_id == "1-stop-not-taken", result.verdict
        assert result.plan is not None and result.pod_uid == "pod-ws"
        results[lean] = result.plan.reclaim
    assert results[True] == results[False] == Reclaim("StatefulSet", "ws-abcde", "sts-uid")


def test_a_lean_pass_chooses_policies_by_labels_then_holds_no_labels() -> None:
    """A notebook's labels are read to choose its policy (a rule's notebookSelector); a lean pass then holds its view
    without them, and decides as a full pass does, under the same policies."""
    rule = {"name": "nb-1-short", "match": {"notebookSelector": {"matchLabels": {"app": "nb-1"}}},
            "policy": {"idleMinutes": 5}}
    settings = load_mapping({"namespaces": {"include": ["team"]}, "idleMinutes": 60,
                             "urls": {"jupyter": "http://127.0.0.1:9/notebook/{namespace}/{name}/"},
                             "probe": {"retries": 0, "timeoutSeconds": 2}, "rules": [rule]}, "test")
    full = Cycle(settings, clock=lambda: NOW).run(_items(4))
    raws: list[PackedPair] = [packed_pair(item) for item in _items(4)]
    chosen = Cycle(settings, clock=lambda: NOW)._select_all(unpacked_pairs(list(raws)), NOW, lean=True).chosen
    assert [c.sel.policy_rule for c in chosen] == ["default", "nb-1-short", "default", "default"]
    assert all(not c.sel.view.labels for c in chosen) and all(c.selected().view.labels == {} for c in chosen)
    lean = Cycle(settings, clock=lambda: NOW).run(unpacked_pairs(raws), lean=True)
    assert _verdicts(lean.results) == _verdicts(full.results)
    assert [r.verdict.policy_rule for r in lean.results] == [r.verdict.policy_rule for r in full.results]
    assert full.results[1].verdict.policy_rule == "nb-1-short"
