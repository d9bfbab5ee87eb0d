"""Brakes: hold the stops when the culler is probably wrong about the whole fleet at once.

dcgm-exporter restarting and reporting 0 for every GPU, a Jupyter upgrade that changes an answer's shape,
a Prometheus relabel that drops the `pod` label: each of these makes many notebooks change verdict in the
same pass, and the culler would act on all of them. Like Kubernetes' node-lifecycle controller, which
stops evicting when too many nodes look unhealthy at once (`--unhealthy-zone-threshold`), the brakes
compare each pass with the previous one and hold every stop for `hold_minutes` when an unusual share of
the fleet changes verdict together. Apart from that, a plain cap on stops and on warnings per pass.

Signals (only running notebooks form the populations; "newly" means against the previous pass, and a
notebook the previous pass did not see is not newly anything, except for `stops`):

- `newly-idle:gpu`: running GPU notebooks whose state went from `active` to `idle`;
- `newly-idle:ide`: the same among running non-GPU notebooks;
- `newly-no-signal`: running notebooks whose state turned `no-signal`;
- `stops`: running notebooks whose action is `stop` and was not `stop` in the previous pass. A notebook
  the previous pass did not see counts, because the first pass on a big idle fleet (after a start, when
  nothing is remembered) is exactly the mass stop to brake.

A signal's share is the mean over the namespaces that have notebooks of its population of (events in the
namespace / population of the namespace), so every namespace weighs the same, however many notebooks it
has. A signal trips when its share is over `fleet_fraction` and its events come from at least
`min_namespaces` namespaces (a population spanning that many is not enough: on a quiet night with three
namespaces running GPU notebooks, two of them turning idle is no fleet).

A namespace counts toward a signal's trip once per `recount_minutes`: the namespaces whose notebooks' events
made a trip are remembered (`spent`, per signal, with the time of the trip), and their notebooks' events of
that signal are not counted again until `recount_minutes` have passed (the notebooks stay in the
population). A notebook flipped between active and idle every other pass, or replaced by a new one of
another name, therefore trips a signal at most once a window, not every other pass, and an admin's release
holds against the same namespaces flapping for the rest of the window. The price: after a trip of a signal,
a second fault within the window in the same namespaces does not trip that signal again; it trips another
one, `stops` (its own signal), when the notebooks come due together.

Why one tenant cannot trip a hold: a "namespace" here is a tenant (below), and the namespaces one user owns
are one. A trip needs events in at least min_namespaces tenants; and with N tenants in the population, one
moves the share by at most 1/N ≤ 1/min_namespaces, and `limits_problem` requires 1/min_namespaces <
fleet_fraction, so a tenant alone (e.g. 500 notebooks of its own turned idle, or made to look so, in one
namespace or in five of its own) stays under the threshold. A trip needs the notebooks of more than
fleet_fraction × N tenants, which is what a broken exporter or upgrade looks like. A user who is a
contributor in the profiles of min_namespaces other owners or more, on a fleet small enough, can trip each
signal once per recount_minutes from those namespaces (see above).

A hold lasts `hold_minutes` after the last trip (a trip in a pass always holds that pass's stops, even
with `hold_minutes` 0), ends by itself, or ends when an admin's release (`released_at`, read by the shell
from an object only admins can write) is at or after the trip being held. Warnings still go out during a
hold: a warning harms nobody. The caps (`max_*_per_pass`, 0 for none) are a separate valve: they apply
with the brakes disabled too, and let through the namespaces in turn, each one's stops due first (one
tenant's many due stops take one place a round, not the whole cap).

"Namespace" above is a session's `tenant` where the cycle gives one (kf_culler/targets/coder.py
`fairness_key`): a Coder workspace's is its Coder owner (all Coder workspaces are in the admin's one
namespace); another session's is its namespace's owner where the user cannot forge it, a Kubeflow Profile's
`spec.owner.name` or an OpenShift project's `openshift.io/requester` (read by the shell,
kf_culler/kube/tenants.py), so that one user's profiles or projects weigh as one; else its namespace.

Pure: no I/O, no clock, no logging; the shell passes `now` and keeps the returned `BrakeState`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from datetime import UTC, datetime

from kf_culler.timeutil import add_minutes

Key = tuple[str, str]  # (namespace, name)
Previous = tuple[str, str]  # (state, action) in the previous pass

_EARLIEST = datetime.min.replace(tzinfo=UTC)


@dataclass(frozen=True)
class BrakeLimits:
    enabled: bool = True
    fleet_fraction: float = 0.5  # a signal trips when its namespace-weighted share of the fleet is over this
    min_namespaces: int = 3  # ...and its counted events come from at least this many namespaces
    hold_minutes: float = 60.0  # stops are held this long after the last trip
    recount_minutes: float = 1440.0  # a namespace whose events made a trip counts toward that signal again after this
    max_stops_per_pass: int = 500  # 0: no cap
    max_warnings_per_pass: int = 1000  # 0: no cap


@dataclass(frozen=True)
class Seen:
    """One notebook in one pass, as the brakes read its verdict (built by the cycle)."""

    namespace: str
    name: str
    running: bool  # it has a running pod (only running notebooks form the populations)
    gpu: bool  # a GPU notebook
    state: str  # the verdict's state: active | idle | no-signal | ... (other strings possible)
    action: str  # keep | warn | stop
    stop_at: datetime | None  # when the verdict says it is/was due to stop (for ordering), may be None
    tenant: str | None = None  # whose share it takes (the fleet's "namespaces" below); None: its namespace

    @property
    def share_key(self) -> str:
        return self.namespace if self.tenant is None else self.tenant


@dataclass(frozen=True)
class BrakeState:
    """What the brakes remember between passes (carried in the runner's Memory; start from BrakeState())."""

    last: Mapping[Key, Previous] = field(default_factory=dict)  # key -> (state, action) in the previous pass
    held_until: datetime | None = None
    why: str | None = None  # the last trip, in words
    tripped_at: datetime | None = None
    # Notebooks an admin's release confirmed as they were (not active) when it ended a hold: their coming
    # due later does not trip the brakes again. A notebook leaves the set once it is seen active.
    acknowledged: frozenset[Key] = frozenset()
    # signal -> the namespaces (Seen.share_key) whose notebooks' events made a trip of that signal -> when; they
    # count for that signal again recount_minutes later (entries older than that are dropped).
    spent: Mapping[str, Mapping[str, datetime]] = field(default_factory=dict)


@dataclass(frozen=True)
class Outcome:
    state: BrakeState  # to keep for the next pass
    held: bool  # stops are held in this pass
    why: str | None  # in words, when held (for the reason, /readyz, the log line)
    trips: tuple[str, ...]  # the signals that tripped in THIS pass (e.g. "newly-idle:gpu"), for a metric
    shares: Mapping[str, float]  # every signal's share this pass (for metrics and tests)
    held_stops: frozenset[Key]  # stops turned into keeps because the brake holds
    deferred_stops: frozenset[Key]  # stops over max_stops_per_pass, left for the next pass
    deferred_warnings: frozenset[Key]  # warnings over max_warnings_per_pass


@dataclass(frozen=True)
class _Share:
    share: float  # the namespace-weighted share of events
    namespaces: int  # namespaces with notebooks of the population
    events: tuple[str, ...]  # the namespaces with a counted event


@dataclass(frozen=True)
class _Signal:
    name: str
    population: str  # in words, for `why`
    happened: str  # in words, for `why`
    member: Callable[[Seen], bool]
    event: Callable[[Seen, Previous | None], bool]

    def share(self, seen: Iterable[Seen], last: Mapping[Key, Previous],
              acknowledged: AbstractSet[Key] = frozenset(), spent: AbstractSet[str] = frozenset()) -> _Share:
        """The namespace-weighted share of events; a notebook an admin acknowledged, or of a namespace `spent`
        (it made a trip of this signal lately), is counted in its population, never as an event."""
        counts: dict[str, tuple[int, int]] = {}  # namespace -> (population, events)
        for s in seen:
            if self.member(s):
                population, happened = counts.get(s.share_key, (0, 0))
                key = (s.namespace, s.name)
                event = (self.event(s, last.get(key)) and key not in acknowledged
                         and s.share_key not in spent)
                counts[s.share_key] = (population + 1, happened + int(event))
        if not counts:
            return _Share(0.0, 0, ())
        share = sum(happened / population for population, happened in counts.values()) / len(counts)
        events = tuple(ns for ns, (_, happened) in counts.items() if happened)
        return _Share(share, len(counts), events)

    def describe(self, share: float, namespaces: int, fleet_fraction: float) -> str:
        return (
            f"{_percent(share)} % of {self.population} in {namespaces} namespaces {self.happened} in one pass "
            f"({self.name} over {_percent(fleet_fraction)} %)"
        )


def _newly_idle(s: Seen, before: Previous | None) -> bool:
    return before is not None and before[0] == "active" and s.state == "idle"


def _newly_no_signal(s: Seen, before: Previous | None) -> bool:
    return before is not None and before[0] != "no-signal" and s.state == "no-signal"


def _newly_stop(s: Seen, before: Previous | None) -> bool:
    return s.action == "stop" and (before is None or before[1] != "stop")


SIGNALS: tuple[_Signal, ...] = (
    _Signal("newly-idle:gpu", "running GPU notebooks", "turned idle", lambda s: s.running and s.gpu, _newly_idle),
    _Signal(
        "newly-idle:ide", "running non-GPU notebooks", "turned idle", lambda s: s.running and not s.gpu, _newly_idle
    ),
    _Signal("newly-no-signal", "running notebooks", "turned no-signal", lambda s: s.running, _newly_no_signal),
    _Signal("stops", "running notebooks", "came due to stop", lambda s: s.running, _newly_stop),
)


def _percent(fraction: float) -> str:
    return f"{fraction * 100:.3g}"


def limits_problem(limits: BrakeLimits) -> str | None:
    """What is wrong with the limits, in words naming the config keys; None if nothing."""
    problems = []
    if not 0 < limits.fleet_fraction <= 1:
        problems.append(f"brakes.fleetFraction must be over 0 and at most 1 (got {limits.fleet_fraction})")
    if limits.min_namespaces < 1:
        problems.append(f"brakes.minNamespaces must be at least 1 (got {limits.min_namespaces})")
    if not limits.hold_minutes >= 0:
        problems.append(f"brakes.holdMinutes must be 0 or more (got {limits.hold_minutes})")
    if not limits.recount_minutes >= 0:
        problems.append(f"brakes.recountMinutes must be 0 or more (got {limits.recount_minutes})")
    if limits.max_stops_per_pass < 0:
        problems.append(f"brakes.maxStopsPerPass must be 0 (no cap) or more (got {limits.max_stops_per_pass})")
    if limits.max_warnings_per_pass < 0:
        problems.append(f"brakes.maxWarningsPerPass must be 0 (no cap) or more (got {limits.max_warnings_per_pass})")
    if not problems and limits.enabled and not 1 / limits.min_namespaces < limits.fleet_fraction:
        problems.append(
            f"1 / brakes.minNamespaces ({limits.min_namespaces}) must be below brakes.fleetFraction "
            f"({limits.fleet_fraction}), else the notebooks of one namespace alone could hold every stop"
        )
    return "; ".join(problems) or None


def _due(s: Seen) -> tuple[bool, datetime, str, str]:
    """Earliest stop_at first, None last, ties by (namespace, name)."""
    return s.stop_at is None, s.stop_at or _EARLIEST, s.namespace, s.name


def _fair(items: Sequence[Seen]) -> list[Seen]:
    """Each namespace's first due, then each one's second, and so on (within a round, the earliest due first):
    a namespace with hundreds of stops due takes one place a round, not the whole cap."""
    ranks: dict[str, int] = {}
    ranked = []
    for s in sorted(items, key=_due):
        rank = ranks.get(s.share_key, 0)
        ranks[s.share_key] = rank + 1
        ranked.append((rank, _due(s), s))
    return [s for _, _, s in sorted(ranked, key=lambda r: (r[0], r[1]))]


def _over_cap(items: Sequence[Seen], cap: int) -> frozenset[Key]:
    if cap <= 0 or len(items) <= cap:
        return frozenset()
    return frozenset((s.namespace, s.name) for s in _fair(items)[cap:])


def _released(state: BrakeState, limits: BrakeLimits, now: datetime, released_at: datetime | None) -> bool:
    """Whether an admin's release ends a hold that still stands in this pass."""
    return (limits.enabled and state.held_until is not None and now < state.held_until and released_at is not None
            and state.tripped_at is not None and released_at >= state.tripped_at)


def _carried_hold(
    state: BrakeState, limits: BrakeLimits, now: datetime, released_at: datetime | None
) -> tuple[datetime | None, str | None]:
    """(held_until, why) of the hold from earlier passes that still stands in this one."""
    if not limits.enabled or state.held_until is None or now >= state.held_until:
        return None, None
    if released_at is not None and state.tripped_at is not None and released_at >= state.tripped_at:
        return None, None
    return state.held_until, state.why


def _still_spent(
    spent: Mapping[str, Mapping[str, datetime]], limits: BrakeLimits, now: datetime
) -> dict[str, dict[str, datetime]]:
    """The namespaces that made a trip less than recount_minutes ago, per signal."""
    kept = {signal: {key: at for key, at in keys.items() if now < add_minutes(at, limits.recount_minutes)}
            for signal, keys in spent.items()}
    return {signal: keys for signal, keys in kept.items() if keys}


def apply_brakes(
    seen: Sequence[Seen],
    state: BrakeState,
    limits: BrakeLimits,
    now: datetime,
    released_at: datetime | None = None,
) -> Outcome:
    """Which stops this pass holds or defers and which warnings it defers, and what to remember."""
    by_key = {(s.namespace, s.name): s for s in seen}
    shares: dict[str, float] = {}
    trips: list[str] = []
    texts: list[str] = []
    released = _released(state, limits, now, released_at)
    acknowledged = frozenset(k for k in state.acknowledged if k in by_key and by_key[k].state != "active")
    if released:
        acknowledged |= frozenset(k for k, s in by_key.items() if s.state != "active")
    spent = _still_spent(state.spent, limits, now)
    for signal in SIGNALS:
        recent = spent.get(signal.name, {})
        counted = signal.share(by_key.values(), state.last, acknowledged, recent.keys())
        shares[signal.name] = counted.share
        if (limits.enabled and counted.share > limits.fleet_fraction
                and len(counted.events) >= limits.min_namespaces):
            trips.append(signal.name)
            texts.append(signal.describe(counted.share, counted.namespaces, limits.fleet_fraction))
            spent[signal.name] = {**recent, **dict.fromkeys(counted.events, now)}

    held_until, why = _carried_hold(state, limits, now, released_at)
    tripped_at = state.tripped_at
    if trips:
        until = add_minutes(now, limits.hold_minutes)
        held_until = until if held_until is None else max(held_until, until)
        why, tripped_at = "; ".join(texts), now
    held = bool(trips) or held_until is not None

    stops = [s for s in by_key.values() if s.action == "stop"]
    warnings = [s for s in by_key.values() if s.action == "warn"]
    return Outcome(
        state=BrakeState(
            last={key: (s.state, s.action) for key, s in by_key.items()},
            held_until=held_until,
            why=why,
            tripped_at=tripped_at,
            acknowledged=acknowledged,
            spent=spent,
        ),
        held=held,
        why=why if held else None,
        trips=tuple(trips),
        shares=shares,
        held_stops=frozenset((s.namespace, s.name) for s in stops) if held else frozenset(),
        deferred_stops=frozenset() if held else _over_cap(stops, limits.max_stops_per_pass),
        deferred_warnings=_over_cap(warnings, limits.max_warnings_per_pass),
    )
