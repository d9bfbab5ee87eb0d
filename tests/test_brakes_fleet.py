"""The brakes (kf_culler/brakes.py) on a fleet: the real API server, a real Prometheus, the culler as a Passes.

Everything the culler reads and writes is real except two stand-ins:

- The GPUs. No GPU exists here, so each notebook's GPU is a line of a dcgm-exporter-shaped /metrics endpoint
  (kf_culler.local.prometheus: `FakeGpu` and `dcgm_exposition`, built by `gpu` of tests/test_gpu_prometheus.py)
  that a real Prometheus (the Debian package) scrapes every second, with `honor_labels: true` so the GPU's
  namespace/pod labels stay as the exporter wrote them. The series shapes are dcgm-exporter's as documented in
  NVIDIA/dcgm-exporter: the README's quick start for 4.x (one line per GPU labelled gpu, UUID, pci_bus_id,
  device, modelName, Hostname, DCGM_FI_DRIVER_VERSION, container/namespace/pod) and etc/default-counters.csv
  (DCGM_FI_DEV_GPU_UTIL in %, DCGM_FI_DEV_FB_USED in MiB). A test changes the values the endpoint serves,
  as a restarted dcgm-exporter reporting 0 for every GPU would.
- The IDEs. Every notebook's Jupyter URL goes to tests/support/faulty.py's FaultyServer, whose `ok` behaviour
  (notebook names ending in `-ok`) answers api/status, api/kernels and api/terminals as a quiet Jupyter
  server does: no kernel, no terminal, last activity a day ago.

Notebooks, their StatefulSets and Running pods are made as Kubeflow's controllers would
(kf_culler.local.objects); the culler runs passes with writes on (not dry-run) and its record, and the
brakes' release ConfigMap, in a namespace of the test. Passes are driven with Passes.once().
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from kubernetes import client
from prometheus_client.parser import text_string_to_metric_families
from support.faulty import FaultyServer
from support.passes import Passes
from test_gpu_prometheus import gpu, prometheus_binary  # noqa: F401 (a fixture)

from kf_culler.config import Settings, load_mapping
from kf_culler.cycle import CycleResult, NotebookResult
from kf_culler.kube import GROUP, PLURAL, VERSION
from kf_culler.kube.brakes import NAME as RELEASE_CONFIGMAP
from kf_culler.kube.brakes import release
from kf_culler.local import objects as obj
from kf_culler.local.prometheus import Exposition, Prometheus, dcgm_exposition, static_job
from kf_culler.metrics import Metrics
from kf_culler.model import STOP_ANNOTATION
from kf_culler.runner import build_runner
from kf_culler.service import instrument, readiness

pytestmark = pytest.mark.cluster
Key = tuple[str, str]  # (namespace, notebook)
IDLE_SECONDS = 3.0  # idleMinutes 0.05
BUSY = (90.0, 20000.0)  # utilisation %, memory used MiB: work (rule 8: both over gpu.utilPercent/memoryMiB)
ZERO = (0.0, 0.0)  # what a restarted dcgm-exporter reports for every GPU
HELD = "Stop held: "
DEFERRED = "Stop deferred to the next pass: "


# -- stand-ins and objects ------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def jupyter() -> Iterator[FaultyServer]:
    """Idle Jupyter answers for every notebook named `*-ok` (last activity a day ago)."""
    with FaultyServer(idle_since=datetime.now(UTC) - timedelta(days=1)) as server:
        yield server


class GpuMetrics:
    """The stand-in dcgm-exporter and the real Prometheus scraping it every second."""

    def __init__(self, exposition: Exposition, prom: Prometheus) -> None:
        self.exposition = exposition
        self.prom = prom

    @property
    def url(self) -> str:
        return self.prom.url

    def serve(self, load: dict[Key, tuple[float, float]]) -> None:
        """Each notebook's pod `<name>-0` holds one GPU with this (utilisation, memory) load."""
        gpus = [gpu(i % 8, util, mem, (ns, f"{name}-0"), node=f"{ns}-node-{i // 8}")
                for i, ((ns, name), (util, mem)) in enumerate(sorted(load.items()))]
        self.exposition.set(dcgm_exposition(gpus))

    def wait_scraped(self, keys: Sequence[Key], util: float) -> None:
        """Until Prometheus holds two scrapes of every one of these GPUs at this utilisation."""
        pods = "|".join(sorted({f"{name}-0" for _, name in keys}))
        namespaces = "|".join(sorted({ns for ns, _ in keys}))
        self.prom.wait_for(f'count_over_time(DCGM_FI_DEV_GPU_UTIL{{namespace=~"{namespaces}",pod=~"{pods}"}}'
                           f'[1m]) >= 2 and DCGM_FI_DEV_GPU_UTIL == {util:g}', count=len(keys), timeout=60)


@pytest.fixture(scope="module")
def gpus(prometheus_binary: str) -> Iterator[GpuMetrics]:  # noqa: F811 (the imported fixture)
    with Exposition(dcgm_exposition([])) as exposition, \
            Prometheus([static_job("dcgm-exporter", [exposition.stub.address], honor_labels=True)],
                       scrape_interval="1s", binary=prometheus_binary) as prom:
        yield GpuMetrics(exposition, prom)


@pytest.fixture()
def tenants(api: Any, namespace: str) -> Iterator[Callable[..., list[str]]]:
    """Makes fresh profile namespaces `<namespace>-<i>` (the `namespace` fixture is the culler's own), with the
    annotations given (as an admin or a controller writes them)."""
    made: list[str] = []

    def make(count: int, annotations: dict[str, str] | None = None) -> list[str]:
        names = [f"{namespace}-{len(made) + i}" for i in range(count)]
        for name in names:
            obj.create_namespace(api, name, annotations)
        made.extend(names)
        return names

    yield make
    core = client.CoreV1Api(api)
    for name in made:
        with contextlib.suppress(Exception):  # left Terminating on an API-server-only cluster: harmless
            core.delete_namespace(name)


def make_notebook(api: Any, ns: str, name: str, started: datetime, gpus: int = 0) -> Key:
    obj.create_notebook(api, ns, obj.notebook(name, gpus=gpus))
    obj.running_pod(api, ns, name, started, gpus=gpus)
    return ns, name


def settings(namespaces: Sequence[str], jupyter: FaultyServer, prometheus: str | None = None,
             **extra: Any) -> Settings:
    raw: dict[str, Any] = {
        "namespaces": {"include": list(namespaces)},
        "idleMinutes": IDLE_SECONDS / 60, "warnMinutes": 0, "startupGraceMinutes": 0, "checkPeriodSeconds": 1,
        "urls": {"jupyter": jupyter.base + "/{name}/"},
        "probe": {"timeoutSeconds": 5}, **extra}
    if prometheus is not None:
        raw["prometheus"] = {"url": prometheus, "stepSeconds": 1, "lookbackMinutes": 15}
    return load_mapping(raw, "test_brakes_fleet")


def culler(config: Settings, api: Any, culler_ns: str) -> tuple[Passes, Metrics]:
    runner = Passes(build_runner(config, api, records_namespace=culler_ns))
    metrics = Metrics()
    runner.runner = instrument(runner.runner, metrics)
    return runner, metrics


def by_key(result: CycleResult) -> dict[Key, NotebookResult]:
    return {(r.namespace, r.name): r for r in result.results}


def stopped_on_server(api: Any, namespaces: Sequence[str]) -> set[Key]:
    """The notebooks whose Notebook object carries kubeflow-resource-stopped, as the API server has them."""
    found: set[Key] = set()
    custom = client.CustomObjectsApi(api)
    for ns in namespaces:
        for nb in custom.list_namespaced_custom_object(GROUP, VERSION, ns, PLURAL)["items"]:
            if STOP_ANNOTATION in (nb["metadata"].get("annotations") or {}):
                found.add((ns, nb["metadata"]["name"]))
    return found


def sample(metrics: Metrics, name: str, labels: dict[str, str] | None = None) -> float | None:
    """A sample's value in the culler's /metrics text (Metrics.render), or None when it is not there."""
    for family in text_string_to_metric_families(metrics.render().decode()):
        for s in family.samples:
            if s.name == name and s.labels == (labels or {}):
                return float(s.value)
    return None


def passes_until(runner: Passes, done: Callable[[CycleResult], bool], seconds: float = 60,
                 each: Callable[[CycleResult], None] | None = None, every: float = 0.3) -> list[CycleResult]:
    """Passes (Passes.once), `every` seconds apart, until one satisfies `done`; `each` checks every pass."""
    deadline = time.monotonic() + seconds
    seen: list[CycleResult] = []
    while time.monotonic() < deadline:
        result = runner.once()
        seen.append(result)
        if each is not None:
            each(result)
        if done(result):
            return seen
        time.sleep(every)
    last = seen[-1] if seen else None
    raise AssertionError(f"no pass reached the expected state in {seconds:g} s; the last: brakes "
                         f"{last.brakes if last else None}, verdicts "
                         f"{[(r.name, r.verdict.action, r.verdict.state) for r in last.results] if last else None}")


def warm_up(runner: Passes, keys: Sequence[Key], passes: int = 2) -> None:
    """Passes until `passes` in a row find every GPU working (the brakes then remember them active)."""
    streak = [0]

    def check(result: CycleResult) -> None:
        assert result.brakes is not None and not result.brakes.held and result.brakes.trips == (), result.brakes
        verdicts = by_key(result)
        working = all(k in verdicts and (verdicts[k].verdict.action, verdicts[k].verdict.state) == ("keep", "active")
                      for k in keys)
        streak[0] = streak[0] + 1 if working else 0

    passes_until(runner, lambda _: streak[0] >= passes, each=check)


# -- 1. a fleet-wide GPU zero ---------------------------------------------------------------------------------

def test_a_fleet_wide_gpu_zero_holds_every_stop_until_an_admin_releases(
        api: Any, namespace: str, tenants: Callable[[int], list[str]], jupyter: FaultyServer, gpus: GpuMetrics,
        caplog: pytest.LogCaptureFixture) -> None:
    """6 namespaces x 2 GPU notebooks whose GPUs work; then the exporter reports 0 for every GPU. The brakes
    trip on the whole fleet turning idle (or coming due) in one pass and hold every stop, visible in the
    verdicts, kf_culler_brakes_held and /readyz; an admin's release lets the stops out on the next pass."""
    caplog.set_level(logging.INFO, logger="kf_culler")
    namespaces = tenants(6)
    started = datetime.now(UTC) - timedelta(hours=1)
    keys = [make_notebook(api, ns, f"g{j}-ok", started, gpus=1) for ns in namespaces for j in range(2)]
    gpus.serve(dict.fromkeys(keys, BUSY))
    gpus.wait_scraped(keys, BUSY[0])
    runner, metrics = culler(settings(namespaces, jupyter, gpus.url), api, namespace)
    with runner:
        warm_up(runner, keys)
        assert sample(metrics, "kf_culler_brakes_held") == 0

        gpus.serve(dict.fromkeys(keys, ZERO))  # dcgm-exporter restarted: 0 for every GPU

        def nothing_stopped(result: CycleResult) -> None:
            assert not [r for r in result.results if r.verdict.action == "stop"], "a stop went out"
            for r in result.results:
                if r.verdict.reason.startswith(HELD):
                    assert r.verdict.action == "keep", r.verdict

        passes = passes_until(runner, lambda res: bool(res.brakes and res.brakes.trips), each=nothing_stopped)
        tripped = passes[-1].brakes
        assert tripped is not None and tripped.held, tripped
        assert set(tripped.trips) <= {"newly-idle:gpu", "stops"}, tripped.trips
        assert all(tripped.shares[signal] > 0.5 for signal in tripped.trips), tripped.shares
        assert tripped.why is not None and "in 6 namespaces" in tripped.why, tripped.why
        # Every notebook turned idle in the same pass (one scrape of one exporter).
        assert {r.verdict.state for r in passes[-1].results} == {"idle"}, [r.verdict for r in passes[-1].results]
        assert stopped_on_server(api, namespaces) == set()

        # Passes go on while the hold stands: every notebook comes due, none is stopped, each verdict says why.
        def all_held_without_a_new_trip(result: CycleResult) -> bool:
            b = result.brakes
            return b is not None and b.held and b.trips == () and b.held_stops == frozenset(keys)

        passes += passes_until(runner, all_held_without_a_new_trip, each=nothing_stopped)
        held = passes[-1]
        assert held.brakes is not None and held.brakes.deferred_stops == frozenset()
        for r in held.results:
            assert r.verdict.action == "keep" and r.verdict.state == "idle", r.verdict
            assert r.verdict.reason.startswith(HELD) and "Stopped after" in r.verdict.reason, r.verdict.reason
            assert r.verdict.idle_seconds is not None and r.verdict.idle_seconds >= IDLE_SECONDS
        assert stopped_on_server(api, namespaces) == set()
        state = runner.memory.brake_state
        assert state.held_until is not None and state.tripped_at is not None
        assert state.held_until - state.tripped_at == timedelta(minutes=60)  # holdMinutes' default
        assert sample(metrics, "kf_culler_brakes_held") == 1
        trips = {s: sample(metrics, "kf_culler_brake_trips_total", {"signal": s}) for s in ("newly-idle:gpu", "stops")}
        assert any(n is not None and n >= 1 for n in trips.values()), trips
        assert sample(metrics, "kf_culler_brake_share", {"signal": "newly-idle:gpu"}) == 0.0  # no longer newly
        assert (sample(metrics, "kf_culler_brake_deferred_total", {"kind": "held-stop"}) or 0) >= len(keys)
        ready, detail = readiness(runner.runner, memory=runner.memory)
        assert ready, detail
        assert "brakes: holding every stop until" in detail and "release-brakes" in detail, detail
        assert [m for m in caplog.messages if m.startswith("brakes: holding every stop until")]

        # The admin looked and confirms: release. The next pass stops all twelve.
        release(api, namespace, datetime.now(UTC))
        cm = client.CoreV1Api(api).read_namespaced_config_map(RELEASE_CONFIGMAP, namespace)
        assert "releasedAt" in (cm.data or {})
        after = runner.once()
        assert after.brakes is not None and not after.brakes.held and after.brakes.trips == (), after.brakes
        verdicts = by_key(after)
        for k in keys:
            r = verdicts[k]
            assert (r.verdict.action, r.verdict.state, r.verdict.rule_id) == ("stop", "idle", "10-idle"), r.verdict
            assert r.write is not None and r.write.outcome == "patched", r.write
        assert stopped_on_server(api, namespaces) == set(keys)
        assert runner.memory.brake_state.held_until is None
        assert sample(metrics, "kf_culler_brakes_held") == 0
        assert sample(metrics, "kf_culler_stops_total", {"reason_rule": "10-idle"}) == len(keys)
        ready, detail = readiness(runner.runner, memory=runner.memory)
        assert ready and "brakes" not in detail, detail
        assert [m for m in caplog.messages if m.startswith("brakes: stops resume")]


# -- 2. one tenant cannot trip a hold -------------------------------------------------------------------------

def test_one_namespace_going_idle_is_stopped_on_time_and_holds_nothing(
        api: Any, namespace: str, tenants: Callable[[int], list[str]], jupyter: FaultyServer,
        gpus: GpuMetrics) -> None:
    """The same zero in one namespace of six: that namespace has 5 GPU notebooks, the five others one working
    notebook each. Its share is 1/6 however many notebooks it has, so nothing is held: its idle notebooks are
    stopped as soon as they are due, the others are kept."""
    namespaces = tenants(6)
    started = datetime.now(UTC) - timedelta(hours=1)
    loud = [make_notebook(api, namespaces[0], f"g{j}-ok", started, gpus=1) for j in range(5)]
    quiet = [make_notebook(api, ns, "g0-ok", started, gpus=1) for ns in namespaces[1:]]
    everyone = loud + quiet
    gpus.serve(dict.fromkeys(everyone, BUSY))
    gpus.wait_scraped(everyone, BUSY[0])
    runner, metrics = culler(settings(namespaces, jupyter, gpus.url), api, namespace)
    shares: list[dict[str, float]] = []

    def on_time(result: CycleResult) -> None:
        assert result.brakes is not None
        assert not result.brakes.held and result.brakes.trips == () and not result.brakes.held_stops, result.brakes
        shares.append(dict(result.brakes.shares))
        verdicts = by_key(result)
        for k in quiet:
            assert (verdicts[k].verdict.action, verdicts[k].verdict.state) == ("keep", "active"), verdicts[k].verdict
        for k in loud:
            v = verdicts[k].verdict
            assert not v.reason.startswith((HELD, DEFERRED)), v.reason
            if v.state == "idle" and v.action == "keep":  # not yet due
                assert v.idle_seconds is not None and v.idle_seconds < IDLE_SECONDS, v
            write = verdicts[k].write
            if v.action == "stop":
                assert write is not None and write.outcome == "patched", write

    with runner:
        warm_up(runner, everyone)
        gpus.serve({**dict.fromkeys(loud, ZERO), **dict.fromkeys(quiet, BUSY)})
        passes_until(runner, lambda _: stopped_on_server(api, namespaces[:1]) == set(loud), each=on_time)
        assert stopped_on_server(api, namespaces) == set(loud)
        assert sample(metrics, "kf_culler_brakes_held") == 0
        assert runner.memory.brake_state.held_until is None
    # The namespace's turn showed in the shares at 1/6: all of one namespace, none of five others.
    assert max(s["newly-idle:gpu"] for s in shares) == pytest.approx(1 / 6)
    assert max(s["stops"] for s in shares) == pytest.approx(1 / 6)


# -- 3. the stop cap, and the first pass on an idle fleet ------------------------------------------------------

def idle_cpu_fleet(api: Any, namespaces: Sequence[str]) -> tuple[list[Key], list[Key]]:
    """Two idle CPU notebooks a namespace, every one due (pods up for hours, IDE idle a day), in order of
    their pods' starts; the order is not the (namespace, name) order. Returns (keys, keys in due order)."""
    count = 2 * len(namespaces)
    base = datetime.now(UTC).replace(microsecond=0) - timedelta(hours=3)
    offsets = [(k * 7) % count for k in range(count)]  # 7 is prime to 16: a permutation of the start minutes
    keys = [make_notebook(api, namespaces[k // 2], f"c{k % 2}-ok", base + timedelta(minutes=offsets[k]))
            for k in range(count)]
    due = [key for _, key in sorted(zip(offsets, keys, strict=True))]
    assert due != sorted(keys)
    return keys, due


def test_the_stop_cap_lets_the_earliest_due_out_five_a_pass(
        api: Any, namespace: str, tenants: Callable[..., list[str]], jupyter: FaultyServer) -> None:
    """8 namespaces x 2 idle notebooks all due at once, brakes off, maxStopsPerPass 5: each pass stops the five
    due first (earliest idle clock) and defers the rest with a reason; 5, 5, 5, then the last one."""
    namespaces = tenants(8)
    keys, due = idle_cpu_fleet(api, namespaces)
    config = settings(namespaces, jupyter, brakes={"enabled": False, "maxStopsPerPass": 5})
    runner, metrics = culler(config, api, namespace)
    batches = [due[i:i + 5] for i in range(0, len(due), 5)]
    with runner:
        done: set[Key] = set()
        for batch in batches:
            result = runner.once()
            assert result.brakes is not None and not result.brakes.held and result.brakes.trips == ()
            verdicts = by_key(result)
            stopped = {k for k, r in verdicts.items() if r.verdict.action == "stop"}
            assert stopped == set(batch), (sorted(stopped), batch)
            for k in batch:
                write = verdicts[k].write
                assert write is not None and write.outcome == "patched", write
            left = set(keys) - done - set(batch)
            assert result.brakes.deferred_stops == left
            for k in left:
                v = verdicts[k].verdict
                assert (v.action, v.state) == ("keep", "idle"), v
                assert v.reason.startswith(DEFERRED + "at most 5 stops per pass.") and "Stopped after" in v.reason
            # the stops went out in due order: each one due no later than any deferred one
            due_at = {k: verdicts[k].verdict.stop_at for k in [*batch, *left]}
            stamps = {k: t for k, t in due_at.items() if t is not None}
            assert stamps.keys() == due_at.keys(), due_at
            if left:
                assert max(stamps[k] for k in batch) < min(stamps[k] for k in left)
            done |= set(batch)
            assert stopped_on_server(api, namespaces) == done
        quiet = runner.once()
        assert {r.verdict.state for r in quiet.results} == {"stopped"}
        assert quiet.brakes is not None and quiet.brakes.deferred_stops == frozenset()
    assert done == set(keys)
    assert sample(metrics, "kf_culler_stops_total", {"reason_rule": "10-idle"}) == len(keys)
    assert sample(metrics, "kf_culler_brake_deferred_total", {"kind": "deferred-stop"}) == 11 + 6 + 1
    assert sample(metrics, "kf_culler_brakes_held") == 0


def test_the_first_pass_on_an_idle_fleet_trips_the_stops_brake(
        api: Any, namespace: str, tenants: Callable[..., list[str]], jupyter: FaultyServer) -> None:
    """The same fleet with the brakes on (default fraction): a fresh culler's first pass finds every notebook
    due at once, which is the mass stop to brake: `stops` trips and every stop is held (the cap does not apply
    to held stops). After a release the cap lets out five a pass, the earliest due first."""
    namespaces = tenants(8)
    keys, due = idle_cpu_fleet(api, namespaces)
    runner, metrics = culler(settings(namespaces, jupyter, brakes={"maxStopsPerPass": 5}), api, namespace)
    with runner:
        first = runner.once()
        b = first.brakes
        assert b is not None and b.trips == ("stops",) and b.held, b
        assert b.shares["stops"] == 1.0 and b.shares["newly-idle:ide"] == 0.0  # nothing was seen before
        assert b.held_stops == frozenset(keys) and b.deferred_stops == frozenset()
        assert b.why == "100 % of running notebooks in 8 namespaces came due to stop in one pass (stops over 50 %)"
        for r in first.results:
            assert (r.verdict.action, r.verdict.state) == ("keep", "idle"), r.verdict
            assert r.verdict.reason.startswith(HELD + "the culler holds every stop for now, because " + b.why)
        assert stopped_on_server(api, namespaces) == set()
        assert sample(metrics, "kf_culler_brakes_held") == 1
        assert sample(metrics, "kf_culler_brake_trips_total", {"signal": "stops"}) == 1

        second = runner.once()  # the hold stands without a new trip: nothing is newly due
        assert second.brakes is not None and second.brakes.held and second.brakes.trips == ()
        assert second.brakes.held_stops == frozenset(keys)
        assert stopped_on_server(api, namespaces) == set()

        assert runner.memory.brake_state.tripped_at is not None
        release(api, namespace, datetime.now(UTC))
        third = runner.once()
        assert third.brakes is not None and not third.brakes.held and third.brakes.trips == ()
        assert {k for k, r in by_key(third).items() if r.verdict.action == "stop"} == set(due[:5])
        assert third.brakes.deferred_stops == frozenset(due[5:])
        assert stopped_on_server(api, namespaces) == set(due[:5])
        assert sample(metrics, "kf_culler_brakes_held") == 0


def test_one_users_projects_are_one_tenant_and_trip_no_hold(
        api: Any, namespace: str, tenants: Callable[..., list[str]], jupyter: FaultyServer) -> None:
    """The first pass on an idle fleet of four namespaces, three of them one user's OpenShift projects (their
    `openshift.io/requester`, set by the project request API): two tenants, under brakes.minNamespaces, so
    nothing trips and every due stop goes out (weighed per namespace, the four tripped `stops` and held them
    all). Control: the same fleet of four owners trips `stops` and holds every stop."""
    mine = tenants(3, {"openshift.io/requester": "mallory"})
    fleet = [*mine, *tenants(1)]
    keys, _ = idle_cpu_fleet(api, fleet)
    runner, _ = culler(settings(fleet, jupyter), api, namespace)
    with runner:
        first = runner.once()
        assert first.brakes is not None and first.brakes.trips == () and not first.brakes.held, first.brakes
        assert first.brakes.shares["stops"] == 1.0
        assert stopped_on_server(api, fleet) == set(keys)

    owned = [name for owner in ("ann", "bea", "cid", "dan") for name in tenants(1, {"openshift.io/requester": owner})]
    keys, _ = idle_cpu_fleet(api, owned)
    runner, _ = culler(settings(owned, jupyter), api, namespace)
    with runner:
        first = runner.once()
        assert first.brakes is not None and first.brakes.trips == ("stops",) and first.brakes.held
        assert first.brakes.held_stops == frozenset(keys)
        assert stopped_on_server(api, owned) == set()
