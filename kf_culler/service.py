"""`kf-culler run`: the runner plus metrics, health endpoints, leader election, logs and traces."""

from __future__ import annotations

import dataclasses
import logging
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kf_culler.config import Settings
from kf_culler.cycle import CycleResult, Memory, NotebookResult
from kf_culler.extend import Extender
from kf_culler.kube.lease import LeaderElector, ShardManager
from kf_culler.kube.tokens import TokenReviewer
from kf_culler.kube.writer import Writer
from kf_culler.metrics import ApiServer, HealthServer, Metrics, not_taken_keys
from kf_culler.model import STOP_ANNOTATION
from kf_culler.replay.recorder import TraceRecorder
from kf_culler.rule_check import loosening_rule_warnings
from kf_culler.runner import Runner, build_runner, gpu_history_warning
from kf_culler.session import annotations_of
from kf_culler.stopped import long_stopped_in
from kf_culler.telemetry import otlp_configured, setup_logging, setup_tracing
from kf_culler.timeutil import format_time
from kf_culler.verdict_api import VerdictApi
from kf_culler.verdicts import VerdictStore

log = logging.getLogger("kf_culler")


@dataclass
class Options:
    once: bool = False
    metrics_address: str | None = None
    api_address: str | None = None
    leader_elect: bool = False
    lease_namespace: str | None = None
    lease_name: str = "kf-culler"
    record: str | None = None  # a trace file, or a directory of segments (an existing directory, or ending in /)
    record_hash_key: str | None = None
    record_segment_hours: float = 24
    record_max_mb: float = 1024
    json_logs: bool = True
    dry_run: bool = False
    records_namespace: str | None = None  # where the culler keeps its record (None: its own namespace)


def _log_result(r: NotebookResult) -> None:
    v = r.verdict
    level = logging.INFO if v.action != "keep" or (r.write and r.write.outcome == "patched") else logging.DEBUG
    log.log(level, "%s/%s: %s (%s)", r.namespace, r.name, v.action, v.state, extra={
        "namespace": r.namespace, "notebook": r.name, "server_type": r.server_type, "action": v.action,
        "state": v.state, "rule": v.rule_id, "reason": v.reason, "idle_seconds": v.idle_seconds,
        "trace_id": r.trace_id, "write": r.write.outcome if r.write else None,
        "event": r.write.event if r.write else None})


class LastPass:
    """The memory the last pass returned, for /readyz (its HTTP thread reads what the passes' thread wrote)."""

    def __init__(self) -> None:
        self.memory = Memory()


def observers(runner_of: Callable[[], Runner], metrics: Metrics, elector: LeaderElector | None = None,
              store: VerdictStore | None = None, last: LastPass | None = None
              ) -> tuple[Callable[[NotebookResult], None], Callable[[CycleResult], None]]:
    """(on_result, on_cycle): feed every notebook result and every pass into the metrics and the logs (and the
    verdict store, and `last`). `runner_of()` is the Runner they serve, read at each pass (it is built with
    them)."""

    def on_result(r: NotebookResult) -> None:
        metrics.observe_result(r)
        _log_result(r)

    def on_cycle(result: CycleResult) -> None:
        runner = runner_of()
        metrics.observe_cycle(result)
        metrics.observe_brakes(result.brakes)
        if store is not None:
            store.update(result)
        if elector is not None:
            metrics.leader.set(1 if elector.is_leader() else 0)
        owns = runner.owns
        # The stopped sessions (all that the GPU-hours reclaimed and the long-stopped report read), as the cache has
        # them after the pass (with its stops); with shards, each replica accounts for its own shards' notebooks.
        notebooks = [nb for nb in runner.cache.sessions() if STOP_ANNOTATION in annotations_of(nb)
                     and (owns is None or owns(str((nb.get("metadata") or {}).get("namespace"))))]
        records = runner.records
        orphaned = frozenset((o.namespace, o.notebook) for o in result.gpu_orphans)
        by_ns: dict[str, int] = {}
        for o in result.gpu_orphans:
            by_ns[o.namespace] = by_ns.get(o.namespace, 0) + 1
        metrics.observe_orphans(by_ns)
        metrics.contested.set(len(result.gpu_contested))
        metrics.coder_unjudged.set(result.memory.coder.unjudged)

        def ours(nb: dict[str, Any]) -> bool:  # the culler's own record says it stopped the notebook
            found = records.get(str((nb.get("metadata") or {}).get("uid")))
            return found is not None and found.stopped_at is not None

        metrics.account_reclaimed([(nb, None) for nb in notebooks], result.now,
                                  lambda nb: runner.policy_of(nb).gpu_resources, ours, orphaned, not_taken_keys(result))
        metrics.observe_long_stopped(long_stopped_in(runner.settings, notebooks, result.now, runner.policy_of))
        if last is not None:
            last.memory = result.memory
        log.info("pass done: %d notebooks in %.2f s", len(result.results), result.seconds)

    return on_result, on_cycle


def instrument(runner: Runner, metrics: Metrics, elector: LeaderElector | None = None,
               store: VerdictStore | None = None) -> Runner:
    """A Runner built already (`check`, tests) with `observers`: the same collaborators, a new value."""
    instrumented: list[Runner] = []
    on_result, on_cycle = observers(lambda: instrumented[0], metrics, elector, store)
    instrumented.append(dataclasses.replace(runner, on_result=on_result, on_cycle=on_cycle,
                                            on_event=metrics.observe_event))
    return instrumented[0]


def _always() -> bool:
    return True


def readiness(runner: Runner, shards: ShardManager | None = None, memory: Memory | None = None) -> tuple[bool, str]:
    """Ready once the caches are synced, and while passes keep completing (`memory`: what the last pass returned,
    None before a first one). With shards, the answer also says which shards this replica holds (one holding none
    is a ready standby: its caches are warm)."""
    memory = memory or Memory()
    period = runner.settings.operations.check_period_seconds
    detail = ""
    if shards is not None:
        held = ",".join(str(i) for i in shards.held()) or "none"
        detail = f"; shards held: {held} of {shards.count} ({shards.live_replicas} live replicas)"
    if not runner.cache.synced:
        return False, "notebook cache not synced" + detail
    brakes = memory.brake_state
    if brakes.held_until is not None:  # ready (passes go on), and says so where admins look
        detail += f"; brakes: holding every stop until {format_time(brakes.held_until)}: " \
                  f"{brakes.why} (kf-culler release-brakes ends it)"
    if memory.cycles and time.monotonic() - memory.last_cycle_end > 3 * period + 60:
        return False, "no pass completed recently" + detail
    return True, "ready" + detail


def serve(settings: Settings, api: Any, opts: Options) -> int:
    """Build the culler's collaborators once — leader election or shards, the trace recorder, the notifier,
    the metrics and verdict-store observers — then the Runner with all of them (nothing is set on it later),
    then its HTTP servers, and run passes until SIGTERM."""
    setup_logging(opts.json_logs)
    gpu_warning = settings.gpu_source_warning()
    if gpu_warning:  # "GPU notebooks are never culled" is never silent (docs/configuration.md)
        log.warning("%s", gpu_warning)
    for rule_warning in loosening_rule_warnings(settings):  # rules any user can opt into
        log.warning("%s", rule_warning)
    history_warning = gpu_history_warning(settings)
    if history_warning:
        log.warning("%s", history_warning)
    provider = setup_tracing()
    metrics = Metrics()
    elector: LeaderElector | None = None
    shards: ShardManager | None = None
    recorder: TraceRecorder | None = None
    owns: Callable[[str], bool] | None = None
    may_write: Callable[[], bool] = _always
    if opts.record and (opts.record.endswith("/") or os.path.isdir(opts.record)):
        from kf_culler.replay.segments import SegmentedRecorder

        recorder = SegmentedRecorder(opts.record, hash_key=opts.record_hash_key,
                                     check_period_seconds=settings.operations.check_period_seconds,
                                     label_keys=settings.selector_label_keys,
                                     segment_seconds=opts.record_segment_hours * 3600,
                                     max_segment_bytes=max(1 << 20, int(opts.record_max_mb * (1 << 20) / 8)),
                                     max_total_bytes=int(opts.record_max_mb * (1 << 20)))
    elif opts.record:
        recorder = TraceRecorder(opts.record, hash_key=opts.record_hash_key,
                                 check_period_seconds=settings.operations.check_period_seconds,
                                 label_keys=settings.selector_label_keys)
    if opts.leader_elect:
        namespace = opts.lease_namespace or opts.records_namespace or os.environ.get("POD_NAMESPACE") or "default"
        identity = os.environ.get("POD_NAME") or f"{socket.gethostname()}-{os.getpid()}"
        elector = LeaderElector(api, namespace, opts.lease_name, identity)
        count = settings.operations.shards
        if count > 1:
            # Each shard's Lease decides who probes and writes its notebooks. The Lease kf-culler is still
            # held by one replica: the keep-until admission policy reads its renewTime as a clock.
            def shards_changed(held: list[int]) -> None:
                metrics.observe_shards(held, count)

            shards = ShardManager(api, namespace, opts.lease_name, identity, count, on_change=shards_changed)
            metrics.observe_shards([], count)
            owns = shards.owns
            shards.start()
        else:
            may_write = elector.is_leader
        elector.start()
    elif settings.operations.shards > 1:
        log.warning("shards: %d needs --leader-elect; without it this process probes and writes every shard",
                    settings.operations.shards)

    store = VerdictStore() if opts.api_address else None
    notifier = None
    if not (opts.dry_run or settings.operations.dry_run):  # notices of warnings and stops
        from kf_culler.notify.notifier import Notifier

        notifier = Notifier.for_settings(settings, api, metrics)
    last = LastPass()
    runner = build_runner(settings, api, dry_run=opts.dry_run, records_namespace=opts.records_namespace,
                          observe=lambda runner_of: observers(runner_of, metrics, elector, store, last),
                          on_event=metrics.observe_event, on_observed=recorder.record if recorder else None,
                          owns=owns, held_shards=shards.held if shards is not None else None, may_write=may_write,
                          notifier=notifier, spans_exported=otlp_configured())
    runner.install_signal_handlers()
    servers: list[HealthServer | ApiServer] = []
    if opts.metrics_address:
        health = HealthServer(opts.metrics_address, metrics, lambda: readiness(runner, shards, last.memory))
        health.notes = [f"warning: {gpu_warning}"] if gpu_warning else []
        servers.append(health)
        log.info("serving /metrics, /healthz and /readyz on %s", opts.metrics_address)
    if opts.api_address and store is not None:
        # Requests to extend are written by whichever replica answers (a user's request, like their own
        # kubectl annotate; the guarded patch keeps it safe); none when this culler writes nothing.
        writes = not (opts.dry_run or settings.operations.dry_run)
        extender = Extender(store, Writer(api) if writes else None)
        servers.append(ApiServer(opts.api_address, VerdictApi(store, TokenReviewer(api), extender)))
        log.info("serving the verdict API /api/v1/ on %s", opts.api_address)
    for server in servers:
        server.start()
    try:
        runner.start_cache()
        runner.loop(max_cycles=1 if opts.once else None)
    finally:
        if shards is not None:
            shards.stop()
        if elector is not None:
            elector.stop()
        for server in servers:
            server.stop()
        if recorder is not None:
            recorder.close()
        if runner.notifier is not None:
            runner.notifier.close()
        provider.shutdown()
    return 0
