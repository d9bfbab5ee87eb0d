"""A Kubernetes list answer read as a stream: each element of its `items` array comes out as the bytes of one
object, so a page never exists decoded as a whole.

A tenant can make Notebooks of 1.5 MiB each (env, volumes) and as many as they like (no quota counts a
stopped one); a 500-object page of them decoded at once would be gigabytes of Python objects. Read this way,
the culler holds one object's JSON and what it keeps of the others.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator
from typing import Any

_SPECIAL = re.compile(rb'[\\"{}\[\]]')
_ITEMS_KEY = re.compile(rb'"items"\s*:\s*$')


class ListSplitter:
    """Fed the bytes of a list answer in any chunks; `feed` gives the complete `items` elements so far, and
    `rest()` the answer without them (`{"metadata": {...}, "items": [], ...}`), decoded."""

    def __init__(self) -> None:
        self.depth = 0
        self.in_string = False
        self.escaped = False  # a backslash ended the last chunk inside a string
        self.where = "shell"  # shell: outside the items array; gap: between its elements; item: in one
        self.shell = bytearray()
        self.item = bytearray()

    def feed(self, chunk: bytes) -> list[bytes]:
        out: list[bytes] = []
        start = 0  # the chunk's bytes from here on are not yet given to shell or item
        i = 0
        if self.escaped and chunk:
            self.escaped, i = False, 1
        n = len(chunk)
        while i < n:
            m = _SPECIAL.search(chunk, i)
            if m is None:
                break
            j, c = m.start(), chunk[m.start()]
            i = j + 1
            if self.in_string:
                if c == 0x5C:  # backslash: the next byte is escaped
                    if j + 1 >= n:
                        self.escaped = True
                        break
                    i = j + 2
                elif c == 0x22:
                    self.in_string = False
                continue
            if c == 0x22:
                self.in_string = True
                if self.where == "gap":
                    raise ValueError("a list's items must be objects")
                continue
            if c in (0x7B, 0x5B):  # { [
                if self.where == "gap":  # an element begins: what was between elements is dropped
                    self.where, start = "item", j
                elif self.where == "shell" and c == 0x5B and self.depth == 1:
                    self.shell += chunk[start:j]
                    start = j
                    if _ITEMS_KEY.search(self.shell):
                        self.shell += b"["
                        start, self.where = j + 1, "gap"
                self.depth += 1
                continue
            if c in (0x7D, 0x5D):  # } ]
                self.depth -= 1
                if self.where == "item" and self.depth == 2:
                    self.item += chunk[start:j + 1]
                    out.append(bytes(self.item))
                    self.item.clear()
                    self.where, start = "gap", j + 1
                elif self.where == "gap" and self.depth == 1:  # the items array ends
                    self.where, start = "shell", j
        if self.where == "shell":
            self.shell += chunk[start:]
        elif self.where == "item":
            self.item += chunk[start:]
        return out

    def rest(self) -> dict[str, Any]:
        if self.where != "shell" or self.depth != 0:
            raise ValueError("the list answer ended inside its items")
        doc = json.loads(bytes(self.shell))
        if not isinstance(doc, dict):
            raise ValueError("a list answer must be an object")
        return doc


def list_items(chunks: Iterable[bytes]) -> tuple[Iterator[dict[str, Any]], ListSplitter]:
    """(each item of the answer, decoded one at a time; the splitter, whose `rest()` is valid once the
    iterator is exhausted)."""
    splitter = ListSplitter()

    def items() -> Iterator[dict[str, Any]]:
        for chunk in chunks:
            for raw in splitter.feed(chunk):
                obj = json.loads(raw)
                if isinstance(obj, dict):
                    yield obj

    return items(), splitter
