"""The rules, in order: each reads the Evidence and returns a Verdict or None; the first verdict wins.

Each rule's docstring names its rule in docs/decisions.md ("The rules, in order"), which says what it
decides and why; the reason texts here are what users read.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from kf_culler.config import Policy
from kf_culler.model import (
    EXEMPT_ANNOTATION,
    KEEP_UNTIL_ANNOTATION,
    Action,
    InputError,
    RuleId,
    State,
    Verdict,
)
from kf_culler.record import CullerRecord
from kf_culler.rules.evidence import Clock, Evidence, read_evidence
from kf_culler.rules.untaken import not_taken
from kf_culler.session import SessionView, pod_trouble
from kf_culler.timeutil import add_minutes, format_time, parse_time
from kf_culler.timeutil import clock_text as hhmm
from kf_culler.timeutil import duration_text as minutes

RuleFn = Callable[[Evidence, Policy, datetime], Verdict | None]


@dataclass(frozen=True)
class TableEntry:
    """One line of the rule table: the spec's rule it applies (`rule_id`, the id its verdicts carry; one rule
    may have several entries, e.g. 5-positive-evidence for the GPU and for the IDE) and its check."""

    rule_id: RuleId
    check: RuleFn


def _verdict(ev: Evidence, action: Action, state: State, reason: str, rule: RuleId, *,
             with_evidence: bool = True, idle_since: datetime | None = None, idle_seconds: float | None = None,
             stop_at: datetime | None = None, warn_at: datetime | None = None,
             extend_until: datetime | None = None) -> Verdict:
    return Verdict(action, state, reason, rule, server_type=ev.view.server_type, gpu_notebook=ev.view.gpu_notebook,
                   idle_since=idle_since, idle_seconds=idle_seconds, stop_at=stop_at, warn_at=warn_at,
                   evidence=ev.record if with_evidence else {}, extend_until=extend_until)


def _plain(ev: Evidence, action: Action, state: State, reason: str, rule: RuleId) -> Verdict:
    """A verdict decided before any source was read: it carries no evidence."""
    return _verdict(ev, action, state, reason, rule, with_evidence=False)


def _clock(ev: Evidence) -> Clock:
    assert ev.clock is not None, "the starting rules come first"
    return ev.clock


# -- 1 to 3: before any evidence ---------------------------------------------------------------------------

def stop_not_taken(ev: Evidence, policy: Policy, now: datetime) -> Verdict | None:
    """Rule 1, a stop is done when the pod is gone: the culler's own stop still stands past the view's
    `stop_deadline_seconds` and a pod of the session still holds a GPU (kf_culler/rules/untaken.py). Before
    rules 1 and 3: such a session is neither stopped nor restarted."""
    return not_taken(ev.view, ev.view.stop_deadline_seconds, now)


def stopped(ev: Evidence, policy: Policy, now: datetime) -> Verdict | None:
    """Rule 1, stopped stays stopped; so does a stop of the culler's own whose pod it still awaits (the pod of a
    Workspace its controller cannot act on, which is not "stopped": rule `1-stop-not-taken` once overdue)."""
    record = ev.view.record
    awaited = ev.view.stop_written and record is not None and record.awaiting_restart()
    if not ev.view.stopped and not awaited:
        return None
    return _plain(ev, "keep", "stopped", "The notebook is stopped; the culler leaves it as it is.", "1-stopped")


def exempt(ev: Evidence, policy: Policy, now: datetime) -> Verdict | None:
    """Rule 2, exempt."""
    if not policy.allow_exempt or str(ev.annotations.get(EXEMPT_ANNOTATION, "")).strip().lower() != "true":
        return None
    return _plain(ev, "keep", "exempt",
                  f"The notebook is exempt from idle culling ({EXEMPT_ANNOTATION}: \"true\").", "2-exempt")


def restarted(ev: Evidence, policy: Policy, now: datetime) -> Verdict | None:
    """Rules 3 and 15, a notebook the culler's own record says it stopped, started again by its user (the stop
    annotation is gone, rule 1 came first). Marks on the Notebook are not read: a user can write them."""
    if ev.view.record is None or not ev.view.record.awaiting_restart():
        return None
    return _plain(ev, "keep", "starting", "The notebook was started again; idle culling waits "
                  f"{minutes(policy.startup_grace_minutes * 60)} after a start.", "3-restarted")


def no_running_pod(ev: Evidence, policy: Policy, now: datetime) -> Verdict | None:
    """Rule 3, starting: no running pod."""
    if ev.clock is not None:
        return None
    why = ("has no pod yet" if ev.view.pod is None
           else "has no running pod yet: the old one is still shutting down" if ev.view.pod_deleting
           else "has no running pod yet (it may be waiting for a GPU)")
    return _plain(ev, "keep", "starting", f"The notebook {why}.", "3-starting")


def in_grace(ev: Evidence, policy: Policy, now: datetime) -> Verdict | None:
    """Rule 3, starting: inside the start-up grace."""
    started = _clock(ev).started
    if now >= add_minutes(started, policy.startup_grace_minutes):
        return None
    return _plain(ev, "keep", "starting",
                  f"The notebook started {minutes((now - started).total_seconds())} ago; idle culling "
                  f"waits {minutes(policy.startup_grace_minutes * 60)} after a start.", "3-starting")


# -- 13 and 14: before the evidence, after the start --------------------------------------------------------

def broken(ev: Evidence, policy: Policy, now: datetime) -> Verdict | None:
    """Rule 14, a GPU notebook whose pod is crash-looping or not Ready for brokenMinutes: reported (a warning),
    or stopped when brokenAction says so. Runs before rule 3: such a pod may be Pending or in its grace."""
    limit = policy.broken_minutes
    trouble = pod_trouble(ev.view.pod) if limit is not None and ev.view.gpu_notebook else None
    if limit is None or trouble is None:
        return None
    since = min(trouble.since, now)
    stop_at = add_minutes(since, limit)
    stopping = policy.broken_action == "stop"
    warn_at = add_minutes(stop_at, -policy.warn_minutes) if stopping and policy.warn_minutes > 0 else stop_at
    if now < warn_at:
        return None
    held = f"It holds {ev.view.gpus} GPU(s) but cannot be used: {trouble.what}, since {hhmm(since, now)}"
    record = {"pod": {"broken": trouble.what, "since": format_time(since), "restarts": trouble.restarts}}
    timing: dict[str, Any] = {"stop_at": stop_at if stopping else None, "warn_at": warn_at}
    action: Action = "warn"
    if not stopping:
        reason = (f"{held} (over {minutes(limit * 60)}). The culler does not stop it; restart or fix the notebook to "
                  "release the GPU.")
    elif now >= stop_at:
        action, reason = "stop", (f"Stopped: broken for {minutes((now - since).total_seconds())}. {held} (limit "
                                  f"{minutes(limit * 60)}). Your files in the home volume are kept; start the "
                                  "notebook again once it is fixed.")
    else:
        reason = f"{held}; it will be stopped at {hhmm(stop_at, now)} unless it recovers."
    return replace(_verdict(ev, action, "broken", reason, "14-broken", **timing), evidence={**ev.record, **record})


def _rest(ev: Evidence, policy: Policy, now: datetime, after: RuleFn) -> Verdict:
    """The verdict of the rules after `after` in the table."""
    following = RULES[next(i for i, entry in enumerate(RULES) if entry.check is after) + 1:]
    return next(v for entry in following if (v := entry.check(ev, policy, now)) is not None)


def lifetime_cap(ev: Evidence, policy: Policy, now: datetime) -> Verdict | None:
    """Rule 13, the lifetime cap: warn, then stop a notebook whose pod (or restart) has run maxRunningMinutes,
    whatever the evidence; keep-until moves it within maxExtendMinutes (rule 12). The state is what the
    evidence says (the rules after this one), and a stop they reach first is theirs."""
    cap = policy.max_running_minutes
    if cap is None:
        return None
    started = _clock(ev).since
    stop_at, note, latest = _extension(ev, policy, now, add_minutes(started, cap))
    warn_at = add_minutes(stop_at, -policy.warn_minutes)
    if now < stop_at and (policy.warn_minutes <= 0 or now < warn_at):
        return None
    rest = _rest(ev, policy, now, lifetime_cap)
    if now < stop_at and rest.action == "stop":
        return None  # the later rule stops it now: its verdict, its id
    ran, since, limit = minutes((now - started).total_seconds()), hhmm(started, now), minutes(cap * 60)
    timing: dict[str, Any] = {"idle_since": rest.idle_since, "idle_seconds": rest.idle_seconds,
                              "stop_at": stop_at, "warn_at": warn_at, "extend_until": latest}
    if now >= stop_at:
        return _verdict(ev, "stop", rest.state, f"Stopped by the lifetime cap: it ran {ran} since {since}, and this "
                        f"cluster stops notebooks after {limit} running, even in use. Your files in the home volume "
                        f"are kept; start the notebook again to continue.{note}", "13-lifetime-cap", **timing)
    ask = f" To ask for more time, set {KEEP_UNTIL_ANNOTATION}." if policy.max_extend_minutes > 0 else ""
    return _verdict(ev, "warn", rest.state, f"Running for {ran} (since {since}); the lifetime cap of {limit} stops "
                    f"it at {hhmm(stop_at, now)} even if it is in use: save your work.{ask}{note}", "13-lifetime-cap",
                    **timing)


# -- 5 and 6: positive evidence, then no signal ------------------------------------------------------------

def gpu_working(ev: Evidence, policy: Policy, now: datetime) -> Verdict | None:
    """Rule 5, positive evidence: GPU work in the latest sample (rule 8)."""
    if ev.gpu is None or not ev.gpu.working_now:
        return None
    s = ev.gpu.samples[-1]
    return _verdict(ev, "keep", "active",
                    f"The GPU is working ({s.util_percent:g}% utilisation, {s.memory_mib:g} MiB in use "
                    f"at {hhmm(s.time, now)}).", "5-positive-evidence")


def ide_busy(ev: Evidence, policy: Policy, now: datetime) -> Verdict | None:
    """Rule 5, positive evidence: a busy kernel or session, unless busyKernelGpuIdleMinutes says it hung."""
    if ev.ide is None or ev.ide_kind is None or not ev.ide.busy:
        return None
    # the policy is read only where it matters (so a sweep sees which policies decide alike: replay/shared_decide.py)
    if ev.gpu is not None and (limit := policy.busy_kernel_gpu_idle_minutes) is not None and \
            now >= add_minutes(min(ev.gpu.idle_since, now), limit):
        return None
    return _verdict(ev, "keep", "active", f"{ev.ide_kind.busy_words}.", "5-positive-evidence")


def _half_evidence(ev: Evidence, policy: Policy, now: datetime) -> bool:
    """The GPU reading is missing but the IDE shows activity inside the idle window (rule 6)."""
    return (ev.gpu_problem is not None and ev.ide_problem is None
            and now < add_minutes(_clock(ev).idle_since, policy.idle_minutes))


def access_problem(ev: Evidence, policy: Policy, now: datetime) -> Verdict | None:
    """Rule 16's exception: the IDE gave no signal and the culler has confirmed, from objects profile users
    cannot write, that its own access is what is missing: kept, and the reason says what the admin must fix."""
    problem = ev.view.access_problem
    if problem is None or ev.ide_problem is None:
        return None
    clock = _clock(ev)
    return _verdict(ev, "keep", "no-signal",
                    f"No signal: {ev.ide_problem}. The culler's own access is missing: {problem[:300]} The notebook "
                    "is kept until an administrator fixes that.", "16-access-problem",
                    idle_since=clock.idle_since, idle_seconds=clock.idle_seconds(now))


def _gpu_idle_stop(ev: Evidence, policy: Policy) -> tuple[datetime, datetime] | None:
    """Rule 16: (since when, stop time) for a GPU notebook whose IDE gives no signal while its readable GPU
    metrics show no work; None when the rule does not apply. The GPU's idle time runs from the latest of the
    last work, the pod's start and the recorded restart (`Clock.started`), and only as far back as samples
    cover it (GpuReading.idle_since)."""
    if ev.ide_problem is None or ev.gpu is None or not ev.view.gpu_notebook:
        return None
    limit = policy.no_signal_gpu_idle_limit
    if limit is None:
        return None
    since = max(ev.gpu.idle_since, _clock(ev).started)
    return since, add_minutes(since, limit)


def no_signal_gpu_idle(ev: Evidence, policy: Policy, now: datetime) -> Verdict | None:
    """Rule 16, an unreadable IDE does not protect an idle GPU forever: warned, then stopped, once the GPU has
    shown no work for noSignalGpuIdleMinutes (the earlier of this and noSignal.afterMinutes wins)."""
    found = _gpu_idle_stop(ev, policy)
    if found is None:
        return None
    gpu_since, limit_stop = found
    clock = _clock(ev)
    after = policy.no_signal.after_minutes
    if policy.no_signal.action == "stop" and after is not None and add_minutes(clock.idle_since, after) < limit_stop:
        return None  # noSignal stops it first: rule 6's verdict
    stop_at, note, latest = _extension(ev, policy, now, limit_stop)
    warn_at = add_minutes(stop_at, -policy.warn_minutes)
    if now < stop_at and (policy.warn_minutes <= 0 or now < warn_at):
        return None
    gpu_idle = minutes((now - gpu_since).total_seconds())
    timing: dict[str, Any] = {"idle_since": gpu_since, "idle_seconds": (now - gpu_since).total_seconds(),
                              "stop_at": stop_at, "warn_at": warn_at, "extend_until": latest}
    what = f"{ev.ide_problem}; the GPU has shown no work for {gpu_idle}, since {hhmm(gpu_since, now)}"
    limit = minutes((policy.no_signal_gpu_idle_limit or 0) * 60)
    if now >= stop_at:
        return _verdict(ev, "stop", "no-signal",
                        f"Stopped: the notebook's IDE could not be read ({what}). A GPU idle for {limit} is "
                        "reclaimed even when the IDE cannot be read. Your files in the home volume are kept; start "
                        f"the notebook again to continue.{note}", "16-no-signal-gpu-idle", **timing)
    return _verdict(ev, "warn", "no-signal",
                    f"The notebook's IDE could not be read ({what}); it will be stopped at {hhmm(stop_at, now)} "
                    f"unless the GPU is used. To ask for more time, set {KEEP_UNTIL_ANNOTATION}.{note}",
                    "16-no-signal-gpu-idle", **timing)


def no_signal(ev: Evidence, policy: Policy, now: datetime) -> Verdict | None:
    """Rule 6, no signal is not idleness; `noSignal` may stop after a time."""
    missing = ev.missing
    if missing is None or _half_evidence(ev, policy, now):
        return None
    clock = _clock(ev)
    timing: dict[str, Any] = {"idle_since": clock.idle_since, "idle_seconds": clock.idle_seconds(now)}
    idle = minutes(clock.idle_seconds(now))
    reason = f"No signal: {missing}. A notebook is not stopped because it could not be read"
    gpu_stop = _gpu_idle_stop(ev, policy)
    if gpu_stop is not None:
        reason = (f"No signal: {missing}. Its GPU has shown no work since {hhmm(gpu_stop[0], now)}; it will be "
                  f"stopped at {hhmm(gpu_stop[1], now)} unless the GPU is used or the IDE can be read again")
    after = policy.no_signal.after_minutes
    if policy.no_signal.action != "stop" or after is None:
        return _verdict(ev, "keep", "no-signal", reason + ".", "6-no-signal",
                        stop_at=gpu_stop[1] if gpu_stop else None, **timing)
    stop_at = add_minutes(clock.idle_since, after)
    warn_at = add_minutes(stop_at, -policy.warn_minutes)
    if now >= stop_at:
        return _verdict(ev, "stop", "no-signal",
                        f"No signal for {idle} ({missing}); the policy stops notebooks that give no signal "
                        f"for {minutes(after * 60)}.", "6-no-signal", stop_at=stop_at, warn_at=warn_at, **timing)
    if policy.warn_minutes > 0 and now >= warn_at:
        return _verdict(ev, "warn", "no-signal",
                        f"No signal for {idle} ({missing}); it will be stopped at {hhmm(stop_at, now)} unless a "
                        "signal returns.", "6-no-signal", stop_at=stop_at, warn_at=warn_at, **timing)
    if gpu_stop is not None:
        return _verdict(ev, "keep", "no-signal", reason + ".", "6-no-signal",
                        stop_at=min(stop_at, gpu_stop[1]), **timing)
    return _verdict(ev, "keep", "no-signal", reason + f" before {hhmm(stop_at, now)}.", "6-no-signal",
                    stop_at=stop_at, **timing)


# -- 9 to 12: connected, then warn and stop ----------------------------------------------------------------

def connected(ev: Evidence, policy: Policy, now: datetime) -> Verdict | None:
    """Rule 9, connected is not active: kept, unless connectedGpuIdleMinutes may reclaim its GPU."""
    if ev.ide is None or ev.ide_kind is None or not ev.ide.connected:
        return None
    if ev.gpu is not None and policy.connected_gpu_idle_minutes is not None:
        return None
    clock = _clock(ev)
    return _verdict(ev, "keep", "connected", f"{ev.ide_kind.connected_words}; connected sessions are kept.",
                    "9-connected", idle_since=clock.idle_since, idle_seconds=clock.idle_seconds(now))


def _extension(ev: Evidence, policy: Policy, now: datetime,
               stop_at: datetime) -> tuple[datetime, str, datetime | None]:
    """Rule 12: the stop time a keep-until request moves to, what the reason says about it, and the latest time
    a request may move it to (None: this cluster allows no extension)."""
    latest = add_minutes(stop_at, policy.max_extend_minutes) if policy.max_extend_minutes > 0 else None
    raw_until = ev.annotations.get(KEEP_UNTIL_ANNOTATION)
    if raw_until is None:
        return stop_at, "", latest
    until = parse_time(raw_until)
    if until is None:
        return stop_at, (f" ({KEEP_UNTIL_ANNOTATION} {str(raw_until)[:40]!r} is not a readable time and was "
                         "ignored.)"), latest
    if latest is None:
        return stop_at, f" ({KEEP_UNTIL_ANNOTATION} is not honoured on this cluster.)", None
    if until <= stop_at:
        return stop_at, "", latest
    moved = min(until, latest)
    if until > latest:
        return moved, (f" (The request to keep it until {hhmm(until, now)} was capped at {hhmm(moved, now)}, "
                       "the longest extension this cluster allows.)"), latest
    return moved, f" (Kept until {hhmm(moved, now)} at the user's request.)", latest


def _idle_words(ev: Evidence, state: State) -> str:
    """What was idle, in words; a connected code-server's only IDE signal is the connection itself."""
    assert ev.ide_kind is not None
    words = [] if state == "connected" and ev.ide_kind.connection_is_only_signal else [ev.ide_kind.idle_words]
    if ev.gpu is not None:
        words.append("an idle GPU")
    return " and ".join(words)


def _warn_then_stop(ev: Evidence, policy: Policy, now: datetime, rule: RuleId, state: State,
                    idle_since: datetime, limit: float) -> Verdict:
    """Rules 10 and 12 over an idle clock and its limit; a half reading (rule 6) is only ever kept."""
    assert ev.ide is not None
    idle_seconds = (now - idle_since).total_seconds()
    stop_at, note, latest = _extension(ev, policy, now, add_minutes(idle_since, limit))
    warn_at = add_minutes(stop_at, -policy.warn_minutes)
    timing: dict[str, Any] = {"idle_since": idle_since, "idle_seconds": idle_seconds,
                              "stop_at": stop_at, "warn_at": warn_at, "extend_until": latest}
    what, since, idle = _idle_words(ev, state), hhmm(idle_since, now), minutes(idle_seconds)
    if ev.ide.busy:  # only reached when the busy kernel stopped counting (busyKernelGpuIdleMinutes)
        note = (f" A kernel reports busy, but the GPU has been idle for over "
                f"{minutes((policy.busy_kernel_gpu_idle_minutes or 0) * 60)}, so it is treated as hung.{note}")
    if rule == "6-half-evidence":
        return _verdict(ev, "keep", state, f"Idle for {idle} ({what} since {since}); GPU metrics are missing "
                        f"({ev.gpu_problem}), so it will not be stopped on this evidence alone.", rule, **timing)
    although = " although a browser is connected" if state == "connected" else ""
    if now >= stop_at:
        return _verdict(ev, "stop", state,
                        f"Stopped after {idle} {'without work' if although else 'idle'}{although}: {what} since "
                        f"{since} (limit {minutes(limit * 60)}). Your files in the home volume are kept; start "
                        f"the notebook again to continue.{note}", rule, **timing)
    if policy.warn_minutes > 0 and now >= warn_at:
        return _verdict(ev, "warn", state,
                        f"Idle for {idle}{although} ({what} since {since}); it will be stopped at "
                        f"{hhmm(stop_at, now)} unless it is used. To ask for more time, set "
                        f"{KEEP_UNTIL_ANNOTATION}.{note}", rule, **timing)
    return _verdict(ev, "keep", state,
                    f"Idle for {idle} ({what} since {since}); it will be stopped after {minutes(limit * 60)} "
                    f"idle, at {hhmm(stop_at, now)}.{note}", rule, **timing)


def half_evidence(ev: Evidence, policy: Policy, now: datetime) -> Verdict | None:
    """Rule 6, half the evidence (GPU metrics missing, IDE active inside the window) never stops."""
    if ev.missing is None:
        return None
    return _warn_then_stop(ev, policy, now, "6-half-evidence", "idle", _clock(ev).idle_since, policy.idle_minutes)


def connected_gpu_idle(ev: Evidence, policy: Policy, now: datetime) -> Verdict | None:
    """Rule 9 with connectedGpuIdleMinutes: a connected GPU session without work."""
    limit = policy.connected_gpu_idle_minutes
    if ev.ide is None or not ev.ide.connected or limit is None or ev.gpu is None:
        return None
    return _warn_then_stop(ev, policy, now, "9-connected-gpu-idle", "connected", _clock(ev).work_since, limit)


def idle(ev: Evidence, policy: Policy, now: datetime) -> Verdict | None:
    """Rules 7, 10 and 12: the idle clock against idleMinutes, then warn and stop."""
    return _warn_then_stop(ev, policy, now, "10-idle", "idle", _clock(ev).idle_since, policy.idle_minutes)


RULES: tuple[TableEntry, ...] = (
    TableEntry("1-stop-not-taken", stop_not_taken),
    TableEntry("1-stopped", stopped),
    TableEntry("2-exempt", exempt),
    TableEntry("3-restarted", restarted),
    TableEntry("14-broken", broken),
    TableEntry("3-starting", no_running_pod),
    TableEntry("3-starting", in_grace),
    TableEntry("13-lifetime-cap", lifetime_cap),
    TableEntry("5-positive-evidence", gpu_working),
    TableEntry("5-positive-evidence", ide_busy),
    TableEntry("16-access-problem", access_problem),
    TableEntry("16-no-signal-gpu-idle", no_signal_gpu_idle),
    TableEntry("6-no-signal", no_signal),
    TableEntry("9-connected", connected),
    TableEntry("6-half-evidence", half_evidence),
    TableEntry("9-connected-gpu-idle", connected_gpu_idle),
    TableEntry("10-idle", idle),
)


def decide(
    notebook: dict[str, Any],
    pod: dict[str, Any] | None,
    observations: dict[str, Any],
    policy: Policy,
    now: datetime,
    *,
    node: dict[str, Any] | None = None,
    record: CullerRecord | None = None,
    access_problem: str | None = None,
    stop_deadline_seconds: float | None = None,
) -> Verdict:
    """The verdict for one notebook. Raises InputError only for inputs that are not a notebook at all.
    `node`: the pod's Node (its GPU model, rule 17); `record`: the culler's own record of this uid (rule 15);
    `access_problem`: the culler's confirmed lack of access to it (rule 16); `stop_deadline_seconds`: how long
    after the culler's stop its pod must be gone (kf_culler/rules/untaken.py; None: not checked)."""
    if not isinstance(notebook, dict):
        raise InputError("notebook is not an object")
    if pod is not None and not isinstance(pod, dict):
        raise InputError("pod is neither an object nor null")
    if not isinstance(observations, dict):
        raise InputError("observations is not an object")
    view = SessionView.of(notebook, pod, policy, node=node, record=record, access_problem=access_problem)
    if stop_deadline_seconds is not None:
        view = replace(view, stop_deadline_seconds=stop_deadline_seconds)
    return decide_view(view, observations, policy, now)


def _named_unknown(ev: Evidence, verdict: Verdict) -> Verdict:
    """Rule 16: an unknown server-type value was probed as Jupyter, and every reason that read evidence says so."""
    unknown = ev.view.unknown_server_type
    if unknown is None or not verdict.evidence:
        return verdict
    return replace(verdict, reason=f"{verdict.reason} (The server type {unknown[:40]!r} is not one the culler "
                   "knows; the notebook was probed as Jupyter, Kubeflow's default.)")


def decide_view(view: SessionView, observations: dict[str, Any], policy: Policy, now: datetime, *,
                parsed: dict[str, object] | None = None) -> Verdict:
    """The verdict for a notebook already unwrapped into its view (what a pass builds once). `parsed`: where
    decisions on the same observations keep what their sources parse into (read_evidence)."""
    return decide_evidence(read_evidence(view, observations, policy, now, parsed), policy, now)


def decide_evidence(ev: Evidence, policy: Policy, now: datetime) -> Verdict:
    """The rules over evidence already read (`read_evidence`): decide_view's second half."""
    for entry in RULES:
        verdict = entry.check(ev, policy, now)
        if verdict is not None:
            return _named_unknown(ev, verdict)
    raise AssertionError("the last rule always decides")
