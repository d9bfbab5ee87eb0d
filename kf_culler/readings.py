"""Pure parsers: a source's raw answer -> a typed reading, or the reason it cannot be read.

A reading is all-or-nothing (rule 6): one bad timestamp or wrong type makes the whole answer
unreadable, because half an answer could make a busy notebook look idle. Which parser reads which
server type's source: the IDE registry, kf_culler/ide.py.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from kf_culler.errors import Unreadable as Unreadable
from kf_culler.timeutil import from_epoch_ms, parse_time


@dataclass(frozen=True)
class IdeReading:
    """What an IDE source says: activity times, whether work is running, whether a client is connected."""

    activity: tuple[datetime, ...] = ()
    busy: bool = False
    connected: bool = False
    connected_at: datetime | None = None  # last moment a client was known connected
    summary: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class GpuSample:
    time: datetime
    util_percent: float
    memory_mib: float


def _error_of(raw: object) -> str | None:
    if isinstance(raw, dict) and "error" in raw:
        err = raw["error"]
        return str(err)[:300] if err else "error"
    return None


def _obj(raw: object, what: str) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise Unreadable(f"{what} is {type(raw).__name__}, not an object")
    return raw


def _time(value: object, what: str) -> datetime:
    t = parse_time(value)
    if t is None:
        raise Unreadable(f"{what} is not a readable timestamp: {str(value)[:60]!r}")
    return t


def _count(value: object, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise Unreadable(f"{what} is not a count: {str(value)[:60]!r}")
    return value


def _number(value: object, what: str) -> float:
    number: float | None = None
    if not isinstance(value, bool) and isinstance(value, int | float):
        try:
            number = float(value)  # a JSON integer may be too large for a float
        except OverflowError:
            number = None
    if number is None or not math.isfinite(number) or number < 0:
        raise Unreadable(f"{what} is not a non-negative number: {str(value)[:60]!r}")
    return number


def _list(value: object, what: str) -> list[Any]:
    if not isinstance(value, list):
        raise Unreadable(f"{what} is {type(value).__name__}, not a list")
    return value


def source_error(raw: object) -> str | None:
    """The `{"error": ...}` a gatherer recorded, if that is what the answer is."""
    return _error_of(raw)


def parse_jupyter(raw: object) -> IdeReading:
    """`{"status": api/status, "kernels": api/kernels, "terminals": api/terminals}`."""
    err = _error_of(raw)
    if err:
        raise Unreadable(err)
    obs = _obj(raw, "the Jupyter answer")
    for part in ("status", "kernels"):
        if part not in obs:
            raise Unreadable(f"the Jupyter answer has no {part}")
        part_err = _error_of(obs[part])
        if part_err:
            raise Unreadable(f"api/{part}: {part_err}")
    status = _obj(obs["status"], "api/status")
    activity = [_time(status.get("last_activity"), "api/status last_activity")]
    connections = _count(status.get("connections", 0), "api/status connections")
    kernels = _list(obs["kernels"], "api/kernels")
    busy = 0
    for i, k in enumerate(kernels):
        kernel = _obj(k, f"kernel {i}")
        activity.append(_time(kernel.get("last_activity"), f"kernel {i} last_activity"))
        state = kernel.get("execution_state")
        if not isinstance(state, str):
            raise Unreadable(f"kernel {i} execution_state is not a string")
        busy += state == "busy"
        connections = max(connections, _count(kernel.get("connections", 0), f"kernel {i} connections"))
    terminals: list[Any] = []
    raw_terms = obs.get("terminals")
    if raw_terms is not None and _error_of(raw_terms) is None:
        # api/status already carries terminal activity; terminals are read when the server has them.
        terminals = _list(raw_terms, "api/terminals")
        for i, t in enumerate(terminals):
            activity.append(_time(_obj(t, f"terminal {i}").get("last_activity"), f"terminal {i} last_activity"))
    latest = max(activity)
    return IdeReading(
        activity=tuple(activity),
        busy=busy > 0,
        connected=connections > 0,
        summary={"kernels": len(kernels), "busyKernels": busy, "terminals": len(terminals),
                 "connections": connections, "lastActivity": latest.isoformat().replace("+00:00", "Z")},
    )


def parse_code_server(raw: object) -> IdeReading:
    """`{"healthz": GET /healthz}` -> connected while `alive`; lastHeartbeat is the last connection."""
    err = _error_of(raw)
    if err:
        raise Unreadable(err)
    obs = _obj(raw, "the code-server answer")
    if "healthz" not in obs:
        raise Unreadable("the code-server answer has no healthz")
    health = _obj(obs["healthz"], "/healthz")
    status = health.get("status")
    if status not in ("alive", "expired"):
        raise Unreadable(f"/healthz status is {str(status)[:40]!r}, not 'alive' or 'expired'")
    beat_raw = health.get("lastHeartbeat")
    _number(beat_raw, "/healthz lastHeartbeat")
    beat = None if beat_raw == 0 else from_epoch_ms(beat_raw)
    if beat_raw != 0 and beat is None:
        raise Unreadable(f"/healthz lastHeartbeat is out of range: {beat_raw!r}")
    return IdeReading(
        activity=(),
        connected=status == "alive",
        connected_at=beat,
        summary={"status": status,
                 "lastHeartbeat": beat.isoformat().replace("+00:00", "Z") if beat else "never"},
    )


def parse_rstudio(raw: object) -> IdeReading:
    """`{"connected": bool, "busy": bool, "lastActivity": RFC3339|null, "via": str}` (see docs/signals.md).

    An optional `"lastConnected": RFC3339|null` is the last moment a browser was seen connected; like
    code-server's lastHeartbeat it counts in the idle clock (rule 7), not as activity.
    """
    err = _error_of(raw)
    if err:
        raise Unreadable(err)
    obs = _obj(raw, "the RStudio answer")
    if "lastActivity" not in obs:
        raise Unreadable("the RStudio answer has no lastActivity")
    connected = obs.get("connected", False)
    busy = obs.get("busy", False)
    if not isinstance(connected, bool) or not isinstance(busy, bool):
        raise Unreadable("RStudio connected/busy are not booleans")
    last = obs["lastActivity"]
    activity = () if last is None else (_time(last, "RStudio lastActivity"),)
    last_conn = obs.get("lastConnected")
    connected_at = None if last_conn is None else _time(last_conn, "RStudio lastConnected")
    return IdeReading(
        activity=activity, busy=busy, connected=connected, connected_at=connected_at,
        summary={"connected": connected, "busy": busy, "lastActivity": last, "lastConnected": last_conn,
                 "via": str(obs.get("via", ""))[:80]},
    )


CODER_BUILD_STATUSES = ("pending", "starting", "running", "stopping", "stopped", "failed", "canceling", "canceled",
                        "deleting", "deleted")  # codersdk/workspacebuilds.go WorkspaceStatus


def parse_coder(raw: object) -> IdeReading:
    """`{"connected": bool, "lastUsedAt": RFC3339|null, "build": latest build status, "agents": str}`: what
    Coder's `GET /api/v2/workspaces` says of one workspace (kf_culler/targets/coder.py `coder_reading`).

    Connected is never active (like code-server, `connection_is_only_signal`): Coder knows connections, not
    work. `lastUsedAt` is the last moment Coder saw the workspace used (a connection, an app, `coder ssh`,
    written in 60 s batches); like a last heartbeat it counts in the idle clock (rule 7), not as activity."""
    err = _error_of(raw)
    if err:
        raise Unreadable(err)
    obs = _obj(raw, "the Coder answer")
    connected = obs.get("connected")
    if not isinstance(connected, bool):
        raise Unreadable("the Coder answer's connected is not a boolean")
    if "lastUsedAt" not in obs:
        raise Unreadable("the Coder answer has no lastUsedAt")
    last = obs["lastUsedAt"]
    last_used = None if last is None else _time(last, "Coder last_used_at")
    build = obs.get("build")
    if build not in CODER_BUILD_STATUSES:
        raise Unreadable(f"the Coder build status is {str(build)[:40]!r}, not one Coder v2 reports")
    return IdeReading(
        activity=(), connected=connected, connected_at=last_used,
        summary={"connected": connected, "lastUsedAt": last, "build": build,
                 "agents": str(obs.get("agents", ""))[:200]},
    )


def parse_gpu(raw: object) -> tuple[GpuSample, ...]:
    """`{"samples": [{"time", "utilPercent", "memoryUsedMiB"}, ...]}`, sorted by time; never empty."""
    err = _error_of(raw)
    if err:
        raise Unreadable(err)
    obs = _obj(raw, "the GPU answer")
    samples = _list(obs.get("samples"), "GPU samples")
    if not samples:
        raise Unreadable("no GPU samples for this pod")
    out = []
    for i, s in enumerate(samples):
        sample = _obj(s, f"GPU sample {i}")
        out.append(GpuSample(
            time=_time(sample.get("time"), f"GPU sample {i} time"),
            util_percent=_number(sample.get("utilPercent"), f"GPU sample {i} utilPercent"),
            memory_mib=_number(sample.get("memoryUsedMiB"), f"GPU sample {i} memoryUsedMiB"),
        ))
    out.sort(key=lambda s: s.time)
    return tuple(out)

