"""One pass: gather -> decide -> apply, for every selected notebook."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import marshal
import threading
import time
from collections.abc import Callable, Coroutine, Iterable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from datetime import UTC, datetime
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, TypeVar

import uvloop
from opentelemetry import context as otel_context
from opentelemetry import trace

from kf_culler.brakes import BrakeLimits, BrakeState, Outcome, Seen, apply_brakes
from kf_culler.config import GPU_MODEL_LABEL, Policy, Settings
from kf_culler.decide import decide_view
from kf_culler.frozen import replaced
from kf_culler.gather import (
    DNS_LABEL,
    Found,
    Gathered,
    Request,
    gather,
    packed_found,
    proxied_namespaces,
    service_host,
    template_for,
    unpacked_found,
    url_for,
)
from kf_culler.kube.cache import Encoded, UnpackedPairs, decoded
from kf_culler.kube.event_tail import EventTail
from kf_culler.kube.prober import ProxyAuth
from kf_culler.kube.records import RecordStore
from kf_culler.kube.writer import Writer, WriteResult
from kf_culler.model import SERVER_SOURCES, STOP_ANNOTATION, WARNED_AT_ANNOTATION, InputError, Verdict
from kf_culler.plan import Plan, plan
from kf_culler.policy import Selected, selection
from kf_culler.record import CullerRecord, RecordChange, imported, warned_this_period
from kf_culler.rules.untaken import plan_reads_pod
from kf_culler.session import SessionView, node_gpu_model
from kf_culler.sources.bulk import BulkSource
from kf_culler.sources.http import Call
from kf_culler.targets import KINDS, SessionKey, fairness_key, session_key, target_of, uid_of
from kf_culler.targets.base import Item
from kf_culler.targets.pairing import Orphan

if TYPE_CHECKING:
    from kf_culler.notify.notifier import Notifier

log = logging.getLogger("kf_culler.cycle")
NO_PROBE_STATES = ("stopped", "exempt", "starting", "broken")  # broken: rule 14 needs no probe
Clock = Callable[[], datetime]
# Told of each probed notebook: (now, notebook, pod, observations, selection context); `run --record`.
Observer = Callable[[datetime, dict[str, Any], dict[str, Any] | None, dict[str, Any], dict[str, Any]], None]
T = TypeVar("T")


def utcnow() -> datetime:
    return datetime.now(UTC)


def run_async(coro: Coroutine[Any, Any, T]) -> T:
    """Run one pass's gather on a uvloop event loop of its own.

    Not asyncio.run/asyncio.Runner: in the main thread those take SIGINT over for the run, cancel the
    task and raise KeyboardInterrupt only if the task ends cancelled, so a task that completed anyway
    would swallow Ctrl-C. Here SIGINT stays Python's: KeyboardInterrupt leaves the loop, what is left
    of the gather is cancelled and the loop closed.
    """
    loop = uvloop.new_event_loop()
    try:
        return loop.run_until_complete(coro)
    finally:
        try:
            left = asyncio.all_tasks(loop)
            for task in left:
                task.cancel()
            if left:
                loop.run_until_complete(asyncio.gather(*left, return_exceptions=True))
            loop.run_until_complete(loop.shutdown_asyncgens())
        finally:
            loop.close()


@dataclass
class NotebookResult:
    namespace: str
    name: str
    server_type: str
    gpus: int
    verdict: Verdict
    observations: dict[str, Any]
    calls: list[Call] = field(default_factory=list)
    plan: Plan | None = None
    write: WriteResult | None = None
    trace_id: str | None = None
    record: CullerRecord | None = None  # the culler's own record of the notebook, as the pass read it
    policy: Policy | None = None  # the policy chosen for it (kf_culler/policy.py): notices read maxExtendMinutes
    # A stop that did not take: how its next step went (kf_culler/kube/writer.py `Writer.reclaim`), or None.
    reclaim: str | None = None
    pod_uid: str | None = None  # the uid of the pod the pass paired with it (a request to extend must come from it)


@dataclass(frozen=True)
class CoderSeen:
    """What the runner remembers of Coder's API between passes (`targets: [coder]`): its last list of workspaces
    (kept for a pass it cannot be read in: those workspaces get no signal; None before a first list), why the last
    list failed (None: it did not), how many workspaces it listed beyond coder.maxWorkspaces, and whether the
    token's roles were checked."""

    listed: list[dict[str, Any]] | None = None
    problem: str | None = None
    unjudged: int = 0
    user_checked: bool = False


@dataclass(frozen=True)
class Memory:
    """What a pass of the runner remembers for the next: returned in its CycleResult (`memory`), given to the
    next `Runner.once`; `run`'s loop keeps it in a local variable. Start from Memory()."""

    slow: frozenset[tuple[str, str]] = frozenset()  # notebooks slow to answer (the last CycleResult's `slow`)
    brake_state: BrakeState = field(default_factory=BrakeState)  # the brakes' memory (kf_culler/brakes.py)
    coder: CoderSeen = field(default_factory=CoderSeen)
    orphans_told: frozenset[str] = frozenset()  # uids of the GPU orphans an Event was sent about
    contested_told: frozenset[tuple[str, str, str]] = frozenset()  # contested GPU series an Event was sent about
    # The pass's Events, maybe still going out (kf_culler/kube/event_tail.py): the next pass waits for them first
    # and sends again those that could not be sent.
    events: EventTail[NotebookResult] | None = None
    cycles: int = 0  # passes run
    last_cycle_end: float = 0.0  # time.monotonic() at the end of the last pass


@dataclass
class CycleResult:
    started: datetime
    now: datetime
    seconds: float
    results: list[NotebookResult]
    bulk_queries: int = 0
    interrupted: bool = False
    phases: dict[str, float] = field(default_factory=dict)  # seconds: select, gather, apply (events, when waited)
    brakes: Outcome | None = None  # what the brakes did in this pass (kf_culler/brakes.py); None: no brakes
    # The pass's Events, sent after its patches (kf_culler/kube/event_tail.py); None: it wrote none.
    events: EventTail[NotebookResult] | None = None
    # What the next pass needs from this one: the notebooks whose probes were slow (Cycle.slow).
    slow: frozenset[tuple[str, str]] = frozenset()
    # Filled by the runner (kf_culler/runner.py `Runner.once`) after the pass: the (notebook, pod) pairs it ran over
    # (`check --compare-config` decides them again), the GPU pods a stop would not remove and the pods whose GPU
    # series contradict each other (namespace, pod, what), and all the next pass needs from this one (`memory`).
    items: list[tuple[dict[str, Any], dict[str, Any] | None]] = field(default_factory=list)
    gpu_orphans: list[Orphan] = field(default_factory=list)
    gpu_contested: list[tuple[str, str, str]] = field(default_factory=list)
    memory: Memory = field(default_factory=Memory)

    def wait_events(self, timeout: float | None = None) -> bool:
        """Wait until the pass's Events are sent (each result's `write.event` then says how it went)."""
        return self.events is None or self.events.wait(timeout)


@dataclass
class Selection:
    """What the select phase found: the sessions chosen (in the order listed), the verdicts given before any probe,
    the gather's requests, and the sessions whose IDE is not probed — its URL untrusted (source, why) or its signal
    carried with its listing (source, raw answer)."""

    chosen: list[Chosen] = field(default_factory=list)
    pre: dict[SessionKey, Verdict] = field(default_factory=dict)
    requests: list[Request] = field(default_factory=list)
    untrusted: dict[SessionKey, tuple[str, str]] = field(default_factory=dict)
    carried: dict[SessionKey, tuple[str, Any]] = field(default_factory=dict)


# The labels of a view a lean pass holds once its policy is chosen: none (`Chosen.of`).
NO_LABELS: Mapping[str, str] = MappingProxyType({})


@dataclass(frozen=True)
class Chosen:
    """A session chosen by the select phase, as the pass holds it until it judges it: the session (a lean pass holds
    it encoded, `packed`), its selection, and in a lean pass its pod encoded, which the selection's view then does
    not hold (`selected` puts it back), nor its labels, read only to choose its policy."""

    session: dict[str, Any] | bytes
    sel: Selected
    pod: bytes | None = None

    @classmethod
    def of(cls, session: dict[str, Any], sel: Selected, lean: bool, encoded: Encoded | None = None) -> Chosen:
        """`encoded`: the bytes the cache holds for the session and for the pod of `sel`'s view, which a lean pass
        then holds instead of encoding them again (kf_culler/kube/cache.py `UnpackedPairs.encoded`)."""
        pod = sel.view.pod
        if not lean:
            return cls(session, sel)
        held = encoded[0] if encoded is not None else packed(session)
        raw = encoded[1] if encoded is not None else None
        if pod is not None and raw is None:
            try:
                raw = marshal.dumps(pod)
            except ValueError:  # held decoded in the view
                raw = None
        # The view's labels are read only to choose its policy (kf_culler/policy.py), done by now.
        view = replaced(sel.view, labels=NO_LABELS, pod=None if raw is not None else pod)
        return cls(held, replaced(sel, view=view), raw)

    def selected(self) -> Selected:
        """The selection with its view's pod."""
        return with_pod(self.sel, self.pod)


def with_pod(sel: Selected, pod: bytes | None) -> Selected:
    """`sel` with the pod a lean pass held encoded put back in its view (`sel` itself when it held none)."""
    if pod is None:
        return sel
    return replaced(sel, view=replaced(sel.view, pod=decoded(pod)))


def packed(session: dict[str, Any]) -> dict[str, Any] | bytes:
    """A session as a lean pass holds it from its select phase to its act phase: its `marshal` bytes, a fifth of
    the memory of the decoded object (what of it the session's view reads, its annotations and labels, the view
    holds); the object itself when it cannot be encoded."""
    try:
        return marshal.dumps(session)
    except ValueError:
        return session


def unpacked(session: dict[str, Any] | bytes) -> dict[str, Any]:
    return decoded(session) if isinstance(session, bytes) else session


@dataclass
class Judged:
    """A notebook with its verdict, between deciding and writing. `held`: the actions the brakes took back
    in this pass (a re-plan after a conflict must not bring them back), and why. `session`: the notebook, or in a
    lean pass its encoded form (`nb` decodes it), and in a lean pass its pod encoded (`pod`)."""

    session: dict[str, Any] | bytes
    sel: Selected
    verdict: Verdict
    found: Found | bytes  # its observations and probe calls; a lean pass holds them encoded (`found_now` decodes)
    held: frozenset[str] = frozenset()
    why: str = ""
    pod: bytes | None = None  # a lean pass's: the pod encoded, which `sel`'s view then does not hold (`Chosen`)
    pod_uid: str | None = None  # the uid of its pod, read when it was judged (the pod decoded then)

    @property
    def nb(self) -> dict[str, Any]:
        return unpacked(self.session)

    def planned_view(self) -> SessionView:
        """The view its plan is made from: in a lean pass with its pod put back where planning reads it
        (kf_culler/rules/untaken.py `plan_reads_pod`: a stop that did not take, whose next step names the pod's
        StatefulSet); else as held, without it."""
        view = self.sel.view
        if self.pod is None or not plan_reads_pod(view):
            return view
        return replaced(view, pod=decoded(self.pod))

    def found_now(self) -> Found:
        return unpacked_found(self.found)

    def restrain(self, verdict: Verdict) -> Verdict:
        if verdict.action not in self.held:
            return verdict
        return dataclasses.replace(verdict, action="keep", reason=f"{self.why} {verdict.reason}")


@dataclass(frozen=True)
class Cycle:
    settings: Settings
    writer: Writer | None = None  # None: decide and report only (check, explain, dry-run)
    gpu: BulkSource | None = None
    rstudio: BulkSource | None = None
    clock: Clock = utcnow
    stop_flag: threading.Event = field(default_factory=threading.Event)
    may_write: Callable[[], bool] = lambda: True
    # With shards: whether this replica holds the shard of a namespace now. Notebooks of other shards are
    # neither probed nor written; a shard lost during the pass stops its writes (checked before each).
    owns: Callable[[str], bool] | None = None
    on_result: Callable[[NotebookResult], None] | None = None
    # Given each notebook as a patch left it, as soon as it is written (the runner's cache records it);
    # the result then no longer holds it: 7,000 written notebooks held to the end of a pass were a
    # third of the culler's memory at 10,000 notebooks.
    on_written: Callable[[dict[str, Any]], None] | None = None
    # Given each probed notebook with its observations and what chose its policy beyond the two objects (the
    # namespace's labels, the GPU model of the pod's Node: `selection_context`), for `--record`.
    on_observed: Observer | None = None
    tracer: trace.Tracer = field(default_factory=lambda: trace.get_tracer("kf_culler"))
    notifier: Notifier | None = None  # offered each write, never blocks the pass
    # A namespace's labels (kf_culler/kube/namespaces.py) for policy rules with a namespaceSelector; it
    # answers None when they are unknown. Not set: no namespaceSelector matches.
    namespace_labels: Callable[[str], Mapping[str, str] | None] | None = None
    # A namespace's owner where the user cannot forge it (kf_culler/kube/tenants.py), or None; the namespaces of
    # one owner take one share in the brakes and the notices' queue (`tenant`). Not set: each namespace is one.
    namespace_owner: Callable[[str], str | None] | None = None
    # Notebooks whose probes were slow in the previous pass (the last CycleResult's `slow`): probed by workers
    # of their own (gather).
    slow: frozenset[tuple[str, str]] = frozenset()
    # The brakes' limits (None: no brakes, no caps), what they remember from the previous pass, and an admin's
    # release of a hold (kf_culler/brakes.py; the runner's Memory carries the state between passes).
    brakes: BrakeLimits | None = None
    brake_state: BrakeState = field(default_factory=BrakeState)
    released_at: datetime | None = None
    # The culler's own record of each notebook (rule 15); None: no record is read or written (every notebook
    # is one the culler has no record of).
    records: RecordStore | None = None
    # Why a notebook's Service cannot be trusted to reach its own pod (kf_culler/targets/pairing.py), when the
    # probe URL goes through the Service; None: not checked.
    service_problem: Callable[[dict[str, Any]], str | None] | None = None
    # (name, ClusterIP) of the Service a session's IDE is probed through, once it passed its checks
    # (`Target.service_address`): the probes connect there instead of looking the name up (`probe.serviceClusterIP`).
    service_address: Callable[[dict[str, Any]], tuple[str, str] | None] | None = None
    # Whether spans leave the process (an exporter): only then is a span made per session and per probe request
    # under the pass's, where otherwise 10,000 sessions' and 25,000 probes' spans a pass would be made for nobody.
    # The pass's span is always made: its trace id is every session's, in their Events, annotations and results.
    spans_exported: bool = True
    # What the culler confirmed keeps its probes out of a namespace (rule 16's accessProblem), or None.
    access_problem: Callable[[str], str | None] | None = None
    # The Node of a name (its GPU model label, rule 17), when the culler reads Nodes; None: it does not.
    nodes: Callable[[object], dict[str, Any] | None] | None = None
    # A Workspace's IDE endpoint, (Service, port, path), or why it cannot be reached safely
    # (kf_culler/targets/workspaces.py `WorkspaceTarget.endpoint`); None: Workspaces are not probed.
    endpoint: Callable[[dict[str, Any]], tuple[str, int, str] | str] | None = None
    # This pass's prober tokens and TLS context for workbenches behind kube-rbac-proxy (probe.authProxy,
    # kf_culler/kube/prober.py), for the namespaces given, by namespace; None: those probes report that there is
    # none and send nothing.
    probe_auth: Callable[[set[str]], dict[str, ProxyAuth]] | None = None
    # The pass's Events go out after all its patches (kf_culler/kube/event_tail.py). False: `run` waits for
    # them before it returns; True: it returns with them still going (`CycleResult.wait_events`).
    events_in_background: bool = False
    on_event: Callable[[NotebookResult], None] | None = None  # told of each result once its Event is sent
    # Earlier passes' results whose Event could not be sent (the API server down): sent again, before this pass's.
    resend: tuple[NotebookResult, ...] = ()

    def node_for(self, pod: dict[str, Any] | None) -> dict[str, Any] | None:
        """The Node the pod runs on, when the culler reads Nodes (rule 17)."""
        if self.nodes is None or not isinstance(pod, dict):
            return None
        spec = pod.get("spec")
        return self.nodes(spec.get("nodeName")) if isinstance(spec, dict) else None

    def select(self, nb: dict[str, Any], pod: dict[str, Any] | None, now: datetime) -> Selected | None:
        """The notebook's view and policy for this pass (kf_culler/policy.py `selection`), or None when gpuOnly
        leaves it out (no GPU by its own policy's gpuResources); InputError when it is not a notebook at all."""
        meta: dict[str, Any] = nb["metadata"] if isinstance(nb.get("metadata"), dict) else {}
        ns = str(meta.get("namespace"))
        labels = None
        if self.namespace_labels is not None and self.settings.needs_namespace_labels:
            labels = self.namespace_labels(ns)
        problem = self.access_problem(ns) if self.access_problem is not None else None
        sel = selection(nb, pod, self.settings, namespace_labels=labels, node=self.node_for(pod),
                        access_problem=problem)
        if self.settings.operations.gpu_only and sel.view.gpus == 0:
            return None
        record = self._record_of(nb, now)  # after gpuOnly: a notebook left out gets no record
        deadline = self.settings.operations.stop_deadline_seconds
        return replaced(sel, view=replaced(sel.view, record=record, stop_deadline_seconds=deadline))

    def selection_context(self, namespace: str, pod: dict[str, Any] | None) -> dict[str, Any]:
        """What the policy choice read besides the notebook and its pod, as a replay trace keeps it
        (kf_culler/replay/trace.py): `namespaceLabels` when rules read them, `node` (its GPU model label)."""
        out: dict[str, Any] = {}
        if self.namespace_labels is not None and self.settings.needs_namespace_labels:
            labels = self.namespace_labels(namespace)
            if labels is not None:
                out["namespaceLabels"] = dict(labels)
        model = node_gpu_model(self.node_for(pod))
        if model:
            out["node"] = {"metadata": {"labels": {GPU_MODEL_LABEL: model[0]}}}
        return out

    def in_scope(self, notebook: dict[str, Any]) -> bool:
        """The configuration's namespaces, and with shards, this replica's."""
        ns = str((notebook.get("metadata") or {}).get("namespace", ""))
        if not self.settings.operations.namespaces.selects(ns):
            return False
        return self.owns is None or self.owns(ns)

    def run(self, items: Iterable[Item], lean: bool = False) -> CycleResult:
        """One pass over the sessions `items` (each with its pod), in four phases: select (which sessions, under
        which policy, and what to ask about each), gather (the probes and bulk queries), judge (each verdict), act
        (the brakes, then the writes); its Events go out after the writes (kf_culler/kube/event_tail.py).

        `lean` (the service's passes, `Runner.loop`): the pass takes `items` over (a list, it empties once selected;
        or the runner's pairs, decoded one at a time as they are selected: kf_culler/kube/cache.py), lets
        go of what it gathered once judged, and of each session's objects, observations and probe calls once it
        acted on it; its results keep neither observations nor calls (`on_result` still sees them). What a pass
        holds at once is then what its act phase has not reached yet, not the whole pass's."""
        t0 = time.monotonic()
        started = self.clock()
        with self.tracer.start_as_current_span("kf_culler.cycle") as span:
            selection = self._select_all(items, started, lean)
            if lean and isinstance(items, list):
                items.clear()
            span.set_attribute("kf_culler.notebooks", len(selection.chosen))
            t_gather = time.monotonic()
            gathered = self._gather(selection, started, lean)
            t_apply = time.monotonic()
            now = self.clock()
            judged = self._judge_all(selection, gathered, now, lean)
            if lean:  # each Judged holds its own part
                selection.chosen.clear()
                selection.requests.clear()
                gathered.clear()
            braked = self._brake(judged, now)
            results, interrupted = self._act_all(judged, now, lean)
            span.set_attribute("kf_culler.interrupted", interrupted)
        t_end = time.monotonic()
        phases = {"select": t_gather - t0, "gather": t_apply - t_gather, "apply": t_end - t_apply}
        events = None
        if self.writer is not None:
            events = EventTail(self.writer, results, self.settings.operations.writes_in_flight, self.on_event,
                               self.resend)
            if not self.events_in_background:
                events.wait()
                phases["events"] = time.monotonic() - t_end
        return CycleResult(started, now, time.monotonic() - t0, results, gathered.bulk_queries, interrupted, phases,
                           braked, events, frozenset(gathered.slow))

    def _select_all(self, items: Iterable[Item], started: datetime, lean: bool = False) -> Selection:
        """Select: the sessions of this pass (in scope, chosen by a policy), the verdict of those that need no probe
        (stopped, exempt, ...), and what to ask about the others: a request each, or why its IDE is not probed.
        `lean`: each session chosen is held encoded, and its pod (`Chosen`)."""
        out = Selection()
        reader = items if isinstance(items, UnpackedPairs) else None
        for nb, pod in items:
            if not self.in_scope(nb):
                continue
            key = session_key(nb)  # (namespace, name); a Workspace's name is `Workspace/<name>`
            encoded = reader.encoded if reader is not None else None
            try:
                sel = self.select(nb, pod, started)
                if sel is None:
                    continue
                if encoded is not None and sel.view.pod is not pod:
                    encoded = (encoded[0], None)
                out.chosen.append(Chosen.of(nb, sel, lean, encoded))
                verdict = decide_view(sel.view, {}, sel.policy, started)
            except InputError as err:
                log.warning("skipping %s/%s: %s", *key, err)
                continue
            except Exception:  # a bug must cost this notebook, not the sweep
                log.exception("skipping %s/%s: deciding it failed", *key)
                continue
            if verdict.state in NO_PROBE_STATES:
                out.pre[key] = verdict
                continue
            out.requests.append(self._request(out, key, nb, pod, sel.view))
        return out

    def _request(self, out: Selection, key: SessionKey, nb: dict[str, Any], pod: dict[str, Any] | None,
                 view: SessionView) -> Request:
        """What the gather asks about one session: its IDE's source and URL by how its target is reached (none when
        the URL cannot be trusted, recorded in `out.untrusted`, or when its signal came with its listing, recorded
        in `out.carried`), and its GPU when it has one."""
        pod_name = ((pod or {}).get("metadata") or {}).get("name")
        source = SERVER_SOURCES.get(view.server_type)
        target = KINDS[view.kind]
        reach = target.reach  # how its target's IDE is reached
        if reach == "carried":  # its IDE signal came with its listing (Coder's): set after the gather
            out.carried[key] = (str(source), target.carried(nb))
            source, url, tampered = None, None, None  # never probed; the GPU is still asked
        elif reach == "endpoint":
            url, tampered = self._session_url(nb, view)
        elif reach == "workload":
            url, tampered = self._workload_url(nb, view, source)
        else:
            url, tampered = None, self._tampered(nb, source)
        if tampered is not None and source is not None:
            out.untrusted[key] = (str(source), tampered)
            source = None  # no IDE probe; the GPU is still asked
        return Request(key[0], key[1], pod_name, source, view.gpus > 0, url,
                       self._address(nb, view) if source is not None and reach != "carried" else None)

    def _address(self, nb: dict[str, Any], view: SessionView) -> tuple[str, str] | None:
        """(the Service's DNS name, its ClusterIP) of a session probed through its Service, for the gather to connect
        to the address the cache holds instead of looking the name up; the probe URL still decides whether it goes
        there (only a URL naming exactly that host is sent to the address). None: looked up in DNS as usual."""
        if self.service_address is None or not self.settings.operations.probe.service_cluster_ip:
            return None
        found = self.service_address(nb)
        if found is None:
            return None
        service, ip = found
        return service_host(service, str(view.namespace), self.settings.operations.cluster_domain), ip

    def _gather(self, selection: Selection, started: datetime, lean: bool = False) -> Gathered:
        """Gather: every request at once (kf_culler/gather.py), then what was known without a probe — an untrusted
        URL's reason, a carried signal — set as those sessions' observations. `lean`: each session's probe answer
        and calls kept encoded as they arrive (`Gathered.packed`)."""
        with self.tracer.start_as_current_span("kf_culler.gather") as gspan:
            requests = selection.requests
            wanted = proxied_namespaces(requests, self.settings.operations) if self.probe_auth else set()
            auth = self.probe_auth(wanted) if wanted and self.probe_auth is not None else None
            gathered = run_async(gather(requests, self.settings.operations, started, self.gpu,
                                        self.rstudio, self.slow, auth, pack=lean)) if requests else Gathered()
            for key, (source, why) in selection.untrusted.items():
                gathered.observations.setdefault(key, {})[source] = {
                    "error": f"not probed: {why}, so its answer could come from another host"}
            for key, (source, raw) in selection.carried.items():
                gathered.observations.setdefault(key, {})[source] = raw
            gspan.set_attribute("kf_culler.probed", len(requests))
            gspan.set_attribute("kf_culler.bulk_queries", gathered.bulk_queries)
        return gathered

    def _judge_all(self, selection: Selection, gathered: Gathered, now: datetime, lean: bool = False) -> list[Judged]:
        """Judge: each chosen session's verdict, from what the gather found or its pre-probe verdict. `lean`: each
        Judged holds its observations and calls encoded (`packed_found`)."""
        judged: list[Judged] = []
        for chosen in selection.chosen:
            sel = chosen.sel
            try:
                j = self._judge(chosen, selection.pre, gathered, now, lean)
            except Exception:  # isolate per notebook: one failure never stops the sweep
                log.exception("skipping %s/%s: deciding it failed", *sel.key)
                continue
            if j is not None:
                judged.append(j)
        return judged

    def _judge(self, chosen: Chosen, pre: dict[SessionKey, Verdict], gathered: Gathered, now: datetime,
               lean: bool = False) -> Judged | None:
        """The notebook's verdict from what the gather found (or from its pre-probe verdict)."""
        nb, sel = chosen.session, chosen.selected()
        view, key = sel.view, sel.key
        observations, calls = gathered.found(key)
        if self.on_observed is not None and key not in pre:
            self.on_observed(now, unpacked(nb), view.pod, observations, self.selection_context(key[0], view.pod))
        try:
            verdict = pre.get(key) or decide_view(view, observations, sel.policy, now)
        except InputError as err:
            log.warning("skipping %s/%s: %s", *key, err)
            return None
        verdict = replaced(verdict, policy_rule=sel.policy_rule)
        found: Found | bytes = (observations, calls)
        if lean and (observations or calls):  # as the gather encoded them when nothing was added to them
            held = gathered.packed.get(key)
            found = held if held is not None and key not in gathered.observations else packed_found(observations, calls)
        return Judged(nb, chosen.sel, verdict, found, pod=chosen.pod, pod_uid=uid_of(view.pod) if view.pod else None)

    def _brake(self, judged: list[Judged], now: datetime) -> Outcome | None:
        """The brakes over the whole pass's verdicts (kf_culler/brakes.py): held and deferred stops, and
        deferred warnings, become keeps that say why."""
        if self.brakes is None:
            return None
        owners = {ns: self.owner_of(ns) for ns in {j.sel.key[0] for j in judged}}  # one look-up a namespace
        seen = [Seen(j.sel.key[0], j.sel.key[1], j.sel.view.pod_start is not None, j.sel.view.gpus > 0,
                     j.verdict.state, self._brake_action(j), j.verdict.stop_at,
                     fairness_key(j.sel.key, owners[j.sel.key[0]]))
                for j in judged]
        outcome = apply_brakes(seen, self.brake_state, self.brakes, now, self.released_at)
        for j in judged:
            key, v = j.sel.key, j.verdict
            if key in outcome.held_stops:
                why = (f"Stop held: the culler holds every stop for now, because {outcome.why}, which looks "
                       "like a fault of a metrics source rather than of the notebooks.")
            elif key in outcome.deferred_stops:
                why = f"Stop deferred to the next pass: at most {self.brakes.max_stops_per_pass} stops per pass."
            elif key in outcome.deferred_warnings:
                why = (f"Warning deferred to the next pass: at most {self.brakes.max_warnings_per_pass} "
                       "warnings per pass.")
            else:
                continue
            j.held, j.why = frozenset({v.action}), why
            j.verdict = j.restrain(v)
        return outcome

    def owner_of(self, namespace: str) -> str | None:
        """The namespace's owner (`namespace_owner`), None when unknown or not looked up."""
        return self.namespace_owner(namespace) if self.namespace_owner is not None else None

    @staticmethod
    def _brake_action(j: Judged) -> str:
        """The verdict's action as the brakes count it: a warning the culler already gave this idle period
        (its own record) is no new warning, and is never capped."""
        v = j.verdict
        if v.action == "warn" and warned_this_period(j.sel.view.record, v.idle_since):
            return "keep"
        return v.action

    def _act_all(self, judged: list[Judged], now: datetime, lean: bool = False) -> tuple[list[NotebookResult], bool]:
        """Plan and write every judged notebook, with at most `writesInFlight` writes at once; results in the
        pass's order. In chunks that each hold at most CHUNK_PER_WRITER x writesInFlight notebooks whose stop,
        warning or restart must have its record stored before its patch: a chunk's records are stored all at
        once (`_store_rows`, one patch per bucket), then its notebooks are written, then the records whose patch
        did not land are taken back. The next chunk's records are stored while this chunk's notebooks are
        written, so a culler killed mid-pass leaves at most two chunks' records ahead of their patches. A stop
        request (SIGTERM) ends the pass between notebooks, and takes back the records stored ahead. `lean`
        (`run`): `judged` is emptied, and each notebook let go of once acted on (`_act_chunk`)."""
        workers = self.settings.operations.writes_in_flight if self.writer is not None else 1
        size = max(1, workers * CHUNK_PER_WRITER)
        plans = self._plan_all(judged, now)
        changes = self._before_changes(judged, plans)
        chunks = _chunks(judged, lambda j: j.sel.key in changes, size)
        if lean:
            judged.clear()
        results: list[NotebookResult] = []
        pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="write") if workers > 1 else None
        ahead = ThreadPoolExecutor(max_workers=1, thread_name_prefix="records-ahead")

        def store(chunk: list[Judged]) -> Future[dict[tuple[str, str], RecordChange]]:
            return ahead.submit(self._store_rows, {j.sel.key: changes[j.sel.key] for j in chunk
                                                   if j.sel.key in changes})

        try:
            upcoming = store(chunks[0]) if chunks else None
            for i, chunk in enumerate(chunks):
                assert upcoming is not None
                stored = upcoming.result()
                upcoming = store(chunks[i + 1]) if i + 1 < len(chunks) and not self.stop_flag.is_set() else None
                found, interrupted = self._act_chunk(chunk, now, pool, stored, plans, lean)
                results += found
                if interrupted:
                    if upcoming is not None:  # stored, never written: taken back
                        kept = upcoming.result()
                        self._undo_all([self._restore(j.nb, j.sel.view) for j in chunks[i + 1]
                                        if kept.get(j.sel.key) not in (None, _NOT_STORED)])
                    return results, True
        finally:
            ahead.shutdown()
            if pool is not None:
                pool.shutdown()
        return results, False

    def _act_chunk(self, judged: list[Judged], now: datetime, pool: ThreadPoolExecutor | None,
                   stored: dict[tuple[str, str], RecordChange], plans: dict[int, Plan], lean: bool = False
                   ) -> tuple[list[NotebookResult], bool]:
        """One chunk of `_act_all`, its records stored (`stored`): write, then take back what did not land. Only the
        notebooks with something to write go to the writers' threads; the others (most of a pass: nothing to
        write) are traced and reported on this one, while the writes are in flight. `lean`: the chunk's list is
        emptied, each notebook let go of (its objects, observations and plan) once acted on, and each result gives
        up its observations and probe calls once reported (`on_result`)."""
        interrupted = False
        context = otel_context.get_current()
        undo: list[tuple[str, str, str, CullerRecord | None]] = []
        settled: set[tuple[str, str]] = set()  # pre-stored records whose patch was sent (or refused) and checked
        keys = [j.sel.key for j in judged]
        # What takes back a record stored ahead for this chunk if its patch is not sent (read before any goes).
        restores = {key: self._restore(j.nb, j.sel.view) for key, j in zip(keys, judged, strict=True)
                    if stored.get(key) not in (None, _NOT_STORED)}
        todo: list[Judged | None] = list(judged)
        if lean:
            judged.clear()

        def act(i: int) -> NotebookResult | None:
            j = todo[i]
            assert j is not None
            token = otel_context.attach(context)  # the notebook's span under the pass's, from any thread
            try:
                if self.stop_flag.is_set():
                    return None
                result = self._act(j, now, stored.get(j.sel.key), undo, settled, plans.get(id(j)))
                if lean:
                    result.observations, result.calls = {}, []
                return result
            except Exception:  # isolate per notebook: one failure never stops the sweep
                log.exception("skipping %s/%s: its pass failed", *j.sel.key)
                return None
            finally:
                otel_context.detach(token)
                if lean:
                    plans.pop(id(j), None)
                    todo[i] = None

        if pool is None:
            found = []
            for i in range(len(todo)):
                if self.stop_flag.is_set():
                    interrupted = True
                    break
                found.append(act(i))
        else:
            writes = {i: pool.submit(act, i) for i, j in enumerate(todo) if j is not None
                      and _writes(plans.get(id(j)))}
            found = [writes[i].result() if i in writes else act(i) for i in range(len(todo))]
            interrupted = self.stop_flag.is_set()
        for key in keys:
            if key in restores and key not in settled:
                undo.append(restores[key])
        self._undo_all(undo)
        return [r for r in found if r is not None], interrupted

    def _plan_all(self, judged: list[Judged], now: datetime) -> dict[int, Plan]:
        """By `id` of each judged notebook, its plan without the trace id a stop's marks carry (added when it is
        written): an empty one when the brakes hold it; none when planning it failed (its own `_act` reports why)."""
        step = self.settings.operations.last_activity_step_minutes
        out: dict[int, Plan] = {}
        for j in judged:
            try:
                out[id(j)] = Plan({}) if j.held else plan(j.planned_view(), j.verdict, now, step)
            except Exception:
                continue
        return out

    def _before_changes(self, judged: list[Judged], plans: Mapping[int, Plan]
                        ) -> dict[tuple[str, str], tuple[RecordChange, tuple[str, str, str, CullerRecord | None]]]:
        """Every record change of the pass that must be kept before its notebook's patch (kf_culler/record.py
        `before_patch`), with the row that stores it, by notebook. Stored per chunk (`_store_rows`): one each,
        in the writers' threads, a storm's 7,000 stop records were 7,000 patches of the same 16 ConfigMaps."""
        if self.writer is None or self.records is None or self.settings.operations.dry_run:
            return {}
        wanted: dict[tuple[str, str], tuple[RecordChange, tuple[str, str, str, CullerRecord | None]]] = {}
        uids: set[str] = set()
        for j in judged:
            view = j.sel.view
            if j.held or j.sel.key in wanted or not self._may_store(str(view.namespace)):
                continue
            planned = plans.get(id(j))
            if planned is None:  # this notebook's own pass reports it
                continue
            change = planned.record
            if change is None or not change.before_patch or planned.empty:
                continue
            uid = (j.nb.get("metadata") or {}).get("uid")  # read last: a lean pass decodes the notebook for it
            if not isinstance(uid, str) or uid in uids:
                continue  # a notebook seen twice (a namespace listed twice) is stored the usual way
            uids.add(uid)
            wanted[j.sel.key] = (change, (uid, str(view.namespace), str(view.name), change.record))
        return wanted

    def _store_rows(self, wanted: Mapping[tuple[str, str], tuple[RecordChange, tuple[str, str, str,
                                                                                    CullerRecord | None]]]
                    ) -> dict[tuple[str, str], RecordChange]:
        """Store the changes (`_before_changes`) of one chunk in one patch per record bucket; the changes stored,
        by notebook (`_NOT_STORED`: its bucket's patch failed, and the notebook is not written)."""
        if not wanted or self.records is None:
            return {}
        done = self.records.put_many([row for _change, row in wanted.values()])
        return {key: change if row[0] in done else _NOT_STORED for key, (change, row) in wanted.items()}

    @staticmethod
    def _restore(nb: dict[str, Any], view: SessionView) -> tuple[str, str, str, CullerRecord | None]:
        """The record as the pass read it, to store back over one recorded before a patch that did not land."""
        return str((nb.get("metadata") or {}).get("uid")), str(view.namespace), str(view.name), view.record

    def _undo_all(self, undo: list[tuple[str, str, str, CullerRecord | None]]) -> None:
        """Store back, in one patch per bucket, the records of stops and warnings whose patch did not land; what
        cannot be stored now goes with the pass's deferred writes (retried by every flush)."""
        if not undo or self.records is None:
            return
        done = self.records.put_many(undo)
        for uid, namespace, name, record in undo:
            if uid not in done:
                self.records.defer(uid, namespace, name, record)

    def _tampered(self, nb: dict[str, Any], source: str | None) -> str | None:
        """Why the probe must not go through the notebook's Service (a user may point it anywhere), or None.
        Checked only when the probe URL template goes through the Service (the default templates do)."""
        if self.service_problem is None or source is None:
            return None
        template = template_for(self.settings.operations, source)
        if template is None or "{name}.{namespace}.svc" not in template:
            return None
        return self.service_problem(nb)

    def _session_url(self, nb: dict[str, Any], view: SessionView) -> tuple[str | None, str | None]:
        """(the IDE's base URL, None) of a session whose target gives its endpoint (a Workspace), or (None, why
        it is not probed). Built only from the admin's `urls.workspace` template and names the API server keeps
        (the Service the Workspace controls, the WorkspaceKind's port): never from what the user writes."""
        if self.endpoint is None:
            return None, "the culler does not read this kind's endpoints"
        found = self.endpoint(nb)
        if isinstance(found, str):
            return None, found
        service, port, path = found
        ns, name = str(view.namespace), str(view.name)
        if not all(DNS_LABEL.match(x) for x in (ns, name, service)):
            return None, "its names are not DNS labels"
        template = self.settings.operations.urls.workspace
        return template.format(service=service, namespace=ns, name=name, port=port, path=path,
                               clusterDomain=self.settings.operations.cluster_domain), None

    def _workload_url(self, nb: dict[str, Any], view: SessionView,
                      source: str | None) -> tuple[str | None, str | None]:
        """(the IDE's base URL, None) of a plain workload, from `urls.workload` and its namespace and name, or
        (None, why it is not probed): through the Service `<name>` only when it selects the workload's pods."""
        template = self.settings.operations.urls.workload
        url = url_for(template, str(view.namespace), str(view.name), self.settings.operations.cluster_domain)
        if url is None:
            return None, "its names are not DNS labels"
        if source is not None and self.service_problem is not None and "{name}.{namespace}.svc" in template:
            problem = self.service_problem(nb)
            if problem is not None:
                return None, problem
        return url, None

    def _record_of(self, nb: dict[str, Any], now: datetime) -> CullerRecord | None:
        """The culler's record of the notebook's uid; for a notebook it has none of, while its namespace's import
        is not yet done (kf_culler/kube/records.py `import_due`), the one-time import of the old marks
        (kf_culler/record.py `imported`), stored with the pass's other deferred record writes."""
        if self.records is None:
            return None
        meta: dict[str, Any] = nb["metadata"] if isinstance(nb.get("metadata"), dict) else {}
        uid = meta.get("uid")
        if not isinstance(uid, str) or not uid:
            return None
        found = self.records.get(uid)
        if found is not None:
            return found
        if not target_of(nb).old_marks:  # the old marks were only ever written on Notebooks
            return None
        ann = meta.get("annotations")
        old = imported(ann, now) if isinstance(ann, dict) and self.records.import_due(str(meta.get("namespace"))) \
            else None
        if old is not None and self._may_store(str(meta.get("namespace"))):
            self.records.defer(uid, str(meta.get("namespace")), str(meta.get("name")), old)
        return old

    def _may_store(self, ns: str) -> bool:
        return (self.writer is not None and not self.settings.operations.dry_run and self.may_write()
                and (self.owns is None or self.owns(ns)))

    def _stores(self, view: SessionView, change: RecordChange | None) -> bool:
        """Whether `_store_record` stores this change before its patch (rather than deferring or skipping it)."""
        return (change is not None and change.before_patch and self.records is not None
                and self._may_store(str(view.namespace)))

    def _store_record(self, nb: dict[str, Any], view: SessionView, change: RecordChange | None) -> bool:
        """Keep a record change (rule 15): a stop's or a restart's now, before the patch it records (False: it
        could not be stored, and the patch must wait); others with the pass's deferred writes."""
        uid = (nb.get("metadata") or {}).get("uid")
        if change is None or self.records is None or not isinstance(uid, str):
            return True
        if not self._may_store(str(view.namespace)):
            return True
        if not change.before_patch:
            self.records.defer(uid, str(view.namespace), str(view.name), change.record)
            return True
        return self.records.put(uid, str(view.namespace), str(view.name), change.record)

    def _landed(self, result: NotebookResult) -> bool:
        """Whether a stop or a warning recorded before its patch was written (re-planned after a 409, it may
        no longer stop or warn); anything else needs no undo."""
        change = result.plan.record if result.plan is not None else None
        write = result.write
        if change is None or self.records is None or write is None or not change.before_patch:
            return True
        mark = {"stop": STOP_ANNOTATION, "warn": WARNED_AT_ANNOTATION}.get(result.verdict.action)
        if mark is None:
            return True
        return write.outcome == "patched" and write.plan is not None and write.plan.annotations.get(mark) is not None

    def _span(self, name: str) -> AbstractContextManager[trace.Span | None]:
        """A span of this name under the current one when spans leave the process (`spans_exported`), else none."""
        return self.tracer.start_as_current_span(name) if self.spans_exported else nullcontext(None)

    def _act(self, j: Judged, now: datetime, stored: RecordChange | None = None,
             undo: list[tuple[str, str, str, CullerRecord | None]] | None = None,
             settled: set[tuple[str, str]] | None = None, planned: Plan | None = None) -> NotebookResult:
        """Trace, plan and write one judged notebook (writes only when this culler writes). `stored`: the record
        change `_store_rows` stored for it (`_NOT_STORED`: it could not be); a stop or warning recorded but not
        written goes on `undo`, and the notebook on `settled` once that is checked."""
        sel, verdict, (observations, calls) = j.sel, j.verdict, j.found_now()
        view, policy = j.planned_view(), sel.policy
        ns, name = sel.key
        stype = view.server_type
        with self._span("kf_culler.session") as span:
            if span is not None:
                span.set_attributes({"k8s.namespace.name": ns, "kf_culler.session": name,
                                     "kf_culler.server_type": stype})
                source = SERVER_SOURCES.get(stype, stype)
                for call in calls:
                    _probe_span(self.tracer, call, source)
            context = (span or trace.get_current_span()).get_span_context()  # the pass's trace, either way
            trace_id = _trace_text(context.trace_id) if context.is_valid else None
            if span is not None:
                span.set_attributes({
                    "kf_culler.action": verdict.action, "kf_culler.state": verdict.state,
                    "kf_culler.rule": verdict.rule_id, "kf_culler.reason": verdict.reason,
                    "kf_culler.idle_seconds": verdict.idle_seconds or 0.0, "kf_culler.gpus": view.gpus})
            result = NotebookResult(ns, name, stype, view.gpus, verdict, observations, calls, trace_id=trace_id,
                                    record=view.record, policy=policy, pod_uid=j.pod_uid)
            step = self.settings.operations.last_activity_step_minutes
            # Held or deferred by the brakes: nothing is written this pass (no mark taken back, no record).
            # An empty plan (`_plan_all`'s) is whole; one with writes is made again with the trace id for its marks.
            result.plan = Plan({}) if j.held else planned if planned is not None and planned.empty \
                else plan(view, verdict, now, step, trace_id)
            # The notebook itself only where something is kept or written (a lean pass holds it encoded).
            nb = j.nb if not result.plan.empty or result.plan.record is not None else {}
            if result.plan.empty:
                self._store_record(nb, view, result.plan.record)  # e.g. runningSince, with nothing to patch
            if self.writer is not None and not self.settings.operations.dry_run and not result.plan.empty:
                with self._span("kf_culler.apply") as aspan:
                    def replan(fresh: dict[str, Any]) -> Plan:
                        pod = view.pod if j.pod is None else decoded(j.pod)
                        fresh_view = dataclasses.replace(
                            SessionView.of(fresh, pod, policy, record=view.record, access_problem=view.access_problem),
                            gpu_models=view.gpu_models, stop_deadline_seconds=view.stop_deadline_seconds)
                        return plan(fresh_view, j.restrain(decide_view(fresh_view, observations, policy, now)), now,
                                    step, trace_id)

                    owns, may_write = self.owns, self.may_write

                    def allowed() -> bool:
                        return may_write() and (owns is None or owns(ns))

                    recorded = False  # whether this pass stored a record for this patch (to take back)
                    if stored is _NOT_STORED:
                        ok = False
                    elif stored is not None and stored == result.plan.record:
                        ok = recorded = True  # stored with the chunk's others (`_store_rows`)
                    else:  # no change stored before (or, never expected, another one): stored now
                        recorded = self._stores(view, result.plan.record)
                        ok = self._store_record(nb, view, result.plan.record)
                        recorded = recorded and ok
                    if ok:
                        result.write = self.writer.apply(nb, result.plan, replan, now, allowed, defer_event=True)
                        if recorded and not self._landed(result):
                            restore = self._restore(nb, view)
                            if undo is not None:
                                undo.append(restore)
                            elif self.records is not None:
                                self.records.put(*restore)
                        if settled is not None:
                            settled.add(sel.key)
                        reclaim = result.write.plan.reclaim if result.write.plan is not None else None
                        if reclaim is not None and result.write.outcome == "patched":
                            result.reclaim = self.writer.reclaim(ns, reclaim, allowed)
                    else:
                        result.write = WriteResult("failed", plan=result.plan,
                                                   error="the culler's record could not be stored; not written")
                    if aspan is not None:
                        aspan.set_attributes({"kf_culler.write": result.write.outcome,
                                              "kf_culler.conflicts": result.write.conflicts,
                                              "kf_culler.event": result.write.event or "none"})
                    if self.notifier is not None:
                        self.notifier.offer_result(result, policy.max_extend_minutes,  # before it goes
                                                   fairness_key(sel.key, self.owner_of(ns)))
                    if self.on_written is not None and result.write.notebook is not None:
                        self.on_written(result.write.notebook)
                        result.write.notebook = None
            if self.on_result is not None:
                self.on_result(result)
            return result


# Notebooks per write worker in one chunk of a pass's writes (`Cycle._act_all`).
CHUNK_PER_WRITER = 16


def _chunks(items: list[Judged], counts: Callable[[Judged], bool], size: int) -> list[list[Judged]]:
    """`items` in order, cut so that each piece holds at most `size` of those `counts` says (and the ones between
    them): a pass's 10,000 notebooks with 7,000 stops are 28 chunks of 256 stops, not 40 of 256 notebooks."""
    out: list[list[Judged]] = []
    current: list[Judged] = []
    counted = 0
    for item in items:
        if counts(item):
            if counted == size:
                out.append(current)
                current, counted = [], 0
            counted += 1
        current.append(item)
    if current:
        out.append(current)
    return out
# A before-patch record change that could not be stored: its notebook is not written this pass.
_NOT_STORED = RecordChange(CullerRecord(), before_patch=True)


def _writes(planned: Plan | None) -> bool:
    """Whether a notebook's `_act` may write, so it goes to a writer's thread: its plan has writes, or planning it
    failed (its `_act` plans again and reports why)."""
    return planned is None or not planned.empty


@functools.lru_cache(maxsize=4)
def _trace_text(trace_id: int) -> str:
    """A trace id as results, annotations and Events show it: one string for every session of a pass (they share
    the pass's trace without an exporter), not 10,000 equal ones held by a pass's results."""
    return format(trace_id, "032x")


def _probe_span(tracer: trace.Tracer, call: Call, source: str) -> None:
    end = time.time_ns()
    start = end - int(call.seconds * 1e9)
    span = tracer.start_span("kf_culler.probe", start_time=start)
    span.set_attributes({"kf_culler.source": source, "url.full": call.url,
                         "http.response.status_code": call.status or 0,
                         "kf_culler.attempts": call.attempts, "kf_culler.probe_error": call.error or ""})
    span.end(end_time=end)
