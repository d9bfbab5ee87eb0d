"""RStudio Server activity, read from Prometheus: container CPU (cAdvisor) and Istio request counts.

RStudio Server open source offers the culler no activity endpoint (docs/signals.md, section RStudio,
gives the evidence): its health check and metrics are Workbench features, and its RPCs need the
browser's CSRF token and active client id. What the cluster does see from outside the pod:

- CPU of the notebook's containers (`container_cpu_usage_seconds_total`, cAdvisor via the kubelet).
  R running code uses CPU; an idle rsession, a suspended one, and an open browser tab use almost none.
  CPU at or above `rstudio.cpuBusyCores` is work.
- requests reaching the pod through its Istio sidecar (`istio_requests_total`, reporter="destination").
  An open RStudio tab long-polls `/events/get_events` (each poll ends within 50 s), so requests mean a
  browser is connected, not that anyone works.

The answer per pod, `{"connected", "busy", "lastActivity", "lastConnected", "via", ...}`:
`busy` is CPU at or above the threshold now; `lastActivity` the last query step in the look-back
window whose CPU was at or above it, or, when there is none, the start of the window (nothing is
known before it, so the answer never claims a quiet period longer than it looked at); `connected`
means requests in the last `connectedWindowSeconds`, and `lastConnected` the last step with requests.
Four instant queries per cycle whatever the number of notebooks (two without Istio).
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import Any

from kf_culler.config import PrometheusSettings, RStudioSettings, Settings
from kf_culler.sources.gpu import pod_of
from kf_culler.sources.prometheus import PrometheusClient, Series, duration, error_for_all
from kf_culler.timeutil import format_epoch

Key = tuple[str, str]
ORDINAL = re.compile(r"^(?P<set>.+)-\d+$")


def workload_of(pod: str) -> str:
    """The StatefulSet of a notebook pod (`<name>-0` -> `<name>`), which Istio reports as the workload."""
    m = ORDINAL.match(pod)
    return m.group("set") if m else pod


class PrometheusRStudio:
    """Answers the RStudio observation for many pods with a constant number of Prometheus queries."""

    def __init__(self, prometheus: PrometheusSettings, settings: RStudioSettings,
                 client: PrometheusClient | None = None) -> None:
        self.prometheus = prometheus
        self.settings = settings
        self.client = client or PrometheusClient(prometheus)

    # -- PromQL ---------------------------------------------------------------------------------

    def cpu_expr(self) -> str:
        matchers = ['container!=""', 'container!="POD"'] + [
            f'container!="{c}"' for c in self.settings.exclude_containers]
        window = duration(self.settings.rate_window_seconds)
        return (f"sum by (namespace, pod, exported_namespace, exported_pod) "
                f"(rate(container_cpu_usage_seconds_total{{{','.join(matchers)}}}[{window}]))")

    def requests_expr(self) -> str:
        matchers = ['reporter="destination"'] + [
            f'source_workload!="{w}"' for w in self.settings.exclude_source_workloads]
        window = duration(self.settings.connected_window_seconds)
        return (f"sum by (destination_workload_namespace, destination_workload) "
                f"(increase(istio_requests_total{{{','.join(matchers)}}}[{window}]))")

    def last_time_expr(self, condition: str) -> str:
        """The latest look-back step at which `condition` (a filtered vector) held."""
        window = duration(self.settings.lookback_minutes * 60)
        step = duration(self.settings.step_seconds)
        return f"max_over_time(timestamp({condition})[{window}:{step}])"

    # -- the source -----------------------------------------------------------------------------

    def samples(self, pods: Sequence[Key], now: datetime) -> tuple[dict[Key, dict[str, Any]], int]:
        """For each (namespace, pod): the RStudio answer or `{"error": ...}`; and the queries made."""
        before = self.client.queries
        try:
            found = self._fetch(now)
        except Exception as err:  # never raise into the cycle
            return error_for_all(pods, err), self.client.queries - before
        cpu_now, cpu_last, req_now, req_last = found
        window_start = now - timedelta(minutes=self.settings.lookback_minutes)
        via = "prometheus: container CPU" + (" and Istio requests" if self.settings.istio else "")
        out: dict[Key, dict[str, Any]] = {}
        for key in pods:
            cores = cpu_now.get(key)
            if cores is None:
                out[key] = {"error": "no container CPU series (container_cpu_usage_seconds_total) for pod"}
                continue
            last_cpu = cpu_last.get(key)
            workload = (key[0], workload_of(key[1]))
            recent = req_now.get(workload, 0.0)
            last_req = req_last.get(workload)
            out[key] = {
                "connected": self.settings.istio and recent > 0,
                "busy": cores >= self.settings.cpu_busy_cores,
                "lastActivity": format_epoch(last_cpu if last_cpu is not None else window_start.timestamp()),
                "lastConnected": format_epoch(last_req) if last_req is not None else None,
                "via": via,
                "cpuCores": round(cores, 4),
                "activityInWindow": last_cpu is not None,
                **({"requests": round(recent, 1)} if self.settings.istio else {}),
            }
        return out, self.client.queries - before

    def _fetch(self, now: datetime) -> tuple[dict[Key, float], dict[Key, float], dict[Key, float],
                                             dict[Key, float]]:
        threshold = f"{self.settings.cpu_busy_cores:g}"
        cpu = self.cpu_expr()
        cpu_now = _by_pod(self.client.query(cpu, now), operator.add)
        cpu_last = _by_pod(self.client.query(self.last_time_expr(f"{cpu} >= {threshold}"), now), max)
        req_now: dict[Key, float] = {}
        req_last: dict[Key, float] = {}
        if self.settings.istio:
            req = self.requests_expr()
            req_now = _by_workload(self.client.query(req, now))
            req_last = _by_workload(self.client.query(self.last_time_expr(f"{req} > 0"), now))
        return cpu_now, cpu_last, req_now, req_last


def _value(series: Series) -> float | None:
    return series.points[-1][1] if series.points else None


def _by_pod(result: list[Series], merge: Callable[[float, float], float]) -> dict[Key, float]:
    """Values per (namespace, pod), in either label style; two groups of one pod are merged."""
    out: dict[Key, float] = {}
    for series in result:
        key = pod_of(series.labels)
        value = _value(series)
        if key is not None and value is not None:
            out[key] = merge(out[key], value) if key in out else value
    return out


def _by_workload(result: list[Series]) -> dict[Key, float]:
    out: dict[Key, float] = {}
    for series in result:
        ns = series.labels.get("destination_workload_namespace", "")
        name = series.labels.get("destination_workload", "")
        value = _value(series)
        if ns and name and name != "unknown" and value is not None:
            out[(ns, name)] = value
    return out


def source_for(settings: Settings) -> PrometheusRStudio | None:
    """The RStudio source when Prometheus is configured and `rstudio.enabled`, else None."""
    ops = settings.operations
    if not ops.prometheus.url or not ops.rstudio.enabled:
        return None
    return PrometheusRStudio(ops.prometheus, ops.rstudio)
