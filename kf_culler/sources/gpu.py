"""GPU samples per pod from dcgm-exporter series in Prometheus.

One range query covers every metric read (utilisation, memory, engine activity) of every GPU pod in
the cluster; the answer is split by metric and pod here, so a cycle makes one query whatever the
number of notebooks.

Labels: dcgm-exporter puts `namespace`/`pod` on a GPU's series. When Prometheus scrapes it without
`honor_labels`, those collide with the target's own labels and arrive as `exported_namespace`/
`exported_pod`. A series with `exported_pod` is read by the `exported_*` pair, any other by the
plain pair, so both styles work in one query.

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
from kf_culler.sources.prometheus import PromError, PrometheusClient, Series, error_for_all
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


def split(metric_series: Mapping[str, Iterable[Series]]) -> dict[Key, dict[GpuId, GpuSeries]]:
    """Series of several metrics -> pod -> GPU -> metric -> time -> value."""
    pods: dict[Key, dict[GpuId, GpuSeries]] = {}
    for metric, series_list in metric_series.items():
        for series in series_list:
            key = pod_of(series.labels)
            if key is None:
                continue
            per_gpu = pods.setdefault(key, {}).setdefault(gpu_of(series.labels), {})
            per_gpu.setdefault(metric, {}).update(series.points)
    return pods


class PrometheusGpu:
    """GPU samples for many pods from one Prometheus, a constant number of queries per call.

    It keeps each GPU pod's combined points of the look-back between calls and asks Prometheus only
    for what is new: the points since the last answer, plus `overlap_seconds` again (a late scrape can
    still change the newest points). A 10,000-notebook fleet's answer therefore stays a few points a
    series instead of the whole look-back every pass. The first call (and one after a long gap) reads
    the look-back in slices of `FIRST_SLICE_MINUTES`, so no single answer holds all of it.
    """

    FIRST_SLICE_MINUTES = 15.0

    def __init__(self, settings: PrometheusSettings, client: PrometheusClient | None = None) -> None:
        self.settings = settings
        self.client = client or PrometheusClient(settings)
        self._points: dict[Key, array[float]] = {}  # pod -> flat (time, util, memory) on the step grid
        self._gpus: dict[Key, int] = {}
        self._through: float | None = None  # the last time point of the last answer

    def metrics(self) -> tuple[str, ...]:
        return (UTIL, MEMORY, ENGINE) if self.settings.gpu_engine_active else (UTIL, MEMORY)

    @staticmethod
    def expr(metric: str) -> str:
        """Every series of `metric` that belongs to a pod, in either label style."""
        return f'{metric}{{pod!=""}} or {metric}{{exported_pod!=""}}'

    def bulk_expr(self) -> str:
        """Every series of every metric read that belongs to a pod, in either label style: one query."""
        names = "|".join(self.metrics())
        return f'{{__name__=~"{names}",pod!=""}} or {{__name__=~"{names}",exported_pod!=""}}'

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
            self._update(now)
        except Exception as err:  # never raise into the cycle
            return error_for_all(pods, err), self.client.queries - before
        out: dict[Key, dict[str, Any]] = {}
        stale = self.stale_after_seconds()
        for key in pods:
            flat = self._points.get(key)
            if key not in self._gpus:
                out[key] = {"error": "no GPU series for pod"}
            elif not flat:
                out[key] = {"error": "no time stamp with both GPU utilisation and memory for pod"}
            elif now.timestamp() - flat[-3] > stale:
                out[key] = {"error": f"GPU samples for pod stop at {format_epoch(flat[-3])} (stale)"}
            else:
                points = [(flat[i], flat[i + 1], flat[i + 2]) for i in range(0, len(flat), 3)]
                out[key] = answer(points, self._gpus[key], "prometheus")
        return out, self.client.queries - before

    def _update(self, now: datetime) -> None:
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
        t0 = since
        while t0 <= end:  # slices [t0, t1] on the grid, disjoint
            t1 = min(end, t0 + slice_seconds)
            per_pod, metrics = self._fetch(t0, t1)
            seen |= metrics
            for key, per_gpu in per_pod.items():
                fresh.setdefault(key, []).extend(combine(per_gpu))
                gpus[key] = len(per_gpu)
            t0 = t1 + step
        for metric in (UTIL, MEMORY):
            if metric not in seen:
                raise PromError(f"no {metric} series in the last {(end - since) / 60:g} min "
                                "(is dcgm-exporter scraped?)")
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

    def _fetch(self, t0: float, t1: float) -> tuple[dict[Key, dict[GpuId, GpuSeries]], set[str]]:
        """Pod -> GPU -> metric -> points over [t0, t1], and the metrics that had any series."""
        results: dict[str, list[Series]] = {metric: [] for metric in self.metrics()}
        first = datetime.fromtimestamp(t0, tz=UTC)
        last = datetime.fromtimestamp(t1, tz=UTC)
        for series in self.client.query_range(self.bulk_expr(), first, last, self.settings.step_seconds):
            name = series.labels.get("__name__", "")
            if name in results:
                results[name].append(series)
        return split(results), {m for m, found in results.items() if found}
