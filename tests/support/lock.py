"""requirements.lock, the image's pinned dependencies (hack/image/lock.sh writes it)."""

from __future__ import annotations

import re
from pathlib import Path

LOCK = Path(__file__).resolve().parents[2] / "requirements.lock"


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def locked(path: Path = LOCK) -> dict[str, tuple[str, list[str]]]:
    """Normalized name -> (version, sha256 hashes)."""
    out = {}
    for entry in re.sub(r"\\\n\s*", " ", path.read_text(encoding="utf-8")).splitlines():
        if entry.strip() and not entry.startswith("#"):
            pin, *options = entry.split()
            name, version = pin.split("==")
            out[normalize(name)] = (version, [o.split(":", 1)[1] for o in options])
    return out
