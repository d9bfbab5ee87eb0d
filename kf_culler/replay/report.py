"""Tables of a replay: the comparison, interruptions, per-behaviour figures, one notebook's timeline."""

from __future__ import annotations

import math
from datetime import datetime
from typing import Any

from kf_culler.replay.simulate import HOUR, ReplayResult, Stop, Tally, TimelineRow
from kf_culler.timeutil import format_time


def percentile(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile (q in 0..100) of values; None when there are none."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def reclaim_delays(stops: list[Stop]) -> list[float]:
    """Seconds from the end of the last `working` to each stop made while nobody worked."""
    return [s.idle_seconds for s in stops if s.truth in ("absent", "present") and s.idle_seconds is not None]


def _hm(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    m = round(seconds / 60)
    return f"{m // 60}:{m % 60:02d}"


def _gh(gpu_seconds: float) -> str:
    return f"{gpu_seconds / HOUR:,.1f}"


def _pct(part: float, whole: float) -> str:
    return f"{100 * part / whole:.1f} %" if whole > 0 else "-"


def summary(result: ReplayResult) -> dict[str, Any]:
    """Everything the tables show, as plain data (also the --format json output)."""
    oracle = result.oracle_gpu_s
    baseline = result.baseline_gpu_s
    policies = []
    for i, name in enumerate(result.rule_names):
        t = result.total(i)
        delays = reclaim_delays(result.stops[i])
        policies.append({
            "name": name,
            "gpuHoursHeld": t.held_gpu_s / HOUR,
            "gpuHoursReclaimed": t.reclaimed_total_gpu_s / HOUR,
            "gpuHoursReclaimedByTruth": {k: v / HOUR for k, v in sorted(t.reclaimed_gpu_s.items())},
            "oracleShare": t.oracle_matched_gpu_s / oracle if oracle > 0 and result.truth_known else None,
            "interruptions": t.interruptions if result.truth_known else None,
            "interruptedWorkingIntervals": t.interrupted_intervals if result.truth_known else None,
            "stopsWhilePresent": t.present_stops if result.truth_known else None,
            "stopsWhileAbsent": t.absent_stops if result.truth_known else None,
            "stops": t.stops,
            "restarts": t.restarts,
            "workingHoursLost": t.working_lost_s / HOUR if result.truth_known else None,
            "timeToReclaimMinutes": {f"p{q}": (None if (v := percentile(delays, q)) is None else v / 60)
                                     for q in (50, 90, 99)},
            "warnings": t.warnings,
            "checks": t.checks,
            "interruptionList": [{"time": format_time(s.time), "notebook": s.id, "reason": s.reason}
                                 for s in result.stops[i] if s.truth == "working"],
        })
    return {
        "trace": {"start": format_time(result.header.start), "synthetic": result.header.synthetic,
                  "notebooks": len(result.notebooks), "records": result.records,
                  "checkPeriodSeconds": result.header.check_period_seconds},
        "replay": {"checkPeriodSeconds": result.check_period_seconds or result.header.check_period_seconds,
                   "restartDelayMinutes": result.restart_delay_minutes,
                   "oracleIdleMinutes": result.oracle_idle_minutes, "seconds": result.seconds,
                   "decideCalls": result.decide_calls, "truthKnown": result.truth_known},
        "gpuHoursWithoutCuller": baseline / HOUR,
        "oracleReclaimableGpuHours": oracle / HOUR if result.truth_known else None,
        "policies": policies,
        "behaviours": behaviour_table(result),
    }


def behaviour_table(result: ReplayResult) -> list[dict[str, Any]]:
    """Per generator behaviour (synthetic traces): held, oracle, and per rule reclaimed share and stops."""
    groups: dict[str, list[str]] = {}
    for key, nb in result.notebooks.items():
        if nb.behaviour:
            groups.setdefault(nb.behaviour, []).append(key)
    rows = []
    for behaviour in sorted(groups):
        keys = groups[behaviour]
        base = sum(result.notebooks[k].baseline_gpu_s for k in keys)
        oracle = sum(result.notebooks[k].oracle_gpu_s for k in keys)
        per_rule = []
        for i in range(len(result.rule_names)):
            t = Tally()
            for k in keys:
                t.add(result.tallies[i][k])
            per_rule.append({"gpuHoursReclaimed": t.reclaimed_total_gpu_s / HOUR,
                             "oracleShare": t.oracle_matched_gpu_s / oracle if oracle > 0 else None,
                             "interruptions": t.interruptions, "stopsWhilePresent": t.present_stops})
        rows.append({"behaviour": behaviour, "notebooks": len(keys), "gpuHoursWithoutCuller": base / HOUR,
                     "oracleReclaimableGpuHours": oracle / HOUR, "policies": per_rule})
    return rows


def _grid(rows: list[list[str]], markdown: bool) -> str:
    widths = [max(len(r[c]) for r in rows) for c in range(len(rows[0]))]
    if markdown:
        rule = "|" + "|".join(["---"] + ["---:"] * (len(widths) - 1)) + "|"
        lines = ["| " + " | ".join(rows[0]) + " |", rule]
        lines += ["| " + " | ".join(r) + " |" for r in rows[1:]]
        return "\n".join(lines)
    out = []
    for n, r in enumerate(rows):
        out.append("  ".join(cell.ljust(widths[c]) if c == 0 else cell.rjust(widths[c])
                             for c, cell in enumerate(r)).rstrip())
        if n == 0:
            out.append("  ".join("-" * w for w in widths))
    return "\n".join(out)


def comparison_table(result: ReplayResult, markdown: bool = False) -> str:
    s = summary(result)
    known = result.truth_known
    rows: list[list[str]] = [["", *result.rule_names]]

    def row(label: str, values: list[str]) -> None:
        rows.append([label, *values])

    pols = s["policies"]
    row("GPU-hours held", [f"{p['gpuHoursHeld']:,.1f}" for p in pols])
    row("GPU-hours reclaimed", [f"{p['gpuHoursReclaimed']:,.1f}" for p in pols])
    for truth in ("absent", "present", "working") if known else ("unknown",):
        row(f"  reclaimed while {truth}" if known else "  reclaimed",
            [f"{p['gpuHoursReclaimedByTruth'].get(truth, 0.0):,.1f}" for p in pols])
    if known:
        row("share of oracle reclaimable", [f"{100 * p['oracleShare']:.1f} %" if p["oracleShare"] is not None
                                            else "-" for p in pols])
        row("interruptions (stops while working)", [str(p["interruptions"]) for p in pols])
        row("  working intervals interrupted", [str(p["interruptedWorkingIntervals"]) for p in pols])
        row("stops while present", [str(p["stopsWhilePresent"]) for p in pols])
        row("stops while absent", [str(p["stopsWhileAbsent"]) for p in pols])
        row("restarts by returning users", [str(p["restarts"]) for p in pols])
        row("working hours lost (stopped, restarting)", [f"{p['workingHoursLost']:,.1f}" for p in pols])
        ttr = [p["timeToReclaimMinutes"] for p in pols]
        row("time to reclaim p50 / p90 / p99 (h:mm)",
            [" / ".join(_hm(None if t[q] is None else t[q] * 60) for q in ("p50", "p90", "p99"))
             for t in ttr])
    else:
        row("stops", [str(p["stops"]) for p in pols])
    row("warnings", [str(p["warnings"]) for p in pols])
    row("checks", [f"{p['checks']:,}" for p in pols])
    return _grid(rows, markdown)


def behaviour_grid(result: ReplayResult, markdown: bool = False) -> str:
    rows: list[list[str]] = [["behaviour", "notebooks", "GPU-h held (no culler)", "oracle GPU-h",
                              *[f"{n}: share / interruptions" for n in result.rule_names]]]
    for b in behaviour_table(result):
        rows.append([b["behaviour"], str(b["notebooks"]), f"{b['gpuHoursWithoutCuller']:,.0f}",
                     f"{b['oracleReclaimableGpuHours']:,.0f}",
                     *[("-" if p["oracleShare"] is None else f"{100 * p['oracleShare']:.0f} %")
                       + f" / {p['interruptions']}" for p in b["policies"]]])
    return _grid(rows, markdown) if len(rows) > 1 else ""


def render(result: ReplayResult, markdown: bool = False, max_list: int = 20) -> str:
    s = summary(result)
    h = result.header
    lines = [
        f"Trace: {s['trace']['notebooks']:,} notebooks, {s['trace']['records']:,} records from "
        f"{format_time(h.start)}" + (f" to {format_time(h.end)}" if h.end else "")
        + (", synthetic (with ground truth)" if h.synthetic else ""),
        f"Replay: each notebook checked every {_minutes(s['replay']['checkPeriodSeconds'])}; "
        f"a stopped notebook restarts {result.restart_delay_minutes:g} min after its user returns; "
        f"oracle idle limit {result.oracle_idle_minutes:g} min; {result.records:,} records and "
        f"{result.decide_calls:,} decide calls in {result.seconds:.1f} s",
        f"GPU-hours held without a culler: {_gh(result.baseline_gpu_s)}"
        + (f"; reclaimable by the oracle (held while absent beyond {result.oracle_idle_minutes:g} min): "
           f"{_gh(result.oracle_gpu_s)}" if result.truth_known else "; no ground truth in this trace"),
        "",
        comparison_table(result, markdown),
    ]
    if result.truth_known:
        for p in s["policies"]:
            listed = p["interruptionList"]
            if not listed:
                continue
            lines += ["", f"Interruptions by {p['name']} ({len(listed)}):"]
            for item in listed[:max_list]:
                lines.append(f"  {item['time']}  {item['notebook']}  {item['reason']}")
            if len(listed) > max_list:
                lines.append(f"  ... and {len(listed) - max_list} more")
    grid = behaviour_grid(result, markdown)
    if grid:
        lines += ["", "By behaviour (share of the oracle's reclaimable GPU-hours / interruptions):", "", grid]
    return "\n".join(lines) + "\n"


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:g} min"


def _signal_text(sig: dict[str, Any]) -> str:
    parts = []
    ide = sig.get("ide")
    if ide:
        if "error" in ide:
            parts.append(f"{ide['source']}: unreadable")
        else:
            flags = [w for w, on in (("busy", ide["busy"]), ("connected", ide["connected"])) if on]
            last = ide.get("lastActivity")
            when = f"last {last:%a %H:%M}" if isinstance(last, datetime) else "no activity"
            parts.append(f"{ide['source']}: {', '.join(flags) or 'quiet'}, {when}")
    gpu = sig.get("gpu")
    if gpu:
        parts.append("gpu: unreadable" if "error" in gpu else f"gpu {gpu['util']:g}% {gpu['mem']:g}MiB")
    return "; ".join(parts) or "-"


def timeline_text(result: ReplayResult) -> str:
    """The rows of one notebook's timeline at which anything changed."""
    if not result.timeline:
        return f"No records for {result.timeline_id} in the trace.\n"
    nb = result.notebooks.get(result.timeline_id or "")
    head = f"Timeline of {result.timeline_id}"
    if nb is not None:
        head += f" ({nb.behaviour}, {nb.gpus} GPU)" if nb.behaviour else f" ({nb.gpus} GPU)"
    lines = [head, ""]
    previous: tuple[Any, ...] | None = None
    for row in result.timeline:
        rule_states = tuple(_rule_state(running, check, row) for running, check in row.rules)
        sig = _signal_text(row.signals) if row.world_running else "(no running pod)"
        key = (row.truth, row.world_running, _signal_kind(row.signals), rule_states)
        if key == previous:
            continue
        previous = key
        lines.append(f"{row.time:%a %Y-%m-%d %H:%M}  truth={row.truth or '?'}  {sig}")
        for name, (running, check) in zip(result.rule_names, row.rules, strict=True):
            state = _rule_state(running, check, row)
            reason = f": {check.reason}" if check is not None and check.action in ("warn", "stop") else ""
            lines.append(f"    {name}: {state}{reason}")
    return "\n".join(lines) + "\n"


def _signal_kind(sig: dict[str, Any]) -> tuple[Any, ...]:
    """What a timeline row's signals amount to, without the times (so quiet hours print once)."""
    ide = sig.get("ide") or {}
    gpu = sig.get("gpu") or {}
    g = "unreadable" if "error" in gpu else (
        "none" if not gpu else ("util" if gpu["util"] > 0 else "") + ("+mem" if gpu["mem"] > 0 else ""))
    return ("error" in ide, ide.get("busy"), ide.get("connected"), g)


def _rule_state(running: bool, check: Any, row: TimelineRow) -> str:
    if not row.world_running:
        return "not running"
    if check is not None:
        return f"{check.action} ({check.state})" if check.action != "stop" else "STOP"
    return "running" if running else "stopped"
