"""Convert a NotebookOS workload template (JSON) into a replay trace, so the sweep can run on a public trace.

NotebookOS (ASPLOS '26) publishes its workloads as templates: `{"sessions": [...]}`, each session with a
`start_tick` and `stop_tick` (one tick is 60 s), the resources it asks for (`max_resource_request`: `gpus`,
`cpus`, `memory` in GB, `vram` in GB) and its `trainings` (cell executions): `start_tick`, `end_tick`
(exclusive), `gpus`, `vram` (GB) and one `{"utilization": %}` per GPU. The excerpt of Adobe's production
notebook trace published with it is one such template.

What the converted trace says about each session (docs/replay.md, "Converting a NotebookOS template"):

- a Jupyter Notebook `<namespace>/s-<index>-<first 8 characters of the session id>` holding `max_resource_request`'s
  GPUs, whose pod runs from `start_tick` to `stop_tick` (a record without a pod at `stop_tick`: the session ended);
- at each check: a kernel that is `busy` while a training runs and `idle` otherwise, its `last_activity` the end
  of the last training (or the session start); no client connected (the template does not say);
- GPU samples, one per tick: during a training with GPUs, the mean of its GPUs' utilisation and its `vram` in
  MiB; otherwise 0 % and 0 MiB (the template gives no memory between trainings);
- ground truth: `working` while a training runs, `absent` otherwise.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from kf_culler.errors import TraceError
from kf_culler.model import SERVER_TYPE_ANNOTATION
from kf_culler.replay.trace import TraceHeader, TraceWriter, Truth, open_text
from kf_culler.timeutil import format_time

TICK_SECONDS = 60
# Tick 0 of the Adobe excerpt ("June (1st & 2nd)" 2021); the template gives no wall-clock time.
DEFAULT_START = datetime(2021, 6, 1, tzinfo=UTC)
SOURCE = "notebookos-workload-template"
IMAGE = "kubeflownotebookswg/jupyter-pytorch-cuda-full"


@dataclass(frozen=True)
class Training:
    start: int  # tick, inclusive
    end: int  # tick, exclusive
    gpus: int
    util_percent: float  # mean over its GPUs
    vram_mib: float


@dataclass(frozen=True)
class Session:
    index: int
    id: str
    start: int
    stop: int
    gpus: int
    cpus: float
    memory_gb: float
    trainings: tuple[Training, ...]

    @property
    def name(self) -> str:
        return f"s-{self.index:03d}-{self.id[:8].lower()}"


def _int(value: object, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int | float) or value != int(value) or value < 0:
        raise TraceError(f"{where}: a whole non-negative number of ticks is expected, not {str(value)[:40]!r}")
    return int(value)


def _num(value: object, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise TraceError(f"{where}: a non-negative number is expected, not {str(value)[:40]!r}")
    return float(value)


def parse_template(doc: object, where: str = "template") -> list[Session]:
    """The sessions of a workload template, checked; TraceError names the bad key."""
    if not isinstance(doc, dict) or not isinstance(doc.get("sessions"), list):
        raise TraceError(f"{where}: not a NotebookOS workload template (an object with a 'sessions' list)")
    out = []
    for i, raw in enumerate(doc["sessions"]):
        at = f"{where}: sessions[{i}]"
        if not isinstance(raw, dict):
            raise TraceError(f"{at}: must be an object")
        start, stop = _int(raw.get("start_tick"), f"{at}.start_tick"), _int(raw.get("stop_tick"), f"{at}.stop_tick")
        if stop <= start:
            raise TraceError(f"{at}: stop_tick {stop} is not after start_tick {start}")
        req = raw.get("max_resource_request") or {}
        if not isinstance(req, dict):
            raise TraceError(f"{at}.max_resource_request: must be an object")
        trainings = []
        for j, t in enumerate(raw.get("trainings") or []):
            tat = f"{at}.trainings[{j}]"
            if not isinstance(t, dict):
                raise TraceError(f"{tat}: must be an object")
            t_start = _int(t.get("start_tick"), f"{tat}.start_tick")
            t_end = _int(t["end_tick"], f"{tat}.end_tick") if "end_tick" in t else \
                t_start + _int(t.get("duration_in_ticks"), f"{tat}.duration_in_ticks")
            utils = t.get("gpu_utilizations") or []
            if not isinstance(utils, list):
                raise TraceError(f"{tat}.gpu_utilizations: must be a list")
            values = [_num(u.get("utilization") if isinstance(u, dict) else None, f"{tat}.gpu_utilizations[{k}]")
                      for k, u in enumerate(utils)]
            gpus = _int(t.get("gpus", len(values)), f"{tat}.gpus")
            trainings.append(Training(t_start, max(t_end, t_start + 1), gpus,
                                      sum(values) / len(values) if values else 0.0,
                                      _num(t.get("vram", 0), f"{tat}.vram") * 1024))
        trainings.sort(key=lambda t: t.start)
        ident = raw.get("id")
        out.append(Session(i, ident if isinstance(ident, str) and ident else f"{i:08d}", start, stop,
                           _int(req.get("gpus", max((t.gpus for t in trainings), default=0)),
                                f"{at}.max_resource_request.gpus"),
                           _num(req.get("cpus", 1), f"{at}.max_resource_request.cpus"),
                           _num(req.get("memory", 1), f"{at}.max_resource_request.memory"), tuple(trainings)))
    return out


def _resources(s: Session) -> dict[str, str]:
    out = {"cpu": f"{max(s.cpus, 0.001):.3f}".rstrip("0").rstrip("."),
           "memory": f"{max(round(s.memory_gb * 1024), 1)}Mi"}
    if s.gpus:
        out["nvidia.com/gpu"] = str(s.gpus)
    return out


class _SessionSim:
    """One session observed at increasing ticks."""

    def __init__(self, s: Session, namespace: str, start: datetime) -> None:
        self.s = s
        self.origin = start
        res = _resources(s)
        self.notebook: dict[str, Any] = {
            "apiVersion": "kubeflow.org/v1", "kind": "Notebook",
            "metadata": {"name": s.name, "namespace": namespace, "uid": s.id,
                         "creationTimestamp": self.z(s.start),
                         "annotations": {SERVER_TYPE_ANNOTATION: "jupyter"}},
            "spec": {"template": {"spec": {"containers": [{
                "name": s.name, "image": IMAGE, "resources": {"limits": dict(res), "requests": dict(res)}}]}}},
        }
        self.pod: dict[str, Any] = {
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"{s.name}-0", "namespace": namespace},
            "spec": {"containers": [{"name": s.name, "resources": {"limits": dict(res), "requests": dict(res)}}]},
            "status": {"phase": "Running", "startTime": self.z(s.start)},
        }
        self.i = 0  # the first training not yet ended
        self.last_sample = s.start - 1  # the last tick a GPU sample was written for

    def z(self, tick: int, micro: bool = False) -> str:
        return format_time(self.origin + timedelta(seconds=tick * TICK_SECONDS), micro=micro)

    def running(self, tick: int) -> Training | None:
        tr = self.s.trainings
        while self.i < len(tr) and tr[self.i].end <= tick:
            self.i += 1
        return tr[self.i] if self.i < len(tr) and tr[self.i].start <= tick else None

    def _at(self, tick: int) -> Training | None:
        """The training running at `tick` (any tick at or after the last `running` call)."""
        for t in self.s.trainings[self.i:]:
            if t.start > tick:
                return None
            if t.end > tick:
                return t
        return None

    def observe(self, tick: int) -> tuple[dict[str, Any], Truth]:
        now = self.running(tick)
        last_end = self.s.trainings[self.i - 1].end if self.i > 0 else self.s.start
        activity = self.z(tick if now is not None else last_end, micro=True)
        kernel = {"id": self.s.id, "name": "python3", "last_activity": activity,
                  "execution_state": "busy" if now is not None else "idle", "connections": 0}
        obs: dict[str, Any] = {"jupyter": {
            "status": {"started": self.z(self.s.start, micro=True), "last_activity": activity, "connections": 0,
                       "kernels": 1},
            "kernels": [kernel], "terminals": []}}
        if self.s.gpus:
            samples = []
            for k in range(self.last_sample + 1, tick + 1):
                t = self._at(k)
                busy = t is not None and t.gpus > 0
                samples.append({"time": self.z(k), "utilPercent": round(t.util_percent, 2) if busy and t else 0,
                                "memoryUsedMiB": round(t.vram_mib) if busy and t else 0})
            self.last_sample = tick
            obs["gpu"] = {"samples": samples}
        return obs, "working" if now is not None else "absent"


def convert(template: str | Path, out: str | Path, *, namespace: str = "notebookos", start: datetime = DEFAULT_START,
            check_ticks: int = 1, until_ticks: int | None = None) -> tuple[int, int]:
    """Write the trace of a template to `out`: a record per running session every `check_ticks` ticks, up to
    `until_ticks` (default: the last session's end). Returns (sessions converted, records)."""
    path = Path(template)
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as err:
        raise TraceError(f"{path}: not JSON: {err}") from None
    sessions = parse_template(doc, str(path))
    if check_ticks < 1:
        raise ValueError("check ticks must be at least 1")
    end = max((s.stop for s in sessions), default=0)
    if until_ticks is not None:
        end = min(end, until_ticks)
    sessions = [s for s in sessions if s.start < end]
    title = doc.get("workloadTitle") or doc.get("workload_title")
    header = TraceHeader(start=start, check_period_seconds=check_ticks * TICK_SECONDS, synthetic=False,
                         end=start + timedelta(seconds=end * TICK_SECONDS),
                         generator={"convertedFrom": SOURCE, "file": path.name,
                                    **({"title": title} if isinstance(title, str) else {}),
                                    "tickSeconds": TICK_SECONDS, "checkTicks": check_ticks, "untilTicks": end,
                                    "sessions": len(sessions)})
    sims = sorted((_SessionSim(s, namespace, start) for s in sessions), key=lambda x: x.s.start)
    active: list[_SessionSim] = []
    nxt = 0
    with open_text(out, "w") as stream:
        writer = TraceWriter(stream, header)
        for tick in range(0, end, check_ticks):
            while nxt < len(sims) and sims[nxt].s.start <= tick:
                active.append(sims[nxt])
                nxt += 1
            now = start + timedelta(seconds=tick * TICK_SECONDS)
            still = []
            for sim in active:
                if tick >= sim.s.stop:  # the session ended: its last record has no pod
                    writer.write(now, sim.notebook, None, {}, "absent")
                    continue
                obs, truth = sim.observe(tick)
                writer.write(now, sim.notebook, sim.pod, obs, truth)
                still.append(sim)
            active = still
        return len(sessions), writer.records
