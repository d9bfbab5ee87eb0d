"""People-facing output: the `check` table, JSON/YAML, and `explain`.

Names, reasons, server types and server answers are written by users: the table and `explain` print each
cut (kf_culler/text.py) and with its control characters made visible, so nothing repaints the terminal.
JSON and YAML escape control characters themselves (json.dumps: `\\u001b`; yaml.safe_dump: `"\\e"`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import yaml

from kf_culler.cycle import CycleResult, NotebookResult
from kf_culler.ide import IDE_KINDS
from kf_culler.stopped import LongStopped
from kf_culler.text import BLOCK, NAME, REASON, SNIPPET, URL, VALUE, clean
from kf_culler.timeutil import format_time

TYPE_NAMES = {k.server_type: k.name.lower() for k in IDE_KINDS}  # jupyter, code-server, rstudio


def _idle(r: NotebookResult) -> str:
    s = r.verdict.idle_seconds
    if s is None:
        return "-"
    if s < 120:
        return f"{int(s)}s"
    m = int(s // 60)
    return f"{m}m" if m < 120 else f"{m // 60}h{m % 60:02d}m"


def rows(result: CycleResult) -> list[dict[str, Any]]:
    out = []
    for r in result.results:
        out.append({
            "namespace": r.namespace, "name": r.name, "type": TYPE_NAMES.get(r.server_type, r.server_type),
            "gpus": r.gpus, **r.verdict.to_dict(),
            "written": None if r.write is None else r.write.outcome,
            "event": None if r.write is None else r.write.event,
        })
    return out


def table(result: CycleResult, wide: bool = False) -> str:
    """One line per notebook; `wide` adds the POLICY column (what chose its policy) and whole reasons."""
    header = ["NAMESPACE", "NAME", "TYPE", "GPUS", "STATE", "IDLE", "ACTION", *(["POLICY"] if wide else []),
              "REASON"]
    lines = [header]
    for r in result.results:
        reason = clean(r.verdict.reason, REASON if wide else 90)
        policy = [clean(r.verdict.policy_rule or "-", NAME)] if wide else []
        lines.append([clean(r.namespace, NAME), clean(r.name, NAME), _type(r.server_type), str(r.gpus),
                      clean(r.verdict.state, VALUE), _idle(r), clean(r.verdict.action, VALUE), *policy, reason])
    widths = [max(len(row[i]) for row in lines) for i in range(len(header) - 1)]
    return "\n".join("   ".join(c.ljust(w) for c, w in zip(row[:-1], widths, strict=True)) + "   " + row[-1]
                     for row in lines)


def _type(server_type: str) -> str:
    """The server type's name; an unknown one (a user's annotation) cut and made visible."""
    return TYPE_NAMES.get(server_type) or clean(server_type, VALUE)


def not_taken(result: CycleResult) -> list[str]:
    """One warning per session whose stop did not take (rule 1): its GPU is still held."""
    return [f"the stop of {r.namespace}/{r.name} did not take: its pod still holds {r.gpus} GPU(s) "
            f"(docs/targets.md, \"A stop that does not take\")" for r in result.results
            if r.verdict.rule_id == "1-stop-not-taken"]


def render(result: CycleResult, fmt: str, warnings: Sequence[str] = ()) -> str:
    """`warnings` (e.g. no GPU metrics source, a stop that did not take): `# warning: ...` lines above the table,
    `warnings` in JSON/YAML."""
    warnings = [*warnings, *not_taken(result)]
    if fmt in ("json", "yaml"):
        doc: dict[str, Any] = {"now": result.now.isoformat(), **({"warnings": list(warnings)} if warnings else {}),
                               "notebooks": rows(result)}
        return json.dumps(doc, indent=2) if fmt == "json" else yaml.safe_dump(doc, sort_keys=False)
    return "".join(f"# warning: {clean(w, BLOCK)}\n" for w in warnings) + table(result, wide=fmt == "wide")


def explain(r: NotebookResult, notifications: str | None = None) -> str:
    v = r.verdict
    out = [f"Notebook {clean(r.namespace, NAME)}/{clean(r.name, NAME)}  (server type "
           f"{clean(r.server_type, VALUE)}, {r.gpus} GPU(s))", ""]
    out.append(f"Verdict: {clean(v.action, VALUE)} / {clean(v.state, VALUE)}   (rule {clean(v.rule_id, VALUE)})")
    out.append(f"Reason:  {clean(v.reason, REASON)}")
    if v.policy_rule is not None:
        out.append(f"Policy: rule {clean(v.policy_rule, NAME)}")
    d = v.to_dict()
    for label, key in (("Idle since", "idleSince"), ("Warn at", "warnAt"), ("Stop at", "stopAt")):
        if d.get(key):
            out.append(f"{label + ':':<11} {clean(d[key], VALUE)}")
    out.append("")
    out.append("Sources (raw answers, then how they were read):")
    if not r.observations:
        out.append("  (none asked: the verdict did not need them)")
    for source, raw in r.observations.items():
        out.append(f"  {clean(source, VALUE)}:")
        text = json.dumps(raw, indent=2, default=str)  # ASCII: every control character as \uNNNN
        if len(text) > BLOCK:
            text = text[:BLOCK] + "\n  … (truncated)"
        out.extend("    " + line for line in text.splitlines())
        if source in v.evidence:
            out.append(f"    read as: {json.dumps(v.evidence[source])}")
    for call in r.calls:
        out.append(f"  GET {clean(call.url, URL)} -> {call.status or '-'} in {call.seconds * 1000:.0f} ms"
                   + (f" ({clean(call.error, SNIPPET)})" if call.error else ""))
    out.append("")
    out.append("The culler's record (rule 15; ConfigMaps kf-culler-records-* in its namespace): "
               + (json.dumps(r.record.to_dict()) if r.record is not None and not r.record.empty else "none"))
    if notifications is not None:
        out.append("")
        out.append(f"Notifications: {clean(notifications, REASON)}")
    if r.plan is not None and not r.plan.empty:
        out.append("")
        step = r.plan.reclaim
        out.append(f"Would write: annotations {json.dumps(r.plan.annotations)}"
                   + (f"; Event {r.plan.event.reason}" if r.plan.event else "")
                   + (f"; scale the {step.kind} {clean(step.name, NAME)} to 0" if step is not None else ""))
    return "\n".join(out)



def with_long_stopped(text: str, fmt: str, found: list[LongStopped], days: float) -> str:
    """`check`'s output with the long-stopped notebooks: a section after the table, `longStopped` in JSON/YAML."""
    if fmt in ("json", "yaml"):
        doc = json.loads(text) if fmt == "json" else yaml.safe_load(text)
        doc["longStopped"] = {"days": days, "notebooks": [s.to_dict() for s in found]}
        return json.dumps(doc, indent=2) if fmt == "json" else yaml.safe_dump(doc, sort_keys=False)
    if not found:
        return text
    lines = [["NAMESPACE", "NAME", "GPUS", "STOPPED", "DAYS", "VOLUMES (kept)"]]
    for s in found:
        lines.append([clean(s.namespace, NAME), clean(s.name, NAME), str(s.gpus), format_time(s.stopped_at),
                      f"{s.days:.0f}", ", ".join(clean(v, NAME) for v in s.volumes) or "-"])
    widths = [max(len(row[i]) for row in lines) for i in range(len(lines[0]) - 1)]
    section = "\n".join("   ".join(c.ljust(w) for c, w in zip(row[:-1], widths, strict=True)) + "   " + row[-1]
                        for row in lines)
    return (f"{text}\n\nStopped for more than {days:g} days ({len(found)}; the culler deletes nothing: starting "
            f"one takes its GPUs again, deleting it is an admin's decision):\n{section}")
