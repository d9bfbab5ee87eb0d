"""Text that users wrote, made safe to echo: cut to a documented length, control characters made visible. Pure.

A profile user chooses their Notebook's annotations and everything their notebook server answers; those
reach verdict reasons, `kf-culler check`/`explain` and notices. Every such string is cut to one of the
limits below wherever it is echoed, and on a terminal no control character of it is printed raw (an ESC
or a CSI could repaint the admin's screen, a CR could overwrite a line): each is shown as `\\xNN` or
`\\uNNNN` (docs/faults.md, "Hostile tenant: untrusted text").
"""

from __future__ import annotations

import unicodedata

# The documented cuts (in characters of the original text).
REASON = 1000  # a verdict reason: the reason annotation, Events, notices, `check -o wide`, `explain`
SNIPPET = 300  # an error snippet from a notebook server, Prometheus or dcgm-exporter
VALUE = 40  # an annotation value quoted in a reason (keep-until, the server type)
FIELD = 60  # a field of a server's answer quoted in an error (a timestamp, a count)
NAME = 253  # a Kubernetes name or namespace (the API server enforces it; cut again when echoed)
URL = 2048  # a probe URL in `explain`
BLOCK = 4000  # one source's raw answer in `explain`

ELLIPSIS = "…"

# Not category Cc, but they reorder (bidi overrides and isolates) or break (line and paragraph
# separators) what a terminal shows around them.
_FORMAT_CONTROLS = frozenset("\u061c\u200e\u200f\u2028\u2029\u202a\u202b\u202c\u202d\u202e"
                             "\u2066\u2067\u2068\u2069")


def cut(s: object, limit: int) -> str:
    """`s` as text, at most `limit` characters; a cut one ends in `…` (within the limit)."""
    text = s if isinstance(s, str) else str(s)
    if len(text) <= limit:
        return text
    return text[: max(0, limit - 1)] + ELLIPSIS


def visible(text: str, newlines: bool = False) -> str:
    """Every control character (C0, DEL, C1, bidi controls, line separators) as a visible escape;
    a tab becomes a space, and `\\n` stays only when `newlines` (a multi-line block)."""
    if text.isprintable() and not any(c in _FORMAT_CONTROLS for c in text):
        return text  # the common case: nothing to escape
    out = []
    for c in text:
        if c == "\t":
            out.append(" ")
        elif c == "\n" and newlines:
            out.append(c)
        elif unicodedata.category(c) == "Cc" or c in _FORMAT_CONTROLS:
            code = ord(c)
            out.append(f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}")
        else:
            out.append(c)
    return "".join(out)


def clean(s: object, limit: int, newlines: bool = False) -> str:
    """For a terminal: `s` cut to `limit` characters (`cut`), then its control characters made visible."""
    return visible(cut(s, limit), newlines)
