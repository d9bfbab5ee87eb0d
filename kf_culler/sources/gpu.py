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
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
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


def answer(points: Sequence[tuple[float, float, float]], gpus: int, source: str) -> dict[str, Any]:
    return {
        "samples": [{"time": format_epoch(t), "utilPercent": round(u, 3), "memoryUsedMiB": round(m, 3)}
                    for t, u, m in points],
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
    """GPU samples for many pods from one Prometheus, a constant number of queries per call."""

    def __init__(self, settings: PrometheusSettings, client: PrometheusClient | None = None) -> None:
        self.settings = settings
        self.client = client or PrometheusClient(settings)

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

    def samples(self, pods: Sequence[Key], now: datetime) -> tuple[dict[Key, dict[str, Any]], int]:
        """For each (namespace, pod): `{"samples": [...]}` or `{"error": ...}`; and the queries made."""
        before = self.client.queries
        try:
            found = self._fetch(now)
        except Exception as err:  # never raise into the cycle
            return error_for_all(pods, err), self.client.queries - before
        out: dict[Key, dict[str, Any]] = {}
        stale = self.stale_after_seconds()
        for key in pods:
            gpus = found.get(key)
            if not gpus:
                out[key] = {"error": "no GPU series for pod"}
                continue
            points = combine(gpus)
            if not points:
                out[key] = {"error": "no time stamp with both GPU utilisation and memory for pod"}
            elif now.timestamp() - points[-1][0] > stale:
                out[key] = {"error": f"GPU samples for pod stop at {format_epoch(points[-1][0])} (stale)"}
            else:
                out[key] = answer(points, len(gpus), "prometheus")
        return out, self.client.queries - before

    def _fetch(self, now: datetime) -> dict[Key, dict[GpuId, GpuSeries]]:
        step = self.settings.step_seconds
        end = datetime.fromtimestamp(math.floor(now.timestamp() / step) * step, tz=UTC)  # on the step grid
        start = end - timedelta(minutes=self.settings.lookback_minutes)
        results: dict[str, list[Series]] = {metric: [] for metric in self.metrics()}
        for series in self.client.query_range(self.bulk_expr(), start, end, step):
            name = series.labels.get("__name__", "")
            if name in results:
                results[name].append(series)
        for metric in (UTIL, MEMORY):
            if not results[metric]:
                raise PromError(f"no {metric} series in the last {self.settings.lookback_minutes:g} min "
                                "(is dcgm-exporter scraped?)")
        return split(results)
