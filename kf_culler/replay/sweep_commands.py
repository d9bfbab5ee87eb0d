"""`kf-culler replay TRACE --sweep` and `kf-culler convert` (cli.py only parses arguments)."""

from __future__ import annotations

import json
import sys
import time
from datetime import datetime
from typing import Any, TextIO

from kf_culler.config import ConfigError, load_mapping
from kf_culler.replay import sweep as sw
from kf_culler.replay.trace import TraceError, read_header
from kf_culler.timeutil import format_time, parse_time


def _hm(minutes: float | None) -> str:
    if minutes is None:
        return "-"
    m = round(minutes)
    return f"{m // 60}:{m % 60:02d}"


def _row(e: sw.Evaluated, f: sw.Figures, mark: str) -> list[str]:
    share = f"{100 * f.reclaimed_gpu_h / f.baseline_gpu_h:.1f} %" if f.baseline_gpu_h > 0 else "-"
    return [mark, e.label, f"{f.reclaimed_gpu_h:,.1f}", share, f"{f.restarts_per_session_day:.2f}",
            str(f.restarts), str(f.interruptions), str(f.warnings),
            f"{_hm(f.delay_minutes(50))} / {_hm(f.delay_minutes(90))}"]


def _table(rows: list[list[str]], markdown: bool) -> str:
    head = ["", "policy", "GPU-h reclaimed", "of held", "restarts / session-day", "restarts", "interruptions",
            "warnings", "reclaim p50 / p90 (h:mm)"]
    rows = [head, *rows]
    if markdown:
        lines = ["| " + " | ".join(head) + " |", "|---|---|" + "---:|" * (len(head) - 2)]
        return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows[1:]])
    widths = [max(len(r[c]) for r in rows) for c in range(len(head))]
    out = []
    for n, r in enumerate(rows):
        out.append("  ".join(c.ljust(widths[i]) if i < 2 else c.rjust(widths[i]) for i, c in enumerate(r)).rstrip())
        if n == 0:
            out.append("  ".join("-" * w for w in widths))
    return "\n".join(out)


def _marked(items: list[sw.Evaluated], current: sw.Evaluated, chosen: sw.Evaluated | None,
            of: Any = lambda e: e.total) -> list[list[str]]:
    """The frontier's rows, with the current configuration and the recommendation added where not on it. Points
    with the same figures are one row: the first of them, and how many more there are."""
    front = sw.frontier(items, of)
    alike: dict[tuple[Any, ...], list[sw.Evaluated]] = {}
    for e in front:
        f = of(e)
        alike.setdefault((round(f.reclaimed_gpu_h, 6), f.restarts, f.interruptions, f.warnings), []).append(e)
    shown = [group[0] for group in alike.values()]
    more = {id(group[0]): len(group) - 1 for group in alike.values()}
    for extra in (current, chosen):
        if extra is not None and extra not in shown:
            shown.append(extra)
    shown.sort(key=lambda e: (of(e).restarts_per_session_day, -of(e).reclaimed_gpu_h))
    rows = []
    for e in shown:
        marks = ("*" if e in front else "") + ("C" if e is current else "") + ("R" if e is chosen else "")
        row = _row(e, of(e), marks)
        if more.get(id(e)):
            row[1] += f" (+{more[id(e)]} alike)"
        rows.append(row)
    return rows


def sweep_command(*, trace: str, config: str | None, grid: list[str], per: str | None, max_restarts: float,
                  jobs: int, plot: str | None, write_config: str | None, output_format: str,
                  restart_delay_minutes: float, check_period_minutes: float | None, bound_gpu_hours: float | None,
                  stdout: TextIO | None = None, stderr: TextIO | None = None) -> int:
    stdout, stderr = stdout or sys.stdout, stderr or sys.stderr
    t0 = time.perf_counter()
    try:
        base = sw.base_mapping(config)
        points = sw.points(sw.parse_grid(grid))
        configs: list[tuple[sw.Point, dict[str, Any]]] = [({}, base), *((p, sw.with_point(base, p)) for p in points)]
        for p, raw in configs[1:]:
            load_mapping(raw, f"sweep point {sw.label(p)}")
        header = read_header(trace)
        truth_known, items = sw.evaluate(trace, configs, grouping=per, restart_delay_minutes=restart_delay_minutes,
                                         check_period_minutes=check_period_minutes, jobs=jobs)
    except ConfigError as err:
        print(f"kf-culler replay: {err}", file=stderr)
        return 2
    except TraceError as err:
        print(f"kf-culler replay: {err}", file=stderr)
        return 2
    except OSError as err:
        print(f"kf-culler replay: {trace}: {err.strerror or err}", file=stderr)
        return 2
    swept_s = time.perf_counter() - t0
    current, grid_items = items[0], items[1:]
    plan = sw.recommend(items, max_restarts, per)  # the current configuration is a candidate too
    verified: sw.Evaluated | None = None
    recommended_raw: dict[str, Any] | None = None
    if plan is not None:
        recommended_raw = sw.recommended_mapping(base, plan, per)
        _, (verified,) = sw.evaluate(trace, [({}, recommended_raw)], grouping=per,
                                     restart_delay_minutes=restart_delay_minutes,
                                     check_period_minutes=check_period_minutes)
        verified.label = "recommended" if plan.per_group else plan.top.label
        if verified.total.interruptions or verified.total.restarts_per_session_day > max_restarts + 1e-12:
            # per-group choices interact with the configuration's rules: fall back to the fleet-wide point
            plan = sw.recommend(items, max_restarts, None)
            if plan is None:
                verified, recommended_raw = None, None
            else:
                recommended_raw = sw.recommended_mapping(base, plan, None)
                _, (verified,) = sw.evaluate(trace, [({}, recommended_raw)], grouping=per,
                                             restart_delay_minutes=restart_delay_minutes,
                                             check_period_minutes=check_period_minutes)
                verified.label = plan.top.label
    total_s = time.perf_counter() - t0
    all_items = [*items, *([verified] if verified is not None else [])]
    work = "stops while working" if truth_known else \
        "stops while an IDE reported running work or the GPU worked (no ground truth)"
    f0 = current.total
    doc: dict[str, Any] = {
        "trace": {"path": trace, "start": format_time(header.start),
                  "end": format_time(header.end) if header.end else None, "groundTruth": truth_known,
                  "sessionDays": f0.session_days, "gpuHoursWithoutCuller": f0.baseline_gpu_h},
        "sweep": {"policies": len(points), "grouping": per, "jobs": jobs, "seconds": round(swept_s, 1),
                  "secondsWithVerification": round(total_s, 1), "interruptionsAre": work,
                  "maxRestartsPerSessionDay": max_restarts},
        "current": {"label": sw.CURRENT, **f0.to_dict()},
        "points": [{"label": e.label, "point": e.point, **e.total.to_dict(),
                    "frontier": e in sw.frontier([*grid_items, current]),
                    **({"groups": {g: f.to_dict() for g, f in sorted(e.groups.items())}} if per else {})}
                   for e in grid_items],
        "recommended": None,
    }
    if plan is not None and verified is not None and recommended_raw is not None:
        doc["recommended"] = {
            "top": plan.top.point, "perGroup": {g: e.point for g, e in sorted(plan.per_group.items())},
            "changes": sw.changes(base, recommended_raw), "replayedAsWritten": verified.total.to_dict(),
            "configuration": recommended_raw}
    if write_config and recommended_raw is not None and verified is not None:
        f = verified.total
        sw.write_yaml(recommended_raw, write_config,
                      f"kf-culler replay --sweep: the recommended configuration for {trace}\n"
                      f"at most {max_restarts:g} restarts per session-day and no interruption: "
                      f"{f.reclaimed_gpu_h:,.1f} GPU-hours reclaimed of {f.baseline_gpu_h:,.1f} held, "
                      f"{f.restarts_per_session_day:.2f} restarts per session-day, {f.warnings} warnings")
    if output_format == "json":
        print(json.dumps(doc, indent=2, default=str), file=stdout)
    else:
        print(render(doc, all_items, current, verified, per, output_format == "markdown"), end="", file=stdout)
    if write_config:
        if recommended_raw is None:
            print(f"kf-culler replay: no policy of the sweep fits the budget; {write_config} not written",
                  file=stderr)
        else:
            print(f"wrote {write_config}", file=stderr)
    if plot:
        try:
            from kf_culler.replay.frontier_plot import frontier_png
        except ImportError:
            print("kf-culler replay: plots need matplotlib (pip install 'kf-culler[replay]')", file=stderr)
            return 1
        try:
            frontier_png(all_items, current, verified, plot, max_restarts=max_restarts,
                         title=f"{len(points)} policies over {trace.rsplit('/', 1)[-1]}: "
                         f"{f0.session_days:,.1f} session-days, {f0.baseline_gpu_h:,.0f} GPU-h held without a culler",
                         bound_gpu_h=bound_gpu_hours)
        except ImportError:
            print("kf-culler replay: plots need matplotlib (pip install 'kf-culler[replay]')", file=stderr)
            return 1
        print(f"wrote {plot}", file=stderr)
    return 0


def render(doc: dict[str, Any], items: list[sw.Evaluated], current: sw.Evaluated, verified: sw.Evaluated | None,
           per: str | None, markdown: bool) -> str:
    t, s = doc["trace"], doc["sweep"]
    grid = [e for e in items if e is not current and e is not verified]
    lines = [
        f"Trace: {t['path']} from {t['start']}" + (f" to {t['end']}" if t["end"] else "")
        + f"; {t['sessionDays']:,.2f} session-days; {t['gpuHoursWithoutCuller']:,.1f} GPU-hours held without a culler"
        + ("" if t["groundTruth"] else "; no ground truth"),
        f"Swept {s['policies']} policies and the current configuration in {s['seconds']:.1f} s "
        f"({s['jobs']} job{'s' if s['jobs'] != 1 else ''}); interruptions are {s['interruptionsAre']}",
        "",
        "Frontier (*: on it; C: current configuration; R: recommended):",
        "",
        _table(_marked([*grid, current], current, next((e for e in [*grid, current] if verified is not None
                                                         and e.label == verified.label), None)), markdown),
    ]
    rec = doc["recommended"]
    budget = s["maxRestartsPerSessionDay"]
    lines.append("")
    if rec is None or verified is None:
        lines.append(f"No policy of the sweep reclaims without interruptions within {budget:g} restarts per "
                     "session-day.")
        return "\n".join(lines) + "\n"
    f = verified.total
    lines += [
        f"Recommended at most {budget:g} restarts per session-day and no interruption"
        + (f" (per {per} where that reclaims more)" if rec["perGroup"] else "") + ":",
        f"  top level: {sw.label(rec['top'])}",
        *[f"  {per} {g}: {sw.label(p)}" for g, p in rec["perGroup"].items()],
        f"  replayed as written: {f.reclaimed_gpu_h:,.1f} GPU-hours reclaimed ({_pct(f)} of those held), "
        f"{f.restarts_per_session_day:.2f} restarts per session-day ({f.restarts}), {f.interruptions} interruptions, "
        f"{f.warnings} warnings, reclaim p50 / p90 {_hm(f.delay_minutes(50))} / {_hm(f.delay_minutes(90))}",
        f"  the current configuration: {current.total.reclaimed_gpu_h:,.1f} GPU-hours, "
        f"{current.total.restarts_per_session_day:.2f} restarts per session-day, "
        f"{current.total.interruptions} interruptions",
        "  changes from the current configuration:",
        *[f"    {c}" for c in rec["changes"] or ["(none)"]],
        "",
        "The recommended configuration (the keys that change, to set in config.yaml):",
        "",
        _fragment(rec["configuration"], rec["changes"]),
    ]
    if per:
        lines += ["", f"Per {per} (the frontier of each):"]
        for g in sorted({g for e in grid for g in e.groups}):
            lines += ["", f"{per} {g}:", "",
                      _table(_marked([e for e in [*grid, current] if g in e.groups], current, None,
                                     of=lambda e, g=g: e.groups[g]), markdown)]
    return "\n".join(lines) + "\n"


def _pct(f: sw.Figures) -> str:
    return f"{100 * f.reclaimed_gpu_h / f.baseline_gpu_h:.1f} %" if f.baseline_gpu_h > 0 else "-"


def _fragment(configuration: dict[str, Any], changed: list[str]) -> str:
    """The top-level keys that changed, as YAML (whole sections for overrides and rules)."""
    import yaml

    keys = {c.split(":", 1)[0].split(".", 1)[0] for c in changed}
    part = {k: configuration[k] for k in configuration if k in keys}
    return yaml.safe_dump(part, sort_keys=False).rstrip() if part else "# (no change)"


def convert_command(*, template: str, out: str, namespace: str, start: str | None, check_minutes: int,
                    until_hours: float | None, stdout: TextIO | None = None, stderr: TextIO | None = None) -> int:
    from kf_culler.replay.notebookos import DEFAULT_START, TICK_SECONDS, convert

    stderr = stderr or sys.stderr
    begin: datetime = DEFAULT_START
    if start is not None:
        parsed = parse_time(start)
        if parsed is None:
            print(f"kf-culler convert: --start {start!r} is not an RFC 3339 time", file=stderr)
            return 2
        begin = parsed
    until = None if until_hours is None else round(until_hours * 3600 / TICK_SECONDS)
    try:
        sessions, records = convert(template, out, namespace=namespace, start=begin,
                                    check_ticks=max(1, round(check_minutes * 60 / TICK_SECONDS)), until_ticks=until)
    except TraceError as err:
        print(f"kf-culler convert: {err}", file=stderr)
        return 2
    except OSError as err:
        print(f"kf-culler convert: {err.filename or template}: {err.strerror or err}", file=stderr)
        return 1
    print(f"wrote {records:,} records of {sessions} sessions to {out}", file=stderr)
    return 0
