"""kf_culler/memory.py: after a pass the cyclic collector stops walking what the culler keeps, and free C
heap memory goes back to the system (glibc's malloc_trim, present on this machine)."""

from __future__ import annotations

import gc
import weakref

from kf_culler import memory


def test_settle_collects_cycles_then_freezes_what_is_left() -> None:
    class Node:
        other: object = None

    a, b = Node(), Node()
    a.other, b.other = b, a  # a reference cycle, garbage once the names go
    gone = weakref.ref(a)
    del a, b
    kept = [{"metadata": {"name": f"nb-{i}"}} for i in range(1000)]
    gc.unfreeze()
    memory.settle()
    try:
        assert gc.get_freeze_count() > len(kept)  # the kept dicts (and the rest alive) are frozen
        assert gone() is None  # the cycle was collected before the freeze
        assert kept[999]["metadata"]["name"] == "nb-999"
    finally:
        gc.unfreeze()


def test_release_finds_malloc_trim_on_this_machine() -> None:
    memory.release()
    assert memory._trim is not None, "glibc's malloc_trim was not found"
