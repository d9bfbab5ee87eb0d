"""A seeded synthetic fleet: named user behaviours turned into a trace with ground truth.

Each notebook follows one behaviour. A behaviour is planned as a list of spans (minutes from the trace
start) in which the user's situation is constant: the ground truth (`working`, `present`, `absent`),
whether a browser is connected, whether the kernel/IDE shows activity, whether a kernel is busy, what
the GPU does, whether the endpoint answers, whether the user stopped the notebook. The spans are then
observed every check period and written in the scenario observation shapes.

Everything is derived from (seed, notebook index) with `random.Random`, so a fleet is reproducible and
one notebook does not depend on how many others there are.
"""

from __future__ import annotations

import bisect
import random
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Literal

from kf_culler.model import SERVER_TYPE_ANNOTATION, STOP_ANNOTATION
from kf_culler.replay.trace import TraceHeader, TraceWriter, Truth, open_text
from kf_culler.timeutil import format_time

DAY = 1440
RSTUDIO_LOOKBACK = 240  # minutes; the RStudio source's default look-back
DEFAULT_START = datetime(2026, 3, 2, tzinfo=UTC)  # a Monday
BEHAVIOUR_LABEL = "fleet.notebook-culler.io/behaviour"
Gpu = Literal["free", "held", "run", "ghost"]
Kernel = Literal["none", "idle", "busy"]
Ide = Literal["jupyter", "codeServer", "rstudio"]


@dataclass(frozen=True, slots=True)
class State:
    """What is true of a notebook during a span."""

    truth: Truth
    client: bool = False  # a browser tab is connected (Jupyter polls, code-server beats, RStudio connected)
    executing: bool = False  # the kernel/R session shows activity (cells run, output flows)
    terminal: bool = False  # someone types in a Jupyter terminal
    kernel: Kernel = "none"  # Jupyter kernel / R session: none, idle or busy
    gpu: Gpu = "free"  # free: 0 % / 0 MiB; held: 0 % / mem; run: util / mem; ghost: util / 0 MiB
    util: int = 0
    mem: int = 0
    reachable: bool = True  # the IDE endpoint answers
    stopped: bool = False  # the user stopped the notebook (kubeflow-resource-stopped, no pod)


@dataclass(frozen=True, slots=True)
class Span:
    start: int  # minutes from the trace start, inclusive
    end: int  # exclusive
    state: State


class Plan:
    """Spans appended in time order; adjacent equal states merge."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.t = 0
        self.spans: list[Span] = []

    def to(self, end: int, state: State) -> None:
        end = min(end, self.total)
        if end <= self.t:
            return
        if self.spans and self.spans[-1].state == state:
            self.spans[-1] = Span(self.spans[-1].start, end, state)
        else:
            self.spans.append(Span(self.t, end, state))
        self.t = end

    def fill(self, state: State) -> None:
        self.to(self.total, state)


@dataclass(frozen=True)
class Profile:
    """One user's habits, drawn once per notebook."""

    ide: Ide
    gpus: int
    arrive: int  # mean arrival, minutes after midnight UTC
    length: int  # mean working day, minutes
    idle_gpu: Gpu  # what the GPU shows between runs: held (a model in memory) or free
    mem: int  # MiB held by the user's model
    tab_open_breaks: float  # chance a break is taken with the tab open (present) rather than closed
    weekday0: int  # weekday of the trace start (0 = Monday)

    def idle(self) -> tuple[Gpu, int, int]:
        if not self.gpus:
            return "free", 0, 0
        return (self.idle_gpu, 0, self.mem) if self.idle_gpu == "held" else ("free", 0, 0)

    def kernel(self) -> Kernel:
        return "none" if self.ide == "codeServer" else "idle"

    def work(self) -> State:
        g, u, m = self.idle()
        return State("working", client=True, executing=True, kernel=self.kernel(), gpu=g, util=u, mem=m)

    def present(self) -> State:
        g, u, m = self.idle()
        return State("present", client=True, kernel=self.kernel(), gpu=g, util=u, mem=m)

    def away(self) -> State:
        g, u, m = self.idle()
        return State("absent", kernel=self.kernel(), gpu=g, util=u, mem=m)

    def run(self, rng: random.Random, client: bool = True) -> State:
        """A run: from a kernel cell (Jupyter), an R call (RStudio) or a terminal (code-server); on the GPU
        when there is one."""
        truth: Truth = "working"
        kernel: Kernel = "none" if self.ide == "codeServer" else "busy"
        if not self.gpus:
            return State(truth, client=client, executing=True, kernel=kernel)
        return State(truth, client=client, executing=True, kernel=kernel, gpu="run",
                     util=rng.randint(60, 99), mem=max(self.mem, rng.randint(4000, 38000)))


def _profile(rng: random.Random, ide: Ide, gpus: int, weekday0: int) -> Profile:
    return Profile(
        ide=ide, gpus=gpus,
        arrive=int(min(max(rng.gauss(9 * 60, 50), 7 * 60), 11 * 60)),
        length=int(min(max(rng.gauss(8.5 * 60, 40), 6 * 60), 10.5 * 60)),
        idle_gpu="held" if rng.random() < 0.65 else "free",
        mem=rng.randint(2000, 24000),
        tab_open_breaks=rng.choice((0.2, 0.4, 0.6)),
        weekday0=weekday0,
    )


def _is_workday(p: Profile, day: int) -> bool:
    return (p.weekday0 + day) % 7 < 5


def _is_friday(p: Profile, day: int) -> bool:
    return (p.weekday0 + day) % 7 == 4


def _day_window(rng: random.Random, p: Profile, day: int) -> tuple[int, int] | None:
    """Arrival and departure (minutes from the trace start) on a day, or None for a day off."""
    if _is_workday(p, day):
        if rng.random() < 0.04:
            return None
        arrive = day * DAY + p.arrive + int(rng.gauss(0, 20))
        return arrive, arrive + p.length + int(rng.gauss(0, 30))
    if rng.random() < 0.08:  # a short weekend session
        arrive = day * DAY + rng.randint(10 * 60, 16 * 60)
        return arrive, arrive + rng.randint(60, 180)
    return None


def _session(plan: Plan, rng: random.Random, p: Profile, arrive: int, leave: int,
             long_steps: bool = True) -> None:
    """Focus blocks with short GPU runs, breaks with the tab open or closed, lunch."""
    t = arrive
    lunch = False
    while t < leave:
        block_end = min(t + rng.randint(25, 90), leave)
        if long_steps and p.ide != "codeServer" and rng.random() < 0.04:
            # a long step (data preparation, an R model fit) runs while the user is in a meeting; half
            # of them print nothing, and then look exactly like a hung call: busy, quiet, GPU idle
            g, u, m = p.idle()
            step = State("working", executing=rng.random() < 0.5, kernel="busy", gpu=g, util=u, mem=m)
            plan.to(t + 1, replace(step, executing=True))  # the cell starts: the kernel's activity moves
            plan.to(block_end + rng.randint(30, 120), step)
        else:
            if (p.gpus or p.ide == "rstudio") and rng.random() < 0.55 and block_end - t >= 10:
                length = rng.randint(3, min(25, block_end - t - 2))
                run_start = t + rng.randint(0, block_end - t - length)
                plan.to(run_start, p.work())
                plan.to(run_start + length, p.run(rng))
            plan.to(block_end, p.work())
        t = plan.t
        if t >= leave:
            break
        if not lunch and t % DAY >= 12 * 60:
            pause, lunch = rng.randint(30, 60), True
        elif rng.random() < 0.2:
            pause = rng.randint(30, 75)  # a meeting
        else:
            pause = rng.randint(5, 20)
        plan.to(min(t + pause, leave), p.present() if rng.random() < p.tab_open_breaks else p.away())
        t = plan.t


def _evening_job(plan: Plan, rng: random.Random, p: Profile, chance: float) -> None:
    """Sometimes a training run is started at the end of the day and left running."""
    if p.gpus and rng.random() < chance:
        job = replace(p.run(rng, client=False), terminal=p.ide == "codeServer")
        plan.to(plan.t + rng.randint(120, 600), job)


# --- behaviours -------------------------------------------------------------------------------------


def plan_coding_bursts(rng: random.Random, p: Profile, days: int) -> list[Span]:
    plan = Plan(days * DAY)
    for day in range(days):
        window = _day_window(rng, p, day)
        if window is None:
            continue
        plan.to(window[0], p.away())
        _session(plan, rng, p, *window)
        _evening_job(plan, rng, p, 0.12)
    plan.fill(p.away())
    return plan.spans


def plan_nohup_training(rng: random.Random, p: Profile, days: int) -> list[Span]:
    plan = Plan(days * DAY)
    shell = State("working", client=True, terminal=True)
    job: State | None = None
    job_end = 0
    for day in range(days):
        window = _day_window(rng, p, day)
        if window is None or window[0] < plan.t:
            continue
        arrive = window[0]
        if job is not None:
            plan.to(min(arrive, job_end), job)
            if job_end > arrive:
                # the job is still running: a look at its log in a terminal, then back to waiting
                plan.to(min(arrive + rng.randint(5, 20), job_end), replace(job, client=True, terminal=True))
                continue
            job = None
        plan.to(arrive, State("absent"))
        plan.to(arrive + rng.randint(20, 60), shell)
        # nohup python train.py &, then the tab is closed
        job = State("working", gpu="run", util=rng.randint(75, 99), mem=rng.randint(12000, 38000))
        job_end = plan.t + rng.randint(4 * 60, 30 * 60)
    if job is not None:
        plan.to(job_end, job)
    plan.fill(State("absent"))
    return plan.spans


def plan_hung_kernel(rng: random.Random, p: Profile, days: int) -> list[Span]:
    plan = Plan(days * DAY)
    hang_day = rng.randrange(0, max(1, min(days, 4)))
    comes_back = rng.random() < 0.5
    hung: State | None = None
    for day in range(days):
        window = _day_window(rng, p, day) if day != hang_day else (
            day * DAY + p.arrive, day * DAY + p.arrive + p.length)
        if window is None:
            continue
        arrive, leave = window
        if hung is not None:
            if not comes_back:
                break
            plan.to(arrive, hung)  # back at work: interrupt the kernel, carry on
            hung = None
        plan.to(arrive, p.away())
        if day != hang_day:
            _session(plan, rng, p, arrive, leave)
            continue
        _session(plan, rng, p, arrive, leave - rng.randint(30, 180), long_steps=False)
        mem = max(p.mem, 4000)
        # the cell hangs; the user watches a while, then leaves
        watching = State("present", client=True, kernel="busy", gpu="held", mem=mem)
        plan.to(plan.t + rng.randint(10, 30), watching)
        hung = State("absent", kernel="busy", gpu="held", mem=mem)
    plan.fill(hung or p.away())
    return plan.spans


def plan_tab_overnight(rng: random.Random, p: Profile, days: int) -> list[Span]:
    plan = Plan(days * DAY)
    evening = p.away()
    for day in range(days):
        window = _day_window(rng, p, day)
        if window is None:
            continue
        plan.to(window[0], evening)
        _session(plan, rng, p, *window)
        evening = p.present()
    plan.fill(evening)
    return plan.spans


def plan_friday_forgotten(rng: random.Random, p: Profile, days: int) -> list[Span]:
    p = replace(p, idle_gpu="held")  # the model stays in GPU memory when the user leaves
    plan = Plan(days * DAY)
    stopped = State("absent", stopped=True)
    evening = stopped
    for day in range(days):
        if not _is_workday(p, day):
            continue
        window = _day_window(rng, p, day)
        if _is_friday(p, day):
            arrive = day * DAY + p.arrive
            window = arrive, max(arrive + 60, day * DAY + rng.randint(13 * 60, 16 * 60))
        if window is None:
            continue
        arrive, leave = window
        plan.to(arrive, evening)
        _session(plan, rng, p, arrive, leave)
        # Monday to Thursday the user stops the notebook on leaving; on Friday it is forgotten
        evening = p.away() if _is_friday(p, day) else stopped
    plan.fill(evening)
    return plan.spans


def plan_code_server(rng: random.Random, p: Profile, days: int) -> list[Span]:
    plan = Plan(days * DAY)
    evening = p.away()
    for day in range(days):
        window = _day_window(rng, p, day)
        if window is None:
            continue
        plan.to(window[0], evening)
        _session(plan, rng, p, *window)
        _evening_job(plan, rng, p, 0.15)
        evening = p.present() if rng.random() < 0.3 else p.away()
    plan.fill(evening)
    return plan.spans


def plan_rstudio(rng: random.Random, p: Profile, days: int) -> list[Span]:
    return plan_coding_bursts(rng, p, days)


def plan_unreachable(rng: random.Random, p: Profile, days: int) -> list[Span]:
    plan = Plan(days * DAY)
    outage_day = rng.randrange(0, max(1, min(days - 1, 4)))
    forever = rng.random() < 0.35
    down = False
    for day in range(days):
        window = _day_window(rng, p, day) if day != outage_day else (
            day * DAY + p.arrive, day * DAY + p.arrive + p.length)
        if window is None:
            continue
        arrive, leave = window
        if down and forever:
            break
        plan.to(arrive, replace(p.away(), reachable=not down))
        down = False  # the user restarts the broken server on arrival
        _session(plan, rng, p, arrive, leave)
        if day == outage_day:
            plan.to(plan.t + rng.randint(0, 180), p.away())
            down = True
    plan.fill(replace(p.away(), reachable=not down))
    return plan.spans


def plan_gpu_util_no_memory(rng: random.Random, p: Profile, days: int) -> list[Span]:
    ghost = State("absent", kernel="idle", gpu="ghost", util=rng.randint(30, 100), mem=0)
    plan = Plan(days * DAY)
    for day in range(days):
        window = _day_window(rng, p, day)
        if window is None:
            continue
        plan.to(window[0], ghost)
        _session(plan, rng, p, *window)
    plan.fill(ghost)
    return plan.spans


def plan_cpu_only(rng: random.Random, p: Profile, days: int) -> list[Span]:
    return plan_coding_bursts(rng, p, days)


@dataclass(frozen=True)
class Behaviour:
    name: str
    description: str
    ide: Ide
    weight: float
    plan: Callable[[random.Random, Profile, int], list[Span]]
    gpus: Callable[[random.Random], int] = field(default=lambda rng: 1)


BEHAVIOURS: dict[str, Behaviour] = {b.name: b for b in (
    Behaviour("coding-bursts", "JupyterLab during working hours: cells every few minutes, short GPU runs, "
              "breaks with the tab open or closed; sometimes a training run left going in the evening",
              "jupyter", 0.24, plan_coding_bursts),
    Behaviour("nohup-training", "a training job started from a terminal with nohup: no kernels, the tab "
              "closed, the GPU busy for 4-30 h", "jupyter", 0.10, plan_nohup_training),
    Behaviour("hung-kernel", "a cell hangs (kernel busy, GPU memory held, 0 % utilisation); the user "
              "leaves, and half of them do not come back this week", "jupyter", 0.05, plan_hung_kernel),
    Behaviour("tab-overnight", "like coding-bursts, but the browser tab stays open overnight and over the "
              "weekend (present, nothing running)", "jupyter", 0.10, plan_tab_overnight),
    Behaviour("friday-forgotten", "stops the notebook every evening from Monday to Thursday, forgets it on "
              "Friday afternoon with a model in GPU memory", "jupyter", 0.08, plan_friday_forgotten),
    Behaviour("code-server", "a code-server user: the browser tab is the only IDE signal, GPU runs from "
              "the terminal, the tab sometimes left open overnight", "codeServer", 0.12, plan_code_server),
    Behaviour("rstudio", "an RStudio user: connected while working, R busy during model fits; half have "
              "a GPU", "rstudio", 0.06, plan_rstudio, lambda rng: int(rng.random() < 0.5)),
    Behaviour("unreachable", "the Jupyter endpoint stops answering one evening for hours (until the user "
              "comes back, or for the rest of the week)", "jupyter", 0.05, plan_unreachable),
    Behaviour("gpu-util-no-memory", "while the user is away the GPU reports utilisation with no memory "
              "in use (no process of this pod)", "jupyter", 0.05, plan_gpu_util_no_memory),
    Behaviour("cpu-only", "a JupyterLab user without a GPU", "jupyter", 0.15, plan_cpu_only, lambda rng: 0),
)}

SERVER_TYPES: dict[Ide, str] = {"jupyter": "jupyter", "codeServer": "group-one", "rstudio": "group-two"}
IMAGES: dict[Ide, str] = {
    "jupyter": "kubeflownotebookswg/jupyter-pytorch-cuda-full:v1.10.0",
    "codeServer": "kubeflownotebookswg/codeserver-python:v1.10.0",
    "rstudio": "kubeflownotebookswg/rstudio-tidyverse:v1.10.0",
}


def allocate(notebooks: int, mix: dict[str, float], rng: random.Random) -> list[str]:
    """Exactly `notebooks` behaviour names in proportion to mix (largest remainder), shuffled."""
    unknown = sorted(set(mix) - set(BEHAVIOURS))
    if unknown:
        raise ValueError(f"unknown behaviour {unknown[0]!r} (known: {', '.join(BEHAVIOURS)})")
    total = sum(w for w in mix.values() if w > 0)
    if total <= 0:
        raise ValueError("the behaviour mix has no positive weight")
    shares = {n: notebooks * w / total for n, w in mix.items() if w > 0}
    counts = {n: int(s) for n, s in shares.items()}
    rest = notebooks - sum(counts.values())
    for n in sorted(shares, key=lambda n: (-(shares[n] - counts[n]), n))[:rest]:
        counts[n] += 1
    names = [n for n in mix if n in counts for _ in range(counts[n])]
    rng.shuffle(names)
    return names


# --- observing a notebook ---------------------------------------------------------------------------


class _Clock:
    """Minute -> time strings, cached (the same few thousand minutes are formatted over and over)."""

    def __init__(self, start: datetime) -> None:
        self.start = start
        self.epoch_ms = int(start.timestamp() * 1000)
        self._z: dict[int, str] = {}
        self._us: dict[int, str] = {}

    def z(self, minute: int) -> str:
        s = self._z.get(minute)
        if s is None:
            s = format_time(self.start + timedelta(minutes=minute))
            self._z[minute] = s
        return s

    def us(self, minute: int) -> str:
        """Jupyter's form: microseconds and Z."""
        s = self._us.get(minute)
        if s is None:
            s = format_time(self.start + timedelta(minutes=minute), micro=True)
            self._us[minute] = s
        return s


def _uuid(token: str) -> str:
    return str(uuid.UUID(int=random.Random(token).getrandbits(128), version=4))


class NotebookSim:
    """Observes one planned notebook at increasing check minutes."""

    def __init__(self, index: int, behaviour: Behaviour, spans: list[Span], gpus: int, clock: _Clock,
                 seed: int, lookback: int, step: int) -> None:
        self.index = index
        self.behaviour = behaviour
        self.spans = spans
        self.starts = [s.start for s in spans]
        self.gpus = gpus
        self.clock = clock
        self.lookback = lookback
        self.step = step
        self.namespace = f"team-{index % 25:02d}"
        self.name = f"nb-{index:04d}-{behaviour.name}"
        self.id = f"{self.namespace}/{self.name}"
        self.kernel_id = _uuid(f"{seed}:{index}:kernel")
        uid = _uuid(f"{seed}:{index}:uid")
        resources: dict[str, Any] = {"cpu": "4", "memory": "16Gi"}
        if gpus:
            resources["nvidia.com/gpu"] = str(gpus)
        self._running_nb: dict[str, Any] = {
            "apiVersion": "kubeflow.org/v1", "kind": "Notebook",
            "metadata": {"name": self.name, "namespace": self.namespace, "uid": uid,
                         "creationTimestamp": clock.z(-7 * DAY),
                         "labels": {BEHAVIOUR_LABEL: behaviour.name},
                         "annotations": {SERVER_TYPE_ANNOTATION: SERVER_TYPES[behaviour.ide]}},
            "spec": {"template": {"spec": {"containers": [{
                "name": self.name, "image": IMAGES[behaviour.ide],
                "resources": {"limits": dict(resources), "requests": dict(resources)}}]}}},
        }
        self._pod_resources = {"limits": {"nvidia.com/gpu": str(gpus)}} if gpus else {
            "limits": {"cpu": "4", "memory": "16Gi"}}
        self.notebook = self._running_nb
        self.pod: dict[str, Any] | None = None
        self.pod_start = 0
        self.stopped = False
        self._i = 0
        self._last = {"client": -1, "executing": -1, "terminal": -1}
        self._samples: dict[int, dict[str, Any]] = {}
        self._enter(spans[0])

    def _enter(self, span: Span) -> None:
        """World changes at the start of a span: the user stops or starts the notebook."""
        if span.state.stopped and (not self.stopped or self.pod is not None):
            self.stopped = True
            nb = dict(self._running_nb)
            meta = dict(nb["metadata"])
            meta["annotations"] = {**meta["annotations"], STOP_ANNOTATION: self.clock.z(span.start)}
            nb["metadata"] = meta
            self.notebook, self.pod = nb, None
        elif not span.state.stopped and (self.stopped or self.pod is None):
            self.stopped = False
            self.pod_start = span.start
            self.notebook = self._running_nb
            self.pod = {
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": f"{self.name}-0", "namespace": self.namespace},
                "spec": {"containers": [{"name": self.name, "resources": self._pod_resources}]},
                "status": {"phase": "Running", "startTime": self.clock.z(span.start)},
            }

    def _leave(self, span: Span) -> None:
        st = span.state
        if st.client:
            self._last["client"] = span.end
        if st.executing:
            self._last["executing"] = span.end
        if st.terminal:
            self._last["terminal"] = span.end

    def _last_at(self, what: str, now: int, flag: bool) -> int:
        """The latest minute <= now at which `what` was true in this pod's life, or -1."""
        t = now - (self.index + now) % 3 if flag else self._last[what]
        if flag:
            t = max(t, self.spans[self._i].start)
        return t if t >= self.pod_start else -1

    def observe(self, now: int) -> tuple[dict[str, Any], dict[str, Any] | None, dict[str, Any], Truth]:
        while self.spans[self._i].end <= now:
            self._leave(self.spans[self._i])
            self._i += 1
            self._enter(self.spans[self._i])
        st = self.spans[self._i].state
        if self.stopped:
            return self.notebook, None, {}, st.truth
        obs: dict[str, Any] = {}
        ide = self.behaviour.ide
        if ide == "jupyter":
            obs["jupyter"] = self._jupyter(now, st)
        elif ide == "codeServer":
            obs["codeServer"] = self._code_server(now, st)
        else:
            obs["rstudio"] = self._rstudio(now, st)
        if self.gpus:
            obs["gpu"] = {"samples": self._gpu(now)}
        return self.notebook, self.pod, obs, st.truth

    def _jupyter(self, now: int, st: State) -> dict[str, Any]:
        if not st.reachable:
            return {"error": "api/status: connection refused"}
        us = self.clock.us
        client = self._last_at("client", now, st.client)
        executing = self._last_at("executing", now, st.executing)
        terminal = self._last_at("terminal", now, st.terminal)
        kernels: list[dict[str, Any]] = []
        if st.kernel != "none":
            kernels.append({"id": self.kernel_id, "name": "python3",
                            "last_activity": us(max(executing, self.pod_start)),
                            "execution_state": st.kernel, "connections": int(st.client)})
        terminals = [{"name": "1", "last_activity": us(terminal)}] if terminal >= 0 else []
        return {
            "status": {"started": us(self.pod_start),
                       "last_activity": us(max(client, executing, terminal, self.pod_start)),
                       "connections": int(st.client), "kernels": len(kernels)},
            "kernels": kernels,
            "terminals": terminals,
        }

    def _code_server(self, now: int, st: State) -> dict[str, Any]:
        client = self._last_at("client", now, st.client)
        beat = 0 if client < 0 else self.clock.epoch_ms + client * 60_000 - (
            ((self.index * 7 + now) % 50) * 1000 if st.client else 0)
        return {"healthz": {"status": "alive" if st.client else "expired", "lastHeartbeat": beat}}

    def _rstudio(self, now: int, st: State) -> dict[str, Any]:
        """The shape of kf_culler.sources.rstudio: CPU and Istio requests seen through Prometheus over a
        240-minute look-back; lastActivity is the window start when R did nothing in it."""
        window = now - RSTUDIO_LOOKBACK
        executing = self._last_at("executing", now, st.executing or st.kernel == "busy")
        client = self._last_at("client", now, st.client)
        return {"connected": st.client, "busy": st.kernel == "busy",
                "lastActivity": self.clock.z(max(executing, window)),
                "lastConnected": self.clock.z(client) if client >= max(window, 0) else None,
                "via": "prometheus"}

    def _gpu(self, now: int) -> list[dict[str, Any]]:
        first = max(self.pod_start, now - self.lookback)
        first += (-first) % self.step
        out = []
        for s in range(first, now + 1, self.step):
            sample = self._samples.get(s)
            if sample is None:
                st = self.spans[bisect.bisect_right(self.starts, s) - 1].state
                jitter = (s // self.step + self.index) % 5
                util = st.util - jitter if st.gpu == "run" else st.util if st.gpu == "ghost" else 0
                mem = st.mem if st.gpu in ("run", "held") else 0
                sample = {"time": self.clock.z(s), "utilPercent": util, "memoryUsedMiB": mem}
                self._samples[s] = sample
            out.append(sample)
        for old in [k for k in self._samples if k < now - self.lookback]:
            del self._samples[old]
        return out


@dataclass(frozen=True)
class FleetSpec:
    notebooks: int
    days: float
    seed: int
    check_minutes: int = 5
    start: datetime = DEFAULT_START
    mix: dict[str, float] = field(default_factory=lambda: {n: b.weight for n, b in BEHAVIOURS.items()})
    gpu_lookback_minutes: int = 30
    gpu_step_minutes: int = 5

    def __post_init__(self) -> None:
        if self.notebooks < 1:
            raise ValueError("notebooks must be at least 1")
        if self.days <= 0:
            raise ValueError("days must be positive")
        if self.check_minutes < 1 or self.gpu_step_minutes < 1 or self.gpu_lookback_minutes < 0:
            raise ValueError("check and GPU step minutes must be at least 1")

    @property
    def total_minutes(self) -> int:
        return int(self.days * DAY)

    def header(self) -> TraceHeader:
        return TraceHeader(
            start=self.start, check_period_seconds=self.check_minutes * 60, synthetic=True,
            end=self.start + timedelta(minutes=self.total_minutes),
            generator={"notebooks": self.notebooks, "days": self.days, "seed": self.seed,
                       "checkMinutes": self.check_minutes, "mix": self.mix,
                       "gpuLookbackMinutes": self.gpu_lookback_minutes,
                       "gpuStepMinutes": self.gpu_step_minutes},
        )


def build_notebook(spec: FleetSpec, index: int, behaviour: str, clock: _Clock | None = None) -> NotebookSim:
    """Plan and set up notebook `index` of a fleet with the given behaviour."""
    b = BEHAVIOURS[behaviour]
    rng = random.Random(f"{spec.seed}:{index}:{behaviour}")
    gpus = b.gpus(rng)
    profile = _profile(rng, b.ide, gpus, spec.start.weekday())
    days = int(-(-spec.total_minutes // DAY))
    spans = [s for s in b.plan(rng, profile, days) if s.start < spec.total_minutes]
    if not spans or spans[0].start != 0:
        raise AssertionError(f"behaviour {behaviour} planned no span at the trace start")
    return NotebookSim(index, b, spans, gpus, clock or _Clock(spec.start), spec.seed,
                       spec.gpu_lookback_minutes, spec.gpu_step_minutes)


def fleet(spec: FleetSpec) -> list[NotebookSim]:
    names = allocate(spec.notebooks, spec.mix, random.Random(f"{spec.seed}:mix"))
    clock = _Clock(spec.start)
    return [build_notebook(spec, i, name, clock) for i, name in enumerate(names)]


def iter_fleet(spec: FleetSpec) -> Iterator[tuple[datetime, dict[str, Any], dict[str, Any] | None,
                                                   dict[str, Any], Truth]]:
    """(time, notebook, pod, observations, truth) for every check time and notebook, in time order."""
    sims = fleet(spec)
    for minute in range(0, spec.total_minutes, spec.check_minutes):
        now = spec.start + timedelta(minutes=minute)
        for sim in sims:
            nb, pod, obs, truth = sim.observe(minute)
            yield now, nb, pod, obs, truth


def write_fleet(spec: FleetSpec, path: str | Path) -> int:
    """Write the fleet's trace to path (gzip when it ends in .gz); the number of records."""
    with open_text(path, "w") as out:
        writer = TraceWriter(out, spec.header())
        for now, nb, pod, obs, truth in iter_fleet(spec):
            writer.write(now, nb, pod, obs, truth)
        return writer.records
