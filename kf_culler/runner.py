"""The long-running culler: watch cache, a cycle every check period, clean exit on SIGTERM."""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from opentelemetry import trace

from kf_culler.brakes import BrakeState
from kf_culler.config import Policy, Settings
from kf_culler.cycle import Clock, Cycle, CycleResult, NotebookResult, Observer, utcnow
from kf_culler.kube.brakes import released_at
from kf_culler.kube.cache import ClusterCache
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
from kf_culler.targets import CODER, target_of
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


@dataclass
class Runner:
    settings: Settings
    api: Any
    dry_run: bool = False
    stop: threading.Event = field(default_factory=threading.Event)
    on_cycle: Callable[[CycleResult], None] | None = None
    on_result: Callable[[NotebookResult], None] | None = None
    on_event: Callable[[NotebookResult], None] | None = None  # a result whose Event was sent (after the pass)
    may_write: Callable[[], bool] = lambda: True
    owns: Callable[[str], bool] | None = None  # with shards: this replica holds the namespace's shard now
    held_shards: Callable[[], list[int]] | None = None  # with shards: the shards this replica holds now
    on_observed: Observer | None = None
    cache: ClusterCache | None = None
    tracer: Tracer | None = None
    notifier: Notifier | None = None  # notices of warnings and stops, or None
    _sources: tuple[BulkSource | None, BulkSource | None] | None = None
    namespace_labels: NamespaceLabels | None = None  # made when rules need it, or for namespace_owners
    # Whose namespace it is (kf_culler/kube/tenants.py), for the brakes and the notices' queue; made on first use.
    namespace_owners: NamespaceOwners | None = None
    policies: PolicyKeeper | None = None  # kf-culler-probes per namespace (istio.manageAuthorizationPolicies)
    clock: Clock = utcnow  # where each pass reads the time (tests and replays set it)
    slow: frozenset[tuple[str, str]] = frozenset()  # notebooks slow to answer last pass (its CycleResult's)
    last_cycle_end: float = 0.0
    cycles: int = 0
    # The (notebook, pod) pairs the last pass ran over (`check --compare-config` decides them again).
    last_items: list[tuple[dict[str, Any], dict[str, Any] | None]] = field(default_factory=list)
    # Where the culler keeps its record of notebooks (kf_culler/kube/records.py); None: `own_namespace()`.
    records_namespace: str | None = None
    records: RecordStore | None = None
    # GPU pods named like a notebook's that a stop would not remove (kf_culler/targets/pairing.py), after the last pass.
    gpu_orphans: list[Orphan] = field(default_factory=list)
    _orphans_told: set[str] = field(default_factory=set)
    # Pods whose GPU series contradict each other (a forged series), after the last pass: (namespace, pod, what).
    gpu_contested: list[tuple[str, str, str]] = field(default_factory=list)
    _contested_told: set[tuple[str, str, str]] = field(default_factory=set)
    _event_writer: Writer | None = None
    brake_state: BrakeState = field(default_factory=BrakeState)  # the brakes' memory (kf_culler/brakes.py)
    # Whether passes go through the brakes: `run` (whose passes follow one another); `check` and `explain`
    # show the verdicts before them (a one-off pass remembers nothing to compare with).
    brakes: bool = True
    # `targets: [coder]`: Coder's API client, the last list it gave (kept for a pass it cannot be read in: those
    # workspaces get no signal), and why the last list failed (None: it did not).
    coder: CoderClient | None = None
    coder_listed: list[dict[str, Any]] | None = None
    coder_problem: str | None = None
    coder_unjudged: int = 0  # workspaces Coder listed beyond coder.maxWorkspaces in the last listing
    _coder_user_checked: bool = False
    _events: CycleResult | None = None  # the last pass, while its Events may still be going out
    _unsent: tuple[NotebookResult, ...] = ()  # results whose Event could not be sent yet (the API server down)
    # The prober tokens for workbenches behind kube-rbac-proxy (probe.authProxy), one prober per namespace; made on
    # first use, its ServiceAccounts in `own_namespace()`, when not given.
    prober: ProberTokens | None = None

    def policy_of(self, notebook: dict[str, Any]) -> Policy:
        """The policy the culler gives a notebook outside a pass (long-stopped counts, GPU-hour accounting):
        kf_culler/policy.py, with the namespace's labels when rules read them."""
        labels = None
        if self.settings.needs_namespace_labels and self.namespace_labels is not None:
            meta = notebook.get("metadata")
            labels = self.namespace_labels(str(meta.get("namespace")) if isinstance(meta, dict) else "")
        return policy_of(notebook, None, self.settings, labels)[0]

    def build_cycle(self, on_written: Callable[[dict[str, Any]], None] | None = None) -> Cycle:
        """This pass's Cycle, every collaborator given at once (a Cycle is frozen)."""
        if self._sources is None:
            self._sources = sources_for(self.settings)
        gpu, rstudio = self._sources
        writes = not (self.dry_run or self.settings.operations.dry_run)
        coder = self.coder_client()
        writer = (Writer(self.api) if coder is None else CoderWriter(self.api, coder)) if writes else None
        if self.settings.needs_namespace_labels and self.namespace_labels is None:
            from kf_culler.kube.namespaces import NamespaceLabels

            self.namespace_labels = NamespaceLabels(self.api)
        if (self.brakes or (writer is not None and self.notifier is not None)) and self.namespace_owners is None:
            from kf_culler.kube.namespaces import NamespaceLabels
            from kf_culler.kube.tenants import NamespaceOwners

            if self.namespace_labels is None:
                self.namespace_labels = NamespaceLabels(self.api)
            self.namespace_owners = NamespaceOwners(self.api, self.namespace_labels)
        cache = self.cache
        if cache is not None:
            if self.records is None:
                self.records = RecordStore(self.api, self.records_namespace or own_namespace())
            self.records.load(cache.record_objects())
        released = None
        if self.brake_state.held_until is not None and writes:  # an admin may have released the hold
            released = released_at(self.api, self.records_namespace or own_namespace(), self.clock())
        return Cycle(
            self.settings, writer, gpu, rstudio, stop_flag=self.stop, may_write=self.may_write, owns=self.owns,
            on_result=self.on_result, on_written=on_written, on_observed=self.on_observed,
            clock=self.clock, notifier=self.notifier if writer is not None else None, slow=self.slow,
            namespace_labels=self.namespace_labels if self.settings.needs_namespace_labels else None,
            namespace_owner=self.namespace_owners,
            records=self.records if cache is not None else None,
            nodes=cache.node if cache is not None and cache.reads_nodes else None,
            service_problem=cache.service_problem if cache is not None else None,
            endpoint=cache.endpoint if cache is not None and cache.endpoints else None,
            probe_auth=self._prober().get if self.settings.operations.probe.auth_proxy.enabled else None,
            access_problem=self.policies.access_problem if self.policies is not None and self.policies.enabled
            else None,
            brakes=self.settings.operations.brakes.limits if self.brakes else None,
            brake_state=self.brake_state, released_at=released, events_in_background=True, on_event=self.on_event,
            resend=self._unsent,
            tracer=self.tracer or trace.get_tracer("kf_culler"))

    def _prober(self) -> ProberTokens:
        if self.prober is None:
            self.prober = ProberTokens(self.settings.operations.probe.auth_proxy, self.api,
                                       self.records_namespace or own_namespace())
        return self.prober

    @property
    def coder_namespace(self) -> str | None:
        coder = self.settings.operations.coder
        return coder.namespace if coder is not None and CODER.name in self.settings.operations.targets else None

    def coder_client(self) -> CoderClient | None:
        """Coder's API client, when Coder workspaces are a target (made once)."""
        coder = self.settings.operations.coder
        if self.coder is None and coder is not None and CODER.name in self.settings.operations.targets:
            self.coder = CoderClient(coder)
        return self.coder

    def coder_items(self) -> list[tuple[dict[str, Any], dict[str, Any] | None]]:
        """(session, pod) of every Coder workspace (kf_culler/targets/coder.py), listed from Coder's API now and
        paired with the cache's pods of the admin's Coder namespace. When Coder cannot be read, the last list's
        workspaces with no signal (never idle on that); none before a first list."""
        client, namespace = self.coder_client(), self.coder_namespace
        if client is None or namespace is None or self.cache is None:
            return []
        if not self._coder_user_checked:
            self._check_coder_user(client)
        now = self.clock()
        try:
            listing = client.list_workspaces()
            self.coder_listed, self.coder_problem = listing.workspaces, None
            if listing.unjudged and listing.unjudged != self.coder_unjudged:
                log.warning("Coder workspaces: %s%d more than coder.maxWorkspaces (%d) are listed; the culler judges "
                            "the first %d by owner and name and leaves the others as they are",
                            "" if listing.complete else "at least ", listing.unjudged,
                            self.settings.operations.coder.max_workspaces if self.settings.operations.coder else 0,
                            len(listing.workspaces))
            self.coder_unjudged = listing.unjudged
        except CoderError as err:
            if self.coder_problem != str(err):
                log.warning("Coder workspaces: %s; they get no signal until Coder can be read", err)
            self.coder_problem = str(err)
            if self.coder_listed is None:
                return []
            return [(unread(s, f"Coder could not be read: {err}"), pod) for s, pod in
                    coder_items(self.coder_listed, namespace, self.cache.objects("pods").values(), now)]
        return coder_items(self.coder_listed, namespace, self.cache.objects("pods").values(), now)

    def _check_coder_user(self, client: CoderClient) -> None:
        """Once: say loudly when the token is not a Coder Owner's (it lists only what it may read, and stop
        builds of others' workspaces are refused)."""
        try:
            me = client.me()
        except CoderError as err:
            log.warning("Coder: %s", err)
            return
        self._coder_user_checked = True
        roles = {str(r.get("name")) for r in me.get("roles") or [] if isinstance(r, dict)}
        if "owner" not in roles:
            log.warning("Coder: the token in coder.tokenFile is %s's, who is not an Owner (roles: %s): it sees only "
                        "the workspaces it may read, and Coder refuses its stop builds of others' workspaces",
                        str(me.get("username"))[:64], ", ".join(sorted(roles)) or "none")

    def start_cache(self, timeout: float = 60.0) -> ClusterCache:
        self.cache = ClusterCache(self.api, self.settings.operations.namespaces.include,
                                  records_namespace=self.records_namespace or own_namespace(),
                                  targets=self.settings.operations.targets,
                                  workloads=lambda o: selects_workload(o, self.settings),
                                  workload_kinds=wl.kinds if (wl := self.settings.operations.workloads) else (),
                                  coder_namespace=self.settings.operations.coder.namespace
                                  if self.coder_client() is not None and self.settings.operations.coder else None)
        self.cache.start()
        if not self.cache.wait_synced(timeout):
            log.warning("the notebook cache has not synced after %.0f s; still trying", timeout)
        return self.cache

    def close(self) -> None:
        """Stop watching (the cache's threads end on their own)."""
        if self.cache is not None:
            self.cache.close()
            self.cache = None

    def __enter__(self) -> Runner:
        if self.cache is None:
            self.start_cache()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def once(self, wait_events: bool = True) -> CycleResult:
        """One pass. Its Events go out after its patches (kf_culler/kube/event_tail.py): `wait_events` waits for
        them before returning; otherwise the next pass does, before it starts (`loop`: they go out during the
        wait for the next period)."""
        cache = self.cache or self.start_cache()
        self.wait_events()
        cycle = self.build_cycle(on_written=cache.record_notebook)
        snapshot = cache.snapshot()
        items = snapshot + self.coder_items()  # Coder's workspaces, listed now (`targets: [coder]`)
        held = self._shards_held()
        result = cycle.run(items)
        self.slow = result.slow
        self.last_items = items  # what the pass ran over (check --compare-config decides them again)
        self._events = result
        if wait_events:
            self.wait_events()
        self._keep_brakes(result)
        self._keep_records(items, held, result.now)
        self._report_orphans(snapshot, result.now)
        self._report_contested(snapshot, result.now)
        if self.policies is None:
            self.policies = PolicyKeeper.for_settings(self.settings, self.api, self.dry_run)
        self.policies.after_pass(snapshot, self.may_write, self.owns or (lambda _ns: True))
        self.cycles += 1
        self.last_cycle_end = time.monotonic()
        if self.on_cycle is not None:
            self.on_cycle(result)
        settle_memory()  # kf_culler/memory.py
        return result

    def wait_events(self, timeout: float | None = None) -> bool:
        """Wait for the last pass's Events (True: all sent or tried)."""
        last = self._events
        if last is None or not last.wait_events(timeout):
            return last is None
        self._events = None
        self._unsent = tuple(last.events.unsent) if last.events is not None else ()
        return True

    def _keep_brakes(self, result: CycleResult) -> None:
        """Remember what the brakes saw for the next pass, and say loudly when they hold stops."""
        braked = result.brakes
        if braked is None:
            return
        was_held = self.brake_state.held_until is not None
        self.brake_state = braked.state
        if braked.trips:
            log.warning("brakes: holding every stop until %s: %s", format_time(braked.state.held_until)
                        if braked.state.held_until else "the end of this pass", braked.why,
                        extra={"brakes": "held", "trips": list(braked.trips)})
        elif was_held and braked.state.held_until is None:
            log.warning("brakes: stops resume (the hold ran out or an admin released it)",
                        extra={"brakes": "released"})
        if braked.deferred_stops or braked.deferred_warnings:
            log.info("brakes: %d stops and %d warnings left for the next pass (per-pass caps)",
                     len(braked.deferred_stops), len(braked.deferred_warnings))

    def _shards_held(self) -> list[int]:
        """The shards of namespaces this replica holds now: every one without shards (or without `owns`)."""
        count = self.settings.operations.shards
        if self.owns is None:
            return list(range(count))
        return self.held_shards() if self.held_shards is not None else []

    def _keep_records(self, snapshot: list[tuple[dict[str, Any], dict[str, Any] | None]], held: list[int],
                      now: datetime) -> None:
        """After a pass: forget the records of notebooks that are gone, then store the pass's deferred record
        writes (one patch per bucket). Only a replica that may write, for the namespaces it holds. Once every
        deferred write is stored, the old marks of the shards held through the whole pass are imported: that
        is remembered, and never done again (kf_culler/kube/records.py)."""
        if self.records is None or self.dry_run or self.settings.operations.dry_run or not self.may_write():
            return
        synced = self.cache is not None and self.cache.synced
        if synced:
            live = {str((nb.get("metadata") or {}).get("uid")) for nb, _ in snapshot}
            selects, owns = self.settings.operations.namespaces.selects, self.owns or (lambda _ns: True)
            # Coder not read yet, or some of its workspaces left out: their records are kept
            unknown = (self.coder_namespace if self.coder is not None
                       and (self.coder_listed is None or self.coder_unjudged) else None)
            self.records.sweep(live, lambda ns: selects(ns) and owns(ns) and ns != unknown)
        self.records.flush()
        still = set(self._shards_held())
        if synced and not self.stop.is_set() and self.records.pending == 0 and self.may_write():
            self.records.mark_imported([i for i in held if i in still], self.settings.operations.shards, now)

    def _report_orphans(self, snapshot: list[tuple[dict[str, Any], dict[str, Any] | None]], now: datetime) -> None:
        """Pods named `<name>-0` that hold a GPU but that the StatefulSet `<name>` does not control (a user
        relabelled the pod off it, or there is none): Kubeflow's notebook-controller stops a notebook by scaling
        that StatefulSet, which leaves such a pod running, and the culler does not delete pods. Kept in
        `gpu_orphans` (a metric), logged, and told once per pod with a Warning Event on the Notebook, which its
        namespace's users and the admin see."""
        if self.cache is None:
            return
        from kf_culler.session import gpu_count

        resources = self.settings.policy.gpu_resources
        self.gpu_orphans = [o for o in self.cache.orphans if gpu_count({}, o.pod, resources) > 0]
        notebooks = {((nb.get("metadata") or {}).get("namespace"), (nb.get("metadata") or {}).get("name")): nb
                     for nb, _ in snapshot if target_of(nb).paired_by_name}  # named like their pods: v1 Notebooks
        writes = not (self.dry_run or self.settings.operations.dry_run) and self.may_write()
        for o in self.gpu_orphans:
            uid = str((o.pod.get("metadata") or {}).get("uid"))
            if uid in self._orphans_told or not (self.owns is None or self.owns(o.namespace)):
                continue
            self._orphans_told.add(uid)
            message = (f"The pod {o.notebook}-0 holds a GPU but is not this notebook's running pod ({o.why}): "
                       f"a stop scales the StatefulSet {o.notebook} to 0, which does not remove this pod, so "
                       "stopping the notebook would not free that GPU. An administrator must delete the pod.")
            log.warning("%s/%s: %s", o.namespace, o.notebook, message)
            nb = notebooks.get((o.namespace, o.notebook))
            if writes and nb is not None:
                if self._event_writer is None:
                    self._event_writer = Writer(self.api)
                self._event_writer.event(nb, EventSpec("Warning", EVENT_ORPHAN, message), now)

    def _report_contested(self, snapshot: list[tuple[dict[str, Any], dict[str, Any] | None]], now: datetime) -> None:
        """GPU series that contradict each other for one pod (kf_culler/sources/gpu.py: someone publishes a
        forged series): that pod's GPU is no-signal for the decision; the admin is told once per pod and
        claim, in a log line and a Warning Event on the notebook naming both series' job and instance."""
        from kf_culler.sources.gpu import PrometheusGpu

        gpu = self._sources[0] if self._sources is not None else None
        self.gpu_contested = list(gpu.contested) if isinstance(gpu, PrometheusGpu) else []
        notebooks = {((nb.get("metadata") or {}).get("namespace"), (nb.get("metadata") or {}).get("name")): nb
                     for nb, _ in snapshot if target_of(nb).paired_by_name}  # named like their pods: v1 Notebooks
        writes = not (self.dry_run or self.settings.operations.dry_run) and self.may_write()
        for ns, pod, what in self.gpu_contested:
            if (ns, pod, what) in self._contested_told or not (self.owns is None or self.owns(ns)):
                continue
            self._contested_told.add((ns, pod, what))
            message = (f"GPU metrics for this notebook's pod {pod} contradict each other: {what}. Its GPU is "
                       "treated as unreadable (it is not stopped on that evidence); an administrator should find "
                       "the series that does not come from dcgm-exporter.")
            log.warning("%s/%s: %s", ns, pod, message)
            nb = notebooks.get((ns, pod[:-2] if pod.endswith("-0") else pod))
            if writes and nb is not None:
                if self._event_writer is None:
                    self._event_writer = Writer(self.api)
                self._event_writer.event(nb, EventSpec("Warning", EVENT_CONTESTED, message[:1000]), now)

    def loop(self, max_cycles: int | None = None) -> None:
        period = self.settings.operations.check_period_seconds
        cache = self.cache or self.start_cache()
        try:
            while not self.stop.is_set():
                t0 = time.monotonic()
                if cache.synced:
                    self.once(wait_events=False)
                if max_cycles is not None and self.cycles >= max_cycles:
                    break
                self.stop.wait(max(0.0, period - (time.monotonic() - t0)))
        finally:
            if not self.wait_events(EVENTS_GRACE_SECONDS):  # within the pod's termination grace period
                log.warning("exiting with Events of the last pass not sent after %.0f s", EVENTS_GRACE_SECONDS)
            cache.close()

    def install_signal_handlers(self) -> None:
        def handler(signum: int, _frame: object) -> None:
            log.info("signal %d: finishing the current notebook, then exiting", signum)
            self.stop.set()

        signal.signal(signal.SIGTERM, handler)
        signal.signal(signal.SIGINT, handler)


ResultObserver = Callable[[NotebookResult], None]
CycleObserver = Callable[[CycleResult], None]


def build_runner(settings: Settings, api: Any, *, one_off: bool = False, dry_run: bool = False,
                 records_namespace: str | None = None, notifier: Notifier | None = None,
                 observe: Callable[[Callable[[], Runner]], tuple[ResultObserver, CycleObserver]] | None = None,
                 on_event: ResultObserver | None = None, on_observed: Observer | None = None,
                 owns: Callable[[str], bool] | None = None, held_shards: Callable[[], list[int]] | None = None,
                 may_write: Callable[[], bool] = lambda: True) -> Runner:
    """The one way the commands build a Runner (`run`, `check`, `explain`, the demos), with its collaborators
    given at construction, never set afterwards. `one_off` (`check`, `explain`): nothing written and no brakes
    (a one-off pass remembers nothing to compare with). `observe(runner_of)` makes the observers of results and
    passes; `runner_of()` is the Runner they serve, built here with them."""
    built: list[Runner] = []
    on_result, on_cycle = observe(lambda: built[0]) if observe is not None else (None, None)
    runner = Runner(settings, api, dry_run=dry_run or one_off, brakes=not one_off, records_namespace=records_namespace,
                    notifier=notifier, on_result=on_result, on_cycle=on_cycle, on_event=on_event,
                    on_observed=on_observed, owns=owns, held_shards=held_shards, may_write=may_write)
    built.append(runner)
    return runner
