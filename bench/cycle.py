"""One culling cycle at scale, and the same fleet under Kubeflow's built-in culler.

    python bench/cycle.py --notebooks 1000 [--steady-minutes 10] [--json out.json]      # loopback
    python bench/cycle.py --notebooks 10000 --netns                                      # root
    python bench/cycle.py --notebooks 10000 --kubeflow [--kubeflow-minutes 10]           # root

The fleet: N Notebooks and their Running pods on a real kube-apiserver (LocalCluster), one aiohttp
server answering every notebook's Jupyter or code-server endpoints after `--latency-ms` (5% hang
past every probe timeout), and a real Prometheus scraping a stand-in dcgm-exporter with a series per
GPU of the GPU pods. A share of the notebooks is active (busy kernel, working GPU), the rest idle;
`--crossing` more notebooks in namespace bench-cross cross the idle limit during the steady window, at
times fixed relative to the start of the cold cycle (so two runs' stop delays compare pass for pass).
`--hostile N` adds, in namespace bench-hostile, N notebooks of each kind of `--hostile-kinds` whose
servers answer hostilely, and N big stopped ones (bench/fleet_server.py); `bench/hostile_fleet.py`
compares a run with them to one without.

kf-culler runs in a child process of its own (so its peak RSS and CPU are its own) with the shipped
configuration (kustomize/base/config.yaml): list+watch, a cold cycle, then a cycle every
checkPeriodSeconds for `--steady-minutes`. API requests are counted by a wrapper around the
kubernetes ApiClient's `call_api` and cross-checked with kube-apiserver's `apiserver_request_total`.

Without `--netns`, the culler's URL templates point at the endpoint server's loopback port: one
host, so connections are reused across notebooks. `--netns` (and `--kubeflow`) runs everything inside
a network namespace made for the run (its own loopback, a
resolv.conf of its own, dnsmasq answering every `*.svc.cluster.local` with 127.0.0.1, the endpoint server
on port 80 of every address, so of the Services' ClusterIPs too, which LocalCluster takes from loopback): both
cullers then reach each notebook as `<name>.<ns>.svc.cluster.local`, as in a cluster — kf-culler at its
Service's ClusterIP (`probe.serviceClusterIP`; `--set probe.serviceClusterIP=false` looks each name up
instead), Kubeflow's culler through DNS. After kf-culler's phase, Kubeflow's notebook-controller (ENABLE_CULLING=true,
IDLENESS_CHECK_PERIOD=1, CULL_IDLE_TIME large) runs on the same fleet for `--kubeflow-minutes`.

Every phase is bounded in time; everything started (processes, netns, files) is removed on exit.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import os
import re
import resource
import shutil
import signal
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from collections import Counter
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT))

from fleet_server import (  # noqa: E402
    CROSS_NAMESPACE,
    DEFAULT_HOSTILE_KINDS,
    HOSTILE_KINDS,
    HOSTILE_NAMESPACE,
    Classes,
    FleetSpec,
    Member,
    cross_time,
    members,
)

WRITE_VERBS = {"POST", "PUT", "PATCH", "DELETE", "APPLY", "CREATE", "UPDATE", "DELETECOLLECTION"}
LAST_ACTIVITY = "notebooks.kubeflow.org/last-activity"
CHECK_TIMESTAMP = "notebooks.kubeflow.org/last_activity_check_timestamp"
RESOURCES = {"notebooks", "pods", "statefulsets", "services", "nodes", "configmaps", "events", "leases"}
STOP_ANNOTATION = "kubeflow-resource-stopped"
# A big stopped notebook: env vars of 900 bytes (as tests/test_pairing.py's huge notebook) up to this much
# JSON, under etcd's default request limit of 1.5 MiB (the StatefulSet, with its managedFields, too).
BIG_NOTEBOOK_BYTES = int(1.4 * 2**20)
PAD_VALUE_BYTES = 900


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def loadavg() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def proc_stats(pid: int) -> dict[str, float]:
    """CPU seconds and peak/current RSS (MiB) of a process, from /proc."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return {}
    tick = os.sysconf("SC_CLK_TCK")
    kib = {m.group(1): int(m.group(2)) for m in re.finditer(r"^(VmHWM|VmRSS):\s+(\d+) kB", status, re.M)}
    return {"cpuSeconds": (int(fields[11]) + int(fields[12])) / tick,
            "peakRssMiB": kib.get("VmHWM", 0) / 1024, "rssMiB": kib.get("VmRSS", 0) / 1024}


def culler_env(pairs: list[str]) -> dict[str, str]:
    """`--culler-env NAME=VALUE` arguments as the culler's extra environment."""
    return dict(kv.split("=", 1) for kv in pairs)


def own_peak_rss_mib() -> float:
    """This process's own peak RSS (VmHWM of its address space), in MiB. Not getrusage's ru_maxrss: on Linux
    that carries over the parent's peak from before the fork and exec (the bench process's, which made the
    fleet: with the big stopped notebooks, ~270 MiB), so a child that never came near it reported it."""
    return proc_stats(os.getpid()).get("peakRssMiB", 0.0)


# -- kube-apiserver's own request counts ---------------------------------------------------------------

def apiserver_counts(server: str, ca: str, cert: str, key: str) -> Counter[str]:
    """apiserver_request_total summed by "VERB resource[/subresource]" (resource requests only)."""
    ctx = ssl.create_default_context(cafile=ca)
    ctx.load_cert_chain(cert, key)
    with urllib.request.urlopen(f"{server}/metrics", timeout=30, context=ctx) as resp:
        text = resp.read().decode()
    out: Counter[str] = Counter()
    for line in text.splitlines():
        if not line.startswith("apiserver_request_total{"):
            continue
        labels = dict(re.findall(r'(\w+)="([^"]*)"', line.split("}", 1)[0]))
        if not labels.get("resource"):
            continue
        what = labels["resource"] + (f"/{labels['subresource']}" if labels.get("subresource") else "")
        out[f"{labels.get('verb', '?')} {what}"] += int(float(line.rsplit(" ", 1)[1]))
    return out


def diff(after: Counter[str], before: Counter[str]) -> dict[str, int]:
    return {k: after[k] - before.get(k, 0) for k in sorted(after) if after[k] - before.get(k, 0)}


def writes_of(counts: dict[str, int], resource_prefix: str = "") -> int:
    return sum(v for k, v in counts.items() if k.split(" ", 1)[0] in WRITE_VERBS
               and k.split(" ", 1)[1].startswith(resource_prefix))


# -- the fleet on the API server -------------------------------------------------------------------------

def _phase(name: str) -> float:
    return int.from_bytes(hashlib.blake2b(f"phase:{name}".encode(), digest_size=8).digest(), "big") / 2**64


def _stamp(ts: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))


def padding_env(target_bytes: int) -> list[dict[str, str]]:
    """Env vars that make a container's JSON about `target_bytes` long."""
    entry = len(json.dumps({"name": "PAD_00000", "value": "y" * PAD_VALUE_BYTES})) + 2
    return [{"name": f"PAD_{i:05d}", "value": "y" * PAD_VALUE_BYTES} for i in range(max(0, target_bytes // entry))]


async def create_fleet(server: str, ca: str, cert: str, key: str, spec: FleetSpec, concurrency: int = 48,
                       shown_spread_seconds: float = 7200.0, stopped_copy: bool = True) -> dict[str, int]:
    """Notebooks (with Kubeflow's culling annotations as its culler initialises them) and Running pods; the
    big stopped hostile notebooks with their StatefulSet scaled to 0 and no pod (its template a copy of the
    big container, as the notebook-controller makes it, unless not `stopped_copy`). Returns the size in bytes
    (JSON as the API server answers) of the largest Notebook and StatefulSet made.

    `last-activity` is spread over the last `shown_spread_seconds` (the culler's lastActivityStepMinutes),
    so an active notebook's rewrites land evenly in time, as in a steady state under that step."""
    import aiohttp

    from kf_culler.local.objects import notebook

    ctx = ssl.create_default_context(cafile=ca)
    ctx.load_cert_chain(cert, key)
    limit = asyncio.Semaphore(concurrency)
    now = _stamp(time.time())
    sizes = {"notebookBytesMax": 0, "statefulSetBytesMax": 0}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ctx, limit=concurrency)) as s:
        async def call(method: str, path: str, body: Any, ctype: str = "application/json") -> dict[str, Any]:
            for attempt in range(5):
                async with s.request(method, server + path, data=json.dumps(body),
                                     headers={"Content-Type": ctype}) as r:
                    if r.status < 300:
                        raw = await r.read()
                        made: dict[str, Any] = json.loads(raw)
                        what = "notebookBytesMax" if made.get("kind") == "Notebook" else "statefulSetBytesMax" \
                            if made.get("kind") == "StatefulSet" else ""
                        if what:
                            sizes[what] = max(sizes[what], len(raw))
                        return made
                    text = await r.text()
                    if r.status not in (429, 500, 503) or attempt == 4:
                        raise RuntimeError(f"{method} {path}: HTTP {r.status}: {text[:300]}")
                await asyncio.sleep(0.5 * (attempt + 1))
            raise AssertionError("unreachable: the last attempt raises")

        spaces = sorted({m.namespace for m in members(spec)})
        await asyncio.gather(*(call("POST", "/api/v1/namespaces", {"metadata": {"name": ns}}) for ns in spaces))

        async def one(m: Member) -> None:
            gpus = 1 if m.gpu else 0
            # Steady state: last-activity written at some point of the last lastActivityStepMinutes
            # (one write per step then lands evenly in time).
            shown = _stamp(spec.t0 - shown_spread_seconds * _phase(m.name))
            body = notebook(m.name, "group-one" if m.kind == "codeserver" else "jupyter", gpus,
                            {LAST_ACTIVITY: shown, CHECK_TIMESTAMP: now})
            body["metadata"]["namespace"] = m.namespace
            container: dict[str, Any] | None = None
            if m.stopped:  # stopped three days ago by its user, through Kubeflow's web app
                body["metadata"]["annotations"][STOP_ANNOTATION] = _stamp(spec.t0 - 3 * 86400)
                container = body["spec"]["template"]["spec"]["containers"][0]
                container["env"] = padding_env(BIG_NOTEBOOK_BYTES - len(json.dumps(body)))
            resources: dict[str, Any] = {"requests": {"cpu": "100m"}}
            if gpus:
                resources = {"requests": {"cpu": "100m", "nvidia.com/gpu": "1"}, "limits": {"nvidia.com/gpu": "1"}}
            pod: dict[str, Any] = {
                "metadata": {"name": f"{m.name}-0", "namespace": m.namespace,
                             "labels": {"notebook-name": m.name, "statefulset": m.name}},  # owner: below
                "spec": {"containers": [{"name": m.name, "image": "notebook:local", "resources": resources}]}}
            started = _stamp(spec.pod_started)
            status = {"status": {"phase": "Running", "startTime": started,
                                 "conditions": [{"type": "Ready", "status": "True"}],
                                 "containerStatuses": [{"name": m.name, "ready": True, "restartCount": 0,
                                                        "image": "notebook:local", "imageID": "",
                                                        "state": {"running": {"startedAt": started}}}]}}
            async with limit:
                # The ownership chain the notebook-controller makes: Notebook -> StatefulSet <name> -> pod <name>-0
                # (the culler pairs a notebook with its pod through it).
                made = await call("POST", f"/apis/kubeflow.org/v1/namespaces/{m.namespace}/notebooks", body)
                sts = await call("POST", f"/apis/apps/v1/namespaces/{m.namespace}/statefulsets",
                                 statefulset(m.name, made["metadata"]["uid"], container, stopped_copy))
                if m.stopped:  # the notebook-controller has scaled it to 0: a Service, no pod
                    await call("POST", f"/api/v1/namespaces/{m.namespace}/services",
                               service(m.name, made["metadata"]["uid"]))
                    return
                pod["metadata"]["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": "StatefulSet",
                                                       "name": m.name, "uid": sts["metadata"]["uid"],
                                                       "controller": True}]
                await call("POST", f"/api/v1/namespaces/{m.namespace}/pods", pod)
                await call("POST", f"/api/v1/namespaces/{m.namespace}/services",
                           service(m.name, made["metadata"]["uid"]))
                await call("PATCH", f"/api/v1/namespaces/{m.namespace}/pods/{m.name}-0/status", status,
                           "application/merge-patch+json")

        await asyncio.gather(*(one(m) for m in members(spec)))
    return sizes


def statefulset(name: str, notebook_uid: str, container: dict[str, Any] | None = None,
                copy: bool = True) -> dict[str, Any]:
    """The StatefulSet the notebook-controller makes for a Notebook, controlled by it (nothing runs it here).
    With `container` (a stopped notebook's), it is scaled to 0 and, with `copy`, its template holds that
    container, as the notebook-controller copies the Notebook's pod template."""
    labels = {"statefulset": name}
    spec_container = {"name": name, "image": "notebook:local"}
    if container is not None and copy:
        spec_container = {k: v for k, v in container.items() if k in ("name", "image", "env")}
    return {"metadata": {"name": name, "ownerReferences": [{"apiVersion": "kubeflow.org/v1", "kind": "Notebook",
                                                            "name": name, "uid": notebook_uid, "controller": True}]},
            "spec": {"replicas": 0 if container is not None else 1, "serviceName": "",
                     "selector": {"matchLabels": labels},
                     "template": {"metadata": {"labels": labels}, "spec": {"containers": [spec_container]}}}}


def service(name: str, notebook_uid: str) -> dict[str, Any]:
    """The Service the notebook-controller makes (the culler probes through it only when it is this one)."""
    return {"metadata": {"name": name, "ownerReferences": [{"apiVersion": "kubeflow.org/v1", "kind": "Notebook",
                                                            "name": name, "uid": notebook_uid, "controller": True}]},
            "spec": {"selector": {"statefulset": name},
                     "ports": [{"name": f"http-{name}"[:63], "port": 80, "targetPort": 8888}]}}


# -- the culler child ----------------------------------------------------------------------------------

class CountingApi:
    """Counts every request the kubernetes ApiClient sends, by "METHOD resource" (watches included)."""

    def __init__(self, api: Any) -> None:
        self.counts: Counter[str] = Counter()
        self.lock = threading.Lock()
        original = api.call_api

        def call_api(method: str, url: str, *args: Any, **kwargs: Any) -> Any:
            parsed = urllib.parse.urlsplit(url)
            parts = [p for p in parsed.path.split("/") if p]
            what = next((p for p in reversed(parts) if p in RESOURCES), "other")
            verb = "WATCH" if "watch=true" in parsed.query.lower() else method
            with self.lock:
                self.counts[f"{verb} {what}"] += 1
                for ns in (CROSS_NAMESPACE, HOSTILE_NAMESPACE):
                    if f"/namespaces/{ns}/" in parsed.path:
                        self.counts[f"{verb} {what} ({ns})"] += 1
            return original(method, url, *args, **kwargs)

        api.call_api = call_api

    def snapshot(self) -> Counter[str]:
        with self.lock:
            return Counter(self.counts)


SITE_FRAMES = 5  # frames kept of each allocation with --tracemalloc-sites
SITES = 25  # sites written per phase


class _Traced:
    """tracemalloc snapshots of the culler: the 30 largest allocation sites (file and line), and the most traced
    since the last snapshot; and for each phase of each pass, what was traced before it, at its most and after it."""

    def __init__(self, path: str | None, sites: bool = False) -> None:
        self.path = path
        self.sites = sites  # each phase's growth by allocation site (slower: a snapshot before and after each)
        self.passes = 0
        if path:
            import tracemalloc

            tracemalloc.start(SITE_FRAMES if sites else 1)
            Path(path).write_text("")

    def snapshot(self, label: str) -> None:
        if not self.path:
            return
        import tracemalloc

        peak = tracemalloc.get_traced_memory()[1]
        snap = tracemalloc.take_snapshot().filter_traces([tracemalloc.Filter(False, tracemalloc.__file__)])
        total = sum(s.size for s in snap.statistics("filename"))
        lines = [f"== {label}: {total / 2**20:.1f} MiB traced (at most {peak / 2**20:.1f} since the last), "
                 f"RSS {proc_stats(os.getpid()).get('rssMiB', 0):.0f} MiB"]
        for stat in snap.statistics("lineno")[:30]:
            frame = stat.traceback[0]
            lines.append(f"{stat.size / 2**20:8.1f} MiB {stat.count:9d} blocks  {frame.filename}:{frame.lineno}")
        with open(self.path, "a") as f:
            f.write("\n".join(lines) + "\n\n")
        del snap  # what the snapshot built is not the culler's: the next peak starts after it
        tracemalloc.reset_peak()

    def phases(self) -> None:
        """Wrap each phase of `Cycle.run` so that it writes its traced memory: before, at its most, after."""
        if not self.path:
            return
        import tracemalloc

        from kf_culler.cycle import Cycle

        path, traced = self.path, self

        def wrapped(name: str) -> Any:
            phase = getattr(Cycle, name)

            def measured(*args: Any, **kwargs: Any) -> Any:
                first = traced.sites and traced.passes < 2 and name in ("_select_all", "_gather", "_act_all")
                start = tracemalloc.take_snapshot() if first else None
                tracemalloc.reset_peak()
                before = tracemalloc.get_traced_memory()[0]
                out = phase(*args, **kwargs)
                after, most = tracemalloc.get_traced_memory()
                lines = [f"phase {name}: {before / 2**20:.1f} MiB traced before, {most / 2**20:.1f} at most, "
                         f"{after / 2**20:.1f} after"]
                if start is not None:
                    grown = tracemalloc.take_snapshot().compare_to(start, "traceback")
                    for stat in grown[:SITES]:
                        where = " < ".join(f"{Path(f.filename).name}:{f.lineno}" for f in stat.traceback)
                        lines.append(f"  {stat.size_diff / 2**20:+7.2f} MiB {stat.count_diff:+8d} blocks  {where}")
                    del grown, start
                if name == "_act_all":
                    traced.passes += 1
                with open(path, "a") as f:
                    f.write("\n".join(lines) + "\n")
                return out

            return measured

        for name in ("_select_all", "_gather", "_judge_all", "_brake", "_act_all"):
            setattr(Cycle, name, wrapped(name))


def held_bytes(value: Any, counted: set[int]) -> int:
    """The bytes `value` holds (`sys.getsizeof` of each dict, list, tuple, string and number reached from it), an
    object reached before (in `counted`: an interned string, a shared label map) counted once, where first reached."""
    total, stack = 0, [value]
    while stack:
        x = stack.pop()
        if id(x) in counted:
            continue
        counted.add(id(x))
        total += sys.getsizeof(x)
        if type(x) is dict:
            stack.extend(x.keys())
            stack.extend(x.values())
        elif type(x) in (list, tuple):
            stack.extend(x)
    return total


def cache_bytes(cache: Any) -> dict[str, dict[str, float]]:
    """Each collection of the watch cache (kf_culler/kube/cache.py, every namespace's together): its objects, the
    MiB they hold as the cache keeps them (the targets' collections as `marshal` bytes, the records and Nodes as
    dicts of the projected JSON; with the dict that holds them), the MiB the same objects hold decoded (each
    dict, list and string reached; what another collection reached first is counted there), and the CPU seconds
    to decode every one of them once."""
    import marshal

    counted: set[int] = set()
    out: dict[str, dict[str, float]] = {}
    named = [*cache.collections.items(), ("records", cache.records), ("nodes", [cache.nodes])]
    for name, collections in named:
        objects: dict[Any, Any] = {}
        for c in collections:
            with c.lock:
                objects.update(c.objects)
        held = sum(sys.getsizeof(c.objects) for c in collections) + sum(
            sys.getsizeof(o) if isinstance(o, bytes) else held_bytes(o, counted) for o in objects.values())
        encoded = [o if isinstance(o, bytes) else marshal.dumps(o) for o in objects.values()]
        cpu0 = time.process_time()
        decoded = [marshal.loads(e) for e in encoded]
        cpu = time.process_time() - cpu0
        as_dicts = held_bytes(decoded, counted) - sys.getsizeof(decoded)
        out[name] = {"objects": len(objects), "heldMiB": held / 2**20, "decodedMiB": as_dicts / 2**20,
                     "marshalMiB": sum(sys.getsizeof(e) for e in encoded) / 2**20, "decodeCpuSeconds": cpu}
    return out


def _log_cache(label: str, sizes: dict[str, dict[str, float]]) -> None:
    log(f"cache {label}: " + "; ".join(
        f"{k} {v['objects']:.0f} objects {v['heldMiB']:.1f} MiB held, {v['decodedMiB']:.1f} MiB decoded, "
        f"{v['marshalMiB']:.1f} MiB as marshal (decoded in {v['decodeCpuSeconds']:.2f} CPU s)"
        for k, v in sizes.items()))


def run_child(params_path: str) -> int:
    """The culler as the Deployment runs it: list+watch, a cold cycle, then one cycle per check period."""
    params = json.loads(Path(params_path).read_text())
    spec = FleetSpec(**params["spec"])
    traced = _Traced(params.get("tracemalloc"), bool(params.get("tracemallocSites")))
    traced.phases()
    import yaml

    from kf_culler.config import load_mapping
    from kf_culler.cycle import Memory, NotebookResult
    from kf_culler.kube.client import api_client
    from kf_culler.runner import build_runner

    settings = load_mapping(yaml.safe_load(Path(params["config"]).read_text()), params["config"])
    period = settings.operations.check_period_seconds
    api = api_client(params["kubeconfig"])
    counting = CountingApi(api)
    per_class: Counter[str] = Counter()
    stops: dict[str, float] = {}
    cross: dict[str, float] = {}
    # Every notebook's verdicts: the distinct consecutive "action/state" of its passes, its last rule, and its
    # last stop time (seconds from the fleet's t0).
    verdicts: dict[str, dict[str, Any]] = {}

    probed: Counter[str] = Counter()  # probe calls and their errors, counted as each result is reported

    # The bench's own bookkeeping runs in the culler's process: each notebook's class worked out once (`Classes`),
    # and what is kept of its verdicts changed only when it changes (no new objects a pass for each notebook).
    classes = Classes(spec)

    def on_result(r: NotebookResult) -> None:  # a lean pass's results give up their calls once reported
        probed["probes"] += len(r.calls)
        probed["errors"] += sum(1 for c in r.calls if c.error)
        found = classes.of(r.namespace, r.name)
        cls, hostile, crossing = found if found is not None else ("other", None, False)
        per_class[f"notebooks:{cls}"] += 1
        per_class[f"state:{cls}:{r.verdict.state}"] += 1
        v = r.verdict
        seen = verdicts.setdefault(f"{r.namespace}/{r.name}", {"cls": hostile or cls, "trail": [], "passes": 0})
        step = f"{v.action}/{v.state}"
        if not seen["trail"] or seen["trail"][-1] != step:
            seen["trail"].append(sys.intern(step))
        seen["passes"] += 1
        if seen.get("rule") != str(v.rule_id):
            seen["rule"] = sys.intern(str(v.rule_id))
        stop_at = round(v.stop_at.timestamp() - spec.t0, 1) if v.stop_at else None
        if seen.get("stopAt", 0.5) != stop_at:
            seen["stopAt"] = stop_at
        if r.write is not None:
            if r.write.outcome == "patched":
                per_class[f"patches:{cls}"] += r.write.attempts
            if crossing and r.verdict.action == "stop" and r.write.outcome == "patched":
                stops[r.name] = time.time()

    def on_event(r: NotebookResult) -> None:  # after the pass's patches (kf_culler/kube/event_tail.py)
        if r.write is not None and r.write.event == "created":
            found = classes.of(r.namespace, r.name)
            per_class[f"events:{found[0] if found is not None else 'other'}"] += 1

    replicas, index = int(params.get("replicas", 1)), int(params.get("index", 0))
    shards_held: list[int] = []
    manager: Any = None
    if replicas > 1:  # one of R replicas, sharded as `run --leader-elect` with `shards: N` does
        from kf_culler.kube.lease import ShardManager
        from kf_culler.sharding import fair_share

        manager = ShardManager(api, "default", "kf-culler", f"bench-{index}", settings.operations.shards)
        manager.start()
        floor = fair_share(settings.operations.shards, replicas)[0]
        limit = time.monotonic() + 120
        while time.monotonic() < limit and not (manager.live_replicas == replicas and len(manager.held()) >= floor):
            time.sleep(0.5)
        time.sleep(2 * manager.renew_seconds)  # the last shard settles
        shards_held = manager.held()
        log(f"replica {index}: holding shards {shards_held} of {settings.operations.shards}")
    from kf_culler.telemetry import otlp_configured, setup_tracing

    setup_tracing()  # as `run` does: its spans are recorded (their trace ids go in Events), exported when OTEL_* says
    runner = build_runner(settings, api, on_result=on_result, on_event=on_event,
                          owns=manager.owns if manager is not None else None, spans_exported=otlp_configured())
    cpu0, t0 = time.process_time(), time.monotonic()
    rss_before = proc_stats(os.getpid()).get("rssMiB", 0.0)
    log(f"RSS before the list+watch sync {rss_before:.0f} MiB")
    runner.start_cache(timeout=float(params["syncTimeout"]))
    log(f"RSS after it {proc_stats(os.getpid()).get('rssMiB', 0):.0f} MiB")
    traced.snapshot("after the list+watch sync")
    sync = {"seconds": time.monotonic() - t0, "cpuSeconds": time.process_time() - cpu0,
            "api": dict(counting.snapshot()), "rssMiB": proc_stats(os.getpid()).get("rssMiB", 0.0),
            "peakRssMiB": own_peak_rss_mib(), "rssBeforeMiB": rss_before}
    sizes: dict[str, Any] = {}
    if params.get("cacheBytes"):  # after the sync's figures; what it holds while it measures is not the culler's
        sizes["afterSync"] = cache_bytes(runner.cache)
        _log_cache("after the sync", sizes["afterSync"])

    memory = [Memory()]  # what each pass remembers for the next

    def measured(label: str) -> dict[str, Any]:
        api0, cls0, cpu0, w0 = counting.snapshot(), Counter(per_class), time.process_time(), time.monotonic()
        probed0 = Counter(probed)
        # as `run` does: after the last pass, and the Events go out while it waits for the next pass
        result = runner.once(memory[0], wait_events=False, lean=True)  # as `run`'s loop (Runner.loop)
        memory[0] = result.memory
        wall = time.monotonic() - w0
        result.wait_events()
        out: dict[str, Any] = {
            "label": label, "wallSeconds": wall, "cycleSeconds": result.seconds,
            "eventsSeconds": result.events.seconds if result.events is not None else 0.0,
            "cpuSeconds": time.process_time() - cpu0, "api": diff(counting.snapshot(), api0),
            "classes": diff(per_class, cls0), "prometheusQueries": result.bulk_queries,
            "probes": probed["probes"] - probed0["probes"], "probeErrors": probed["errors"] - probed0["errors"],
            "notebooks": len(result.results), "rssMiB": proc_stats(os.getpid()).get("rssMiB", 0.0),
            "peakRssMiB": own_peak_rss_mib(),
            "load": loadavg(), "phases": result.phases,
        }
        out["apiRequests"] = sum(v for k, v in out["api"].items() if "(" not in k)
        out["apiWrites"] = writes_of({k: v for k, v in out["api"].items() if "(" not in k})
        log(f"{label}: {out['wallSeconds']:.2f} s wall, {out['cpuSeconds']:.2f} s CPU, "
            f"{out['apiRequests']} API requests ({out['apiWrites']} writes), {out['probes']} probes, "
            f"{out['prometheusQueries']} Prometheus queries, RSS {out['rssMiB']:.0f} MiB, load {out['load']}; "
            + ", ".join(f"{k} {v:.1f} s" for k, v in result.phases.items())
            + f"; its Events {out['eventsSeconds']:.1f} s after it")
        return out

    cycles: list[dict[str, Any]] = []
    profile_text = None
    start, start_wall = time.monotonic(), time.time()
    cycles.append(measured("cold"))
    traced.snapshot("after the cold pass")
    if params.get("cacheBytes"):
        sizes["afterColdPass"] = cache_bytes(runner.cache)
        _log_cache("after the cold pass", sizes["afterColdPass"])
    # The crossing notebooks cross the idle limit during the steady window, from a time fixed relative to the
    # pass schedule (the cold cycle's start), whatever the cold cycle took.
    steady_seconds = float(params["steadyMinutes"]) * 60
    cross0 = max(start_wall + min(60.0, steady_seconds / 4), time.time() + 1.0)
    span = max(1.0, steady_seconds - 2.5 * period)
    if index == 0:  # with replicas, the first one sets the crossing times and tells the others
        with urllib.request.urlopen(urllib.request.Request(
                f"{params['control']}?cross0={cross0}&span={span}", method="POST"), timeout=10) as resp:
            resp.read()
        if replicas > 1:
            Path(params["crossFile"]).write_text(json.dumps([cross0, span]))
    else:
        limit = time.monotonic() + 600
        while not Path(params["crossFile"]).exists() and time.monotonic() < limit:
            time.sleep(0.5)
        cross0, span = json.loads(Path(params["crossFile"]).read_text())
    for m in members(spec):
        if m.crossing:
            cross[m.name] = cross_time(spec, m, cross0, span)
    api_steady0, cls_steady0, cpu_steady0 = counting.snapshot(), Counter(per_class), time.process_time()
    steady_start = time.monotonic()
    deadline = steady_start + steady_seconds
    k = 1
    while True:
        next_at = start + k * period
        if next_at >= deadline:
            break
        time.sleep(max(0.0, next_at - time.monotonic()))
        if params.get("profile") and k == 2:
            from pyinstrument import Profiler  # type: ignore[import-not-found,unused-ignore]

            profiler = Profiler(interval=0.002, async_mode="disabled")
            profiler.start()
            cycles.append(measured(f"steady {k} (profiled)"))
            profiler.stop()
            profile_text = profiler.output_text(unicode=False, color=False, show_all=False)
            Path(params["profile"]).write_text(profile_text)
        else:
            cycles.append(measured(f"steady {k}"))
            if k in (1, 3):
                traced.snapshot(f"after steady cycle {k}")
        k += 1
    time.sleep(max(0.0, deadline - time.monotonic()))
    window = time.monotonic() - steady_start
    steady_api = diff(counting.snapshot(), api_steady0)
    runner.cache.close()
    latencies = {n: stops[n] - cross[n] for n in cross if n in stops}
    out = {
        "sync": sync, "cycles": cycles, "steadyWindowSeconds": window,
        "steadyApi": steady_api, "steadyClasses": diff(per_class, cls_steady0),
        "steadyCpuSeconds": time.process_time() - cpu_steady0,
        "crossing": {"count": len(cross), "stopped": len(latencies),
                     "latencies": sorted(latencies.values()), "notStopped": sorted(set(cross) - set(stops)),
                     "latencyByName": {n: round(v, 3) for n, v in sorted(latencies.items())},
                     "cross0": cross0 - start_wall, "span": span},
        "verdicts": verdicts, "cacheBytes": sizes,
        "peakRssMiB": own_peak_rss_mib(),
        # getrusage's figure, which earlier reports gave as the peak: at least the parent's peak (own_peak_rss_mib)
        "ruMaxrssMiB": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "cpuSeconds": time.process_time(), "checkPeriodSeconds": period,
        "replica": index, "replicas": replicas, "shardsHeld": shards_held,
        "shardsHeldAtEnd": manager.held() if manager is not None else [],
    }
    Path(params["out"]).write_text(json.dumps(out, indent=1))
    return 0


# -- the benchmark ---------------------------------------------------------------------------------------

class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.dir = Path(tempfile.mkdtemp(prefix="kfc-bench-"))
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.cluster: Any = None
        self.prom: Any = None
        self.report: dict[str, Any] = {}

    def close(self) -> None:
        from kf_culler.local import procs

        for name in reversed(list(self.procs)):
            procs.stop(self.procs[name], grace=5)
        if self.prom is not None:
            self.prom.stop()
        if self.cluster is not None:
            self.cluster.stop()
        shutil.rmtree(self.dir, ignore_errors=True)

    def start(self, name: str, cmd: list[str], env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        from kf_culler.local import procs

        self.procs[name] = procs.start(cmd, self.dir / f"{name}.log", env=env)
        return self.procs[name]

    def tail(self, name: str) -> str:
        from kf_culler.local import procs

        return procs.tail(self.dir / f"{name}.log")

    # -- phases ----------------------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        from kf_culler.local import procs
        from kf_culler.local.cluster import LocalCluster
        from kf_culler.local.prometheus import Prometheus, static_job

        a = self.args
        netns = bool(a.inside_netns)
        spec = FleetSpec(notebooks=a.notebooks, crossing=a.crossing if a.crossing >= 0 else max(5, a.notebooks // 200),
                         hang_share=a.hang_share, active_share=a.active_share, gpu_share=a.gpu_share,
                         codeserver_share=a.codeserver_share, latency=a.latency_ms / 1000, t0=time.time(),
                         hostile=a.hostile, hostile_kinds=a.hostile_kinds)
        spec = replace(spec, idle_minutes=float(self._base_config()["idleMinutes"]))
        spec_path = self.dir / "spec.json"
        spec.dump(spec_path)
        self.report = {"machine": {"cpus": os.cpu_count(), "memGiB": round(os.sysconf("SC_PAGE_SIZE")
                                   * os.sysconf("SC_PHYS_PAGES") / 2**30, 1), "loadAtStart": loadavg()},
                       "spec": asdict(spec), "netns": netns, "cullerEnv": culler_env(a.culler_env)}
        classes = Counter(m.cls for m in members(spec))
        self.report["fleet"] = {**classes, "gpu": sum(1 for m in members(spec) if m.gpu),
                                "codeServer": sum(1 for m in members(spec) if m.kind == "codeserver")}
        log(f"fleet: {dict(self.report['fleet'])}; load {loadavg()}")

        if netns:
            self.start("dnsmasq", ["dnsmasq", "--keep-in-foreground", "--conf-file=/dev/null", "--no-hosts",
                                   "--no-resolv", "--listen-address=127.0.0.1", "--bind-interfaces", "--port=53",
                                   "--address=/svc.cluster.local/127.0.0.1", "--user=root", "--pid-file",
                                   "--cache-size=0"])
            procs.wait_until(lambda: _resolves("nb-00000.bench-0.svc.cluster.local"), 15, 0.2,
                             "dnsmasq to answer")
        port = procs.free_port()
        # In the run's own network namespace, port 80 on every address: the Services' ClusterIPs are loopback ones
        # (LocalCluster's Service range), where kube-proxy would lead to the pods in a cluster.
        binds = [f"127.0.0.1:{port}"] + (["0.0.0.0:80"] if netns else [])
        server = self.start("endpoints", [sys.executable, str(HERE / "fleet_server.py"), str(spec_path), *binds])
        base = f"http://127.0.0.1:{port}"
        procs.wait_until(lambda: _http_ok(f"{base}/stats") or server.poll() is not None, 30, 0.2, "the endpoints")
        if server.poll() is not None:
            raise RuntimeError(f"the endpoint server exited:\n{self.tail('endpoints')}")

        t = time.monotonic()
        self.cluster = LocalCluster(quiet=True)
        self.cluster.start()
        self.cluster.apply_notebook_crd()
        c = self.cluster
        tls = (str(c.ca.cert), str(c.admin.cert), str(c.admin.key))
        log(f"API server up in {time.monotonic() - t:.1f} s; creating {spec.size} notebooks")
        t = time.monotonic()
        sizes = asyncio.run(create_fleet(c.server, *tls, spec, shown_spread_seconds=60 * self._step_minutes(),
                                         stopped_copy=a.stopped_statefulset == "copy"))
        self.report["setup"] = {"createSeconds": time.monotonic() - t, "objects": 3 * spec.size, **sizes,
                                "stoppedStatefulSet": a.stopped_statefulset}
        log(f"created in {self.report['setup']['createSeconds']:.1f} s (largest Notebook "
            f"{sizes['notebookBytesMax'] / 2**20:.2f} MiB, StatefulSet {sizes['statefulSetBytesMax'] / 2**20:.2f} "
            f"MiB); load {loadavg()}")

        self.prom = Prometheus([static_job("dcgm-exporter", [f"127.0.0.1:{port}"])], scrape_interval="15s").start()
        gpus = self.report["fleet"]["gpu"]
        self.prom.wait_for('DCGM_FI_DEV_GPU_UTIL{pod!=""}', count=gpus, timeout=120)
        prom0 = _prom_queries(self.prom.url)

        config = self._base_config()
        config["prometheus"] = {**(config.get("prometheus") or {}), "url": self.prom.url}
        if not netns or a.ours_urls == "loopback":
            config["urls"] = {"jupyter": f"{base}/notebook/{{namespace}}/{{name}}/",
                              "codeServer": f"{base}/codeserver/{{namespace}}/{{name}}/"}
        for item in a.set or []:
            key, _, value = item.partition("=")
            _set(config, key, json.loads(value))
        import yaml

        (self.dir / "config.yaml").write_text(yaml.safe_dump(config))
        self.report["config"] = {k: config[k] for k in ("checkPeriodSeconds", "concurrency", "probe",
                                                          "lastActivityStepMinutes", "idleMinutes", "urls")
                                 if k in config}
        self.report["config"]["urls"] = config.get("urls", "default (Service DNS, port 80)")
        params = {"spec": asdict(spec), "config": str(self.dir / "config.yaml"), "kubeconfig": str(c.kubeconfig),
                  "steadyMinutes": a.steady_minutes, "control": f"{base}/control", "out": str(self.dir / "ours.json"),
                  "syncTimeout": 600, "profile": a.profile, "tracemalloc": a.tracemalloc,
                  "tracemallocSites": a.tracemalloc_sites,
                  "cacheBytes": a.cache_bytes}
        (self.dir / "params.json").write_text(json.dumps(params))
        before = apiserver_counts(c.server, *tls)
        srv0 = _get_json(f"{base}/stats")
        log(f"kf-culler: cold cycle, then {a.steady_minutes:g} min of cycles; load {loadavg()}")
        children = {}
        for k in range(a.replicas):
            name = "kf-culler" if k == 0 else f"kf-culler-{k}"
            if a.replicas > 1:
                (self.dir / f"params-{k}.json").write_text(json.dumps({
                    **params, "replicas": a.replicas, "index": k, "crossFile": str(self.dir / "cross.json"),
                    "out": str(self.dir / ("ours.json" if k == 0 else f"ours-{k}.json"))}))
            children[name] = self.start(name, [sys.executable, str(Path(__file__).resolve()), "--culler-child",
                                               str(self.dir / (f"params-{k}.json" if a.replicas > 1
                                                               else "params.json"))],
                                        env={**os.environ, "MALLOC_ARENA_MAX": "2",  # as the image sets it
                                             **culler_env(a.culler_env)})
        limit = time.monotonic() + a.steady_minutes * 60 + 900
        while any(ch.poll() is None for ch in children.values()) and time.monotonic() < limit:
            time.sleep(1.0)
        for name, child in children.items():
            if child.poll() is None:
                raise RuntimeError(f"the {name} child did not finish in time:\n" + self.tail(name))
            if child.returncode != 0:
                raise RuntimeError(f"the {name} child failed (exit status {child.returncode}):\n{self.tail(name)}")
        ours = json.loads((self.dir / "ours.json").read_text())
        if a.replicas > 1:
            self.report["replicas"] = [ours] + [json.loads((self.dir / f"ours-{k}.json").read_text())
                                                for k in range(1, a.replicas)]
        ours["apiserver"] = diff(apiserver_counts(c.server, *tls), before)
        ours["prometheusServed"] = _prom_queries(self.prom.url) - prom0
        srv1 = _get_json(f"{base}/stats")
        ours["endpointServer"] = {"cpuSeconds": srv1["cpuSeconds"] - srv0["cpuSeconds"],
                                  "requests": {k: v - srv0["counts"].get(k, 0) for k, v in srv1["counts"].items()}}
        self.report["ours"] = ours
        if a.profile:
            self.report["profile"] = a.profile

        if a.kubeflow:
            self.report["kubeflow"] = self.kubeflow(spec, base, tls)
        self.report["machine"]["loadAtEnd"] = loadavg()
        return self.report

    def _step_minutes(self) -> float:
        """lastActivityStepMinutes as the culler will run with it (the shipped file, then --set)."""
        step = float(self._base_config().get("lastActivityStepMinutes", 10))
        for item in self.args.set or []:
            key, _, value = item.partition("=")
            if key == "lastActivityStepMinutes":
                step = float(json.loads(value))
        return step

    def _base_config(self) -> dict[str, Any]:
        import yaml

        data: dict[str, Any] = yaml.safe_load((ROOT / "kustomize" / "base" / "config.yaml").read_text())
        return data

    def kubeflow(self, spec: FleetSpec, base: str, tls: tuple[str, str, str]) -> dict[str, Any]:
        """Kubeflow's notebook-controller with built-in culling on, on the same fleet, for a bounded window."""
        from kf_culler.local import procs
        from kf_culler.local.cluster import NotebookControllerUnavailable, notebook_controller_binary

        a = self.args
        c = self.cluster
        try:
            binary = Path(a.notebook_controller) if a.notebook_controller else notebook_controller_binary(build=False)
        except NotebookControllerUnavailable as err:
            log(f"Kubeflow's notebook-controller is not available: {err}")
            return {"unavailable": str(err)}
        metrics_port, probe_port = procs.free_port(), procs.free_port()
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(self.dir),
               "KUBECONFIG": str(c.kubeconfig), "ENABLE_CULLING": "true", "IDLENESS_CHECK_PERIOD": "1",
               "CULL_IDLE_TIME": str(a.kubeflow_cull_idle_time), "CLUSTER_DOMAIN": "cluster.local",
               "USE_ISTIO": "false"}
        before = apiserver_counts(c.server, *tls)
        srv0 = _get_json(f"{base}/stats")
        log(f"Kubeflow's notebook-controller ({binary}) for {a.kubeflow_minutes:g} min; load {loadavg()}")
        t0 = time.monotonic()
        ctl = self.start("notebook-controller", [
            str(binary), "--kubeconfig", str(c.kubeconfig), "--metrics-addr", f"127.0.0.1:{metrics_port}",
            "--probe-addr", f"127.0.0.1:{probe_port}", "--enable-leader-election=false"], env=env)
        samples: list[dict[str, Any]] = []
        deadline = t0 + a.kubeflow_minutes * 60
        while time.monotonic() < deadline:
            if ctl.poll() is not None:
                raise RuntimeError(f"the notebook-controller exited {ctl.returncode}:\n"
                                   + self.tail("notebook-controller"))
            time.sleep(min(15.0, max(0.0, deadline - time.monotonic())))
            st = _get_json(f"{base}/stats")
            api = diff(apiserver_counts(c.server, *tls), before)
            samples.append({"t": time.monotonic() - t0, "goKernels": st["counts"].get("go:kernels", 0)
                            - srv0["counts"].get("go:kernels", 0), "goDistinct": st["goDistinct"],
                            "goAllAt": st["goAllAt"], "goFirst": st["goFirst"], "wallTime": st["time"],
                            "notebookUpdates": api.get("PUT notebooks", 0) + api.get("UPDATE notebooks", 0),
                            "writes": writes_of(api), "requests": sum(api.values()), **proc_stats(ctl.pid)})
            s = samples[-1]
            log(f"  t={s['t']:.0f}s probes={s['goKernels']} distinct={s['goDistinct']} "
                f"notebook updates={s['notebookUpdates']} writes={s['writes']} requests={s['requests']} "
                f"rss={s.get('rssMiB', 0):.0f}MiB cpu={s.get('cpuSeconds', 0):.1f}s load {loadavg()}")
        api = diff(apiserver_counts(c.server, *tls), before)
        last = samples[-1]
        stats = proc_stats(ctl.pid)
        procs.stop(ctl, grace=5)
        # Steady rates from the second half of the window (after the controller's start-up burst).
        half = next((s for s in samples if s["t"] >= last["t"] / 2), samples[0])
        dt = last["t"] - half["t"] or 1.0
        probe_rate = (last["goKernels"] - half["goKernels"]) / dt
        update_rate = (last["notebookUpdates"] - half["notebookUpdates"]) / dt
        write_rate = (last["writes"] - half["writes"]) / dt
        request_rate = (last["requests"] - half["requests"]) / dt
        pass_seconds = (last["goAllAt"] - last["goFirst"]) if last["goAllAt"] else None
        est_pass = spec.notebooks / probe_rate if probe_rate else None
        return {
            "binary": str(binary), "windowSeconds": last["t"], "samples": samples, "apiserver": api,
            "probes": last["goKernels"], "distinctProbed": last["goDistinct"],
            "passSeconds": pass_seconds, "passSecondsFromRate": est_pass,
            "probesPerSecond": probe_rate, "notebookUpdatesPerSecond": update_rate,
            "writesPerSecond": write_rate, "requestsPerSecond": request_rate,
            "notebookUpdatesPerNotebookHour": update_rate * 3600 / spec.notebooks,
            "writesPerNotebookHour": write_rate * 3600 / spec.notebooks,
            "peakRssMiB": stats.get("peakRssMiB"), "cpuSeconds": stats.get("cpuSeconds"),
        }


def _set(config: dict[str, Any], dotted: str, value: Any) -> None:
    keys = dotted.split(".")
    for k in keys[:-1]:
        config = config.setdefault(k, {})
    config[keys[-1]] = value


def _resolves(host: str) -> bool:
    try:
        return any(a[4][0] == "127.0.0.1" for a in socket.getaddrinfo(host, 80, socket.AF_INET))
    except OSError:
        return False


def _http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return bool(resp.status == 200)
    except OSError:
        return False


def _get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=30) as resp:
        return json.loads(resp.read())


def _prom_queries(url: str) -> int:
    """Queries Prometheus has answered (instant and range), from its own /metrics."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    total = 0
    for line in text.splitlines():
        if line.startswith("prometheus_http_requests_total{") and re.search(r'handler="/api/v1/query(_range)?"', line):
            total += int(float(line.rsplit(" ", 1)[1]))
    return total


# -- the report ------------------------------------------------------------------------------------------

def summarize(report: dict[str, Any]) -> dict[str, Any]:
    ours = report["ours"]
    n = report["spec"]["notebooks"]
    cycles = ours["cycles"]
    steady = [c for c in cycles[1:] if "profiled" not in c["label"]]
    hours = ours["steadyWindowSeconds"] / 3600
    main_api = {k: v for k, v in ours["steadyApi"].items() if "(" not in k}
    cross_api = {k.split(" (")[0]: v for k, v in ours["steadyApi"].items() if f"({CROSS_NAMESPACE})" in k}
    hostile_api = {k.split(" (")[0]: v for k, v in ours["steadyApi"].items() if f"({HOSTILE_NAMESPACE})" in k}
    fleet_writes = writes_of(main_api) - writes_of(cross_api) - writes_of(hostile_api)
    cls = ours["steadyClasses"]
    per_class = {}
    for name in ("idle", "active", "hang"):
        count = report["fleet"].get(name, 0)
        w = cls.get(f"patches:{name}", 0) + cls.get(f"events:{name}", 0)
        per_class[name] = w / (count * hours) if count and hours else 0.0
    lat = ours["crossing"]["latencies"]
    s: dict[str, Any] = {
        "notebooks": n, "coldCycleSeconds": cycles[0]["wallSeconds"],
        "steadyCycleSecondsMedian": statistics.median(c["wallSeconds"] for c in steady) if steady else None,
        "steadyCycleSecondsMax": max(c["wallSeconds"] for c in steady) if steady else None,
        "coldApiRequests": cycles[0]["apiRequests"], "coldApiWrites": cycles[0]["apiWrites"],
        "steadyApiRequestsPerCycle": statistics.mean(c["apiRequests"] for c in steady) if steady else None,
        "steadyApiWritesPerCycle": statistics.mean(c["apiWrites"] for c in steady) if steady else None,
        "steadyWritesPerNotebookHour": fleet_writes / (n * hours) if hours else None,
        "steadyRequestsPerNotebookHour": (sum(main_api.values()) - sum(cross_api.values())
                                          - sum(hostile_api.values())) / (n * hours) if hours else None,
        "writesPerNotebookHourByClass": per_class,
        "prometheusQueriesPerCycle": max(c["prometheusQueries"] for c in cycles),
        "probesPerCycle": cycles[0]["probes"],
        "peakRssMiB": ours["peakRssMiB"], "cpuSecondsCold": cycles[0]["cpuSeconds"],
        "cpuSecondsSteadyMedian": statistics.median(c["cpuSeconds"] for c in steady) if steady else None,
        "syncSeconds": ours["sync"]["seconds"],
        "crossingToStopSecondsMax": max(lat) if lat else None,
        "crossingToStopSecondsMedian": statistics.median(lat) if lat else None,
        "crossingStopped": f"{ours['crossing']['stopped']}/{ours['crossing']['count']}",
        "checkPeriodSeconds": ours["checkPeriodSeconds"],
        "rssAfterSyncMiB": ours["sync"]["rssMiB"], "peakRssAfterSyncMiB": ours["sync"].get("peakRssMiB"),
        "rssBeforeSyncMiB": ours["sync"].get("rssBeforeMiB"),
    }
    if ours.get("cacheBytes"):
        s["cacheBytes"] = ours["cacheBytes"]
    if report["spec"].get("hostile"):
        finals: dict[str, Counter[str]] = {}
        for v in ours.get("verdicts", {}).values():
            finals.setdefault(v["cls"], Counter())[v["trail"][-1]] += 1
        s["hostile"] = {"perKind": report["spec"]["hostile"], "kinds": report["spec"]["hostile_kinds"],
                        "finalVerdicts": {k: dict(c) for k, c in sorted(finals.items())},
                        "steadyApiWrites": writes_of(hostile_api)}
    if report.get("replicas"):
        s["replicas"] = []
        for r in report["replicas"]:
            st = [c for c in r["cycles"][1:] if "profiled" not in c["label"]]
            s["replicas"].append({
                "replica": r["replica"], "shards": r["shardsHeld"], "shardsAtEnd": r["shardsHeldAtEnd"],
                "notebooksPerCycle": statistics.median(c["notebooks"] for c in st) if st else None,
                "probesPerCycle": statistics.median(c["probes"] for c in st) if st else None,
                "coldCycleSeconds": r["cycles"][0]["wallSeconds"],
                "steadyCycleSecondsMedian": statistics.median(c["wallSeconds"] for c in st) if st else None,
                "steadyCycleSecondsMax": max(c["wallSeconds"] for c in st) if st else None,
                "cpuSecondsSteadyMedian": statistics.median(c["cpuSeconds"] for c in st) if st else None,
                "steadyApiWritesPerCycle": statistics.mean(c["apiWrites"] for c in st) if st else None,
                "peakRssMiB": r["peakRssMiB"],
                "crossingStopped": f"{r['crossing']['stopped']}",
                "crossingToStopSecondsMax": max(r["crossing"]["latencies"], default=None)})
    kf = report.get("kubeflow")
    if kf and "unavailable" not in kf:
        s["kubeflow"] = {k: kf[k] for k in ("passSeconds", "passSecondsFromRate", "probesPerSecond",
                                           "notebookUpdatesPerNotebookHour", "writesPerNotebookHour",
                                           "requestsPerSecond", "peakRssMiB", "cpuSeconds", "windowSeconds",
                                           "probes", "distinctProbed")}
    return s


def in_netns(argv: list[str]) -> int:
    """Re-run this benchmark inside a network namespace made for it; remove the namespace afterwards."""
    name = f"kfcbench{os.getpid()}"
    etc = Path("/etc/netns") / name
    child: subprocess.Popen[bytes] | None = None
    try:
        subprocess.run(["ip", "netns", "add", name], check=True)
        subprocess.run(["ip", "-n", name, "link", "set", "lo", "up"], check=True)
        etc.mkdir(parents=True, exist_ok=True)
        (etc / "resolv.conf").write_text("nameserver 127.0.0.1\noptions timeout:2 attempts:2\n")
        child = subprocess.Popen(["ip", "netns", "exec", name, sys.executable, str(Path(__file__).resolve()),
                                  *argv, "--inside-netns"])
        return child.wait()
    except KeyboardInterrupt:
        return 130
    finally:
        if child is not None and child.poll() is None:
            child.send_signal(signal.SIGINT)
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.wait(60)
        # Whatever is still running in the namespace was started by this run.
        pids = subprocess.run(["ip", "netns", "pids", name], capture_output=True, text=True).stdout.split()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pid), signal.SIGKILL)
        subprocess.run(["ip", "netns", "del", name], check=False)
        shutil.rmtree(etc, ignore_errors=True)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--notebooks", type=int, default=1000)
    p.add_argument("--crossing", type=int, default=-1, help="notebooks that cross the idle limit (default N/200)")
    p.add_argument("--latency-ms", type=float, default=50.0)
    p.add_argument("--hang-share", type=float, default=0.05)
    p.add_argument("--active-share", type=float, default=0.25)
    p.add_argument("--gpu-share", type=float, default=0.20)
    p.add_argument("--codeserver-share", type=float, default=0.20)
    p.add_argument("--steady-minutes", type=float, default=10.0)
    p.add_argument("--hostile", type=int, default=0,
                   help="N notebooks of each hostile kind beside the fleet, in bench-hostile (bench/fleet_server.py)")
    p.add_argument("--hostile-kinds", default=DEFAULT_HOSTILE_KINDS,
                   help=f"comma-separated, of {','.join(HOSTILE_KINDS)} (default {DEFAULT_HOSTILE_KINDS})")
    p.add_argument("--stopped-statefulset", choices=("copy", "bare"), default="copy",
                   help="the big stopped notebooks' StatefulSets: their template a copy of the big container, "
                        "as the notebook-controller makes them (default), or a bare one")
    p.add_argument("--replicas", type=int, default=1,
                   help="run R culler processes sharing the notebooks by shard Leases (with --set shards=N)")
    p.add_argument("--set", action="append", metavar="KEY=JSON",
                   help="override a config key of kustomize/base/config.yaml, e.g. concurrency=256")
    p.add_argument("--ours-urls", choices=("dns", "loopback"), default="dns",
                   help="inside the netns: probe through Service DNS names (default) or loopback templates")
    p.add_argument("--netns", action="store_true",
                   help="run in a network namespace with Service DNS names (implied by --kubeflow)")
    p.add_argument("--kubeflow", action="store_true", help="also run Kubeflow's notebook-controller (root; a netns)")
    p.add_argument("--kubeflow-minutes", type=float, default=10.0)
    p.add_argument("--kubeflow-cull-idle-time", type=int, default=100000)
    p.add_argument("--notebook-controller", help="the notebook-controller binary (default: the build cache)")
    p.add_argument("--profile", help="profile one steady cycle with pyinstrument into this text file")
    p.add_argument("--tracemalloc", help="trace allocations: the largest sites after the sync, the cold cycle and "
                                         "steady cycles 1 and 3, and each phase's traced memory, into this text "
                                         "file (slows the culler)")
    p.add_argument("--tracemalloc-sites", action="store_true",
                   help="with --tracemalloc: what the select, gather and act phases of the cold pass and the first "
                        "steady one hold more after them than before, by allocation site (5 frames each; the "
                        "snapshots are traced too, so take the phases' figures from a run without)")
    p.add_argument("--cache-bytes", action="store_true",
                   help="after the sync and after the cold cycle, measure each cached collection: the memory "
                        "its objects hold, the same objects encoded with marshal, and the CPU to decode them "
                        "(measuring holds memory of its own: such a run's peak RSS is not the culler's, measure it "
                        "in a run without)")
    p.add_argument("--culler-env", action="append", default=[], metavar="NAME=VALUE",
                   help="set in the culler's environment (repeatable), e.g. to measure another memory allocator: "
                        "--culler-env LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libjemalloc.so.2 "
                        "--culler-env PYTHONMALLOC=malloc")
    p.add_argument("--json", help="write the full report here")
    p.add_argument("--inside-netns", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--culler-child", help=argparse.SUPPRESS)
    a = p.parse_args()
    bad = [kv for kv in a.culler_env if not kv.partition("=")[0] or "=" not in kv]
    if bad:
        p.error(f"--culler-env takes NAME=VALUE: {', '.join(bad)}")
    unknown = set(a.hostile_kinds.split(",")) - set(HOSTILE_KINDS)
    if unknown:
        p.error(f"unknown hostile kinds: {', '.join(sorted(unknown))}")
    if a.culler_child:
        return run_child(a.culler_child)
    if (a.kubeflow or a.netns) and not a.inside_netns:
        if os.geteuid() != 0 or not shutil.which("ip") or not shutil.which("dnsmasq"):
            print("--kubeflow and --netns need root, iproute2 and dnsmasq (apt-get install -y iproute2 "
                  "dnsmasq-base)", file=sys.stderr)
            return 2
        return in_netns(sys.argv[1:])
    bench = Bench(a)
    interrupted = threading.Event()

    def on_signal(signum: int, _frame: object) -> None:
        interrupted.set()
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_signal)
    try:
        report = bench.run()
    finally:
        bench.close()
    report["summary"] = summarize(report)
    text = json.dumps(report, indent=1)
    if a.json:
        Path(a.json).write_text(text)
    print(json.dumps(report["summary"], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
