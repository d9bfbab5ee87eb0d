"""The long-running culler: watch cache, a cycle every check period, clean exit on SIGTERM."""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from opentelemetry import trace

from kf_culler.brakes import BrakeState
from kf_culler.config import Policy, Settings
from kf_culler.cycle import Clock, CoderSeen, Cycle, CycleResult, Memory, NotebookResult, Observer, utcnow
from kf_culler.kube.brakes import released_at
from kf_culler.kube.cache import ClusterCache, Kept, identities, packed_pair, unpacked_pairs
from kf_culler.kube.coder import CoderWriter
from kf_culler.kube.istio import PolicyKeeper
from kf_culler.kube.prober import ProberTokens
from kf_culler.kube.records import RecordStore
from kf_culler.kube.writer import Writer
from kf_culler.memory import settle as settle_memory
from kf_culler.plan import EVENT_CONTESTED, EVENT_ORPHAN, EventSpec
from kf_culler.policy import policy_of, selects_workload
from kf_culler.sources.bulk import BulkSource
from kf_culler.sources.coder import CoderClient, CoderError
from kf_culler.targets import CODER, identity, target_of
from kf_culler.targets.base import Item
from kf_culler.targets.coder import coder_items, unread
from kf_culler.targets.pairing import Orphan
from kf_culler.timeutil import format_time

if TYPE_CHECKING:
    from opentelemetry.trace import Tracer

    from kf_culler.kube.namespaces import NamespaceLabels
    from kf_culler.kube.tenants import NamespaceOwners
    from kf_culler.notify.notifier import Notifier

log = logging.getLogger("kf_culler")


# How long a culler asked to exit waits for its last pass's Events (the pod's grace period is 30 s by default).
EVENTS_GRACE_SECONDS = 20.0


def gpu_window_minutes(settings: Settings) -> float:
    """How far back GPU evidence must reach: the longest idle limit any policy can apply, plus a margin.

    GPU work older than the look-back would be invisible, and an IDE idle for longer could then be
    stopped although its GPU worked inside the idle window.
    """
    longest = 0.0
    for policy in settings.policies():
        limits = [policy.idle_minutes, policy.connected_gpu_idle_minutes or 0,
                  policy.busy_kernel_gpu_idle_minutes or 0, policy.no_signal_gpu_idle_limit or 0]
        longest = max(longest, *limits)
    return longest + 10


MAX_GPU_WINDOW_MINUTES = 24 * 60


def gpu_history_warning(settings: Settings) -> str | None:
    """Rule 16 cannot fire when the GPU history the culler reads is shorter than noSignalGpuIdleMinutes."""
    longest = max((p.no_signal_gpu_idle_limit or 0 for p in settings.policies()), default=0)
    if longest + 10 <= MAX_GPU_WINDOW_MINUTES:
        return None
    return (f"noSignalGpuIdleMinutes {longest:g} is longer than the GPU history the culler reads "
            f"({MAX_GPU_WINDOW_MINUTES - 10} min): an unreadable IDE beside an idle GPU is never stopped by rule 16")


def sources_for(settings: Settings) -> tuple[BulkSource | None, BulkSource | None]:
    """The bulk sources the settings ask for: GPU from Prometheus (else from dcgm-exporter directly) and
    RStudio through Prometheus. Create them once per process: the direct scraper keeps history."""
    from kf_culler.sources import dcgm, rstudio

    ops = settings.operations
    window = gpu_window_minutes(settings)
    gpu: BulkSource | None = None
    if ops.prometheus.url:
        from kf_culler.sources.gpu import PrometheusGpu

        prom = ops.prometheus
        if prom.lookback_minutes < window:
            prom = prom.model_copy(update={"lookback_minutes": min(window, MAX_GPU_WINDOW_MINUTES)})
        gpu = PrometheusGpu(prom)
    elif ops.dcgm.endpoints:
        scraper_settings = settings.operations.dcgm
        if scraper_settings.lookback_minutes < window:
            scraper_settings = scraper_settings.model_copy(
                update={"lookback_minutes": min(window, MAX_GPU_WINDOW_MINUTES)})
        gpu = dcgm.DcgmScraper(scraper_settings)
    return gpu, rstudio.source_for(settings)


def own_namespace() -> str:
    """A Runner's namespace when it is given none (a library use; the commands always give it, from
    kf_culler/kube/client.py's `culler_namespace`): POD_NAMESPACE, else `default`."""
    return os.environ.get("POD_NAMESPACE") or "default"


class _NamedLikePods:
    """The sessions of a pass named like their pods (v1 Notebooks), by (namespace, name), for the Events about pods:
    indexed when first asked, so a pass with nothing to tell indexes none of its 10,000."""

    def __init__(self, snapshot: list[tuple[dict[str, Any], dict[str, Any] | None]]) -> None:
        self._snapshot = snapshot
        self._index: dict[tuple[Any, Any], dict[str, Any]] | None = None

    def get(self, key: tuple[str, str]) -> dict[str, Any] | None:
        if self._index is None:
            self._index = {((nb.get("metadata") or {}).get("namespace"), (nb.get("metadata") or {}).get("name")): nb
                           for nb, _ in self._snapshot if target_of(nb).paired_by_name}
        return self._index.get(key)


@dataclass(frozen=True)
class Runner:
    """The culler's collaborators, made complete by `build_runner` and frozen: nothing is set on a Runner after it
    is built. What a pass remembers for the next is the `Memory` it returns (`CycleResult.memory`), given back to
    the next `once`."""

    settings: Settings
    api: Any
    cache: ClusterCache  # started by `start_cache` (or the first pass)
    sources: tuple[BulkSource | None, BulkSource | None]  # GPU and RStudio (`sources_for`)
    writer: Writer | None  # the passes' writer; None: decide and report only (check, explain, dry-run)
    event_writer: Writer  # the Warning Events about GPU orphans and contested GPU series
    records: RecordStore  # the culler's record of notebooks (kf_culler/kube/records.py), in `records_namespace`
    namespace_labels: NamespaceLabels  # given to the passes when rules read namespaces' labels
    # Whose namespace it is (kf_culler/kube/tenants.py), for the brakes and the notices' queue.
    namespace_owners: NamespaceOwners
    policies: PolicyKeeper  # kf-culler-probes per namespace (istio.manageAuthorizationPolicies)
    # The prober tokens for workbenches behind kube-rbac-proxy (probe.authProxy), one prober per namespace, its
    # ServiceAccounts in `records_namespace`.
    prober: ProberTokens
    coder: CoderClient | None  # `targets: [coder]`: Coder's API client
    tracer: Tracer
    records_namespace: str  # where the culler keeps its record of notebooks (the culler's own namespace)
    dry_run: bool = False
    # Whether passes go through the brakes: `run` (whose passes follow one another); `check` and `explain`
    # show the verdicts before them (a one-off pass remembers nothing to compare with).
    brakes: bool = True
    spans_exported: bool = True  # spans leave the process (`Cycle.spans_exported`): a span per session and probe
    stop: threading.Event = field(default_factory=threading.Event)
    on_cycle: Callable[[CycleResult], None] | None = None
    on_result: Callable[[NotebookResult], None] | None = None
    on_event: Callable[[NotebookResult], None] | None = None  # a result whose Event was sent (after the pass)
    may_write: Callable[[], bool] = lambda: True
    owns: Callable[[str], bool] | None = None  # with shards: this replica holds the namespace's shard now
    held_shards: Callable[[], list[int]] | None = None  # with shards: the shards this replica holds now
    on_observed: Observer | None = None
    notifier: Notifier | None = None  # notices of warnings and stops, or None
    clock: Clock = utcnow  # where each pass reads the time (tests and replays set it)

    def policy_of(self, notebook: dict[str, Any]) -> Policy:
        """The policy the culler gives a notebook outside a pass (long-stopped counts, GPU-hour accounting):
        kf_culler/policy.py, with the namespace's labels when rules read them."""
        labels = None
        if self.settings.needs_namespace_labels:
            meta = notebook.get("metadata")
            labels = self.namespace_labels(str(meta.get("namespace")) if isinstance(meta, dict) else "")
        return policy_of(notebook, None, self.settings, labels)[0]

    def build_cycle(self, memory: Memory | None = None, on_written: Callable[[dict[str, Any]], None] | None = None,
                    resend: tuple[NotebookResult, ...] = ()) -> Cycle:
        """A pass's Cycle after the one that returned `memory` (None: a first pass), every collaborator given at
        once (a Cycle is frozen). `resend`: earlier results whose Event could not be sent."""
        memory = memory or Memory()
        gpu, rstudio = self.sources
        writer = self.writer
        cache = self.cache
        owners = self.brakes or (writer is not None and self.notifier is not None)
        released = None
        if memory.brake_state.held_until is not None and writer is not None:  # an admin may have released the hold
            released = released_at(self.api, self.records_namespace, self.clock())
        self.records.load(cache.record_objects())
        return Cycle(
            self.settings, writer, gpu, rstudio, stop_flag=self.stop, may_write=self.may_write, owns=self.owns,
            on_result=self.on_result, on_written=on_written, on_observed=self.on_observed,
            clock=self.clock, notifier=self.notifier if writer is not None else None, slow=memory.slow,
            namespace_labels=self.namespace_labels if self.settings.needs_namespace_labels else None,
            namespace_owner=self.namespace_owners if owners else None,
            records=self.records,
            nodes=cache.node if cache.reads_nodes else None,
            service_problem=cache.service_problem,
            service_address=cache.service_address,
            endpoint=cache.endpoint if cache.endpoints else None,
            probe_auth=self.prober.get if self.settings.operations.probe.auth_proxy.enabled else None,
            access_problem=self.policies.access_problem if self.policies.enabled else None,
            brakes=self.settings.operations.brakes.limits if self.brakes else None,
            brake_state=memory.brake_state, released_at=released, events_in_background=True, on_event=self.on_event,
            resend=resend, tracer=self.tracer, spans_exported=self.spans_exported)

    @property
    def coder_namespace(self) -> str | None:
        coder = self.settings.operations.coder
        return coder.namespace if coder is not None and CODER.name in self.settings.operations.targets else None

    def coder_items(self, seen: CoderSeen | None = None
                    ) -> tuple[list[tuple[dict[str, Any], dict[str, Any] | None]], CoderSeen]:
        """(session, pod) of every Coder workspace (kf_culler/targets/coder.py), listed from Coder's API now and
        paired with the cache's pods of the admin's Coder namespace, and what to remember of the listing after
        `seen`, the last one's. When Coder cannot be read, the last list's workspaces with no signal (never idle on
        that); none before a first list."""
        seen = seen or CoderSeen()
        client, namespace = self.coder, self.coder_namespace
        if client is None or namespace is None:
            return [], seen
        if not seen.user_checked:
            seen = dataclasses.replace(seen, user_checked=self._check_coder_user(client))
        now = self.clock()
        try:
            listing = client.list_workspaces()
        except CoderError as err:
            if seen.problem != str(err):
                log.warning("Coder workspaces: %s; they get no signal until Coder can be read", err)
            seen = dataclasses.replace(seen, problem=str(err))
            if seen.listed is None:
                return [], seen
            return [(unread(s, f"Coder could not be read: {err}"), pod) for s, pod in
                    coder_items(seen.listed, namespace, self.cache.objects("pods").values(), now)], seen
        if listing.unjudged and listing.unjudged != seen.unjudged:
            log.warning("Coder workspaces: %s%d more than coder.maxWorkspaces (%d) are listed; the culler judges "
                        "the first %d by owner and name and leaves the others as they are",
                        "" if listing.complete else "at least ", listing.unjudged,
                        self.settings.operations.coder.max_workspaces if self.settings.operations.coder else 0,
                        len(listing.workspaces))
        seen = dataclasses.replace(seen, listed=listing.workspaces, problem=None, unjudged=listing.unjudged)
        return coder_items(listing.workspaces, namespace, self.cache.objects("pods").values(), now), seen

    @staticmethod
    def _check_coder_user(client: CoderClient) -> bool:
        """Say loudly when the token is not a Coder Owner's (it lists only what it may read, and stop builds of
        others' workspaces are refused). True: checked (never again)."""
        try:
            me = client.me()
        except CoderError as err:
            log.warning("Coder: %s", err)
            return False
        roles = {str(r.get("name")) for r in me.get("roles") or [] if isinstance(r, dict)}
        if "owner" not in roles:
            log.warning("Coder: the token in coder.tokenFile is %s's, who is not an Owner (roles: %s): it sees only "
                        "the workspaces it may read, and Coder refuses its stop builds of others' workspaces",
                        str(me.get("username"))[:64], ", ".join(sorted(roles)) or "none")
        return True

    def start_cache(self, timeout: float = 60.0) -> ClusterCache:
        """Start watching (once: a started cache is returned as it is)."""
        if self.cache.start() and not self.cache.wait_synced(timeout):
            log.warning("the notebook cache has not synced after %.0f s; still trying", timeout)
        return self.cache

    def close(self) -> None:
        """Stop watching, for good (a closed cache does not start again); waits a few seconds for the cache's
        threads to end (kf_culler/kube/cache.py `ClusterCache.close`)."""
        self.cache.close()

    def __enter__(self) -> Runner:
        self.start_cache()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def once(self, after: Memory | None = None, wait_events: bool = True, lean: bool = False) -> CycleResult:
        """One pass after the one that returned `after` (None: a first pass); its result's `memory` is what the
        next pass needs. Its Events go out after its patches (kf_culler/kube/event_tail.py): `wait_events` waits
        for them before returning; otherwise the next pass does, before it starts (`loop`: they go out during the
        wait for the next period). `lean` (`loop`): the pass lets go of each session's objects once it acted on it
        (`Cycle.run`), and what the runner reads after it is each session's identity alone; the result's `items`
        is then empty and its results keep no observations or probe calls."""
        memory = after or Memory()
        cache = self.start_cache()
        resend = unsent_after(memory)
        cycle = self.build_cycle(memory, on_written=cache.record_notebook, resend=resend)
        items: Iterable[Item]
        held_kept: list[Kept] = []
        if lean:  # the pairs as the cache holds them encoded, decoded one at a time by the pass (its select phase)
            packed, held_kept = cache.packed_pairs()
            listed = len(packed)  # the cache's sessions, then Coder's
            coder, coder_seen = self.coder_items(memory.coder)  # Coder's workspaces, listed now (`targets: [coder]`)
            packed += [packed_pair(item) for item in coder]
            held_kept += [(identity(nb), None) for nb, _pod in coder]
            items = unpacked_pairs(packed)
            kept: list[Item] = []
        else:
            snapshot = cache.snapshot()
            listed = len(snapshot)
            coder, coder_seen = self.coder_items(memory.coder)
            snapshot += coder
            kept = list(snapshot)
            items = snapshot
        del coder
        held = self._shards_held()
        result = cycle.run(items, lean)
        del items
        if lean:  # what is read of each session after the pass: its identity, decoded now
            kept, held_kept = identities(held_kept), []
        if wait_events:
            result.wait_events()
        brake_state = self._keep_brakes(memory.brake_state, result)
        self._keep_records(kept, held, result.now, coder_seen)
        snapshot = kept[:listed]
        orphans, orphans_told = self._report_orphans(snapshot, result.now, memory.orphans_told)
        contested, contested_told = self._report_contested(snapshot, result.now, memory.contested_told)
        self.policies.after_pass(snapshot, self.may_write, self.owns or (lambda _ns: True))
        result = dataclasses.replace(
            result, items=[] if lean else kept, gpu_orphans=orphans, gpu_contested=contested,
            memory=Memory(slow=result.slow, brake_state=brake_state, coder=coder_seen, orphans_told=orphans_told,
                          contested_told=contested_told, events=result.events, cycles=memory.cycles + 1,
                          last_cycle_end=time.monotonic()))
        if self.on_cycle is not None:
            self.on_cycle(result)
        settle_memory()  # kf_culler/memory.py
        return result

    @staticmethod
    def _keep_brakes(state: BrakeState, result: CycleResult) -> BrakeState:
        """What the brakes remember for the next pass (`state` when the pass had none); say loudly when they
        hold stops."""
        braked = result.brakes
        if braked is None:
            return state
        if braked.trips:
            log.warning("brakes: holding every stop until %s: %s", format_time(braked.state.held_until)
                        if braked.state.held_until else "the end of this pass", braked.why,
                        extra={"brakes": "held", "trips": list(braked.trips)})
        elif state.held_until is not None and braked.state.held_until is None:
            log.warning("brakes: stops resume (the hold ran out or an admin released it)",
                        extra={"brakes": "released"})
        if braked.deferred_stops or braked.deferred_warnings:
            log.info("brakes: %d stops and %d warnings left for the next pass (per-pass caps)",
                     len(braked.deferred_stops), len(braked.deferred_warnings))
        return braked.state

    def _shards_held(self) -> list[int]:
        """The shards of namespaces this replica holds now: every one without shards (or without `owns`)."""
        count = self.settings.operations.shards
        if self.owns is None:
            return list(range(count))
        return self.held_shards() if self.held_shards is not None else []

    def _keep_records(self, snapshot: list[tuple[dict[str, Any], dict[str, Any] | None]], held: list[int],
                      now: datetime, coder: CoderSeen) -> None:
        """After a pass: forget the records of notebooks that are gone, then store the pass's deferred record
        writes (one patch per bucket). Only a replica that may write, for the namespaces it holds. Once every
        deferred write is stored, the old marks of the shards held through the whole pass are imported: that
        is remembered, and never done again (kf_culler/kube/records.py)."""
        if self.dry_run or self.settings.operations.dry_run or not self.may_write():
            return
        synced = self.cache.synced
        if synced:
            live = {str((nb.get("metadata") or {}).get("uid")) for nb, _ in snapshot}
            selects, owns = self.settings.operations.namespaces.selects, self.owns or (lambda _ns: True)
            # Coder not read yet, or some of its workspaces left out: their records are kept
            unknown = (self.coder_namespace if self.coder is not None
                       and (coder.listed is None or coder.unjudged) else None)
            self.records.sweep(live, lambda ns: selects(ns) and owns(ns) and ns != unknown)
        self.records.flush()
        still = set(self._shards_held())
        if synced and not self.stop.is_set() and self.records.pending == 0 and self.may_write():
            self.records.mark_imported([i for i in held if i in still], self.settings.operations.shards, now)

    def _report_orphans(self, snapshot: list[tuple[dict[str, Any], dict[str, Any] | None]], now: datetime,
                        told: frozenset[str]) -> tuple[list[Orphan], frozenset[str]]:
        """Pods named `<name>-0` that hold a GPU but that the StatefulSet `<name>` does not control (a user
        relabelled the pod off it, or there is none): Kubeflow's notebook-controller stops a notebook by scaling
        that StatefulSet, which leaves such a pod running, and the culler does not delete pods. Returned (the
        pass's `gpu_orphans`, a metric), logged, and told once per pod with a Warning Event on the Notebook, which
        its namespace's users and the admin see; `told`: the pods told already, and returned with this pass's."""
        from kf_culler.session import gpu_count

        resources = self.settings.policy.gpu_resources
        orphans = [o for o in self.cache.orphans if gpu_count({}, o.pod, resources) > 0]
        notebooks = _NamedLikePods(snapshot)
        writes = not (self.dry_run or self.settings.operations.dry_run) and self.may_write()
        now_told = set(told)
        for o in orphans:
            uid = str((o.pod.get("metadata") or {}).get("uid"))
            if uid in now_told or not (self.owns is None or self.owns(o.namespace)):
                continue
            now_told.add(uid)
            message = (f"The pod {o.notebook}-0 holds a GPU but is not this notebook's running pod ({o.why}): "
                       f"a stop scales the StatefulSet {o.notebook} to 0, which does not remove this pod, so "
                       "stopping the notebook would not free that GPU. An administrator must delete the pod.")
            log.warning("%s/%s: %s", o.namespace, o.notebook, message)
            nb = notebooks.get((o.namespace, o.notebook))
            if writes and nb is not None:
                self.event_writer.event(nb, EventSpec("Warning", EVENT_ORPHAN, message), now)
        return orphans, frozenset(now_told)

    def _report_contested(self, snapshot: list[tuple[dict[str, Any], dict[str, Any] | None]], now: datetime,
                          told: frozenset[tuple[str, str, str]]
                          ) -> tuple[list[tuple[str, str, str]], frozenset[tuple[str, str, str]]]:
        """GPU series that contradict each other for one pod (kf_culler/sources/gpu.py: someone publishes a
        forged series): that pod's GPU is no-signal for the decision; the admin is told once per pod and
        claim, in a log line and a Warning Event on the notebook naming both series' job and instance.
        Returned (the pass's `gpu_contested`), with the claims told, `told` and this pass's."""
        from kf_culler.sources.gpu import PrometheusGpu

        gpu = self.sources[0]
        contested = list(gpu.contested) if isinstance(gpu, PrometheusGpu) else []
        notebooks = _NamedLikePods(snapshot)
        writes = not (self.dry_run or self.settings.operations.dry_run) and self.may_write()
        now_told = set(told)
        for ns, pod, what in contested:
            if (ns, pod, what) in now_told or not (self.owns is None or self.owns(ns)):
                continue
            now_told.add((ns, pod, what))
            message = (f"GPU metrics for this notebook's pod {pod} contradict each other: {what}. Its GPU is "
                       "treated as unreadable (it is not stopped on that evidence); an administrator should find "
                       "the series that does not come from dcgm-exporter.")
            log.warning("%s/%s: %s", ns, pod, message)
            nb = notebooks.get((ns, pod[:-2] if pod.endswith("-0") else pod))
            if writes and nb is not None:
                self.event_writer.event(nb, EventSpec("Warning", EVENT_CONTESTED, message[:1000]), now)
        return contested, frozenset(now_told)

    def loop(self, max_cycles: int | None = None) -> Memory:
        """Passes every check period until asked to stop (or `max_cycles` passes), each given the memory the
        last one returned; returns the last pass's."""
        period = self.settings.operations.check_period_seconds
        cache = self.start_cache()
        memory = Memory()
        try:
            while not self.stop.is_set():
                t0 = time.monotonic()
                if cache.synced:
                    memory = self.once(memory, wait_events=False, lean=True).memory
                if max_cycles is not None and memory.cycles >= max_cycles:
                    break
                self.stop.wait(max(0.0, period - (time.monotonic() - t0)))
        finally:
            # within the pod's termination grace period
            if memory.events is not None and not memory.events.wait(EVENTS_GRACE_SECONDS):
                log.warning("exiting with Events of the last pass not sent after %.0f s", EVENTS_GRACE_SECONDS)
            cache.close()
        return memory

    def install_signal_handlers(self) -> None:
        def handler(signum: int, _frame: object) -> None:
            log.info("signal %d: finishing the current notebook, then exiting", signum)
            self.stop.set()

        signal.signal(signal.SIGTERM, handler)
        signal.signal(signal.SIGINT, handler)


def unsent_after(memory: Memory) -> tuple[NotebookResult, ...]:
    """Wait for the Events of the pass that returned `memory`; the results whose Event could not be sent (the API
    server down), for the next pass to send again."""
    events = memory.events
    if events is None:
        return ()
    events.wait()
    return tuple(events.unsent)


ResultObserver = Callable[[NotebookResult], None]
CycleObserver = Callable[[CycleResult], None]


def build_runner(settings: Settings, api: Any, *, one_off: bool = False, dry_run: bool = False,
                 records_namespace: str | None = None, notifier: Notifier | None = None,
                 observe: Callable[[Callable[[], Runner]], tuple[ResultObserver, CycleObserver]] | None = None,
                 on_result: ResultObserver | None = None, on_cycle: CycleObserver | None = None,
                 on_event: ResultObserver | None = None, on_observed: Observer | None = None,
                 owns: Callable[[str], bool] | None = None, held_shards: Callable[[], list[int]] | None = None,
                 may_write: Callable[[], bool] = lambda: True, clock: Clock = utcnow, tracer: Tracer | None = None,
                 prober: ProberTokens | None = None, records: RecordStore | None = None,
                 spans_exported: bool = True) -> Runner:
    """The one way a Runner is built (`run`, `check`, `explain`, the demos, the tests), every collaborator made
    here, complete, and never set afterwards. `one_off` (`check`, `explain`): nothing written and no brakes (a
    one-off pass remembers nothing to compare with). `observe(runner_of)` makes the observers of results and
    passes (else `on_result` and `on_cycle`); `runner_of()` is the Runner they serve, built here with them.
    `records_namespace`: the culler's own namespace (None: `own_namespace()`). `prober` and `records`: made here
    when not given. `spans_exported`: spans leave the process (`run`: when it has an exporter), so a span per
    session and per probe request is made (`Cycle.spans_exported`)."""
    from kf_culler.kube.namespaces import NamespaceLabels
    from kf_culler.kube.tenants import NamespaceOwners

    dry_run = dry_run or one_off
    own = records_namespace or own_namespace()
    ops = settings.operations
    coder = CoderClient(ops.coder) if ops.coder is not None and CODER.name in ops.targets else None
    writes = not (dry_run or ops.dry_run)
    writer = (Writer(api) if coder is None else CoderWriter(api, coder)) if writes else None
    cache = ClusterCache(api, ops.namespaces.include, records_namespace=own, targets=ops.targets,
                         workloads=lambda o: selects_workload(o, settings),
                         workload_kinds=wl.kinds if (wl := ops.workloads) else (),
                         coder_namespace=ops.coder.namespace if coder is not None and ops.coder else None)
    labels = NamespaceLabels(api)
    built: list[Runner] = []
    if observe is not None:
        on_result, on_cycle = observe(lambda: built[0])
    runner = Runner(settings, api, cache=cache, sources=sources_for(settings), writer=writer,
                    event_writer=Writer(api), records=records or RecordStore(api, own), namespace_labels=labels,
                    namespace_owners=NamespaceOwners(api, labels),
                    policies=PolicyKeeper.for_settings(settings, api, dry_run),
                    prober=prober or ProberTokens(ops.probe.auth_proxy, api, own), coder=coder,
                    tracer=tracer or trace.get_tracer("kf_culler"), records_namespace=own, dry_run=dry_run,
                    brakes=not one_off, on_cycle=on_cycle, on_result=on_result, on_event=on_event,
                    may_write=may_write, owns=owns, held_shards=held_shards, on_observed=on_observed,
                    notifier=notifier, clock=clock, spans_exported=spans_exported)
    built.append(runner)
    return runner
