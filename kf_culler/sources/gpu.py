"""GPU samples per pod from dcgm-exporter series in Prometheus.

One range query covers every metric read (utilisation, memory, engine activity) of every GPU pod in
the cluster; the answer is split by metric and pod here, so a cycle makes one query whatever the
number of notebooks.

Which series are read: only those `prometheus.gpuSeriesSelector` admits (label matchers ANDed into the
query; by default `job=~".*dcgm.*"`, the admin's dcgm-exporter job), so a user's pod that publishes
`DCGM_FI_*` series through an annotation-driven scrape job is not read (docs/configuration.md, "GPU
series that users cannot forge").

Which pod a series names (`pod_identity`): dcgm-exporter puts `namespace`/`pod` on a GPU's series. When
Prometheus scrapes it without `honor_labels`, those collide with the target's own labels (the exporter's
own pod) and arrive as `exported_namespace`/`exported_pod` next to the target's `namespace`/`pod`. So:
a series carrying all four names the pod of its `exported_*` pair; a series carrying `namespace`/`pod`
and no `exported_*` label names that pod; any other series with a pod label (an `exported_*` label
without the target's pair, or half of a pair) is ambiguous: it is ignored and counted
(`PrometheusGpu.ambiguous`), never guessed.

Contested GPUs: two series that claim the same GPU of the same pod (namespace, pod, UUID or else GPU
index, MIG instance) with different values at one time stamp make that pod's answer
`{"error": "contested: ..."}` (no signal: never idle) naming both series' job and instance, for as long as
the contested time stamp is inside the look-back (`PrometheusGpu.contested` lists them). Equal values
(one exporter scraped twice) are one series.

A flood of series: each range query reads at most `prometheus.maxSeries` series (counted while the answer
streams in). Over it, the pass counts the series of each namespace it asks about and reads again only the
namespaces that fit, fewest series first, so a namespace with no more than maxSeries / (namespaces with
GPU series) series is always read whatever the others publish; a namespace left out answers an error
(no signal) until the gap is past the look-back (`PrometheusGpu.unread`).

Several GPUs in one pod (the combination): at each time stamp the pod's utilisation is the highest
utilisation of its GPUs and its memory is the highest memory use of its GPUs. If any one GPU works
(utilisation and memory both over the policy's thresholds) the pod shows work; it can also show work
when one GPU is utilised and another holds memory, which errs towards keeping a notebook. A GPU's
utilisation is the larger of `DCGM_FI_DEV_GPU_UTIL` and 100 × `DCGM_FI_PROF_GR_ENGINE_ACTIVE` (when
that series exists). Utilisation and memory are matched per GPU and time stamp: if any GPU of the pod
lacks one of the two at a time stamp, that time stamp is dropped for the pod.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from kf_culler.config import PrometheusSettings
from kf_culler.sources.prometheus import PromError, PrometheusClient, Series, TooManySeries, duration, error_for_all
from kf_culler.timeutil import format_epoch

UTIL = "DCGM_FI_DEV_GPU_UTIL"
MEMORY = "DCGM_FI_DEV_FB_USED"
ENGINE = "DCGM_FI_PROF_GR_ENGINE_ACTIVE"

Key = tuple[str, str]
GpuId = tuple[str, str, str]
# metric -> time -> value, for one GPU
GpuSeries = dict[str, dict[float, float]]


def pod_of(labels: Mapping[str, str]) -> Key | None:
    """(namespace, pod) of a dcgm-exporter series, in either label style; None for an unassigned GPU."""
    if labels.get("exported_pod"):
        ns, pod = labels.get("exported_namespace", ""), labels["exported_pod"]
    else:
        ns, pod = labels.get("namespace", ""), labels.get("pod", "")
    return (ns, pod) if ns and pod else None


def pod_identity(labels: Mapping[str, str]) -> Key | str | None:
    """The pod a dcgm-exporter series read through Prometheus names (the module's rule): (namespace, pod);
    None when it names none (a GPU no pod holds); a string saying why when the labels are ambiguous."""
    ns, pod = labels.get("namespace", ""), labels.get("pod", "")
    ens, epod = labels.get("exported_namespace", ""), labels.get("exported_pod", "")
    if ens or epod:
        if ens and epod and ns and pod:  # the target's pair (the exporter's pod) and the GPU's pair
            return (ens, epod)
        return "exported_namespace/exported_pod without the target's own namespace and pod"
    if ns and pod:
        return (ns, pod)
    if pod:
        return "pod without namespace"
    return None


def device_of(labels: Mapping[str, str]) -> tuple[str, str]:
    """What two series must share to claim the same GPU of a pod: UUID (else GPU index), MIG instance."""
    uuid = labels.get("UUID")
    return (f"UUID {uuid}" if uuid else f"gpu {labels.get('gpu', '')}", labels.get("GPU_I_ID", ""))


def series_name(labels: Mapping[str, str]) -> str:
    """A series as an admin finds its scrape target: its job and instance."""
    return f"job={labels.get('job', '')!r} instance={labels.get('instance', '')!r}"


def gpu_of(labels: Mapping[str, str]) -> GpuId:
    """A GPU's identity: node, device (UUID, else index) and MIG instance."""
    return (labels.get("Hostname", labels.get("instance", "")), labels.get("UUID") or labels.get("gpu", ""),
            labels.get("GPU_I_ID", ""))


def combine(gpus: Mapping[GpuId, GpuSeries]) -> list[tuple[float, float, float]]:
    """One pod's (time, utilPercent, memoryUsedMiB) points, per the module's combination rule."""
    times: set[float] = set()
    for series in gpus.values():
        times.update(series.get(UTIL, {}))
        times.update(series.get(MEMORY, {}))
    out = []
    for t in sorted(times):
        utils: list[float] = []
        mems: list[float] = []
        complete = True
        for series in gpus.values():
            u = series.get(UTIL, {}).get(t)
            m = series.get(MEMORY, {}).get(t)
            if u is None and m is None:
                continue  # this GPU has no sample at t at all
            if u is None or m is None:
                complete = False
                break
            engine = series.get(ENGINE, {}).get(t)
            utils.append(max(u, engine * 100.0) if engine is not None else u)
            mems.append(m)
        if complete and utils:
            out.append((t, max(0.0, max(utils)), max(0.0, max(mems))))
    return out


Point = tuple[float, float, float]  # (unix time, utilPercent, memoryUsedMiB)


def runs(points: Sequence[Point]) -> list[Point]:
    """The first and the last point of every run of equal values; a point alone stays.

    What the rules read of GPU samples (the first time, the latest sample, the last time the GPU
    worked under any threshold) is the same for these as for all the points, and an idle GPU's
    70-minute look-back becomes two samples instead of seventy.
    """
    kept: list[Point] = []
    last = len(points) - 1
    for i, p in enumerate(points):
        if i in (0, last) or points[i - 1][1:] != p[1:] or points[i + 1][1:] != p[1:]:
            kept.append(p)
    return kept


def answer(points: Sequence[Point], gpus: int, source: str) -> dict[str, Any]:
    """A pod's GPU answer: its samples (the ends of runs of equal values, `runs`) and how many points
    they stand for."""
    return {
        "samples": [{"time": format_epoch(t), "utilPercent": round(u, 3), "memoryUsedMiB": round(m, 3)}
                    for t, u, m in runs(points)],
        "points": len(points),
        "gpus": gpus,
        "source": source,
    }


class Split:
    """Series of several metrics split by pod: pod -> GPU -> metric -> time -> value (`pods`), the pods
    whose GPU two series claim with different values (`contested`: pod -> (latest such time, what)),
    and the series whose pod is ambiguous (`ambiguous`, the first one's reason in `ambiguous_example`)."""

    def __init__(self) -> None:
        self.pods: dict[Key, dict[GpuId, GpuSeries]] = {}
        self.contested: dict[Key, tuple[float, str]] = {}
        self.ambiguous = 0
        self.ambiguous_example = ""


def _conflict(group: Sequence[Series]) -> tuple[float, str, str] | None:
    """The latest time stamp at which two series of `group` have different values, and who they are
    (their job and instance first: an answer's error is read up to 300 characters)."""
    seen: dict[float, tuple[float, int]] = {}
    found: tuple[float, int, float, int, float] | None = None
    for i, series in enumerate(group):
        for t, v in series.points:
            first = seen.setdefault(t, (v, i))
            if first[0] != v and (found is None or t > found[0]):
                found = (t, first[1], first[0], i, v)
    if found is None:
        return None
    t, a, va, b, vb = found
    return t, f"{series_name(group[a].labels)} ({va:g}) and {series_name(group[b].labels)} ({vb:g})", format_epoch(t)


def split(metric_series: Mapping[str, Iterable[Series]]) -> Split:
    """Series of several metrics -> pod -> GPU -> metric -> time -> value, per the module's rules."""
    out = Split()
    claims: dict[tuple[Key, str, tuple[str, str]], list[Series]] = {}
    for metric, series_list in metric_series.items():
        for series in series_list:
            key = pod_identity(series.labels)
            if key is None:
                continue
            if isinstance(key, str):
                out.ambiguous += 1
                if not out.ambiguous_example:
                    out.ambiguous_example = f"{series_name(series.labels)}: {key}"
                continue
            claims.setdefault((key, metric, device_of(series.labels)), []).append(series)
    for (key, metric, (device, mig)), group in claims.items():
        if len(group) > 1 and (conflict := _conflict(group)) is not None:
            t, who, when = conflict
            if key not in out.contested or t > out.contested[key][0]:
                gpu = device + (f" MIG {mig}" if mig else "")
                out.contested[key] = (t, f"{who} claim {metric} of {gpu} of pod {key[0]}/{key[1]} "
                                         f"with different values at {when}")
        for series in group:
            per_gpu = out.pods.setdefault(key, {}).setdefault(gpu_of(series.labels), {})
            per_gpu.setdefault(metric, {}).update(series.points)
    return out


def regex_literal(text: str) -> str:
    """`text` as a PromQL double-quoted regex that matches exactly it (anything but [A-Za-z0-9_-] escaped)."""
    return "".join(ch if ch.isascii() and (ch.isalnum() or ch in "-_") else f"\\\\x{{{ord(ch):x}}}"
                   for ch in text)


class Unread:
    """One range query that left namespaces out (a series flood): its window end, the namespaces it read,
    and the series counted in each namespace left out that the caller asked about."""

    def __init__(self, end: float, admitted: frozenset[str], dropped: dict[str, int], cap: int) -> None:
        self.end = end
        self.admitted = admitted
        self.dropped = dropped
        self.cap = cap

    def error(self, namespace: str) -> str:
        count = self.dropped.get(namespace)
        why = (f"{count} series, more than its share of prometheus.maxSeries ({self.cap})" if count is not None
               else f"prometheus.maxSeries ({self.cap}) was exceeded and the namespace was not asked about")
        return f"GPU series of namespace {namespace} were not read up to {format_epoch(self.end)} ({why})"


class PrometheusGpu:
    """GPU samples for many pods from one Prometheus, a constant number of queries per call.

    It keeps each GPU pod's combined points of the look-back between calls and asks Prometheus only
    for what is new: the points since the last answer, plus `overlap_seconds` again (a late scrape can
    still change the newest points). A 10,000-notebook fleet's answer therefore stays a few points a
    series instead of the whole look-back every pass. The first call (and one after a long gap) reads
    the look-back in slices of `FIRST_SLICE_MINUTES`, so no single answer holds all of it.

    What a caller can log or count after each `samples` call (the module's rules): `contested`, the
    pods whose GPU two series claim with different values inside the look-back, as (namespace, pod,
    what); `ambiguous`, the series of the call ignored because their pod is ambiguous (the first
    one's reason in `ambiguous_example`); `unread`, the namespaces the call asked about whose series
    were left out by `prometheus.maxSeries`, as (namespace, series counted).
    """

    FIRST_SLICE_MINUTES = 15.0

    def __init__(self, settings: PrometheusSettings, client: PrometheusClient | None = None) -> None:
        self.settings = settings
        self.client = client or PrometheusClient(settings)
        self.selector = PrometheusSettings.check_series_selector(settings.gpu_series_selector)
        self._points: dict[Key, array[float]] = {}  # pod -> flat (time, util, memory) on the step grid
        self._gpus: dict[Key, int] = {}
        self._through: float | None = None  # the last time point of the last answer
        self._contested: dict[Key, tuple[float, str]] = {}  # pod -> (latest contested time, what)
        self._unread: list[Unread] = []  # range queries that left namespaces out, inside the look-back
        self.contested: list[tuple[str, str, str]] = []
        self.ambiguous = 0
        self.ambiguous_example = ""
        self.unread: list[tuple[str, int]] = []

    def metrics(self) -> tuple[str, ...]:
        return (UTIL, MEMORY, ENGINE) if self.settings.gpu_engine_active else (UTIL, MEMORY)

    def _matchers(self, *more: str) -> str:
        return ",".join(m for m in (self.selector, *more) if m)

    def expr(self, metric: str) -> str:
        """Every admitted series of `metric` that belongs to a pod, in either label style."""
        plain, exported = self._matchers('pod!=""'), self._matchers('exported_pod!=""')
        return f"{metric}{{{plain}}} or {metric}{{{exported}}}"

    def bulk_expr(self, namespaces: Iterable[str] | None = None) -> str:
        """Every admitted series of every metric read that belongs to a pod, in either label style: one
        query. With `namespaces`, only the series whose pod (per `pod_identity`) is in one of them."""
        names = self._matchers(f'__name__=~"{"|".join(self.metrics())}"')
        if namespaces is None:
            return f'{{{names},pod!=""}} or {{{names},exported_pod!=""}}'
        regex = "|".join(regex_literal(n) for n in sorted(namespaces))
        return (f'{{{names},exported_pod!="",exported_namespace=~"{regex}"}} or '
                f'{{{names},pod!="",exported_pod="",namespace=~"{regex}"}}')

    def count_expr(self, namespaces: Iterable[str], seconds: float) -> str:
        """The series of each of `namespaces` with a sample in the last `seconds`: one instant query, one
        row per (label style, metric, namespace)."""
        regex = "|".join(regex_literal(n) for n in sorted(namespaces))
        window = duration(seconds)
        parts = []
        for i, metric in enumerate(self.metrics()):
            for label, extra in (("exported_namespace", 'exported_pod!=""'),
                                 ("namespace", 'pod!="",exported_pod=""')):
                matchers = self._matchers(extra, f'{label}=~"{regex}"')
                inner = f"{metric}{{{matchers}}}"
                parts.append(f'label_replace(count by ({label}) (last_over_time({inner}[{window}])), '
                             f'"kfc_metric", "{i}", "kfc_metric", "")')
        return " or ".join(parts)

    def stale_after_seconds(self) -> float:
        """A pod whose newest sample is older than this is not being observed now."""
        return max(3 * self.settings.step_seconds, 300.0)

    def overlap_seconds(self) -> float:
        """How far back each call reads again: Prometheus' 5-minute staleness window, at least 3 steps."""
        return max(300.0, 3 * self.settings.step_seconds)

    def samples(self, pods: Sequence[Key], now: datetime) -> tuple[dict[Key, dict[str, Any]], int]:
        """For each (namespace, pod): `{"samples": [...]}` or `{"error": ...}`; and the queries made."""
        before = self.client.queries
        try:
            self._update(now, {ns for ns, _ in pods})
        except Exception as err:  # never raise into the cycle; the text never holds prometheus.url
            return error_for_all(pods, err, self.settings.url), self.client.queries - before
        out: dict[Key, dict[str, Any]] = {}
        stale = self.stale_after_seconds()
        for key in pods:
            flat = self._points.get(key)
            unread = next((u for u in reversed(self._unread) if key[0] not in u.admitted), None)
            if key in self._contested:
                out[key] = {"error": f"contested: {self._contested[key][1]}"[:300]}
            elif unread is not None:
                out[key] = {"error": unread.error(key[0])}
            elif key not in self._gpus:
                out[key] = {"error": "no GPU series for pod"}
            elif not flat:
                out[key] = {"error": "no time stamp with both GPU utilisation and memory for pod"}
            elif now.timestamp() - flat[-3] > stale:
                out[key] = {"error": f"GPU samples for pod stop at {format_epoch(flat[-3])} (stale)"}
            else:
                points = [(flat[i], flat[i + 1], flat[i + 2]) for i in range(0, len(flat), 3)]
                out[key] = answer(points, self._gpus[key], "prometheus")
        return out, self.client.queries - before

    def _update(self, now: datetime, wanted: set[str]) -> None:
        """Read the points not read yet (and the overlap again) and drop those past the look-back."""
        step = self.settings.step_seconds
        end = math.floor(now.timestamp() / step) * step  # on the step grid
        start = end - self.settings.lookback_minutes * 60
        since = start
        if self._through is not None and self._through <= end:
            since = max(start, self._through - math.ceil(self.overlap_seconds() / step) * step)
        slice_seconds = math.ceil(self.FIRST_SLICE_MINUTES * 60 / step) * step
        fresh: dict[Key, list[Point]] = {}
        gpus: dict[Key, int] = {}
        seen: set[str] = set()
        contested = {k: v for k, v in self._contested.items() if v[0] >= start}
        unread = [u for u in self._unread if u.end >= start]
        self.ambiguous, self.ambiguous_example, self.unread = 0, "", []
        flooded = False
        t0 = since
        while t0 <= end:  # slices [t0, t1] on the grid, disjoint
            t1 = min(end, t0 + slice_seconds)
            got, metrics, left_out = self._fetch(t0, t1, wanted)
            seen |= metrics
            if left_out is not None:
                flooded = True
                unread.append(left_out)
                self.unread.extend((ns, n) for ns, n in left_out.dropped.items() if (ns, n) not in self.unread)
            self.ambiguous += got.ambiguous
            self.ambiguous_example = self.ambiguous_example or got.ambiguous_example
            for key, claim in got.contested.items():
                if key not in contested or claim[0] >= contested[key][0]:
                    contested[key] = claim
            for key, per_gpu in got.pods.items():
                fresh.setdefault(key, []).extend(combine(per_gpu))
                gpus[key] = len(per_gpu)
            t0 = t1 + step
        for metric in (UTIL, MEMORY):
            if metric not in seen and not flooded:
                raise PromError(f"no {metric} series in the last {(end - since) / 60:g} min "
                                "(is dcgm-exporter scraped, and does prometheus.gpuSeriesSelector "
                                "admit its job?)")
        kept: dict[Key, array[float]] = {}
        for key in set(self._points) | set(fresh):
            old = self._points.get(key, array("d"))
            flat = array("d", (v for i in range(0, len(old), 3) if start <= old[i] < since
                               for v in old[i:i + 3]))
            for point in fresh.get(key, ()):
                flat.extend(point)
            if flat:
                kept[key] = flat
        self._points = kept
        self._gpus = {k: gpus.get(k, self._gpus.get(k, 0)) for k in set(kept) | set(gpus)}
        self._through = end
        self._contested = contested
        self._unread = unread
        self.contested = sorted((ns, pod, what) for (ns, pod), (_, what) in contested.items())

    def _fetch(self, t0: float, t1: float, wanted: set[str]) -> tuple[Split, set[str], Unread | None]:
        """Pod -> GPU -> metric -> points over [t0, t1] (and what `split` found), the metrics that had any
        series, and, when the series exceeded `prometheus.maxSeries`, which namespaces were left out."""
        first = datetime.fromtimestamp(t0, tz=UTC)
        last = datetime.fromtimestamp(t1, tz=UTC)
        cap = self.settings.max_series
        left_out: Unread | None = None
        try:
            found = self.client.query_range(self.bulk_expr(), first, last, self.settings.step_seconds, cap)
        except TooManySeries:
            admitted, dropped = self._share(t0, t1, wanted)
            left_out = Unread(t1, frozenset(admitted), dropped, cap)
            found = []
            if admitted:
                try:
                    found = self.client.query_range(self.bulk_expr(admitted), first, last,
                                                    self.settings.step_seconds, cap)
                except TooManySeries as err:
                    raise PromError(f"{err} even when reading only {len(admitted)} namespaces "
                                    f"(prometheus.maxSeries {cap})") from None
        results: dict[str, list[Series]] = {metric: [] for metric in self.metrics()}
        for series in found:
            name = series.labels.get("__name__", "")
            if name in results:
                results[name].append(series)
        return split(results), {m for m, got in results.items() if got}, left_out

    def _share(self, t0: float, t1: float, wanted: set[str]) -> tuple[set[str], dict[str, int]]:
        """The namespaces asked about that fit in `prometheus.maxSeries`, fewest series first (ties by
        name), and the series counted in each one left out. Namespaces not asked about are left out."""
        if not wanted:
            return set(), {}
        at = datetime.fromtimestamp(t1, tz=UTC)
        counts = dict.fromkeys(wanted, 0)
        for row in self.client.query(self.count_expr(wanted, t1 - t0 + 300.0), at):
            ns = row.labels.get("exported_namespace") or row.labels.get("namespace", "")
            if ns in counts and row.points:
                counts[ns] += int(row.points[-1][1])
        admitted: set[str] = set()
        total = 0
        for ns, n in sorted(counts.items(), key=lambda item: (item[1], item[0])):
            if total + n > self.settings.max_series:
                break
            admitted.add(ns)
            total += n
        return admitted, {ns: n for ns, n in counts.items() if ns not in admitted}
