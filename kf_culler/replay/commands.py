"""The `kf-culler fleet` and `kf-culler replay` subcommands (cli.py only parses arguments)."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import TextIO

from kf_culler.config import ConfigError
from kf_culler.replay.contenders import ConfiguredPolicy, make_contenders
from kf_culler.replay.fleet import BEHAVIOURS, DEFAULT_START, FleetSpec, write_fleet
from kf_culler.replay.report import render, summary, timeline_text
from kf_culler.replay.simulate import replay
from kf_culler.replay.trace import TraceError
from kf_culler.timeutil import parse_time


def parse_mix(text: str) -> dict[str, float]:
    """`name=weight,name=weight` (a bare name weighs 1)."""
    mix: dict[str, float] = {}
    for part in text.split(","):
        name, _, weight = part.strip().partition("=")
        if name not in BEHAVIOURS:
            raise ValueError(f"unknown behaviour {name!r} (known: {', '.join(BEHAVIOURS)})")
        try:
            mix[name] = float(weight) if weight else 1.0
        except ValueError:
            raise ValueError(f"behaviour weight {weight!r} is not a number") from None
    return mix


def fleet_command(*, notebooks: int, days: float, seed: int, out: str, check_minutes: int = 5,
                  start: str | None = None, mix: str | None = None, gpu_lookback_minutes: int = 30,
                  gpu_step_minutes: int = 5, list_behaviours: bool = False, stdout: TextIO | None = None,
                  stderr: TextIO | None = None) -> int:
    stdout, stderr = stdout or sys.stdout, stderr or sys.stderr
    if list_behaviours:
        for b in BEHAVIOURS.values():
            print(f"{b.name:20s} {b.weight:5.2f}  {b.description}", file=stdout)
        return 0
    begin = DEFAULT_START
    if start is not None:
        parsed = parse_time(start)
        if parsed is None:
            print(f"kf-culler fleet: --start {start!r} is not an RFC 3339 time", file=stderr)
            return 2
        begin = parsed
    try:
        spec = FleetSpec(notebooks=notebooks, days=days, seed=seed, check_minutes=check_minutes, start=begin,
                         mix=parse_mix(mix) if mix else FleetSpec(1, 1, 0).mix,
                         gpu_lookback_minutes=gpu_lookback_minutes, gpu_step_minutes=gpu_step_minutes)
    except ValueError as err:
        print(f"kf-culler fleet: {err}", file=stderr)
        return 2
    t0 = time.perf_counter()
    try:
        n = write_fleet(spec, out)
    except OSError as err:
        print(f"kf-culler fleet: {out}: {err.strerror or err}", file=stderr)
        return 1
    print(f"wrote {n:,} records for {notebooks} notebooks over {days:g} days to {out} "
          f"in {time.perf_counter() - t0:.1f} s", file=stderr)
    return 0


def replay_command(*, trace: str, config: str | None, compare: list[str], plot: str | None = None,
                   timeline: str | None = None, timeline_plot: str | None = None,
                   restart_delay_minutes: float = 5, check_period_minutes: float | None = None,
                   oracle_idle_minutes: float | None = None, output_format: str = "text", max_list: int = 20,
                   stdout: TextIO | None = None, stderr: TextIO | None = None) -> int:
    stdout, stderr = stdout or sys.stdout, stderr or sys.stderr
    try:
        rules = make_contenders(config, compare)
    except ConfigError as err:
        print(f"kf-culler replay: {err}", file=stderr)
        return 2
    resources = rules[0].settings.policy.gpu_resources if isinstance(rules[0], ConfiguredPolicy) else (
        "nvidia.com/gpu",)
    try:
        result = replay(trace, rules, restart_delay_minutes=restart_delay_minutes,
                        check_period_minutes=check_period_minutes, oracle_idle_minutes=oracle_idle_minutes,
                        timeline_id=timeline, gpu_resources=resources)
    except TraceError as err:
        print(f"kf-culler replay: {err}", file=stderr)
        return 2
    except OSError as err:
        print(f"kf-culler replay: {trace}: {err.strerror or err}", file=stderr)
        return 2
    if output_format == "json":
        print(json.dumps(summary(result), indent=2), file=stdout)
    else:
        print(render(result, markdown=output_format == "markdown", max_list=max_list), end="", file=stdout)
    if timeline:
        print("", file=stdout)
        print(timeline_text(result), end="", file=stdout)
        if not result.timeline:
            print(f"kf-culler replay: no records for {timeline} in {trace}", file=stderr)
            return 2
    if plot or (timeline and timeline_plot):
        try:
            from kf_culler.replay import plot as plots
        except ImportError:
            print("kf-culler replay: plots need matplotlib (pip install 'kf-culler[replay]')", file=stderr)
            return 1
        if plot:
            plots.comparison_png(result, plot)
            print(f"wrote {plot}", file=stderr)
        if timeline and (timeline_plot or plot):
            target = timeline_plot or str(Path(plot or "timeline.png").with_suffix("")) + "-timeline.png"
            plots.timeline_png(result, target)
            print(f"wrote {target}", file=stderr)
    return 0
