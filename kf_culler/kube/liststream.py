"""A Kubernetes list answer read as a stream: each element of its `items` array comes out decoded on its own,
so a page never exists decoded as a whole.

A tenant can make Notebooks of 1.5 MiB each (env, volumes) and as many as they like (no quota counts a
stopped one); a 500-object page of them decoded at once would be gigabytes of Python objects. Read this way,
the culler holds one object's JSON and what it keeps of the others.

The answer's outer object is walked here (its keys, the `items` array's brackets and commas); every value,
each item among them, is decoded by the standard library's C decoder (`JSONDecoder.raw_decode`) where it
starts. An item that a chunk's end cuts fails to decode; its end is then found by scanning its text for
brackets outside strings as the next chunks come, and it is decoded once, whole (its text kept in parts until
then, never copied chunk after chunk).
"""

from __future__ import annotations

import codecs
import json
import re
from collections.abc import Iterable, Iterator
from typing import Any

_WS = re.compile(r"[ \t\n\r]*")
_SPECIAL = re.compile(r'[\\"{}\[\]]')
_DECODER = json.JSONDecoder()


class ListSplitter:
    """Fed the bytes of a list answer in any chunks; `feed` gives the `items` elements completed so far,
    decoded, `finish()` those left once the answer has ended, and `rest()` the answer without them
    (`{"metadata": {...}, "items": [], ...}`)."""

    def __init__(self) -> None:
        self._utf8 = codecs.getincrementaldecoder("utf-8")()
        self._text = ""  # the answer's text not yet walked, from `_pos`
        self._pos = 0
        # start: before the outer `{`; key: a key or `}`; colon: before `:`; value: a value of the outer object;
        # after: `,` or `}`; open: the items' `[`; first: an item or `]`; item: an item; next: `,` or `]`
        self._state = "start"
        self._key = ""
        self._wait = 0  # a failed decode is tried again once the text is this long (or the answer ended)
        self._shell: dict[str, Any] = {}
        # An item cut by a chunk's end: its text so far, and where the scan for its end is (bracket depth,
        # inside a string, after a backslash).
        self._parts: list[str] | None = None
        self._depth, self._in_string, self._escaped = 0, False, False

    def _scan(self, text: str) -> int | None:
        """Where in `text` the cut item ends (the index after its closing brace), or None: not in it."""
        i, n = 0, len(text)
        if self._escaped and n:
            self._escaped, i = False, 1
        while True:
            m = _SPECIAL.search(text, i)
            if m is None:
                return None
            j = m.start()
            c, i = text[j], j + 1
            if self._in_string:
                if c == "\\":
                    if j + 1 >= n:
                        self._escaped = True
                        return None
                    i = j + 2
                elif c == '"':
                    self._in_string = False
            elif c == '"':
                self._in_string = True
            elif c in "{[":
                self._depth += 1
            else:
                self._depth -= 1
                if self._depth == 0:
                    return i

    def feed(self, chunk: bytes) -> list[dict[str, Any]]:
        text = self._utf8.decode(chunk)
        if self._parts is not None:  # inside a cut item
            end = self._scan(text)
            if end is None:
                self._parts.append(text)
                return []
            self._parts.append(text[:end])
            whole, self._parts = "".join(self._parts), None
            obj = json.loads(whole)
            del whole
            # What follows it is walked with the next chunk: the item is handed on (and dropped) first.
            self._state = "next"
            self._text, self._pos, self._wait = text[end:], 0, 0
            return [obj]
        self._text = self._text[self._pos:] + text if self._pos else self._text + text
        self._wait = max(0, self._wait - self._pos)
        self._pos = 0
        return self._walk(final=False)

    def finish(self) -> list[dict[str, Any]]:
        """The items left once the answer has ended."""
        if self._parts is not None:
            raise ValueError("the list answer ended inside its items")
        self._text = self._text[self._pos:] + self._utf8.decode(b"", final=True)
        self._pos, self._wait = 0, 0
        return self._walk(final=True)

    def _value(self, final: bool) -> tuple[Any, bool]:
        """(the value at `_pos`, whether it is whole); a value cut by the chunk's end is waited for."""
        if not final and len(self._text) < self._wait:
            return None, False
        try:
            value, end = _DECODER.raw_decode(self._text, self._pos)
        except json.JSONDecodeError:
            if final:
                raise ValueError("the list answer ended inside a value") from None
            self._wait = self._pos + 2 * max(1, len(self._text) - self._pos)
            return None, False
        if not final and not isinstance(value, (dict, list, str)) and (
                end >= len(self._text) or self._text[end] in ".eE"):
            return None, False  # a number (or true, false, null) may go on in the next chunk
        self._pos, self._wait = end, 0
        return value, True

    def _walk(self, final: bool) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        text = self._text
        while True:
            self._pos = _WS.match(text, self._pos).end()  # type: ignore[union-attr]  # always matches
            if self._pos >= len(text):
                return out
            c, state = text[self._pos], self._state
            if state == "start":
                if c != "{":
                    raise ValueError("a list answer must be an object")
                self._pos += 1
                self._state = "key"
            elif state in ("key", "after"):
                if c == "}":
                    self._pos += 1
                    self._state = "done"
                elif state == "after":
                    if c != ",":
                        raise ValueError("a list answer's keys must be separated by commas")
                    self._pos += 1
                    self._state = "key"
                else:
                    key, whole = self._value(final)
                    if not whole:
                        return out
                    if not isinstance(key, str):
                        raise ValueError("a list answer's keys must be strings")
                    self._key, self._state = key, "colon"
            elif state == "colon":
                if c != ":":
                    raise ValueError("a list answer's key must be followed by a colon")
                self._pos += 1
                self._state = "open" if self._key == "items" else "value"
            elif state == "open" and c == "[":
                self._pos += 1
                self._shell["items"] = []
                self._state = "first"
            elif state in ("value", "open"):
                value, whole = self._value(final)
                if not whole:
                    return out
                self._shell[self._key] = value
                self._state = "after"
            elif state in ("first", "next") and c == "]":
                self._pos += 1
                self._state = "after"
            elif state == "next":
                if c != ",":
                    raise ValueError("a list's items must be separated by commas")
                self._pos += 1
                self._state = "item"
            elif state in ("first", "item"):
                if c != "{":
                    raise ValueError("a list's items must be objects")
                self._wait = 0
                obj, whole = self._value(final)
                if not whole:  # cut by the chunk's end: found by scanning as the next chunks come
                    rest = text[self._pos:]
                    self._depth, self._in_string, self._escaped = 0, False, False
                    if self._scan(rest) is not None:
                        raise ValueError("a list's item is not valid JSON")
                    self._parts, self._text, self._pos = [rest], "", 0
                    return out
                out.append(obj)
                self._state = "next"
            else:  # done: nothing may follow the outer object
                raise ValueError("text after the list answer")

    def rest(self) -> dict[str, Any]:
        if self._state != "done":
            raise ValueError("the list answer ended inside its items")
        return self._shell


def list_items(chunks: Iterable[bytes]) -> tuple[Iterator[dict[str, Any]], ListSplitter]:
    """(each item of the answer, decoded one at a time; the splitter, whose `rest()` is valid once the
    iterator is exhausted)."""
    splitter = ListSplitter()

    def items() -> Iterator[dict[str, Any]]:
        for chunk in chunks:
            yield from splitter.feed(chunk)
        yield from splitter.finish()

    return items(), splitter
