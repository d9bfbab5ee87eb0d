"""What a notice says: built from the verdict of the pass that wrote the warning or the stop. Pure.

Texts are `string.Template`s; every `$field` below may be used in `notifications.templates`
(docs/notifications.md lists them).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timedelta
from string import Template
from typing import Any

from kf_culler.config import Templates
from kf_culler.model import KEEP_UNTIL_ANNOTATION, STOP_ANNOTATION
from kf_culler.timeutil import format_time

VERSION = "kf-culler.notification/v1"

DEFAULTS: dict[str, str] = {
    "warn_subject": "Notebook $namespace/$name will be stopped at $stopAt",
    "warn_body": (
        "Your notebook $name in namespace $namespace will be stopped at $stopAt "
        "(in about $minutesLeft minutes).\n\n"
        "Why: $reason\n\n"
        "How to keep it running:\n$howToKeep\n\n"
        "A stop keeps your files in the home volume; running kernels, processes and anything outside the "
        "home volume are lost.\n"),
    "stop_subject": "Notebook $namespace/$name was stopped",
    "stop_body": (
        "Your notebook $name in namespace $namespace was stopped at $stopAt.\n\n"
        "Why: $reason\n\n"
        "To start it again:\n$howToStart\n"),
    "restart_subject": "Notebook $namespace/$name was started again",
    "restart_body": (
        "Your notebook $name in namespace $namespace was started again at $at. The idle clock and the "
        "start-up grace count from then.\n"),
}
FIELDS = ("kind", "namespace", "name", "reason", "state", "rule", "at", "stopAt", "minutesLeft", "idleSince",
          "howToKeep", "keepCommand", "keepUntilMax", "howToStart", "startCommand", "maxExtendMinutes",
          "dashboardUrl", "traceId")


@dataclass(frozen=True)
class Notice:
    """One warning, stop or restart, as written by one pass (kf_culler/notify/notifier.py queues it)."""

    kind: str  # warn | stop | restart
    namespace: str
    name: str
    uid: str | None
    reason: str
    state: str
    rule: str
    at: datetime  # when the pass wrote it
    stop_at: datetime | None  # warn: the planned stop; stop: the stop itself
    idle_since: datetime | None = None
    max_extend_minutes: float = 0
    server_type: str | None = None
    gpus: int = 0
    trace_id: str | None = None

    @property
    def key(self) -> tuple[str, str]:
        return self.namespace, self.name


def keep_command(n: Notice) -> str | None:
    """The exact command that moves the stop, at most maxExtendMinutes (None when extensions are off)."""
    if n.max_extend_minutes <= 0 or n.stop_at is None:
        return None
    latest = n.stop_at + timedelta(minutes=n.max_extend_minutes)
    return (f"kubectl annotate notebook {n.name} -n {n.namespace} "
            f"{KEEP_UNTIL_ANNOTATION}={format_time(latest)} --overwrite")


def start_command(n: Notice) -> str:
    return f"kubectl annotate notebook {n.name} -n {n.namespace} {STOP_ANNOTATION}-"


def fields(n: Notice, dashboard_url: str | None = None) -> dict[str, str]:
    """Every $field a template may use, as text."""
    keep = keep_command(n)
    latest = n.stop_at + timedelta(minutes=n.max_extend_minutes) if n.stop_at and keep else None
    how_to_keep = "- Use it: open the notebook and work in it (run a cell, use a terminal) before then."
    if keep and latest is not None:
        how_to_keep += (f"\n- Or ask for more time (at most {n.max_extend_minutes:g} minutes past the planned "
                        f"stop, until {format_time(latest)}; an earlier time also works):\n    {keep}")
    where = f"Kubeflow's Notebooks page ({dashboard_url})" if dashboard_url else "Kubeflow's Notebooks page"
    how_to_start = (f"- {where}: find {n.name} in namespace {n.namespace} and press Start,\n"
                    f"- or: {start_command(n)}")
    minutes_left = max(0, round((n.stop_at - n.at).total_seconds() / 60)) if n.stop_at else 0
    return {
        "kind": n.kind, "namespace": n.namespace, "name": n.name, "reason": n.reason, "state": n.state,
        "rule": n.rule, "at": format_time(n.at), "stopAt": format_time(n.stop_at) if n.stop_at else "",
        "minutesLeft": str(minutes_left), "idleSince": format_time(n.idle_since) if n.idle_since else "",
        "howToKeep": how_to_keep, "keepCommand": keep or "",
        "keepUntilMax": format_time(latest) if latest else "", "howToStart": how_to_start,
        "startCommand": start_command(n), "maxExtendMinutes": f"{n.max_extend_minutes:g}",
        "dashboardUrl": dashboard_url or "", "traceId": n.trace_id or "",
    }


def render(n: Notice, templates: Templates | None = None, dashboard_url: str | None = None) -> tuple[str, str]:
    """(subject, body) for the notice, from the configured templates or the defaults."""
    values = fields(n, dashboard_url)
    chosen = templates or Templates()
    subject = getattr(chosen, f"{n.kind}_subject") or DEFAULTS[f"{n.kind}_subject"]
    body = getattr(chosen, f"{n.kind}_body") or DEFAULTS[f"{n.kind}_body"]
    return (Template(subject).safe_substitute(values).replace("\n", " ").strip(),
            Template(body).safe_substitute(values))


def payload(n: Notice, fmt: str, templates: Templates | None = None, dashboard_url: str | None = None) -> bytes:
    """The webhook body: `generic` (versioned, docs/notifications.md), `slack` or `teams`."""
    subject, body = render(n, templates, dashboard_url)
    values = fields(n, dashboard_url)
    doc: dict[str, Any]
    if fmt == "slack":
        doc = {"text": subject, "blocks": [
            {"type": "header", "text": {"type": "plain_text", "text": subject[:150]}},
            {"type": "section", "text": {"type": "mrkdwn", "text": body[:3000]}},
            {"type": "context", "elements": [{"type": "mrkdwn", "text": f"kf-culler · rule {n.rule}"}]},
        ]}
    elif fmt == "teams":  # an Adaptive Card, as Teams' Workflows webhooks take it
        facts = [{"title": "Notebook", "value": f"{n.namespace}/{n.name}"},
                 {"title": "Stopped at" if n.kind == "stop" else "Stop at", "value": values["stopAt"]}]
        doc = {"type": "message", "attachments": [{
            "contentType": "application/vnd.microsoft.card.adaptive", "contentUrl": None,
            "content": {"$schema": "http://adaptivecards.io/schemas/adaptive-card.json", "type": "AdaptiveCard",
                        "version": "1.4", "body": [
                            {"type": "TextBlock", "text": subject, "weight": "Bolder", "size": "Medium",
                             "wrap": True},
                            {"type": "FactSet", "facts": facts if n.kind != "restart" else facts[:1]},
                            {"type": "TextBlock", "text": body.replace("\n", "\n\n"), "wrap": True}]}}]}
    else:
        doc = {
            "version": VERSION, "kind": n.kind,
            "notebook": {"namespace": n.namespace, "name": n.name, "uid": n.uid, "serverType": n.server_type,
                         "gpus": n.gpus},
            "reason": n.reason, "state": n.state, "rule": n.rule, "at": values["at"],
            "stopAt": values["stopAt"] or None, "idleSince": values["idleSince"] or None,
            "howToKeep": values["howToKeep"] if n.kind == "warn" else None,
            "keepCommand": (values["keepCommand"] or None) if n.kind == "warn" else None,
            "keepUntilMax": (values["keepUntilMax"] or None) if n.kind == "warn" else None,
            "howToStart": values["howToStart"] if n.kind == "stop" else None,
            "startCommand": values["startCommand"] if n.kind == "stop" else None,
            "traceId": n.trace_id, "subject": subject, "text": body,
        }
    return json.dumps(doc).encode()
