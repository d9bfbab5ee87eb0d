"""The scenario format (shared/scenarios/README.md): one notebook's situation in one JSON document."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from kf_culler.config import ConfigError, load_mapping
from kf_culler.decide import decide
from kf_culler.model import InputError, Verdict
from kf_culler.notebook import NotebookView
from kf_culler.policy import select
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
    labels = doc.get("namespaceLabels")  # the Namespace's labels, for rules with a namespaceSelector
    if labels is not None and not (isinstance(labels, dict) and all(
            isinstance(k, str) and isinstance(v, str) for k, v in labels.items())):
        raise InputError(f"{source}: 'namespaceLabels' must map label keys to string values")
    observations: Any = doc.get("observations") or {}
    try:
        policy, rule = select(NotebookView.of(notebook, doc.get("pod"), settings.policy), labels, settings)
        return dataclasses.replace(decide(notebook, doc.get("pod"), observations, policy, now), policy_rule=rule)
    except InputError as err:
        raise InputError(f"{source}: {err}") from None


def verdict_for_text(text: str, source: str = "input") -> Verdict:
    try:
        doc = json.loads(text)
    except ValueError as err:
        raise InputError(f"{source}: not valid JSON: {err}") from None
    return verdict_for_document(doc, source)


__all__ = ["ConfigError", "InputError", "verdict_for_document", "verdict_for_text"]
