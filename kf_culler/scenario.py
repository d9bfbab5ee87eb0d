"""The scenario format (shared/scenarios/README.md): one notebook's situation in one JSON document."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from kf_culler.config import ConfigError, load_mapping
from kf_culler.decide import decide
from kf_culler.model import InputError, Verdict
from kf_culler.policy import select
from kf_culler.record import parse_record
from kf_culler.session import SessionView
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
    node = doc.get("node")
    if node is not None and not isinstance(node, dict):
        raise InputError(f"{source}: 'node' must be the Node object (or null)")
    problem = doc.get("accessProblem")
    if problem is not None and not (isinstance(problem, str) and problem.strip()):
        raise InputError(f"{source}: 'accessProblem' must be a non-empty sentence (or null)")
    observations: Any = doc.get("observations") or {}
    try:
        record = parse_record(doc.get("cullerRecord"))
        view = SessionView.of(notebook, doc.get("pod"), settings.policy, node=node)
        policy, rule = select(view, labels, settings)
        verdict = decide(notebook, doc.get("pod"), observations, policy, now, node=node, record=record,
                         stop_deadline_seconds=settings.operations.stop_deadline_seconds,
                         access_problem=problem)
        return dataclasses.replace(verdict, policy_rule=rule)
    except InputError as err:
        raise InputError(f"{source}: {err}") from None


def verdict_for_text(text: str, source: str = "input") -> Verdict:
    try:
        doc = json.loads(text)
    except ValueError as err:
        raise InputError(f"{source}: not valid JSON: {err}") from None
    return verdict_for_document(doc, source)


__all__ = ["ConfigError", "InputError", "verdict_for_document", "verdict_for_text"]
