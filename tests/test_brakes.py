"""The brakes (kf_culler/brakes.py): mass verdict changes hold the stops; per-pass caps. Pure, no clock."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from kf_culler.brakes import BrakeLimits, BrakeState, Outcome, Seen, apply_brakes, limits_problem
from kf_culler.targets.coder import fairness_key

T0 = datetime(2026, 12, 1, tzinfo=UTC)
LIMITS = BrakeLimits()


def minutes(m: float) -> datetime:
    return T0 + timedelta(minutes=m)


def nb(
    namespace: str,
    name: str,
    state: str = "active",
    action: str = "keep",
    *,
    gpu: bool = True,
    running: bool = True,
    stop_at: datetime | None = None,
) -> Seen:
    return Seen(namespace, name, running=running, gpu=gpu, state=state, action=action, stop_at=stop_at)


def fleet(
    namespaces: int = 10,
    per: int = 5,
    prefix: str = "team",
    state: str = "active",
    action: str = "keep",
    *,
    gpu: bool = True,
    running: bool = True,
) -> list[Seen]:
    return [
        nb(f"{prefix}-{i}", f"nb-{j}", state, action, gpu=gpu, running=running)
        for i in range(namespaces)
        for j in range(per)
    ]


def gpu_zero() -> tuple[Outcome, list[Seen]]:
    """10 namespaces × 5 GPU notebooks all active at T0, all idle at T0+5 min (nb-0 of each also a stop)."""
    first = apply_brakes(fleet(), BrakeState(), LIMITS, T0)
    assert first.trips == () and not first.held
    zeroed = [replace(s, state="idle", action="stop" if s.name == "nb-0" else "keep") for s in fleet()]
    return apply_brakes(zeroed, first.state, LIMITS, minutes(5)), zeroed


def stop_keys(seen: list[Seen]) -> frozenset[tuple[str, str]]:
    return frozenset((s.namespace, s.name) for s in seen if s.action == "stop")


def test_fleet_wide_gpu_zero_trips_and_holds_the_stops_of_that_pass() -> None:
    out, zeroed = gpu_zero()
    assert out.trips == ("newly-idle:gpu",)
    assert out.shares["newly-idle:gpu"] == 1.0
    assert out.shares["stops"] == pytest.approx(0.2)  # one stop in five per namespace: not a trip by itself
    assert out.held
    assert out.held_stops == stop_keys(zeroed) and len(out.held_stops) == 10
    assert out.deferred_stops == frozenset()
    assert out.why == out.state.why
    assert out.why == (
        "100 % of running GPU notebooks in 10 namespaces turned idle in one pass (newly-idle:gpu over 50 %)"
    )
    assert out.state.held_until == minutes(65)
    assert out.state.tripped_at == minutes(5)


def test_the_hold_covers_later_passes_within_hold_minutes_and_lets_warnings_out() -> None:
    out, zeroed = gpu_zero()
    # 40 minutes on: the same notebooks still idle and still stops (not newly), others now warned.
    later = [replace(s, action="warn") if s.action == "keep" else s for s in zeroed]
    second = apply_brakes(later, out.state, LIMITS, minutes(45))
    assert second.trips == ()
    assert second.held and second.why == out.why
    assert second.held_stops == stop_keys(later)
    assert second.deferred_warnings == frozenset()  # warnings are not held
    assert second.state.held_until == minutes(65)  # no new trip: not extended
    # A held stop is remembered as a stop: it does not count as newly a stop in the next pass.
    assert second.state.last[("team-0", "nb-0")] == ("idle", "stop")
    assert second.shares["stops"] == 0.0


def test_the_hold_expires_by_itself_after_hold_minutes() -> None:
    out, zeroed = gpu_zero()
    just_before = apply_brakes(zeroed, out.state, LIMITS, minutes(65) - timedelta(seconds=1))
    assert just_before.held and just_before.held_stops == stop_keys(zeroed)
    expired = apply_brakes(zeroed, just_before.state, LIMITS, minutes(65))
    assert expired.trips == ()
    assert not expired.held and expired.why is None
    assert expired.held_stops == frozenset()
    assert expired.state.held_until is None and expired.state.why is None
    assert expired.state.tripped_at == minutes(5)  # the last trip stays on record


def test_a_later_trip_extends_the_hold() -> None:
    out, zeroed = gpu_zero()
    everyone_stops = [replace(s, action="stop") for s in zeroed]  # 4 of 5 newly stops in every namespace
    again = apply_brakes(everyone_stops, out.state, LIMITS, minutes(30))
    assert again.trips == ("stops",)
    assert again.held and again.held_stops == stop_keys(everyone_stops)
    assert again.state.held_until == minutes(90)
    assert again.why is not None and "came due to stop" in again.why and "80 %" in again.why


def test_an_admin_release_ends_the_hold() -> None:
    out, zeroed = gpu_zero()
    released = apply_brakes(zeroed, out.state, LIMITS, minutes(10), released_at=minutes(6))
    assert not released.held and released.held_stops == frozenset() and released.why is None
    assert released.state.held_until is None


def test_a_release_older_than_the_trip_does_not_end_it() -> None:
    out, zeroed = gpu_zero()
    stale = apply_brakes(zeroed, out.state, LIMITS, minutes(10), released_at=minutes(4))
    assert stale.held and stale.held_stops == stop_keys(zeroed)


def test_a_release_covers_the_stops_of_the_notebooks_it_confirmed() -> None:
    """The GPU zero trips newly-idle:gpu; the admin releases the hold before the notebooks come due; when they
    come due together, the `stops` signal does not trip again for them: the admin confirmed their idleness."""
    out, zeroed = gpu_zero()
    released = apply_brakes(zeroed, out.state, LIMITS, minutes(8), released_at=minutes(6))
    assert not released.held and released.state.acknowledged == stop_keys(
        [replace(s, action="stop") for s in zeroed])
    everyone_stops = [replace(s, action="stop") for s in zeroed]
    due = apply_brakes(everyone_stops, released.state, LIMITS, minutes(10), released_at=minutes(6))
    assert due.trips == () and not due.held and due.held_stops == frozenset()


def test_without_a_release_the_notebooks_coming_due_trip_again() -> None:
    out, zeroed = gpu_zero()
    everyone_stops = [replace(s, action="stop") for s in zeroed]
    again = apply_brakes(everyone_stops, out.state, LIMITS, minutes(10))
    assert again.trips == ("stops",) and again.held
    assert again.state.held_until == minutes(70) and again.state.tripped_at == minutes(10)
    # A release older than the new trip does not end it.
    after = apply_brakes(everyone_stops, again.state, LIMITS, minutes(15), released_at=minutes(6))
    assert after.held


def test_an_acknowledged_notebook_seen_active_again_counts_again() -> None:
    """Seen active, a notebook leaves the acknowledged set. Its turning idle again within recountMinutes of the
    trip it made does not count toward newly-idle:gpu again; its coming due counts toward `stops`, so a second
    GPU zero is still held when it matters; after recountMinutes its turning idle counts again."""
    out, zeroed = gpu_zero()
    released = apply_brakes(zeroed, out.state, LIMITS, minutes(8), released_at=minutes(6))
    back = apply_brakes(fleet(), released.state, LIMITS, minutes(9))  # every GPU works again
    assert back.state.acknowledged == frozenset()
    idle_again = apply_brakes(zeroed, back.state, LIMITS, minutes(10))
    assert idle_again.trips == () and not idle_again.held
    everyone_stops = [replace(s, action="stop") for s in zeroed]
    due = apply_brakes(everyone_stops, idle_again.state, LIMITS, minutes(11))
    assert due.trips == ("stops",) and due.held and due.held_stops == stop_keys(everyone_stops)
    a_day_later = apply_brakes(fleet(), due.state, LIMITS, minutes(5 + 1440))
    assert a_day_later.state.spent.get("newly-idle:gpu") is None  # the window of the first trip is over
    idle_then = apply_brakes(zeroed, a_day_later.state, LIMITS, minutes(5 + 1441))
    assert idle_then.trips == ("newly-idle:gpu",) and idle_then.held


def test_one_tenant_with_500_notebooks_cannot_trip_a_hold() -> None:
    steady = fleet(namespaces=9, per=3)
    big = [nb("big", f"nb-{j}") for j in range(500)]
    first = apply_brakes(steady + big, BrakeState(), LIMITS, T0)
    flipped = [replace(s, state="idle", action="stop") for s in big]
    out = apply_brakes(steady + flipped, first.state, LIMITS, minutes(5))
    # Each namespace weighs once: 1/10, not 500/527 as a count of notebooks would say.
    assert out.shares["newly-idle:gpu"] == pytest.approx(0.1)
    assert out.shares["stops"] == pytest.approx(0.1)
    assert out.trips == ()
    assert not out.held and out.held_stops == frozenset()
    assert out.deferred_stops == frozenset()  # 500 stops, the default cap 500


def test_the_weighting_is_a_mean_of_per_namespace_shares() -> None:
    before = [nb("a", "1"), nb("a", "2"), nb("b", "1"), nb("c", "1"), nb("c", "2"), nb("c", "3"), nb("c", "4")]
    first = apply_brakes(before, BrakeState(), LIMITS, T0)
    now = [
        replace(s, state="idle") if (s.namespace, s.name) in {("a", "1"), ("b", "1"), ("c", "1")} else s for s in before
    ]
    out = apply_brakes(now, first.state, LIMITS, minutes(5))
    assert out.shares["newly-idle:gpu"] == pytest.approx((1 / 2 + 1 + 1 / 4) / 3)
    assert out.trips == ("newly-idle:gpu",)  # 0.583 > 0.5 over 3 namespaces


def test_a_first_pass_on_a_big_idle_fleet_trips_stops() -> None:
    stopping = fleet(namespaces=6, per=20, prefix="idle", state="idle", action="stop")
    quiet = fleet(namespaces=4, per=20, prefix="busy")
    out = apply_brakes(stopping + quiet, BrakeState(), LIMITS, T0)
    assert out.trips == ("stops",)
    assert out.shares["stops"] == pytest.approx(0.6)
    assert out.shares["newly-idle:gpu"] == 0.0  # nothing remembered: nothing is newly idle
    assert out.held and out.held_stops == stop_keys(stopping) and len(out.held_stops) == 120
    assert out.deferred_stops == frozenset()


def test_stops_in_exactly_half_the_namespaces_do_not_trip() -> None:
    stopping = fleet(namespaces=5, per=2, prefix="idle", state="idle", action="stop")
    quiet = fleet(namespaces=5, per=2, prefix="busy")
    out = apply_brakes(stopping + quiet, BrakeState(), LIMITS, T0)
    assert out.shares["stops"] == pytest.approx(0.5)
    assert out.trips == () and not out.held


@pytest.mark.parametrize(("namespaces", "trips"), [(2, ()), (3, ("newly-idle:gpu",))])
def test_min_namespaces(namespaces: int, trips: tuple[str, ...]) -> None:
    first = apply_brakes(fleet(namespaces=namespaces), BrakeState(), LIMITS, T0)
    idle = fleet(namespaces=namespaces, state="idle")
    out = apply_brakes(idle, first.state, BrakeLimits(min_namespaces=3), minutes(5))
    assert out.shares["newly-idle:gpu"] == 1.0
    assert out.trips == trips


def test_a_jupyter_upgrade_that_makes_every_ide_no_signal_trips() -> None:
    before = fleet(namespaces=4, per=3, gpu=False)
    first = apply_brakes(before, BrakeState(), LIMITS, T0)
    out = apply_brakes([replace(s, state="no-signal") for s in before], first.state, LIMITS, minutes(5))
    assert out.trips == ("newly-no-signal",)
    assert out.shares["newly-idle:ide"] == 0.0 and out.shares["newly-no-signal"] == 1.0
    # Still no-signal a pass later: not newly, nothing trips again.
    later = apply_brakes([replace(s, state="no-signal") for s in before], out.state, LIMITS, minutes(10))
    assert later.trips == () and later.held


def test_ide_notebooks_turning_idle_trip_their_own_signal() -> None:
    before = fleet(namespaces=4, per=2, gpu=False) + fleet(namespaces=4, per=2, prefix="gpu")
    first = apply_brakes(before, BrakeState(), LIMITS, T0)
    now = [replace(s, state="idle") if not s.gpu else s for s in before]
    out = apply_brakes(now, first.state, LIMITS, minutes(5))
    assert out.trips == ("newly-idle:ide",)
    assert out.shares["newly-idle:gpu"] == 0.0


def test_notebooks_without_a_running_pod_are_not_in_the_populations() -> None:
    before = fleet(namespaces=4, per=2, running=False)
    first = apply_brakes(before, BrakeState(), LIMITS, T0)
    out = apply_brakes([replace(s, state="idle", action="stop") for s in before], first.state, LIMITS, minutes(5))
    assert out.shares == {"newly-idle:gpu": 0.0, "newly-idle:ide": 0.0, "newly-no-signal": 0.0, "stops": 0.0}
    assert out.trips == () and not out.held


def test_the_stop_cap_defers_the_latest_due_and_lets_the_earliest_through() -> None:
    seen = [
        nb("b", "late", "idle", "stop", stop_at=minutes(30)),
        nb("a", "none", "idle", "stop"),
        nb("a", "early", "idle", "stop", stop_at=minutes(1)),
        nb("z", "tie", "idle", "stop", stop_at=minutes(10)),
        nb("c", "tie", "idle", "stop", stop_at=minutes(10)),
        nb("a", "keep"),
    ]
    out = apply_brakes(seen, BrakeState(), BrakeLimits(enabled=False, max_stops_per_pass=3), minutes(40))
    assert not out.held and out.held_stops == frozenset()
    assert out.deferred_stops == {("b", "late"), ("a", "none")}  # let through: early, c/tie, z/tie
    capped = apply_brakes(seen, BrakeState(), BrakeLimits(enabled=False, max_stops_per_pass=2), minutes(40))
    assert capped.deferred_stops == {("b", "late"), ("a", "none"), ("z", "tie")}
    uncapped = apply_brakes(seen, BrakeState(), BrakeLimits(enabled=False, max_stops_per_pass=0), minutes(40))
    assert uncapped.deferred_stops == frozenset()


def test_the_warning_cap_defers_the_rest_held_or_not() -> None:
    warned = [nb(f"ns-{i}", "nb", "idle", "warn", stop_at=minutes(60 - i)) for i in range(5)]
    limits = BrakeLimits(max_warnings_per_pass=2)
    out = apply_brakes(warned, BrakeState(), limits, T0)
    assert not out.held
    assert out.deferred_warnings == {("ns-0", "nb"), ("ns-1", "nb"), ("ns-2", "nb")}  # ns-4, ns-3 are due first
    held = BrakeState(held_until=minutes(30), why="a trip", tripped_at=T0)
    during = apply_brakes(warned, held, limits, minutes(1))
    assert during.held and during.held_stops == frozenset()
    assert during.deferred_warnings == out.deferred_warnings
    assert apply_brakes(warned, BrakeState(), BrakeLimits(max_warnings_per_pass=0), T0).deferred_warnings == set()


def test_disabled_brakes_neither_trip_nor_hold_but_still_cap() -> None:
    limits = BrakeLimits(enabled=False, max_stops_per_pass=20)
    first = apply_brakes(fleet(), BrakeState(), limits, T0)
    everyone = [replace(s, state="idle", action="stop", stop_at=minutes(j)) for j, s in enumerate(fleet())]
    out = apply_brakes(everyone, first.state, limits, minutes(5))
    assert out.shares["newly-idle:gpu"] == 1.0 and out.shares["stops"] == 1.0
    assert out.trips == () and not out.held and out.held_stops == frozenset()
    assert len(out.deferred_stops) == 30
    # Namespaces in turn: the two due first of each of the ten namespaces go out, the rest wait.
    firsts = {(s.namespace, s.name) for s in everyone if s.name in ("nb-0", "nb-1")}
    assert out.deferred_stops == {(s.namespace, s.name) for s in everyone} - firsts
    # A hold from before the brakes were disabled is dropped.
    earlier = BrakeState(held_until=minutes(60), why="a trip", tripped_at=T0)
    dropped = apply_brakes(everyone, earlier, limits, minutes(5))
    assert not dropped.held and dropped.state.held_until is None


def test_a_trip_holds_its_own_pass_even_with_hold_minutes_zero() -> None:
    limits = BrakeLimits(hold_minutes=0)
    stopping = fleet(state="idle", action="stop")
    out = apply_brakes(stopping, BrakeState(), limits, T0)
    assert out.trips == ("stops",) and out.held and len(out.held_stops) == 50
    after = apply_brakes(stopping, out.state, limits, minutes(1))
    assert not after.held and after.held_stops == frozenset()


def test_limits_problem() -> None:
    assert limits_problem(BrakeLimits()) is None
    for bad in (0.0, 1.5, -0.1, math.nan):
        problem = limits_problem(BrakeLimits(fleet_fraction=bad))
        assert problem is not None and "brakes.fleetFraction" in problem
    assert "brakes.minNamespaces" in (limits_problem(BrakeLimits(min_namespaces=0)) or "")
    assert "brakes.holdMinutes" in (limits_problem(BrakeLimits(hold_minutes=-1)) or "")
    assert "brakes.holdMinutes" in (limits_problem(BrakeLimits(hold_minutes=math.nan)) or "")
    assert "brakes.recountMinutes" in (limits_problem(BrakeLimits(recount_minutes=-1)) or "")
    assert "brakes.maxStopsPerPass" in (limits_problem(BrakeLimits(max_stops_per_pass=-1)) or "")
    assert "brakes.maxWarningsPerPass" in (limits_problem(BrakeLimits(max_warnings_per_pass=-1)) or "")
    one_tenant = limits_problem(BrakeLimits(min_namespaces=2, fleet_fraction=0.5))
    assert one_tenant is not None
    assert "brakes.minNamespaces" in one_tenant and "brakes.fleetFraction" in one_tenant
    assert limits_problem(BrakeLimits(min_namespaces=3, fleet_fraction=0.34)) is None
    assert limits_problem(BrakeLimits(enabled=False, min_namespaces=1, fleet_fraction=0.5)) is None
    assert limits_problem(BrakeLimits(fleet_fraction=1.0, min_namespaces=2)) is None


def test_one_namespace_with_many_stops_due_takes_one_place_a_round() -> None:
    """One tenant's 500 notebooks all due first cannot push the other namespaces' stops out of the cap."""
    limits = BrakeLimits(enabled=False, max_stops_per_pass=10)
    big = [nb("big", f"nb-{j:03d}", "idle", "stop", stop_at=minutes(j / 100)) for j in range(500)]
    others = [nb(f"team-{i}", "nb-0", "idle", "stop", stop_at=minutes(30)) for i in range(5)]
    out = apply_brakes(big + others, BrakeState(), limits, minutes(40))
    let_through = {(s.namespace, s.name) for s in big + others} - out.deferred_stops
    assert {(s.namespace, s.name) for s in others} <= let_through
    assert len(let_through) == 10 and sum(ns == "big" for ns, _ in let_through) == 5
    assert {("big", f"nb-{j:03d}") for j in range(5)} <= let_through  # the big one's earliest due


# -- a tenant flapping notebooks in several profiles ----------------------------------------------------------

def flapping_night(passes: int, profiles: int, *, others: int = 0, zero_at: int | None = None,
                   released_at: datetime | None = None, limits: BrakeLimits = LIMITS,
                   rename: bool = False, owners: Mapping[str, str] | None = None) -> list[Outcome]:
    """One pass a minute. A user who is a contributor in `profiles` profiles flips one GPU notebook in each
    between active and idle every other pass; the namespace `night` has one GPU notebook idle and due to stop
    in every pass (as a new one would come due); `others` namespaces have a GPU notebook at work, until pass
    `zero_at`, from which on every GPU reads 0 (a restarted dcgm-exporter). `rename`: the flipped notebook is a
    new one every two passes (`flip-<n>`). `owners`: the owner of each namespace named (kf_culler/kube/tenants.py),
    the sessions' tenant as the cycle gives it (kf_culler/targets/coder.py `fairness_key`)."""
    state, outcomes = BrakeState(), []
    for i in range(passes):
        zeroed = zero_at is not None and i >= zero_at
        flip = f"flip-{i // 2}" if rename else "flip"
        seen = [nb(f"mallory-{p}", flip, "active" if i % 2 == 0 and not zeroed else "idle")
                for p in range(profiles)]
        seen += [nb("night", "due", "idle", "stop", stop_at=minutes(i - 1))]
        seen += [nb(f"team-{t}", "work", "idle" if zeroed else "active") for t in range(others)]
        if owners is not None:
            seen = [replace(s, tenant=fairness_key((s.namespace, s.name), owners.get(s.namespace))) for s in seen]
        release = released_at if released_at is not None and released_at <= minutes(i) else None  # as read
        out = apply_brakes(seen, state, limits, minutes(i), release)
        outcomes.append(out)
        state = out.state
    return outcomes


def held_passes(outcomes: Sequence[Outcome]) -> list[int]:
    return [i for i, out in enumerate(outcomes) if ("night", "due") in out.held_stops]


def test_a_tenant_flipping_a_notebook_in_two_profiles_holds_no_stop() -> None:
    """Three namespaces run GPU notebooks (a night); two of them are one user's, flipped every other pass: the
    events come from two namespaces, under brakes.minNamespaces (3), so the third namespace's due stop is never
    held, in none of 240 passes."""
    outcomes = flapping_night(240, profiles=2)
    assert max(out.shares["newly-idle:gpu"] for out in outcomes) == pytest.approx(2 / 3)  # over 0.5, yet
    assert held_passes(outcomes) == []
    assert all(out.trips == () for out in outcomes)


def test_a_tenant_flipping_notebooks_in_three_profiles_trips_once_a_window() -> None:
    """With three profiles the first flip trips (events in three namespaces of four); the same notebooks do not
    count again for brakes.recountMinutes, so the hold ends after holdMinutes and no later pass holds the due
    stop of the fourth namespace."""
    outcomes = flapping_night(300, profiles=3)
    trips = [i for i, out in enumerate(outcomes) if out.trips]
    assert trips == [1]
    held = held_passes(outcomes)
    assert held == list(range(1, 61))  # the trip at minute 1 holds until minute 61
    assert outcomes[-1].state.spent["newly-idle:gpu"].keys() == {f"mallory-{p}" for p in range(3)}


@pytest.mark.parametrize("projects", [3, 5])
def test_one_owner_flipping_notebooks_in_several_projects_holds_no_stop(projects: int) -> None:
    """The same night, the namespaces being one user's OpenShift projects (or Kubeflow profiles): weighed by their
    owner, they are one tenant, under brakes.minNamespaces, so no pass of 300 trips and the due stop of the
    namespace `night` is never held (weighed per namespace, three of them held it for holdMinutes a window)."""
    owners = {f"mallory-{p}": "mallory@example.com" for p in range(projects)}
    outcomes = flapping_night(300, profiles=projects, owners=owners)
    assert all(out.trips == () for out in outcomes)
    assert held_passes(outcomes) == []
    assert max(out.shares["newly-idle:gpu"] for out in outcomes) == pytest.approx(1 / 2)  # one of two tenants


def test_three_owners_flipping_notebooks_together_still_trip() -> None:
    """Control: the same flips by three different owners (or in namespaces with no owner known) are what a
    broken exporter looks like, and trip the brakes as before."""
    owners = {f"mallory-{p}": f"user-{p}@example.com" for p in range(3)}
    for given in (owners, {}):
        outcomes = flapping_night(300, profiles=3, owners=given)
        assert [i for i, out in enumerate(outcomes) if out.trips] == [1]
        assert held_passes(outcomes) == list(range(1, 61))


def test_new_notebooks_of_the_same_namespaces_do_not_count_again_either() -> None:
    """The same user replaces the flipped notebook by a new one of another name every two passes (seen active,
    then idle): the namespaces that made the trip are spent, not only their notebooks."""
    outcomes = flapping_night(300, profiles=3, rename=True)
    assert [i for i, out in enumerate(outcomes) if out.trips] == [1]
    assert held_passes(outcomes) == list(range(1, 61))


def test_an_admin_release_holds_against_the_flapping() -> None:
    outcomes = flapping_night(300, profiles=3, released_at=minutes(10))
    assert held_passes(outcomes) == list(range(1, 10))


def test_a_fleet_wide_gpu_zero_still_trips_amid_the_flapping() -> None:
    """While one user flaps notebooks in three profiles (3 namespaces of 11: no trip), a GPU zero across the
    fleet trips and holds every stop from its first pass."""
    outcomes = flapping_night(240, profiles=3, others=7, zero_at=200)
    assert [i for i, out in enumerate(outcomes) if out.trips] == [200]
    assert outcomes[200].trips == ("newly-idle:gpu",)
    assert outcomes[200].shares["newly-idle:gpu"] == pytest.approx(7 / 11)
    assert held_passes(outcomes) == list(range(200, 240))


def test_a_fleet_wide_gpu_zero_after_a_flapping_trip_still_trips() -> None:
    """The flapping notebooks made a trip and are spent (the other namespaces' notebooks stopped for the night);
    when the fleet is back and every GPU reads 0, the spent notebooks count as no event, the others count."""
    state = flapping_night(100, profiles=3)[-1].state
    fleet_back = [nb(f"mallory-{p}", "flip") for p in range(3)] + [nb(f"team-{t}", "work") for t in range(7)]
    first = apply_brakes(fleet_back, state, LIMITS, minutes(100))
    zero = apply_brakes([replace(s, state="idle") for s in fleet_back], first.state, LIMITS, minutes(101))
    assert zero.trips == ("newly-idle:gpu",) and zero.held
    assert zero.shares["newly-idle:gpu"] == pytest.approx(7 / 10)


def test_a_trip_needs_events_in_min_namespaces_namespaces() -> None:
    """Three namespaces run GPU notebooks, two of them turn idle: 2/3 of the namespace-weighted share, yet not
    a fleet; the third one too, a trip."""
    before = fleet(namespaces=3)
    first = apply_brakes(before, BrakeState(), LIMITS, T0)
    two = [replace(s, state="idle") if s.namespace != "team-2" else s for s in before]
    out = apply_brakes(two, first.state, LIMITS, minutes(5))
    assert out.shares["newly-idle:gpu"] == pytest.approx(2 / 3) and out.trips == ()
    three = apply_brakes([replace(s, state="idle") for s in before], first.state, LIMITS, minutes(5))
    assert three.trips == ("newly-idle:gpu",)
