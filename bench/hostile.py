"""Hostile notebook servers in a pass: the culler's memory and event loop, with and without them.

    python bench/hostile.py [--ordinary 200] [--hostile 20] [--json out.json]

A loopback server (tests/support/faulty.py, in a process of its own so that its memory is not
counted) answers `--ordinary` notebooks with a valid idle Jupyter answer (`ok`) and `--hostile`
notebooks with one of the hostile kinds, round robin: an endless header (1 KiB lines, one endless
line, a thousand short lines, a line every 0.25 s), 1 MiB of `[{},{},...]` for api/kernels, a list
nested 25 deep, 2,000 kernels. `kf_culler.gather.gather` runs over them with the default Operations
(only the Jupyter URL template points at the server), on the culler's uvloop loop, once per scenario,
each scenario in a fresh child process: peak RSS (VmHWM) over the process's RSS before the pass,
the gather time, the longest the loop was blocked (a 10 ms ticker), what `Gathered.observations`
keeps, then the same pass again under tracemalloc for its peak. Figures only; no assertions.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
import tracemalloc
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))

KINDS = ["endlesshead", "longline", "manyheaders", "slowhead", "flat", "deep", "many"]

SERVER = """
import sys, time
sys.path.insert(0, sys.argv[1])
from support.faulty import FaultyServer
with FaultyServer(port=int(sys.argv[2])) as server:
    print("ready", flush=True)
    sys.stdin.read()  # until the bench closes it
"""


def rss_mib(field: str = "VmRSS") -> float:
    """This process's RSS (VmRSS), or its own peak RSS (VmHWM: not getrusage's ru_maxrss, which on Linux
    carries over the parent's peak from before the fork and exec), in MiB."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(f"{field}:"):
                return int(line.split()[1]) / 1024
    return 0.0


def deep_size(value: Any, seen: set[int] | None = None) -> int:
    seen = set() if seen is None else seen
    if id(value) in seen:
        return 0
    seen.add(id(value))
    size = sys.getsizeof(value)
    if isinstance(value, dict):
        size += sum(deep_size(k, seen) + deep_size(v, seen) for k, v in value.items())
    elif isinstance(value, list | tuple):
        size += sum(deep_size(v, seen) for v in value)
    return size


def scenario(port: int, ordinary: int, hostile: int) -> dict[str, Any]:
    """One scenario, in this (child) process."""
    from kf_culler.config import Operations
    from kf_culler.cycle import run_async
    from kf_culler.gather import Gathered, Request, gather

    ops = Operations.model_validate({"urls": {"jupyter": f"http://127.0.0.1:{port}/{{name}}/"}})
    requests = [Request("bench", f"nb{i}-ok", f"nb{i}-ok-0", "jupyter", False) for i in range(ordinary)]
    requests += [Request("bench", f"h{i}-{KINDS[i % len(KINDS)]}", f"h{i}-0", "jupyter", False)
                 for i in range(hostile)]

    async def timed() -> tuple[Gathered, float, float]:
        gaps = [0.0]
        done = asyncio.Event()

        async def ticker() -> None:
            last = time.monotonic()
            while not done.is_set():
                await asyncio.sleep(0.01)
                now = time.monotonic()
                gaps.append(now - last - 0.01)
                last = now

        tick = asyncio.create_task(ticker())
        t0 = time.monotonic()
        try:
            got = await gather(requests, ops, datetime.now(UTC))
        finally:
            seconds = time.monotonic() - t0
            done.set()
            await tick
        return got, seconds, max(gaps)

    run_async(gather(requests[:1], ops, datetime.now(UTC)))  # imports and first-use costs out of the way
    rss_before = rss_mib()
    got, seconds, gap = run_async(timed())
    peak_rss = rss_mib("VmHWM")
    errors = sum(1 for obs in got.observations.values() if "error" in obs.get("jupyter", {}))
    kept = deep_size(got.observations)
    kept_calls = deep_size(got.calls)
    del got

    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        traced = run_async(gather(requests, ops, datetime.now(UTC)))
        current, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    del traced
    return {"notebooks": len(requests), "ordinary": ordinary, "hostile": hostile, "errors": errors,
            "gatherSeconds": round(seconds, 3), "worstLoopBlockSeconds": round(gap, 3),
            "rssBeforeMiB": round(rss_before, 1), "peakRssMiB": round(peak_rss, 1),
            "peakRssOverBeforeMiB": round(peak_rss - rss_before, 1),
            "tracemallocPeakMiB": round(peak / 2**20, 2), "tracemallocHeldAfterMiB": round(current / 2**20, 2),
            "observationsKiB": round(kept / 1024, 1), "callsKiB": round(kept_calls / 1024, 1)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ordinary", type=int, default=200)
    parser.add_argument("--hostile", type=int, default=20)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--scenario", nargs=3, type=int, metavar=("PORT", "ORDINARY", "HOSTILE"),
                        help=argparse.SUPPRESS)  # internal: one scenario in a child process
    args = parser.parse_args()
    if args.scenario:
        print(json.dumps(scenario(*args.scenario)))
        return 0

    from kf_culler.local.procs import free_port

    port = free_port()
    server = subprocess.Popen([sys.executable, "-c", SERVER, str(ROOT / "tests"), str(port)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    results = []
    try:
        assert server.stdout is not None and server.stdout.readline().strip() == "ready"
        for ordinary, hostile in ((args.ordinary, 0), (args.ordinary, args.hostile)):
            out = subprocess.run([sys.executable, __file__, "--scenario", str(port), str(ordinary), str(hostile)],
                                 capture_output=True, text=True, timeout=600, check=True,
                                 env={**os.environ, "PYTHONHASHSEED": "0"})
            results.append(json.loads(out.stdout.strip().splitlines()[-1]))
    finally:
        if server.stdin is not None:
            server.stdin.close()
        try:
            server.wait(10)
        except subprocess.TimeoutExpired:
            server.kill()
    kinds = ", ".join(f"{KINDS[i % len(KINDS)]}" for i in range(min(args.hostile, len(KINDS))))
    print(f"python {sys.version.split()[0]}; default Operations (probe.timeoutSeconds 5, concurrency 512); "
          f"hostile kinds round robin: {kinds}")
    keys = list(results[0])
    width = max(len(k) for k in keys)
    print(f"{'':{width}}  {'without hostile':>16}  {'with hostile':>16}")
    for key in keys:
        print(f"{key:{width}}  {results[0][key]!s:>16}  {results[1][key]!s:>16}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
