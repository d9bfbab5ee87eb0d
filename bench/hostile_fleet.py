"""Hostile notebooks in a fleet: a run of bench/cycle.py with `--hostile N` against one without.

    python bench/cycle.py --notebooks 1000 --crossing 20 --hostile 0 --steady-minutes 4 --netns --json hb0.json
    python bench/cycle.py --notebooks 1000 --crossing 20 --hostile 20 --steady-minutes 4 --netns --json hb20.json
    python bench/hostile_fleet.py hb0.json hb20.json [more runs ...] [--json comparison.json]

Each run's report (`--json` of bench/cycle.py) holds the culler child's own peak RSS (VmHWM), its passes,
every notebook's verdicts (the distinct consecutive `action/state` of its passes, its last stop time
from the fleet's start) and each crossing notebook's delay from its idle limit to its stop annotation.
The runs without hostile notebooks are the base, the others the hostile runs; this prints each run, then
for every pair of runs (base against base and hostile against hostile too, the noise between two runs
of the same fleet) the ordinary notebooks (idle, active, hanging) whose verdicts differ and the largest
difference in a crossing notebook's stop delay, and the change of the mean peak RSS.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
from pathlib import Path
from typing import Any

ORDINARY = ("idle", "active", "hang")


def load(path: str) -> dict[str, Any]:
    report: dict[str, Any] = json.loads(Path(path).read_text())
    report["path"] = path
    if "verdicts" not in report.get("ours", {}):
        raise SystemExit(f"{path}: no verdicts in the report (made by an older bench/cycle.py?)")
    return report


def row(r: dict[str, Any]) -> dict[str, Any]:
    """One run's figures."""
    ours = r["ours"]
    steady = [c["wallSeconds"] for c in ours["cycles"][1:] if "profiled" not in c["label"]]
    delays = ours["crossing"]["latencies"]
    hostile = [v for v in ours["verdicts"].values() if v["cls"] not in (*ORDINARY, "crossing")]
    return {
        "run": Path(r["path"]).name, "hostilePerKind": r["spec"].get("hostile", 0),
        "notebooks": len(ours["verdicts"]), "hostileNotebooks": len(hostile),
        "peakRssMiB": round(ours["peakRssMiB"], 1),
        "peakRssAtSyncMiB": round(ours["sync"].get("peakRssMiB", 0.0), 1),
        "rssAfterSyncMiB": round(ours["sync"]["rssMiB"], 1),
        "coldPassSeconds": round(ours["cycles"][0]["wallSeconds"], 2),
        "steadyPasses": len(steady),
        "steadyPassSecondsMedian": round(statistics.median(steady), 2) if steady else None,
        "steadyPassSecondsMax": round(max(steady), 2) if steady else None,
        "crossingStopped": f"{ours['crossing']['stopped']}/{ours['crossing']['count']}",
        "stopDelaySecondsMedian": round(statistics.median(delays), 1) if delays else None,
        "stopDelaySecondsMax": round(max(delays), 1) if delays else None,
        "load": f"{r['machine'].get('loadAtStart', '?')} .. {r['machine'].get('loadAtEnd', '?')}",
    }


def same_time(x: float | None, y: float | None, slack: float = 1.0) -> bool:
    if x is None or y is None:
        return x is None and y is None
    return abs(x - y) <= slack


def compare(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """What differs between two runs for the notebooks both have (the ordinary and crossing ones)."""
    va, vb = a["ours"]["verdicts"], b["ours"]["verdicts"]
    ordinary = sorted(k for k, v in va.items() if v["cls"] in ORDINARY and k in vb)
    missing = sorted(k for k, v in va.items() if v["cls"] in (*ORDINARY, "crossing") and k not in vb)
    final = [k for k in ordinary if va[k]["trail"][-1] != vb[k]["trail"][-1]]
    trail = [k for k in ordinary if va[k]["trail"] != vb[k]["trail"]]
    rule = [k for k in ordinary if va[k].get("rule") != vb[k].get("rule")]
    # An idle notebook's planned stop is fixed from the fleet's start (idle since a set time): it must agree.
    stop_at = [k for k in ordinary if va[k]["cls"] == "idle" and not same_time(va[k]["stopAt"], vb[k]["stopAt"])]
    crossing = sorted(k for k, v in va.items() if v["cls"] == "crossing" and k in vb)
    cross_trail = [k for k in crossing if va[k]["trail"] != vb[k]["trail"]]
    la, lb = a["ours"]["crossing"]["latencyByName"], b["ours"]["crossing"]["latencyByName"]
    both = sorted(set(la) & set(lb))
    deltas = {n: round(lb[n] - la[n], 2) for n in both}
    worst = max(deltas, key=lambda n: abs(deltas[n]), default=None)
    ra, rb = a["ours"]["peakRssMiB"], b["ours"]["peakRssMiB"]
    return {
        "a": Path(a["path"]).name, "b": Path(b["path"]).name,
        "peakRssMiB": [round(ra, 1), round(rb, 1)], "peakRssChangePercent": round(100 * (rb - ra) / ra, 1),
        "ordinary": len(ordinary), "ordinaryMissing": missing,
        "finalVerdictDiffers": final, "verdictTrailDiffers": trail, "ruleDiffers": rule,
        "idleStopAtDiffers": stop_at,
        "crossing": len(crossing), "crossingTrailDiffers": cross_trail,
        "crossingStoppedInBoth": len(both),
        "crossingStoppedInOneOnly": sorted(set(la) ^ set(lb)),
        "stopDelayDifferenceSecondsMaxAbs": abs(deltas[worst]) if worst else None,
        "stopDelayDifferenceWorst": worst,
        "stopDelayDifferenceSecondsMedian": round(statistics.median(deltas.values()), 2) if deltas else None,
        "stopDelayDifferences": deltas,
    }


def mean_peak(runs: list[dict[str, Any]]) -> float:
    return statistics.mean(float(r["ours"]["peakRssMiB"]) for r in runs)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("reports", nargs="+", help="bench/cycle.py --json reports, with and without --hostile")
    parser.add_argument("--json", type=Path, help="write the comparison here")
    args = parser.parse_args()
    runs = [load(p) for p in args.reports]
    base = [r for r in runs if not r["spec"].get("hostile")]
    hostile = [r for r in runs if r["spec"].get("hostile")]
    if not base or not hostile:
        print("need at least one run without --hostile and one with it", file=sys.stderr)
        return 2
    rows = [row(r) for r in runs]
    keys = list(rows[0])
    width = max(len(k) for k in keys)
    print(f"{'':{width}}  " + "  ".join(f"{x['run']:>22}" for x in rows))
    for key in keys[1:]:
        print(f"{key:{width}}  " + "  ".join(f"{x[key]!s:>22}" for x in rows))

    pairs = [compare(a, b) for a, b in itertools.product(base, hostile)]
    noise = [compare(a, b) for group in (base, hostile) for a, b in itertools.combinations(group, 2)]
    print()
    for label, group in (("without -> with hostile", pairs), ("same fleet, two runs (noise)", noise)):
        for c in group:
            print(f"{label}: {c['a']} -> {c['b']}: peak RSS {c['peakRssMiB'][0]} -> {c['peakRssMiB'][1]} MiB "
                  f"({c['peakRssChangePercent']:+.1f} %); of {c['ordinary']} ordinary notebooks "
                  f"{len(c['finalVerdictDiffers'])} final verdicts differ, {len(c['verdictTrailDiffers'])} "
                  f"verdict trails, {len(c['ruleDiffers'])} rules, {len(c['idleStopAtDiffers'])} idle stop times; "
                  f"{len(c['crossingTrailDiffers'])} of {c['crossing']} crossing trails differ; stop delay "
                  f"difference max {c['stopDelayDifferenceSecondsMaxAbs']} s ({c['stopDelayDifferenceWorst']}), "
                  f"median {c['stopDelayDifferenceSecondsMedian']} s over {c['crossingStoppedInBoth']} stopped "
                  f"in both" + (f"; stopped in one run only: {c['crossingStoppedInOneOnly']}"
                                if c["crossingStoppedInOneOnly"] else ""))
            for k in c["verdictTrailDiffers"][:10]:
                va = next(r for r in runs if Path(r["path"]).name == c["a"])["ours"]["verdicts"][k]
                vb = next(r for r in runs if Path(r["path"]).name == c["b"])["ours"]["verdicts"][k]
                print(f"    {k} ({va['cls']}): {' > '.join(va['trail'])}  |  {' > '.join(vb['trail'])}")
    change = 100 * (mean_peak(hostile) - mean_peak(base)) / mean_peak(base)
    print(f"\nmean peak RSS: {mean_peak(base):.1f} MiB without ({len(base)} runs), {mean_peak(hostile):.1f} MiB "
          f"with ({len(hostile)} runs): {change:+.1f} % (target: at most 10 %)")
    if args.json:
        args.json.write_text(json.dumps({"runs": rows, "pairs": pairs, "noise": noise,
                                         "meanPeakRssChangePercent": round(change, 1)}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
