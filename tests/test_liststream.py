"""The list answer split into its items whatever the chunks: the same objects and metadata as a whole
decode, with strings holding braces, brackets, quotes and backslashes, across every chunk boundary."""

from __future__ import annotations

import json
import random

import pytest

from kf_culler.kube.liststream import ListSplitter, list_items


def answer() -> bytes:
    items = [{"metadata": {"name": f"nb-{i}", "annotations": {"a": 'x{[}]"\\' * i, "items": "[1]"}},
              "spec": {"template": {"spec": {"containers": [{"env": [{"name": "V", "value": "y]" * 50}]}]}}}}
             for i in range(7)]
    doc = {"apiVersion": "kubeflow.org/v1", "items": items, "kind": "NotebookList",
           "metadata": {"continue": "tok\\\"en", "resourceVersion": "42"}}
    return json.dumps(doc).encode()


@pytest.mark.parametrize("size", [1, 2, 3, 7, 64, 1 << 20])
def test_items_and_rest_match_a_whole_decode(size: int) -> None:
    raw = answer()
    whole = json.loads(raw)
    chunks = [raw[i:i + size] for i in range(0, len(raw), size)]
    items, splitter = list_items(chunks)
    assert list(items) == whole["items"]
    rest = splitter.rest()
    assert rest == {**whole, "items": []}


def test_random_chunks_and_whitespace() -> None:
    raw = json.dumps(json.loads(answer()), indent=2).encode()
    rng = random.Random(5)
    for _ in range(50):
        cuts = sorted(rng.sample(range(1, len(raw)), 30))
        chunks = [raw[a:b] for a, b in zip([0, *cuts], [*cuts, len(raw)], strict=True)]
        items, splitter = list_items(chunks)
        assert [o["metadata"]["name"] for o in items] == [f"nb-{i}" for i in range(7)]
        assert splitter.rest()["metadata"]["resourceVersion"] == "42"


def test_an_answer_cut_inside_its_items_is_an_error() -> None:
    raw = answer()
    splitter = ListSplitter()
    splitter.feed(raw[: len(raw) // 2])
    with pytest.raises(ValueError):
        splitter.rest()


@pytest.mark.parametrize("size", [1, 2, 5])
def test_numbers_and_literals_cut_by_a_chunk(size: int) -> None:
    """A number, true, false or null at a chunk's end may go on in the next chunk: it is waited for."""
    raw = b'{"count": 12345, "ok": true, "none": null, "f": -1.5e3, "items": [{"a": 1}, {"b": [2, 30]}], "n": 678}'
    chunks = [raw[i:i + size] for i in range(0, len(raw), size)]
    items, splitter = list_items(chunks)
    assert list(items) == [{"a": 1}, {"b": [2, 30]}]
    assert splitter.rest() == {"count": 12345, "ok": True, "none": None, "f": -1500.0, "items": [], "n": 678}


def test_an_item_that_is_not_an_object_is_an_error() -> None:
    items, _ = list_items([b'{"items": [{"a": 1}, "x"]}'])
    with pytest.raises(ValueError):
        list(items)
