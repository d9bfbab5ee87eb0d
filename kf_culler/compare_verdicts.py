"""`kf-culler check --compare-config FILE`: beside each notebook's verdict, the one another configuration gives.

One pass gathers the evidence with the running configuration (its sources, its probes, its GPU look-back) and
decides with it, as `check` always does. Each notebook of that pass is then chosen a policy and decided again
with the other configuration (kf_culler/cycle.py `Cycle.select`, then `decide_view`), from the same objects and
the same observations: one gather, two pure decisions. A notebook the running configuration did not probe
(stopped, exempt, starting, broken) but the other one would have: its other verdict is decided without an IDE
answer, and says so. docs/replay.md, "Record, sweep, apply".
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import yaml

from kf_culler.config import Settings
from kf_culler.cycle import NO_PROBE_STATES, Cycle, CycleResult, NotebookResult
from kf_culler.model import InputError, Verdict
from kf_culler.report import not_taken
from kf_culler.rules import decide_view
from kf_culler.runner import gpu_window_minutes
from kf_culler.targets import SessionKey, session_key
from kf_culler.text import BLOCK, NAME, REASON, VALUE, clean
from kf_culler.timeutil import clock_text

UNPROBED = "not probed in this pass (the running configuration did not need it): decided without an IDE answer"


@dataclass
class Compared:
    result: NotebookResult  # the running configuration's
    other: Verdict | None  # the other configuration's; None: it does not select the notebook
    note: str | None = None  # why there is no other verdict, or what it rests on

    @property
    def differs(self) -> bool:
        """Another action, state or rule, or another stop time ahead (two stops now are the same step)."""
        v, o = self.result.verdict, self.other
        return o is None or _step(v) != _step(o)


def _step(v: Verdict) -> tuple[object, ...]:
    return v.action, v.state, v.rule_id, None if v.action == "stop" else v.stop_at


def compare(result: CycleResult, items: Sequence[tuple[dict[str, Any], dict[str, Any] | None]], cycle: Cycle,
            other: Settings, namespace_labels: Callable[[str], Mapping[str, str] | None] | None = None
            ) -> list[Compared]:
    """Each notebook of the pass (`result`, run by `cycle` over `items`) with the verdict `other` gives it.
    `namespace_labels`: the namespaces' labels, for `other`'s rules that select by them (the running pass's cycle
    reads none when its own rules do not)."""
    by_key = {session_key(nb): (nb, pod) for nb, pod in items}
    theirs = dataclasses.replace(cycle, settings=other,
                                 namespace_labels=namespace_labels if other.needs_namespace_labels else None)
    out = []
    for r in result.results:
        found = by_key.get(SessionKey(r.namespace, r.name))
        if found is None:  # not reached: every result is of an item
            out.append(Compared(r, None, "not found among the pass's notebooks"))
            continue
        nb, pod = found
        if not theirs.in_scope(nb):
            out.append(Compared(r, None, "not selected: namespaces.include/exclude"))
            continue
        try:
            sel = theirs.select(nb, pod, result.started)
            if sel is None:
                out.append(Compared(r, None, "not selected: gpuOnly (the notebook has no GPU)"))
                continue
            first = decide_view(sel.view, {}, sel.policy, result.started)
            verdict = first if first.state in NO_PROBE_STATES else decide_view(
                sel.view, r.observations, sel.policy, result.now)
        except InputError as err:
            out.append(Compared(r, None, f"not a notebook: {err}"))
            continue
        note = UNPROBED if first.state not in NO_PROBE_STATES and r.verdict.state in NO_PROBE_STATES else None
        out.append(Compared(r, dataclasses.replace(verdict, policy_rule=sel.policy_rule), note))
    return out


def warnings_for(running: Settings, other: Settings, path: str) -> list[str]:
    """What the comparison cannot show: evidence the running configuration did not gather for the other one."""
    out = []
    if running.gpu_source_configured and gpu_window_minutes(other) > gpu_window_minutes(running):
        out.append(f"{path} applies longer GPU limits than the running configuration: the GPU samples were "
                   f"queried for {gpu_window_minutes(running):g} minutes, it needs {gpu_window_minutes(other):g}")
    if other.operations != running.operations:
        out.append(f"{path} sets other operations (sources, probes, namespaces...) than the running "
                   "configuration: the evidence was gathered with the running configuration's")
    return out


def _next(v: Verdict, now: Any) -> str:
    """What happens next: `stop now`, `warn, stop 14:20 UTC`, `keep, stop 14:20 UTC`, or the action alone."""
    if v.action == "stop":
        return "stop now"
    if v.stop_at is None:
        return v.action
    return f"{v.action}, stop {clock_text(v.stop_at, now)}"


def table(rows: list[Compared], now: Any, label: str, wide: bool = False) -> str:
    header = ["NAMESPACE", "NAME", "GPUS", "STATE", "NEXT", f"STATE ({label})", f"NEXT ({label})", "",
              "REASON" if not wide else f"REASON ({label})"]
    lines = [header]
    for c in rows:
        v, o = c.result.verdict, c.other
        reason = c.note if o is None else (o.reason + (f" [{c.note}]" if c.note else "")) if wide else (
            c.note or (o.reason if c.differs else ""))
        lines.append([clean(c.result.namespace, NAME), clean(c.result.name, NAME), str(c.result.gpus),
                      clean(v.state, VALUE), _next(v, now), clean(o.state, VALUE) if o else "-",
                      _next(o, now) if o else "-", "*" if c.differs else "",
                      clean(reason or "", REASON if wide else 90)])
    widths = [max(len(row[i]) for row in lines) for i in range(len(header) - 1)]
    return "\n".join(("   ".join(cell.ljust(w) for cell, w in zip(row[:-1], widths, strict=True)) + "   "
                      + row[-1]).rstrip() for row in lines)


def render(rows: list[Compared], result: CycleResult, fmt: str, label: str, warnings: Sequence[str] = ()) -> str:
    """The comparison as a table (`*` marks a notebook whose verdict differs), or JSON/YAML."""
    warnings = [*warnings, *not_taken(result)]
    if fmt in ("json", "yaml"):
        doc: dict[str, Any] = {
            "now": result.now.isoformat(), "compared": label, **({"warnings": list(warnings)} if warnings else {}),
            "notebooks": [{"namespace": c.result.namespace, "name": c.result.name, "gpus": c.result.gpus,
                           "differs": c.differs, "current": c.result.verdict.to_dict(),
                           "compared": c.other.to_dict() if c.other else None, "note": c.note} for c in rows]}
        return json.dumps(doc, indent=2) if fmt == "json" else yaml.safe_dump(doc, sort_keys=False)
    head = "".join(f"# warning: {clean(w, BLOCK)}\n" for w in warnings)
    differ = sum(c.differs for c in rows)
    return (head + table(rows, result.now, label, wide=fmt == "wide")
            + f"\n# {differ} of {len(rows)} notebooks get another verdict with {clean(label, NAME)}")
