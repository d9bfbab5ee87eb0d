"""The long-running culler: watch cache, a cycle every check period, clean exit on SIGTERM."""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kf_culler.config import Settings
from kf_culler.cycle import Clock, Cycle, CycleResult, NotebookResult, utcnow
from kf_culler.kube.cache import ClusterCache
from kf_culler.kube.istio import PolicyKeeper
from kf_culler.kube.writer import Writer
from kf_culler.memory import settle as settle_memory
from kf_culler.sources.bulk import BulkSource

log = logging.getLogger("kf_culler")


def gpu_window_minutes(settings: Settings) -> float:
    """How far back GPU evidence must reach: the longest idle limit any policy can apply, plus a margin.

    GPU work older than the look-back would be invisible, and an IDE idle for longer could then be
    stopped although its GPU worked inside the idle window.
    """
    longest = 0.0
    for policy in settings.policies():
        limits = [policy.idle_minutes, policy.connected_gpu_idle_minutes or 0,
                  policy.busy_kernel_gpu_idle_minutes or 0]
        longest = max(longest, *limits)
    return longest + 10


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
            prom = prom.model_copy(update={"lookback_minutes": min(window, 24 * 60)})
        gpu = PrometheusGpu(prom)
    elif ops.dcgm.endpoints:
        scraper_settings = settings.operations.dcgm
        if scraper_settings.lookback_minutes < window:
            scraper_settings = scraper_settings.model_copy(update={"lookback_minutes": min(window, 24 * 60)})
        gpu = dcgm.DcgmScraper(scraper_settings)
    return gpu, rstudio.source_for(settings)


@dataclass
class Runner:
    settings: Settings
    api: Any
    dry_run: bool = False
    stop: threading.Event = field(default_factory=threading.Event)
    on_cycle: Callable[[CycleResult], None] | None = None
    on_result: Callable[[NotebookResult], None] | None = None
    may_write: Callable[[], bool] = lambda: True
    owns: Callable[[str], bool] | None = None  # with shards: this replica holds the namespace's shard now
    on_observed: Any = None
    cache: ClusterCache | None = None
    tracer: Any = None
    notifier: Any = None  # kf_culler.notify.notifier.Notifier (notices of warnings and stops), or None
    _sources: tuple[BulkSource | None, BulkSource | None] | None = None
    namespace_labels: Any = None  # kf_culler.kube.namespaces.NamespaceLabels, made when rules need it
    policies: PolicyKeeper | None = None  # kf-culler-probes per namespace (istio.manageAuthorizationPolicies)
    clock: Clock = utcnow  # where each pass reads the time (tests and replays set it)
    slow: set[tuple[str, str]] = field(default_factory=set)  # notebooks slow to answer last pass
    last_cycle_end: float = 0.0
    cycles: int = 0

    def build_cycle(self) -> Cycle:
        if self._sources is None:
            self._sources = sources_for(self.settings)
        gpu, rstudio = self._sources
        writer = None if (self.dry_run or self.settings.operations.dry_run) else Writer(self.api)
        cycle = Cycle(self.settings, writer, gpu, rstudio, stop_flag=self.stop, may_write=self.may_write,
                      on_result=self.on_result, on_observed=self.on_observed, owns=self.owns, clock=self.clock)
        cycle.notifier = self.notifier if writer is not None else None
        cycle.slow = self.slow
        if self.settings.needs_namespace_labels:
            if self.namespace_labels is None:
                from kf_culler.kube.namespaces import NamespaceLabels

                self.namespace_labels = NamespaceLabels(self.api)
            cycle.namespace_labels = self.namespace_labels
        if self.tracer is not None:
            cycle.tracer = self.tracer
        return cycle

    def start_cache(self, timeout: float = 60.0) -> ClusterCache:
        self.cache = ClusterCache(self.api, self.settings.operations.namespaces.include)
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

    def once(self) -> CycleResult:
        cache = self.cache or self.start_cache()
        cycle = self.build_cycle()
        cycle.on_written = cache.record_notebook
        snapshot = cache.snapshot()
        result = cycle.run(snapshot)
        if self.policies is None:
            self.policies = PolicyKeeper.for_settings(self.settings, self.api, self.dry_run)
        self.policies.after_pass(snapshot, self.may_write, self.owns or (lambda _ns: True))
        self.cycles += 1
        self.last_cycle_end = time.monotonic()
        if self.on_cycle is not None:
            self.on_cycle(result)
        settle_memory()  # kf_culler/memory.py
        return result

    def loop(self, max_cycles: int | None = None) -> None:
        period = self.settings.operations.check_period_seconds
        cache = self.cache or self.start_cache()
        try:
            while not self.stop.is_set():
                t0 = time.monotonic()
                if cache.synced:
                    self.once()
                if max_cycles is not None and self.cycles >= max_cycles:
                    break
                self.stop.wait(max(0.0, period - (time.monotonic() - t0)))
        finally:
            cache.close()

    def install_signal_handlers(self) -> None:
        def handler(signum: int, _frame: object) -> None:
            log.info("signal %d: finishing the current notebook, then exiting", signum)
            self.stop.set()

        signal.signal(signal.SIGTERM, handler)
        signal.signal(signal.SIGINT, handler)
