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
from kf_culler.cycle import Cycle, CycleResult, NotebookResult
from kf_culler.gather import GpuSource, PodSource
from kf_culler.kube.cache import ClusterCache
from kf_culler.kube.writer import Writer

log = logging.getLogger("kf_culler")


def api_client(kubeconfig: str | None) -> Any:
    """A client from --kubeconfig, the in-cluster service account, or the default kubeconfig."""
    import os

    from kubernetes import client, config

    if kubeconfig:
        return config.new_client_from_config(config_file=kubeconfig)
    if os.environ.get("KUBERNETES_SERVICE_HOST"):
        config.load_incluster_config()
        return client.ApiClient()
    return config.new_client_from_config()


def sources_for(settings: Settings) -> tuple[GpuSource | None, PodSource | None]:
    """The bulk sources the settings ask for (GPU, RStudio through Prometheus)."""
    gpu: GpuSource | None = None
    rstudio: PodSource | None = None
    prom = settings.operations.prometheus
    if prom.url:
        from kf_culler.sources.gpu import PrometheusGpu

        gpu = PrometheusGpu(prom)
        try:
            from kf_culler.sources.rstudio import source_for as rstudio_source

            rstudio = rstudio_source(settings)
        except ImportError:
            rstudio = None
    return gpu, rstudio


@dataclass
class Runner:
    settings: Settings
    api: Any
    dry_run: bool = False
    stop: threading.Event = field(default_factory=threading.Event)
    on_cycle: Callable[[CycleResult], None] | None = None
    on_result: Callable[[NotebookResult], None] | None = None
    may_write: Callable[[], bool] = lambda: True
    on_observed: Any = None
    cache: ClusterCache | None = None
    last_cycle_end: float = 0.0
    cycles: int = 0

    def build_cycle(self) -> Cycle:
        gpu, rstudio = sources_for(self.settings)
        writer = None if (self.dry_run or self.settings.operations.dry_run) else Writer(self.api)
        return Cycle(self.settings, writer, gpu, rstudio, stop_flag=self.stop, may_write=self.may_write,
                     on_result=self.on_result, on_observed=self.on_observed)

    def start_cache(self, timeout: float = 60.0) -> ClusterCache:
        self.cache = ClusterCache(self.api, self.settings.operations.namespaces.include)
        self.cache.start()
        if not self.cache.wait_synced(timeout):
            log.warning("the notebook cache has not synced after %.0f s; still trying", timeout)
        return self.cache

    def once(self) -> CycleResult:
        cache = self.cache or self.start_cache()
        cycle = self.build_cycle()
        result = cycle.run(cache.snapshot())
        for r in result.results:
            if r.write is not None and r.write.notebook is not None:
                cache.record_notebook(r.write.notebook)
        self.cycles += 1
        self.last_cycle_end = time.monotonic()
        if self.on_cycle is not None:
            self.on_cycle(result)
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
