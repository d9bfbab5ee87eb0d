"""PNG plots of a replay: the policy comparison and one notebook's timeline.

matplotlib is imported only here, when a plot is asked for.
"""

from __future__ import annotations

import importlib
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from kf_culler.replay.simulate import HOUR, ReplayResult

TRUTH_COLOURS = {"working": "#2ca02c", "present": "#ff7f0e", "absent": "#c7c7c7", None: "#ffffff"}


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def comparison_png(result: ReplayResult, path: str | Path) -> None:
    """GPU-hours reclaimed against interruptions, one point per policy, and what each reclaimed."""
    plt = _pyplot()
    names = result.rule_names
    totals = [result.total(i) for i in range(len(names))]
    known = result.truth_known
    fig, (left, right) = plt.subplots(1, 2, figsize=(14, 6.4), gridspec_kw={"width_ratios": [1, 1.2]})

    xs = [t.interruptions if known else t.stops for t in totals]
    ys = [t.reclaimed_total_gpu_s / HOUR for t in totals]
    markers = "osD^vP*X"
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, name in enumerate(names):
        left.scatter([xs[i]], [ys[i]], s=90, color=colours[i % len(colours)], marker=markers[i % len(markers)],
                     zorder=3, label=f"{name}: {xs[i]:,}, {ys[i]:,.0f} GPU-h")
    if known:
        left.axhline(result.oracle_gpu_s / HOUR, color="black", linestyle="--", linewidth=1,
                     label=f"oracle reclaimable: {result.oracle_gpu_s / HOUR:,.0f} GPU-h")
    left.set_xscale("symlog", linthresh=10)
    left.set_xlim(left=-1, right=max(10, max(xs)) * 3)
    left.set_xlabel("interruptions (stops while working), symmetric log scale" if known else "stops")
    left.set_ylabel("GPU-hours reclaimed")
    left.set_ylim(bottom=0, top=max([*ys, result.oracle_gpu_s / HOUR]) * 1.1 or 1)
    left.grid(True, alpha=0.3)
    left.legend(fontsize=7.5, loc="upper center", bbox_to_anchor=(0.5, -0.13), ncol=2)
    left.set_title("reclaimed vs interrupted")

    parts = ("absent", "present", "working") if known else ("unknown",)
    part_colours = {"absent": "#7f7f7f", "present": "#ff7f0e", "working": "#d62728", "unknown": "#1f77b4"}
    lefts = [0.0] * len(names)
    for part in parts:
        widths = [t.reclaimed_gpu_s.get(part, 0.0) / HOUR for t in totals]
        right.barh(names, widths, left=lefts, color=part_colours[part],
                   label=f"reclaimed while {part}" if known else "reclaimed")
        lefts = [a + b for a, b in zip(lefts, widths, strict=True)]
    if known:
        right.axvline(result.oracle_gpu_s / HOUR, color="black", linestyle="--", linewidth=1,
                      label="oracle reclaimable")
    right.invert_yaxis()
    right.set_xlabel("GPU-hours")
    right.legend(fontsize=7.5, loc="upper center", bbox_to_anchor=(0.5, -0.13), ncol=2)
    right.set_title(f"of {result.baseline_gpu_s / HOUR:,.0f} GPU-hours held without a culler")
    right.grid(True, axis="x", alpha=0.3)
    fig.suptitle(f"{len(result.notebooks)} notebooks, {result.records:,} records")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _spans(times: list[datetime], values: list[Any], end: datetime) -> list[tuple[datetime, datetime, Any]]:
    out: list[tuple[datetime, datetime, Any]] = []
    for i, (t, v) in enumerate(zip(times, values, strict=True)):
        nxt = times[i + 1] if i + 1 < len(times) else end
        if out and out[-1][2] == v and out[-1][1] == t:
            out[-1] = (out[-1][0], nxt, v)
        else:
            out.append((t, nxt, v))
    return out


def timeline_png(result: ReplayResult, path: str | Path) -> None:
    """One notebook: ground truth, signals, and when each policy held or had stopped it."""
    plt = _pyplot()
    mdates: Any = importlib.import_module("matplotlib.dates")

    rows = result.timeline
    if not rows:
        raise ValueError(f"no records for {result.timeline_id} in the trace")
    times = [r.time for r in rows]
    end = times[-1] + timedelta(seconds=result.header.check_period_seconds)
    n_rules = len(result.rule_names)
    fig, (top, bands) = plt.subplots(2, 1, figsize=(14, 3.2 + 0.45 * (n_rules + 4)), sharex=True,
                                     gridspec_kw={"height_ratios": [1.2, 0.5 * (n_rules + 4)]})

    util = [r.signals.get("gpu", {}).get("util") for r in rows]
    mem = [r.signals.get("gpu", {}).get("mem") for r in rows]
    if any(u is not None for u in util):
        top.plot(times, [u if u is not None else float("nan") for u in util], color="#1f77b4", linewidth=0.9,
                 label="GPU utilisation %")
        twin = top.twinx()
        twin.plot(times, [m / 1024 if m is not None else float("nan") for m in mem], color="#9467bd",
                  linewidth=0.9, label="GPU memory GiB")
        twin.set_ylabel("GiB")
        twin.set_ylim(bottom=0)
        top.legend(loc="upper left", fontsize=8)
        twin.legend(loc="upper right", fontsize=8)
    top.set_ylabel("%")
    top.set_ylim(0, 105)
    top.set_title(f"{result.timeline_id}")

    def band(y: int, spans: list[tuple[datetime, datetime, Any]], colour_of: Any) -> None:
        for a, b, v in spans:
            colour = colour_of(v)
            if colour:
                bands.broken_barh([(mdates.date2num(a), mdates.date2num(b) - mdates.date2num(a))],
                                  (y - 0.4, 0.8), color=colour, linewidth=0)

    labels = ["truth", "IDE connected", "IDE busy", "IDE unreadable"]
    band(0, _spans(times, [r.truth for r in rows], end), lambda v: TRUTH_COLOURS.get(v))
    ide = [r.signals.get("ide", {}) for r in rows]
    band(1, _spans(times, [bool(i.get("connected")) for i in ide], end), lambda v: "#17becf" if v else None)
    band(2, _spans(times, [bool(i.get("busy")) for i in ide], end), lambda v: "#bcbd22" if v else None)
    band(3, _spans(times, ["error" in i for i in ide], end), lambda v: "#d62728" if v else None)
    for k, name in enumerate(result.rule_names):
        y = 4 + k
        labels.append(name)
        held = [r.world_running and r.rules[k][0] for r in rows]
        band(y, _spans(times, held, end), lambda v: "#1f77b4" if v else None)
        for r in rows:
            check = r.rules[k][1]
            if check is not None and check.action == "stop":
                bands.plot([r.time], [y], marker="x" if r.truth == "working" else "|", color="#d62728"
                           if r.truth == "working" else "black", markersize=10, mew=2)
    bands.set_yticks(range(len(labels)))
    bands.set_yticklabels(labels, fontsize=8)
    bands.set_ylim(len(labels) - 0.5, -0.5)
    bands.xaxis.set_major_formatter(mdates.DateFormatter("%a %H:%M"))
    bands.grid(True, axis="x", alpha=0.3)
    bands.set_xlabel("time (UTC); blue: the policy lets the notebook hold its pod; x: a stop while working")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
