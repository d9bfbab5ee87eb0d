"""The decision rules (shared/scenarios/README.md): pure, no I/O, no clock.

decide(notebook, pod, observations, policy, now) -> Verdict
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from kf_culler.config import Policy
from kf_culler.model import (
    EXEMPT_ANNOTATION,
    KEEP_UNTIL_ANNOTATION,
    RESTARTED_AT_ANNOTATION,
    SERVER_SOURCES,
    SERVER_TYPE_ANNOTATION,
    SOURCES,
    STOP_ANNOTATION,
    STOPPED_BY_ANNOTATION,
    STOPPED_BY_VALUE,
    InputError,
    Verdict,
)
from kf_culler.readings import IDE_PARSERS, GpuSample, IdeReading, Unreadable, parse_gpu, source_error
from kf_culler.timeutil import add_minutes, format_time, parse_time

MAX_GPUS = 1 << 20  # a sum of huge requests stays a finite count
IDE_NAMES = {"jupyter": "Jupyter", "codeServer": "code-server", "rstudio": "RStudio"}
IDLE_WORDS = {
    "jupyter": "no kernel, terminal or server activity",
    "codeServer": "no browser connected to code-server",
    "rstudio": "no RStudio activity",
}


def _annotations(notebook: dict[str, Any]) -> dict[str, Any]:
    meta = notebook.get("metadata")
    if meta is None:
        return {}
    if not isinstance(meta, dict):
        raise InputError("notebook.metadata is not an object")
    ann = meta.get("annotations") or {}
    if not isinstance(ann, dict):
        raise InputError("notebook.metadata.annotations is not an object")
    return ann


def _containers(obj: dict[str, Any] | None, *path: str) -> list[dict[str, Any]]:
    cur: Any = obj
    for key in path:
        cur = cur.get(key) if isinstance(cur, dict) else None
    return [c for c in cur if isinstance(c, dict)] if isinstance(cur, list) else []


def _quantity(value: object) -> float:
    """A plain resource count (units and garbage count as 0); an infinite one is capped, NaN is 0."""
    try:
        number = float(str(value))
    except ValueError:
        return 0.0
    if math.isnan(number):
        return 0.0
    return min(number, MAX_GPUS)


def gpu_count(notebook: dict[str, Any], pod: dict[str, Any] | None, resources: tuple[str, ...]) -> int:
    """GPUs the pod (or, without a pod, the notebook template) asks for."""
    containers = _containers(pod, "spec", "containers") if pod else []
    if not containers:
        containers = _containers(notebook, "spec", "template", "spec", "containers")
    total = 0.0
    for c in containers:
        res = c.get("resources")
        res = res if isinstance(res, dict) else {}
        for kind in ("limits", "requests"):
            q = res.get(kind)
            q = q if isinstance(q, dict) else {}
            n = max((_quantity(q.get(r, 0)) for r in resources), default=0.0)
            if n > 0:
                total += n
                break
    return int(min(total, MAX_GPUS))


def server_type(notebook: dict[str, Any], policy: Policy) -> str:
    value = _annotations(notebook).get(SERVER_TYPE_ANNOTATION)
    if isinstance(value, str) and value:
        return value
    for c in _containers(notebook, "spec", "template", "spec", "containers")[:1]:
        image = c.get("image")
        if isinstance(image, str):
            found = policy.server_type_for_image(image)
            if found:
                return found
    return "jupyter"


def _pod_start(pod: dict[str, Any] | None) -> datetime | None:
    """When the pod started running; None when it is not running, or is being deleted (a stopped
    notebook's old pod can still answer for up to its termination grace)."""
    if not isinstance(pod, dict):
        return None
    meta = pod.get("metadata")
    if isinstance(meta, dict) and meta.get("deletionTimestamp"):
        return None
    status = pod.get("status")
    if not isinstance(status, dict) or status.get("phase") != "Running":
        return None
    return parse_time(status.get("startTime"))


def _restarted_at(ann: dict[str, Any], now: datetime) -> datetime | None:
    """When the culler saw the notebook started again after its own stop; a time in the future is
    not one the culler wrote, and is ignored."""
    t = parse_time(ann.get(RESTARTED_AT_ANNOTATION))
    return t if t is not None and t <= now else None


def _minutes(seconds: float) -> str:
    if seconds < 120:
        return f"{max(0, int(seconds))} s"
    m = int(seconds // 60)
    if m < 60:
        return f"{m} min"
    h, m = divmod(m, 60)
    if h >= 48:
        return f"{h // 24} days {h % 24} h"
    return f"{h} h {m} min" if m else f"{h} h"


def _hhmm(t: datetime, now: datetime) -> str:
    if t.date() != now.date():
        return format_time(t)
    return f"{t:%H:%M} UTC" if t.second == 0 else f"{t:%H:%M:%S} UTC"


def _works(s: GpuSample, policy: Policy) -> bool:
    return s.util_percent >= policy.gpu.util_percent and s.memory_mib >= policy.gpu.memory_mib


@dataclass(frozen=True)
class _Gpu:
    samples: tuple[GpuSample, ...]
    last_work: datetime | None
    idle_since: datetime  # conservative: we only know it idle since the last work or the first sample
    working_now: bool


def _read_gpu(raw: object, policy: Policy) -> _Gpu:
    samples = parse_gpu(raw)
    work = [s.time for s in samples if _works(s, policy)]
    last_work = max(work) if work else None
    return _Gpu(samples, last_work, last_work or samples[0].time, _works(samples[-1], policy))


def decide(
    notebook: dict[str, Any],
    pod: dict[str, Any] | None,
    observations: dict[str, Any],
    policy: Policy,
    now: datetime,
) -> Verdict:
    """The verdict for one notebook. Raises InputError only for inputs that are not a notebook at all."""
    if not isinstance(notebook, dict):
        raise InputError("notebook is not an object")
    if pod is not None and not isinstance(pod, dict):
        raise InputError("pod is neither an object nor null")
    if not isinstance(observations, dict):
        raise InputError("observations is not an object")
    ann = _annotations(notebook)
    stype = server_type(notebook, policy)
    gpus = gpu_count(notebook, pod, policy.gpu_resources)

    def plain(action: str, state: str, reason: str, rule: str) -> Verdict:
        return Verdict(action, state, reason, rule, server_type=stype, gpu_notebook=gpus > 0)  # type: ignore[arg-type]

    # Rule 1: stopped stays stopped, whoever stopped it.
    if STOP_ANNOTATION in ann:
        return plain("keep", "stopped", "The notebook is stopped; the culler leaves it as it is.", "1-stopped")
    # Rule 2: exempt.
    if policy.allow_exempt and str(ann.get(EXEMPT_ANNOTATION, "")).strip().lower() == "true":
        return plain("keep", "exempt",
                     f"The notebook is exempt from idle culling ({EXEMPT_ANNOTATION}: \"true\").", "2-exempt")
    # Rule 3: starting. A notebook this culler stopped whose stop annotation is gone was started again
    # by its user, whatever its old pod is still doing: the grace counts from the restart.
    grace = _minutes(policy.startup_grace_minutes * 60)
    if ann.get(STOPPED_BY_ANNOTATION) == STOPPED_BY_VALUE:
        return plain("keep", "starting",
                     f"The notebook was started again; idle culling waits {grace} after a start.", "3-restarted")
    started = _pod_start(pod)
    if started is None:
        meta = pod.get("metadata") if pod is not None else None
        why = ("has no pod yet" if pod is None
               else "has no running pod yet: the old one is still shutting down"
               if isinstance(meta, dict) and meta.get("deletionTimestamp")
               else "has no running pod yet (it may be waiting for a GPU)")
        return plain("keep", "starting", f"The notebook {why}.", "3-starting")
    started = min(started, now)
    restarted = _restarted_at(ann, now)
    if restarted is not None and restarted > started:
        started = restarted
    grace_end = add_minutes(started, policy.startup_grace_minutes)
    if now < grace_end:
        return plain("keep", "starting",
                     f"The notebook started {_minutes((now - started).total_seconds())} ago; idle culling "
                     f"waits {grace} after a start.", "3-starting")

    # Rule 4: the IDE's own source; answers of the others about the IDE are ignored.
    ide_key = SERVER_SOURCES.get(stype)
    evidence: dict[str, Any] = {}
    for key in SOURCES:
        if key in observations and key not in (ide_key, "gpu"):
            evidence[key] = {"ignored": f"not the source for server type {stype!r}"}
    ide: IdeReading | None = None
    ide_problem: str | None = None
    if ide_key is None:
        ide_problem = f"unknown server type {stype!r}"
    elif ide_key not in observations:
        ide_problem = f"{IDE_NAMES[ide_key]} was not asked"
    else:
        try:
            ide = IDE_PARSERS[ide_key](observations[ide_key])
            evidence[ide_key] = {"read": True, **ide.summary}
        except Unreadable as err:
            ide_problem = f"could not read {IDE_NAMES[ide_key]}: {err}"
            evidence[ide_key] = {"read": False, "error": str(err)}

    gpu: _Gpu | None = None
    gpu_problem: str | None = None
    if gpus > 0 or "gpu" in observations:
        if "gpu" not in observations:
            gpu_problem = "GPU metrics were not asked"
        else:
            try:
                gpu = _read_gpu(observations["gpu"], policy)
                latest = gpu.samples[-1]
                evidence["gpu"] = {
                    "read": True, "samples": len(gpu.samples),
                    "latest": {"time": format_time(latest.time), "utilPercent": latest.util_percent,
                               "memoryUsedMiB": latest.memory_mib},
                    "lastWork": format_time(gpu.last_work) if gpu.last_work else None,
                }
            except Unreadable as err:
                gpu_problem = f"no GPU metrics: {err}" if source_error(observations["gpu"]) is None \
                    else f"no GPU metrics ({err})"
                evidence["gpu"] = {"read": False, "error": str(err)}
        if gpus == 0:
            gpu_problem = None  # a CPU notebook needs no GPU evidence

    def verdict(action: str, state: str, reason: str, rule: str, **kw: Any) -> Verdict:
        return Verdict(action, state, reason, rule, server_type=stype,  # type: ignore[arg-type]
                       gpu_notebook=gpus > 0, evidence=evidence, **kw)

    # Rule 5: positive evidence wins.
    gpu_idle_long = (
        gpu is not None and policy.busy_kernel_gpu_idle_minutes is not None
        and now >= add_minutes(min(gpu.idle_since, now), policy.busy_kernel_gpu_idle_minutes)
    )
    if gpu is not None and gpu.working_now:
        s = gpu.samples[-1]
        return verdict("keep", "active",
                       f"The GPU is working ({s.util_percent:g}% utilisation, {s.memory_mib:g} MiB in use "
                       f"at {_hhmm(s.time, now)}).", "5-positive-evidence")
    if ide is not None and ide.busy and not gpu_idle_long:
        what = "A kernel is running code" if ide_key == "jupyter" else f"{IDE_NAMES[ide_key or '']} is running work"
        return verdict("keep", "active", f"{what}.", "5-positive-evidence")

    # Rule 7: the idle clock, from everything readable.
    clock = [started]
    if ide is not None:
        clock.extend(ide.activity)
        if ide.connected_at is not None:
            clock.append(ide.connected_at)
    if gpu is not None and gpu.last_work is not None:
        clock.append(gpu.last_work)
    idle_since = min(max(clock), now)
    idle_seconds = (now - idle_since).total_seconds()
    timing = {"idle_since": idle_since, "idle_seconds": idle_seconds}

    # Rule 6: no signal is not idleness.
    missing = ide_problem or (gpu_problem if gpus > 0 else None)
    if missing and ide_problem is None and ide is not None and \
            now < add_minutes(idle_since, policy.idle_minutes):
        missing = None  # half the evidence, but the IDE shows activity inside the idle window: never stop
        half_evidence = True
    else:
        half_evidence = False
    if missing:
        reason = f"No signal: {missing}. A notebook is not stopped because it could not be read"
        if policy.no_signal.action == "stop" and policy.no_signal.after_minutes is not None:
            stop_at = add_minutes(idle_since, policy.no_signal.after_minutes)
            warn_at = add_minutes(stop_at, -policy.warn_minutes)
            if now >= stop_at:
                return verdict("stop", "no-signal",
                               f"No signal for {_minutes(idle_seconds)} ({missing}); the policy stops "
                               f"notebooks that give no signal for {_minutes(policy.no_signal.after_minutes * 60)}.",
                               "6-no-signal", stop_at=stop_at, warn_at=warn_at, **timing)
            if policy.warn_minutes > 0 and now >= warn_at:
                return verdict("warn", "no-signal",
                               f"No signal for {_minutes(idle_seconds)} ({missing}); it will be stopped at "
                               f"{_hhmm(stop_at, now)} unless a signal returns.",
                               "6-no-signal", stop_at=stop_at, warn_at=warn_at, **timing)
            return verdict("keep", "no-signal", reason + f" before {_hhmm(stop_at, now)}.", "6-no-signal",
                           stop_at=stop_at, **timing)
        return verdict("keep", "no-signal", reason + ".", "6-no-signal", **timing)
    assert ide is not None and ide_key is not None

    # Rule 9: connected is not active.
    limit = policy.idle_minutes
    rule = "10-idle"
    state = "idle"
    if ide.connected:
        n = policy.connected_gpu_idle_minutes
        if n is None or gpu is None:
            client = "A browser is connected" if ide_key != "jupyter" else "A client is connected to a kernel"
            return verdict("keep", "connected",
                           f"{client}; connected sessions are kept.", "9-connected", **timing)
        # A connected GPU session with no work: the connection itself is not evidence of work.
        work = [started, *ide.activity] + ([gpu.last_work] if gpu.last_work else [])
        idle_since = min(max(work), now)
        idle_seconds = (now - idle_since).total_seconds()
        timing = {"idle_since": idle_since, "idle_seconds": idle_seconds}
        limit, rule, state = n, "9-connected-gpu-idle", "connected"

    # Rules 10 and 12: warn, then stop; a bounded extension moves the stop.
    stop_at = add_minutes(idle_since, limit)
    note = ""
    raw_until = ann.get(KEEP_UNTIL_ANNOTATION)
    if raw_until is not None:
        until = parse_time(raw_until)
        if until is None:
            note = f" ({KEEP_UNTIL_ANNOTATION} {str(raw_until)[:40]!r} is not a readable time and was ignored.)"
        elif policy.max_extend_minutes <= 0:
            note = f" ({KEEP_UNTIL_ANNOTATION} is not honoured on this cluster.)"
        elif until > stop_at:
            cap = add_minutes(stop_at, policy.max_extend_minutes)
            stop_at = min(until, cap)
            note = (f" (The request to keep it until {_hhmm(until, now)} was capped at {_hhmm(stop_at, now)}, "
                    "the longest extension this cluster allows.)" if until > cap
                    else f" (Kept until {_hhmm(stop_at, now)} at the user's request.)")
    warn_at = add_minutes(stop_at, -policy.warn_minutes)
    timing.update(stop_at=stop_at, warn_at=warn_at)

    # What was idle, in words; a connected code-server's only IDE signal is the connection itself.
    idle_words = [] if state == "connected" and ide_key == "codeServer" else [IDLE_WORDS[ide_key]]
    if gpu is not None:
        idle_words.append("an idle GPU")
    what = " and ".join(idle_words)
    if ide.busy:  # only reached when the busy kernel stopped counting (busyKernelGpuIdleMinutes)
        note = (f" A kernel reports busy, but the GPU has been idle for over "
                f"{_minutes((policy.busy_kernel_gpu_idle_minutes or 0) * 60)}, so it is treated as hung.{note}")
    since = _hhmm(idle_since, now)
    if half_evidence:
        return verdict("keep", state, f"Idle for {_minutes(idle_seconds)} ({what} since {since}); GPU metrics "
                       f"are missing ({gpu_problem}), so it will not be stopped on this evidence alone.",
                       "6-half-evidence", **timing)
    connected = " although a browser is connected" if state == "connected" else ""
    if now >= stop_at:
        return verdict("stop", state,
                       f"Stopped after {_minutes(idle_seconds)} {'without work' if connected else 'idle'}"
                       f"{connected}: {what} since {since} "
                       f"(limit {_minutes(limit * 60)}). Your files in the home volume are kept; start the "
                       f"notebook again to continue.{note}", rule, **timing)
    if policy.warn_minutes > 0 and now >= warn_at:
        return verdict("warn", state,
                       f"Idle for {_minutes(idle_seconds)}{connected} ({what} since {since}); it will be "
                       f"stopped at {_hhmm(stop_at, now)} unless it is used. To ask for more time, set "
                       f"{KEEP_UNTIL_ANNOTATION}.{note}", rule, **timing)
    return verdict("keep", state,
                   f"Idle for {_minutes(idle_seconds)} ({what} since {since}); it will be stopped after "
                   f"{_minutes(limit * 60)} idle, at {_hhmm(stop_at, now)}.{note}", rule, **timing)
