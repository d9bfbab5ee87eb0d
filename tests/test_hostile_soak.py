"""Soak: a hundred and fifty passes (a minute apart on the culler's clock) over ordinary notebooks and, beside
them, a hostile notebook of each kind, on the real API server with the real probe client. The ordinary ones
are each stopped at the first pass past their idle limit, exactly as without the hostile ones; the hostile
CPU notebooks whose servers answer garbage stay `no-signal` (never stopped for being unreadable); the one
whose user rewrites the culler's marks every pass and the one whose user's script writes it after every read
are stopped on time all the same; and the process's memory stays bounded."""

from __future__ import annotations

import math
import resource
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from support.faulty import FaultyServer
from support.passes import Passes

from kf_culler.config import load_mapping
from kf_culler.local import objects as obj
from kf_culler.model import RESTARTED_AT_ANNOTATION, STOPPED_BY_ANNOTATION, STOPPED_BY_VALUE
from kf_culler.runner import build_runner
from kf_culler.timeutil import format_time

pytestmark = [pytest.mark.slow, pytest.mark.cluster]
PASSES = 150
IDLE_MINUTES = 30
ORDINARY = [f"ord{i}-ok" for i in range(10)]
GARBAGE = ["h1-endlesshead", "h2-flat", "h3-deep", "h4-hang", "h5-e503", "h6-longline", "h7-slowhead",
           "h8-badjson", "h9-huge"]
FORGER, LOOPER = "hmarks-ok", "hloop-ok"


def test_ordinary_notebooks_are_culled_on_time_beside_hostile_ones(api: Any, namespace: str) -> None:
    start = datetime.now(UTC)
    idle_since = start - timedelta(hours=1)  # every server's last activity; the pods started before it
    limits: dict[str, float] = {}
    with FaultyServer(idle_since=idle_since) as faulty:
        for i, name in enumerate([*ORDINARY, FORGER, LOOPER]):
            limits[name] = 70 + 10 * i  # staggered: due at passes 10, 20, ... (policy rules by the app label)
        for name in [*ORDINARY, FORGER, LOOPER, *GARBAGE]:
            obj.create_notebook(api, namespace, obj.notebook(name))
            obj.running_pod(api, namespace, name, start - timedelta(hours=3))
        rules = [{"name": f"r{i}", "match": {"notebookSelector": {"matchLabels": {"app": name}}},
                  "policy": {"idleMinutes": limit}} for i, (name, limit) in enumerate(limits.items())]
        settings = load_mapping({
            "idleMinutes": IDLE_MINUTES, "warnMinutes": 0, "startupGraceMinutes": 0, "rules": rules,
            "namespaces": {"include": [namespace]}, "urls": {"jupyter": faulty.base + "/{name}/"},
            "probe": {"timeoutSeconds": 1, "connectTimeoutSeconds": 1, "retries": 0}}, "soak")
        now = [start]
        runner = Passes(build_runner(settings, api, clock=lambda: now[0]))

        def hostile_user(_now: datetime, nb: dict[str, Any], pod: Any, observations: Any, _context: Any) -> None:
            name = nb["metadata"]["name"]
            if name == FORGER:  # the culler's marks, rewritten before every decision
                obj.patch_annotations(api, namespace, name, {
                    RESTARTED_AT_ANNOTATION: format_time(now[0] - timedelta(minutes=1)),
                    STOPPED_BY_ANNOTATION: STOPPED_BY_VALUE})
            elif name == LOOPER:  # a script writing the Notebook after every read
                obj.patch_annotations(api, namespace, name, {"team.example.com/tick": format_time(now[0])})

        runner.change(on_observed=hostile_user)
        stopped_at: dict[str, int] = {}
        states: dict[str, set[str]] = {name: set() for name in GARBAGE}
        rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        with runner:
            for n in range(PASSES):
                now[0] = start + timedelta(minutes=n)
                for r in runner.once().results:
                    if r.name in states:
                        states[r.name].add(f"{r.verdict.action}/{r.verdict.state}")
                    if r.verdict.action == "stop" and r.name not in stopped_at:
                        assert r.write is not None and r.write.outcome == "patched", (r.name, r.write)
                        stopped_at[r.name] = n
        rss_growth_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss_before) / 1024

    for name in [*ORDINARY, FORGER, LOOPER]:
        # idle since the servers' last activity; passes are a minute apart from `start`, so the first pass at
        # or after the minute its limit runs out stops it
        due = math.ceil((idle_since + timedelta(minutes=limits[name]) - start).total_seconds() / 60)
        assert stopped_at.get(name) == due, (name, stopped_at.get(name), due)
    for name in GARBAGE:
        assert name not in stopped_at and states[name] == {"keep/no-signal"}, (name, states[name])
    assert rss_growth_mib < 150, rss_growth_mib
