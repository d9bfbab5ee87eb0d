"""The scenario format (shared/scenarios/README.md): one notebook's situation in one JSON document."""

from __future__ import annotations

import json
from typing import Any

from kf_culler.config import ConfigError, load_mapping
from kf_culler.decide import decide
from kf_culler.model import InputError, Verdict
from kf_culler.timeutil import parse_time


def verdict_for_document(doc: object, source: str = "input") -> Verdict:
    """Decide a decoded scenario document. Raises InputError or ConfigError for bad input."""
    if not isinstance(doc, dict):
        raise InputError(f"{source}: a scenario must be a JSON object")
    for key in ("now", "notebook"):
        if key not in doc:
            raise InputError(f"{source}: missing required key '{key}'")
    now = parse_time(doc["now"])
    if now is None:
        raise InputError(f"{source}: 'now' is not an RFC 3339 time with a zone: {str(doc['now'])[:60]!r}")
    settings = load_mapping(doc.get("config"), f"{source}: config")
    notebook = doc["notebook"]
    if not isinstance(notebook, dict):
        raise InputError(f"{source}: 'notebook' must be an object")
    meta = notebook.get("metadata")
    namespace = meta.get("namespace") if isinstance(meta, dict) else None
    policy = settings.policy_for(namespace) if isinstance(namespace, str) else settings.policy
    observations: Any = doc.get("observations") or {}
    try:
        return decide(notebook, doc.get("pod"), observations, policy, now)
    except InputError as err:
        raise InputError(f"{source}: {err}") from None


def verdict_for_text(text: str, source: str = "input") -> Verdict:
    try:
        doc = json.loads(text)
    except ValueError as err:
        raise InputError(f"{source}: not valid JSON: {err}") from None
    return verdict_for_document(doc, source)


__all__ = ["ConfigError", "InputError", "verdict_for_document", "verdict_for_text"]
