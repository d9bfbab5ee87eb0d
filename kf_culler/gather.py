"""Gather: ask each notebook's sources concurrently, within bounds, and return plain observations.

Probe URLs are built only from the notebook's namespace and name and the admin's URL templates;
no annotation or other user-editable field ever reaches a URL.

With `probe.authProxy` on, the probes built from the `urls.jupyter` and `urls.codeServer` templates (a
Notebook's, never a Workspace's or a workload's, whose URL comes from their own templates) go through a
fetcher of their namespace's that adds that namespace's prober token (kf_culler/kube/prober.py): the token of a
request's namespace, chosen by the request's namespace, and no other; no other fetcher ever holds one.
"""

from __future__ import annotations

import asyncio
import marshal
import re
from collections.abc import Awaitable, Callable, Mapping, Sequence, Set
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from kf_culler.config import Operations
from kf_culler.ide import IDE_KINDS
from kf_culler.kube.prober import ProxyAuth
from kf_culler.sources import codeserver, jupyter
from kf_culler.sources.bulk import Answers, BulkSource
from kf_culler.sources.http import Call, Fetcher

DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
Key = tuple[str, str]


@dataclass(slots=True)
class Request:
    """What the gather asks about one session (a pass holds one for each of its sessions at once)."""

    namespace: str
    name: str
    pod: str | None
    source: str | None  # "jupyter" | "codeServer" | "rstudio" | None
    gpu: bool
    # The IDE's base URL when the session's target gives it (a Workspace: its own Service's port and path,
    # kf_culler/targets/), built from objects the user cannot point elsewhere; None: the `urls` template.
    url: str | None = None
    # (the DNS name of the Service it is probed through, that Service's ClusterIP from the watch cache): a probe
    # URL naming that host connects to the address instead of looking the name up (`probe.serviceClusterIP`).
    address: tuple[str, str] | None = None


SLOW_SECONDS = 1.0  # a notebook whose probes took longer gets a worker of the slow set next pass


# A session's observations (by source) and the calls its probes made.
Found = tuple[dict[str, Any], list[Call]]


def packed_found(observations: dict[str, Any], calls: list[Call]) -> Found | bytes:
    """Observations and calls as a lean pass holds them: one `marshal` bytes, a fraction of the memory of the
    decoded answers (`unpacked_found` decodes it); as they are when something in them cannot be encoded."""
    try:
        return marshal.dumps((observations, [(c.url, c.status, c.seconds, c.attempts, c.error) for c in calls]))
    except ValueError:
        return observations, calls


def unpacked_found(found: Found | bytes) -> Found:
    if not isinstance(found, bytes):
        return found
    observations, calls = marshal.loads(found)
    return observations, [Call(*c) for c in calls]


@dataclass
class Gathered:
    """What the gather found, by session: its observations and probe calls; with `packed` (a lean pass) each probed
    session's probe answer and calls are kept encoded as they arrive (`packed_found`), and `observations` holds
    only the rest (bulk answers, what the cycle sets). `found` reads a session's, either way."""

    observations: dict[Key, dict[str, Any]] = field(default_factory=dict)
    calls: dict[Key, list[Call]] = field(default_factory=dict)
    bulk_queries: int = 0
    slow: set[Key] = field(default_factory=set)  # notebooks whose probes took over SLOW_SECONDS
    packed: dict[Key, bytes] = field(default_factory=dict)

    def found(self, key: Key) -> Found:
        """The session's observations and probe calls (empty when it was not probed)."""
        held = self.packed.get(key)
        if held is None:
            return self.observations.get(key, {}), self.calls.get(key, [])
        observations, calls = unpacked_found(held)
        return {**observations, **self.observations.get(key, {})}, calls

    def clear(self) -> None:
        """Let go of every session's observations and calls (a lean pass, once it judged them)."""
        self.observations.clear()
        self.calls.clear()
        self.packed.clear()


def split_slow(requests: Sequence[Request], slow: Set[Key]) -> tuple[list[Request], list[Request]]:
    """(requests of notebooks that were slow last pass, the others), each in its own order."""
    first = [r for r in requests if (r.namespace, r.name) in slow]
    return first, [r for r in requests if (r.namespace, r.name) not in slow]


def service_host(service: str, namespace: str, cluster_domain: str) -> str:
    """A Service's DNS name, as cluster DNS answers it and as the default URL templates spell it."""
    return f"{service}.{namespace}.svc.{cluster_domain}"


def url_for(template: str, namespace: str, name: str, cluster_domain: str) -> str | None:
    """The probe URL, or None when the names are not plain DNS labels (they never reach a URL then)."""
    if not DNS_LABEL.match(namespace) or not DNS_LABEL.match(name):
        return None
    return template.format(name=name, namespace=namespace, clusterDomain=cluster_domain)


# The probe of each IDE kind probed by URL (kf_culler/ide.py `url_key`), by its source.
PROBES: dict[str, Callable[[Fetcher, str], Awaitable[tuple[dict[str, Any], list[Call]]]]] = {
    "jupyter": jupyter.probe, "codeServer": codeserver.probe}
_BY_SOURCE = {k.source: k for k in IDE_KINDS}
# The IDE kinds read from a bulk source instead (RStudio, through Prometheus): `gather`'s `rstudio` source.
BULK_IDE_SOURCES: tuple[str, ...] = tuple(k.source for k in IDE_KINDS if k.url_key is None)


def template_for(ops: Operations, source: str | None) -> str | None:
    """The URL template of an IDE source, when that IDE is probed by URL."""
    kind = _BY_SOURCE.get(source or "")
    return ops.urls.template_for(kind.url_key) if kind is not None else None


# By namespace, the fetcher for that namespace's kube-rbac-proxy URLs (probe.authProxy, holding its prober token),
# or why there is none this pass.
Proxied = Mapping[str, Fetcher | str] | None


def through_proxy(req: Request, ops: Operations) -> bool:
    """Whether req's probes go through the workbench's kube-rbac-proxy with its namespace's prober token."""
    return ops.probe.auth_proxy.enabled and req.url is None and template_for(ops, req.source) is not None \
        and req.source in PROBES and DNS_LABEL.match(req.namespace) is not None


def proxied_namespaces(requests: Sequence[Request], ops: Operations) -> set[str]:
    """The namespaces this pass needs a prober token for."""
    return {r.namespace for r in requests if through_proxy(r, ops)}


async def _probe_one(fetcher: Fetcher, ops: Operations, req: Request,
                     proxied: Proxied = None) -> tuple[dict[str, Any] | None, list[Call]]:
    template = template_for(ops, req.source)
    probe = PROBES.get(req.source or "")
    if template is None or probe is None:
        return None, []
    url = req.url or url_for(template, req.namespace, req.name, ops.cluster_domain)
    if url is None:
        return {"error": "the notebook's name or namespace is not a DNS label; not probed"}, []
    if req.url is None and ops.probe.auth_proxy.enabled:  # the admin's template: the workbench's proxy
        own = proxied.get(req.namespace) if proxied is not None else None  # this namespace's token, no other
        if not isinstance(own, Fetcher):
            return {"error": f"probe.authProxy: {own or 'no prober token'}; not probed"}, []
        fetcher = own
    return await probe(fetcher, url)


# What one session's probes found (its answer under its source, or nothing), as the gather keeps it (encoded with
# `pack`), and whether they took over SLOW_SECONDS.
ProbeResult = tuple[Found | bytes, bool]
_NOTHING: ProbeResult = (({}, []), False)


def _kept(req: Request, answer: dict[str, Any] | None, calls: list[Call], pack: bool) -> ProbeResult:
    observations = {req.source or "": answer} if answer is not None else {}
    slow = sum(c.seconds for c in calls) > SLOW_SECONDS
    return (packed_found(observations, calls) if pack else (observations, calls)), slow


async def _probe_all(fetcher: Fetcher, ops: Operations, reqs: Sequence[Request],
                     proxied: Proxied = None, pack: bool = False) -> list[ProbeResult]:
    """Probe every request, `ops.concurrency` at a time, answers in the order asked; `pack`: each kept encoded
    from the moment it is complete (`packed_found`).

    A fixed set of workers takes the next notebook when it is done with one: 10,000 notebooks cost
    `concurrency` tasks, not 10,000 tasks waiting on a semaphore (memory and scheduling).
    """
    results: list[ProbeResult] = [_NOTHING] * len(reqs)
    todo = iter(enumerate(reqs))

    async def worker() -> None:
        for i, req in todo:  # shared iterator: each notebook goes to exactly one worker
            answer, calls = await _probe_one(fetcher, ops, req, proxied)
            results[i] = _kept(req, answer, calls, pack)

    await asyncio.gather(*(worker() for _ in range(min(ops.concurrency, len(reqs)))))
    return results


async def _probe_split(fetcher: Fetcher, ops: Operations, reqs: Sequence[Request],
                       slow: Set[Key], proxied: Proxied = None, pack: bool = False) -> list[ProbeResult]:
    """`_probe_all`, with the notebooks that were slow last pass in a second set of workers of their own
    (at most `concurrency`): a hanging endpoint holds its worker for the whole probe budget, and 500
    of them would otherwise hold nearly every worker while the answering notebooks wait."""
    slow_reqs, others = split_slow(reqs, slow)
    if not slow_reqs:
        return await _probe_all(fetcher, ops, reqs, proxied, pack)
    got_slow, got_others = await asyncio.gather(_probe_all(fetcher, ops, slow_reqs, proxied, pack),
                                                _probe_all(fetcher, ops, others, proxied, pack))
    by_key = {(r.namespace, r.name): res for r, res in zip(slow_reqs + others, got_slow + got_others, strict=True)}
    return [by_key[(r.namespace, r.name)] for r in reqs]


async def gather(requests: Sequence[Request], ops: Operations, now: datetime,
                 gpu: BulkSource | None = None, rstudio: BulkSource | None = None,
                 slow: Set[Key] = frozenset(), auth: Mapping[str, ProxyAuth] | None = None,
                 pack: bool = False) -> Gathered:
    """Observations of every request; `slow`: the notebooks slow to answer last pass (`_probe_split`); `auth`: by
    namespace, this pass's prober token and TLS context when `probe.authProxy` is on (a namespace without one:
    its probes report why not); `pack` (a lean pass): each session's probe answer and calls kept encoded from the
    moment they are complete (`Gathered.packed`), so the gather holds decoded only the answers in flight."""
    out = Gathered()
    fetcher = Fetcher.open(ops.probe, ops.concurrency,
                           addresses=dict(r.address for r in requests if r.address is not None))
    by_namespace: dict[str, Fetcher | str] = {}
    if ops.probe.auth_proxy.enabled:
        for ns in proxied_namespaces(requests, ops):
            got = (auth or {}).get(ns)
            if got is not None and got.header is not None and got.error is None:
                by_namespace[ns] = fetcher.sibling(got.header, got.tls)
            else:
                by_namespace[ns] = (got.error if got is not None else None) or "no prober token"
    proxied: Proxied = by_namespace
    try:
        http_reqs = [r for r in requests if r.source in PROBES]
        wanted: list[tuple[str, BulkSource | None, list[Request]]] = [
            ("gpu", gpu, [r for r in requests if r.pod and r.gpu]),
            *((source, rstudio, [r for r in requests if r.pod and r.source == source]) for source in BULK_IDE_SOURCES),
        ]
        bulk_reqs = [(name, src, reqs) for name, src, reqs in wanted if src is not None and reqs]
        bulk_calls = [asyncio.to_thread(_bulk, src, [(r.namespace, r.pod or "") for r in reqs], now)
                      for _, src, reqs in bulk_reqs]
        probe_results, bulk_results = await asyncio.gather(
            _probe_split(fetcher, ops, http_reqs, slow, proxied, pack),
            asyncio.gather(*bulk_calls),
        )
        for r, (found, took_long) in zip(http_reqs, probe_results, strict=True):
            key = (r.namespace, r.name)
            if isinstance(found, bytes):
                out.packed[key] = found
            else:
                observations, out.calls[key] = found
                if observations:
                    out.observations.setdefault(key, {}).update(observations)
            if took_long:
                out.slow.add(key)
        probe_results.clear()
        for (name, _, reqs), (answers, queries) in zip(bulk_reqs, bulk_results, strict=True):
            out.bulk_queries += queries
            for r in reqs:
                out.observations.setdefault((r.namespace, r.name), {})[name] = answers.get(
                    (r.namespace, r.pod or ""), {"error": f"no {name} answer for pod {r.pod}"})
    finally:
        await fetcher.close()  # its siblings' connections too
    return out


def _bulk(src: BulkSource, pods: list[Key], now: datetime) -> tuple[Answers, int]:
    """One bulk query; a source that raises gives every pod an error instead of breaking the pass."""
    try:
        answers, queries = src.samples(pods, now)
        return answers, int(queries)
    except Exception as err:
        return {p: {"error": f"{type(err).__name__}: {err}"[:300]} for p in pods}, 0
