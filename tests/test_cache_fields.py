"""The watch cache keeps exactly the fields the rules read: every scenario (the shared spec's and ours)
decides the same on the Notebook and pod as the cache keeps them (kf_culler/targets/notebooks.py
`notebook_fields`, kf_culler/targets/fields.py `pod_fields`) as on the whole objects. A rule that starts reading
a field the cache drops passes the scenarios and sees nothing in the running culler; this test is where that
shows."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from kf_culler.scenario import verdict_for_document
from kf_culler.targets.fields import pod_fields as _slim_pod
from kf_culler.targets.notebooks import notebook_fields as _slim_notebook

HERE = Path(__file__).resolve().parent
SCENARIOS = sorted((HERE.parents[1] / "shared" / "scenarios").glob("*.json")) + sorted(
    (HERE / "scenarios").glob("*.json"))


def as_cached(doc: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(doc)
    out["notebook"] = _slim_notebook(out["notebook"])
    pod = out.get("pod")
    if isinstance(pod, dict):
        meta = pod.setdefault("metadata", {})
        # the cache keeps only pods a notebook can have: a StatefulSet's (scenario pods may omit the owner)
        if not any(r.get("kind") == "StatefulSet" for r in meta.get("ownerReferences") or []):
            meta.setdefault("name", f"{out['notebook']['metadata'].get('name', 'nb')}-0")
        out["pod"] = _slim_pod(pod)
        assert out["pod"] is not None, "the cache would drop this notebook's pod"
    return out


def test_there_are_scenarios() -> None:
    assert len(SCENARIOS) >= 40


@pytest.mark.parametrize("path", SCENARIOS, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_the_cached_objects_decide_as_the_whole_ones(path: Path) -> None:
    doc = json.loads(path.read_text())
    if not isinstance(doc.get("notebook"), dict):
        pytest.fail(f"{path.name}: no notebook object")  # every scenario has one
    whole = verdict_for_document(copy.deepcopy(doc), path.name)
    cached = verdict_for_document(as_cached(doc), path.name)
    assert cached.to_dict() == whole.to_dict()


def test_two_sessions_decoded_from_the_cache_share_their_annotation_keys_and_short_values(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """What a pass holds of each session it chose (its annotations, from its select phase to its act phase) is
    decoded from the cache's bytes: the keys, and the short values two sessions repeat, are one string each; a
    time is each session's own. (Where interning frees, `fields.INTERN`: the image's Python 3.11.)"""
    import marshal

    from kf_culler.local.objects import notebook
    from kf_culler.targets import fields

    monkeypatch.setattr(fields, "INTERN", True)

    stamp = "2026-12-08T00:00:%02dZ"
    a, b = ({**notebook(n), "metadata": {**notebook(n)["metadata"], "annotations": {
        "notebooks.kubeflow.org/server-type": "jupyter", "notebooks.kubeflow.org/last-activity": stamp % i}}}
        for i, n in enumerate(("nb-a", "nb-b")))
    held = [marshal.loads(marshal.dumps(_slim_notebook(json.loads(json.dumps(o))))) for o in (a, b)]
    ann_a, ann_b = (h["metadata"]["annotations"] for h in held)
    keys_a, keys_b = sorted(ann_a), sorted(ann_b)
    assert keys_a == keys_b and all(x is y for x, y in zip(keys_a, keys_b, strict=True))
    assert ann_a["notebooks.kubeflow.org/server-type"] is ann_b["notebooks.kubeflow.org/server-type"]
    assert ann_a["notebooks.kubeflow.org/last-activity"] == stamp % 0 and ann_b[
        "notebooks.kubeflow.org/last-activity"] == stamp % 1


def test_strings_a_tenant_writes_are_not_interned_where_interning_never_frees(monkeypatch: pytest.MonkeyPatch) -> None:
    """Labels and annotation keys are tenants' strings: kept once only where an interned string is freed with its
    last reference (Python 3.11, 3.13); where it never is (3.12), a user writing ever new keys would grow the
    culler's memory for good, so each object keeps its own."""
    import sys

    from kf_culler.targets import fields

    key = "".join(("team.example.com/", "ever-new-key-0001"))
    assert fields.shared(key) is sys.intern("".join(("team.example.com/", "ever-new-key-0001"))) or not fields.INTERN
    monkeypatch.setattr(fields, "INTERN", False)
    other = "".join(("team.example.com/", "ever-new-key-0002"))
    kept = fields.shared(other)
    assert kept is other and sys.intern("".join(("team.example.com/", "ever-new-key-0002"))) is not other
    assert fields.annotation_strings({other: "jupyter"}) == {other: "jupyter"}
