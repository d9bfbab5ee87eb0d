"""What a notice says: built from the verdict of the pass that wrote the warning or the stop. Pure.

Texts are `string.Template`s; every `$field` below may be used in `notifications.templates`
(docs/notifications.md lists them).

The admin writes the templates; the notebook's user writes what fills several fields (the name and
namespace, and through annotations and their server's answers, parts of the reason). Those values are
escaped for where they are shown, the templates never: control characters are made visible in every text
(kf_culler/text.py); Slack gets `&`, `<`, `>` as `&amp;` `&lt;` `&gt;` in its mrkdwn texts, which are also
`verbatim` (no automatic links or mentions); Teams gets the Markdown characters (`_TEAMS_SPECIAL`: the
backslash, emphasis, code, link, HTML and brace characters) after a backslash (no emphasis, links or
`{{DATE()}}`). The generic document carries the raw values (JSON encodes them).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from string import Template
from typing import Any

from kf_culler.config import Templates
from kf_culler.targets import SessionKey, for_key
from kf_culler.text import NAME, REASON, VALUE, cut, visible
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
    rule_id: str
    at: datetime  # when the pass wrote it
    stop_at: datetime | None  # warn: the planned stop; stop: the stop itself
    idle_since: datetime | None = None
    max_extend_minutes: float = 0
    server_type: str | None = None
    gpus: int = 0
    trace_id: str | None = None

    @property
    def key(self) -> SessionKey:
        return SessionKey(self.namespace, self.name)


def keep_command(n: Notice) -> str | None:
    """The exact command that moves the stop, at most maxExtendMinutes (None when extensions are off, or the
    session's target has no such command)."""
    if n.max_extend_minutes <= 0 or n.stop_at is None:
        return None
    latest = n.stop_at + timedelta(minutes=n.max_extend_minutes)
    return for_key(n.key).keep_command(n.namespace, n.key.object_name, format_time(latest))


def start_command(n: Notice) -> str:
    """The command that starts the session again, by its target (kf_culler/targets/)."""
    return for_key(n.key).start_command(n.namespace, n.key.object_name)


Escape = Callable[[str], str]


def plain(text: str) -> str:
    """For plain text (mail; the generic document's subject and text): control characters made visible."""
    return visible(text)


def slack_escape(text: str) -> str:
    """For Slack mrkdwn: `&`, `<`, `>` as entities, so no `<!channel>`, `<@U…>` or `<url|label>` of a user's
    works (https://api.slack.com/reference/surfaces/formatting#escaping)."""
    return visible(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _slack_cut(text: str, limit: int) -> str:
    """At most `limit` characters, never ending inside an entity (`&am`)."""
    if len(text) <= limit:
        return text
    head = text[:limit]
    amp = head.rfind("&")
    return head[:amp] if amp != -1 and ";" not in head[amp:] else head


_TEAMS_SPECIAL = frozenset("\\*_~`[]<>{}")


def teams_escape(text: str) -> str:
    """For a Teams Adaptive Card TextBlock (a CommonMark subset): Markdown's emphasis, code, link and
    HTML characters, and the braces of `{{DATE()}}`, each after a backslash, so they are shown as written."""
    return "".join("\\" + c if c in _TEAMS_SPECIAL else c for c in visible(text))


def _shown(n: Notice, esc: Escape) -> Notice:
    """The notice with every user-derived text cut (kf_culler/text.py) and escaped by `esc`."""
    return replace(n, namespace=esc(cut(n.namespace, NAME)), name=esc(cut(n.name, NAME)),
                   reason=esc(cut(n.reason, REASON)), state=esc(cut(n.state, VALUE)),
                   rule_id=esc(cut(n.rule_id, VALUE)))


def fields(n: Notice, dashboard_url: str | None = None, esc: Escape = plain,
           link: Escape | None = None) -> dict[str, str]:
    """Every $field a template may use, as text: user-derived values through `esc`; the admin's dashboard
    URL as written (`link`, when given, makes $dashboardUrl and the one in $howToStart a link)."""
    n = _shown(n, esc)
    if dashboard_url and link is not None:
        dashboard_url = link(dashboard_url)
    keep = keep_command(n)
    latest = n.stop_at + timedelta(minutes=n.max_extend_minutes) if n.stop_at and keep else None
    how_to_keep = "- Use it: open the notebook and work in it (run a cell, use a terminal) before then."
    if keep and latest is not None:
        how_to_keep += (f"\n- Or ask for more time (at most {n.max_extend_minutes:g} minutes past the planned "
                        f"stop, until {format_time(latest)}; an earlier time also works):\n    {keep}")
    place = for_key(n.key).where_to_start
    where = f"{place} ({dashboard_url})" if dashboard_url else place
    how_to_start = (f"- {where}: find {n.key.object_name} in namespace {n.namespace} and press Start,\n"
                    f"- or: {start_command(n)}")
    minutes_left = max(0, round((n.stop_at - n.at).total_seconds() / 60)) if n.stop_at else 0
    return {
        "kind": n.kind, "namespace": n.namespace, "name": n.name, "reason": n.reason, "state": n.state,
        "rule": n.rule_id, "at": format_time(n.at), "stopAt": format_time(n.stop_at) if n.stop_at else "",
        "minutesLeft": str(minutes_left), "idleSince": format_time(n.idle_since) if n.idle_since else "",
        "howToKeep": how_to_keep, "keepCommand": keep or "",
        "keepUntilMax": format_time(latest) if latest else "", "howToStart": how_to_start,
        "startCommand": start_command(n), "maxExtendMinutes": f"{n.max_extend_minutes:g}",
        "dashboardUrl": dashboard_url or "", "traceId": n.trace_id or "",
    }


def render(n: Notice, templates: Templates | None = None, dashboard_url: str | None = None) -> tuple[str, str]:
    """(subject, body) for the notice, from the configured templates or the defaults."""
    return _render(n, fields(n, dashboard_url), templates)


def _render(n: Notice, values: dict[str, str], templates: Templates | None) -> tuple[str, str]:
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
        # Values escaped (Slack decodes the three entities in every text object, plain_text too); the mrkdwn
        # texts `verbatim` (no automatic links, channel names or mentions), so the dashboard is an explicit link.
        subject, body = _render(n, fields(n, dashboard_url, slack_escape, lambda u: f"<{slack_escape(u)}>"),
                                templates)
        doc = {"text": subject, "blocks": [
            {"type": "header", "text": {"type": "plain_text", "text": _slack_cut(subject, 150)}},
            {"type": "section", "text": {"type": "mrkdwn", "text": _slack_cut(body, 3000), "verbatim": True}},
            {"type": "context", "elements": [{"type": "mrkdwn", "text": f"kf-culler · rule {slack_escape(n.rule_id)}",
                                              "verbatim": True}]},
        ]}
    elif fmt == "teams":  # an Adaptive Card, as Teams' Workflows webhooks take it
        subject, body = _render(n, fields(n, dashboard_url, teams_escape), templates)
        shown = _shown(n, teams_escape)
        facts = [{"title": "Notebook", "value": f"{shown.namespace}/{shown.name}"},
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
            "reason": cut(n.reason, REASON), "state": n.state, "rule": n.rule_id, "at": values["at"],
            "stopAt": values["stopAt"] or None, "idleSince": values["idleSince"] or None,
            "howToKeep": values["howToKeep"] if n.kind == "warn" else None,
            "keepCommand": (values["keepCommand"] or None) if n.kind == "warn" else None,
            "keepUntilMax": (values["keepUntilMax"] or None) if n.kind == "warn" else None,
            "howToStart": values["howToStart"] if n.kind == "stop" else None,
            "startCommand": values["startCommand"] if n.kind == "stop" else None,
            "traceId": n.trace_id, "subject": subject, "text": body,
        }
    return json.dumps(doc).encode()
