"""Hand the memory a pass freed back to the system, and keep the cyclic garbage collector off the cache.

A pass decodes thousands of small JSON answers and writes; CPython returns what it frees to the C
heap, and glibc keeps much of it (in the heap of each thread that allocated it) instead of returning
it to the system. `malloc_trim(0)` after each pass gives those free pages back, so the resident size
follows what the culler holds. The image also sets `MALLOC_ARENA_MAX=2` (Dockerfile): fewer per-thread
heaps, less memory kept free in each. Elsewhere than glibc this does nothing.

The cache of 10,000 notebooks and their pods is millions of small dicts and strings that live for
hours. Python's cyclic collector walks all of them in each full collection, which a pass's churn
triggers now and then. After each pass `settle` collects once, then
freezes what is left (`gc.freeze`): those objects are still freed by reference counting when the
culler drops them, but the collector no longer walks them. What the culler keeps holds no reference
cycles (JSON dicts, lists, strings, numbers).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
from collections.abc import Callable

_trim: Callable[[int], int] | None = None
_looked = False


def release() -> bool:
    """malloc_trim(0) where the C library has it; whether memory was given back."""
    global _trim, _looked
    if not _looked:
        _looked = True
        name = ctypes.util.find_library("c")
        try:
            _trim = ctypes.CDLL(name).malloc_trim if name else None
        except (OSError, AttributeError):
            _trim = None
    return bool(_trim(0)) if _trim is not None else False


def settle() -> None:
    """After a pass: collect its cyclic garbage, freeze what remains, give free memory back."""
    gc.collect()
    gc.freeze()
    release()
