"""GPU samples scraped straight from dcgm-exporter endpoints, for clusters without Prometheus.

Each call scrapes every endpoint once (`/metrics`, Prometheus text format), turns the GPUs that
belong to pods into one sample per pod (the same combination as `kf_culler.sources.gpu`), and keeps
a bounded history in memory: samples older than `lookbackMinutes` are dropped, each pod keeps at most
`maxSamplesPerPod` samples, and at most `maxPods` pods are tracked (a pod beyond that is not tracked
and answers an error).

This history holds only what this process scraped, so after a restart it starts empty. A short
history must not make a GPU look idle for longer than it was watched, so a pod's samples are given
only when the process has watched that pod's endpoint without a gap for the whole look-back window,
or has seen the pod appear while watching. Until then, and whenever the newest sample is older than
`staleSeconds`, the answer is `{"error": ...}`: no signal, which the rules never treat as idleness.
"""

from __future__ import annotations

import math
import threading
from collections import OrderedDict, deque
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import requests
import urllib3
from prometheus_client.parser import text_string_to_metric_families

from kf_culler.config import DcgmSettings, Settings
from kf_culler.errors import ScrapeError
from kf_culler.sources.gpu import ENGINE, MEMORY, UTIL, GpuId, Key, answer, combine, gpu_of, pod_of
from kf_culler.timeutil import format_epoch

MAX_EXPOSITION_BYTES = 16 << 20
WANTED = (UTIL, MEMORY, ENGINE)


@dataclass
class _Endpoint:
    url: str
    run_start: float | None = None  # start of the current gap-free run of successful scrapes
    last_ok: float | None = None
    last_pods: frozenset[Key] | None = None  # every pod in the previous successful scrape of this run
    last_error: str | None = None


@dataclass
class _Pod:
    endpoint: str
    appeared: float | None  # when we saw the pod appear while watching its endpoint, if we did
    samples: deque[tuple[float, float, float, int]]  # (time, utilPercent, memoryUsedMiB, gpus)
    lost_until: float = float("-inf")  # newest sample dropped for room (not for age)


@dataclass
class _Scrape:
    url: str
    pods: dict[Key, dict[GpuId, dict[str, float]]] = field(default_factory=dict)  # pod -> GPU -> metric
    error: str | None = None


class DcgmScraper:
    """Scrapes dcgm-exporter endpoints and answers GPU samples per pod from its own bounded history."""

    def __init__(self, settings: DcgmSettings, session: requests.Session | None = None) -> None:
        self.settings = settings
        self.session = session or requests.Session()
        self.session.headers.update({"User-Agent": "kf-culler", "Accept": "text/plain"})
        if settings.insecure_skip_verify:
            # The admin chose not to verify; say it once in the docs, not in every cycle's log.
            urllib3.disable_warnings(urllib3.exceptions.InsecureRequestWarning)
        self._endpoints: dict[str, _Endpoint] = {}
        self._pods: OrderedDict[Key, _Pod] = OrderedDict()
        self._lock = threading.Lock()
        self.scrapes = 0

    # -- scraping -------------------------------------------------------------------------------

    def scrape(self, now: datetime, endpoints: Sequence[str] | None = None) -> int:
        """Scrape every endpoint once at `now`, record what it says; returns the number of scrapes."""
        urls = list(dict.fromkeys(endpoints if endpoints is not None else self.settings.endpoints))
        if not urls:
            return 0
        t = now.timestamp()
        with ThreadPoolExecutor(max_workers=min(16, len(urls)), thread_name_prefix="dcgm") as pool:
            results = list(pool.map(self._scrape_one, urls))
        with self._lock:
            self.scrapes += len(urls)
            for result in results:
                self._record(result, t)
            self._prune(t)
        return len(urls)

    def _scrape_one(self, url: str) -> _Scrape:
        out = _Scrape(url)
        try:
            text = self._fetch(url)
            for family in text_string_to_metric_families(text):
                if family.name not in WANTED:
                    continue
                for sample in family.samples:
                    if sample.name != family.name:
                        continue
                    key = pod_of(sample.labels)
                    if key is None:
                        continue
                    value = float(sample.value)
                    if math.isfinite(value):
                        gpu = out.pods.setdefault(key, {}).setdefault(gpu_of(sample.labels), {})
                        gpu[family.name] = value
        except ScrapeError as err:
            out.error = str(err)
        except (ValueError, TypeError) as err:
            out.error = f"not Prometheus text format: {str(err)[:200]}"
        except Exception as err:  # never raise into the cycle
            out.error = f"{type(err).__name__}: {err}"[:300]
        return out

    def _fetch(self, url: str) -> str:
        budget = self.settings.timeout_seconds
        verify: bool | str = False if self.settings.insecure_skip_verify else (self.settings.ca_file or True)
        try:
            with self.session.get(url, timeout=(min(budget, 5.0), budget), verify=verify, stream=True,
                                  allow_redirects=False) as resp:
                if resp.status_code != 200:
                    raise ScrapeError(f"HTTP {resp.status_code}")
                chunks: list[bytes] = []
                size = 0
                for chunk in resp.iter_content(65536):
                    size += len(chunk)
                    if size > MAX_EXPOSITION_BYTES:
                        raise ScrapeError(f"the exposition exceeds {MAX_EXPOSITION_BYTES} bytes")
                    chunks.append(chunk)
        except requests.exceptions.Timeout:
            raise ScrapeError(f"no answer within {budget:g}s") from None
        except (requests.exceptions.InvalidURL, requests.exceptions.MissingSchema, requests.exceptions.InvalidSchema,
                requests.exceptions.URLRequired, urllib3.exceptions.LocationValueError) as err:
            raise ScrapeError(f"the dcgm-exporter endpoint (dcgm.endpoints) is not usable "
                              f"({type(err).__name__})") from None
        except requests.exceptions.ConnectionError as err:
            # the client's text repeats the endpoint's host and path (a path may hold a token): not in a reason
            raise ScrapeError(f"{type(err).__name__}: the endpoint could not be reached") from None
        except requests.exceptions.RequestException as err:
            raise ScrapeError(f"{type(err).__name__}: the request failed") from None
        return b"".join(chunks).decode("utf-8", errors="replace")

    def _record(self, result: _Scrape, t: float) -> None:
        ep = self._endpoints.setdefault(result.url, _Endpoint(result.url))
        if result.error is not None:
            # A failed scrape ends the run only once the silence outlasts staleSeconds (checked at the
            # next success), but no appearance can be witnessed across it.
            ep.last_error = result.error
            ep.last_pods = None
            return
        gap = ep.last_ok is None or ep.run_start is None or t - ep.last_ok > self.settings.stale_seconds
        if gap:
            ep.run_start = t
            ep.last_pods = None  # pods present at the start of a run may be older than the run
        ep.last_ok = t
        ep.last_error = None
        for key, gpus in result.pods.items():
            points = combine({g: {m: {t: v} for m, v in per.items()} for g, per in gpus.items()})
            pod = self._pods.get(key)
            if pod is None:
                if len(self._pods) >= self.settings.max_pods:
                    continue  # not tracked: answers an error (never a partial history)
                seen_absent = ep.last_pods is not None and key not in ep.last_pods
                pod = _Pod(result.url, t if seen_absent else None,
                           deque(maxlen=self.settings.max_samples_per_pod))
                self._pods[key] = pod
            elif pod.endpoint != result.url:
                pod.endpoint = result.url
                pod.appeared = None
            if points:
                if len(pod.samples) == pod.samples.maxlen:
                    pod.lost_until = pod.samples[0][0]
                _, u, m = points[0]
                pod.samples.append((t, u, m, len(gpus)))
            self._pods.move_to_end(key)
        ep.last_pods = frozenset(result.pods)

    def _prune(self, t: float) -> None:
        horizon = t - self.settings.lookback_minutes * 60
        for key in list(self._pods):
            pod = self._pods[key]
            while pod.samples and pod.samples[0][0] < horizon:
                pod.samples.popleft()
            if not pod.samples and (pod.appeared is None or pod.appeared < horizon):
                del self._pods[key]

    # -- answers --------------------------------------------------------------------------------

    def samples(self, pods: Sequence[Key], now: datetime,
                endpoints: Sequence[str] | None = None) -> tuple[dict[Key, dict[str, Any]], int]:
        """Scrape once, then answer each (namespace, pod): `{"samples": [...]}` or `{"error": ...}`."""
        try:
            made = self.scrape(now, endpoints)
            with self._lock:
                return {key: self._answer(key, now.timestamp()) for key in pods}, made
        except Exception as err:  # never raise into the cycle
            return {key: {"error": f"dcgm-exporter: {type(err).__name__}: {err}"[:300]} for key in pods}, 0

    def _answer(self, key: Key, t: float) -> dict[str, Any]:
        pod = self._pods.get(key)
        if pod is None or not pod.samples:
            return {"error": self._why_missing(key)}
        ep = self._endpoints.get(pod.endpoint) or _Endpoint(pod.endpoint)
        newest = pod.samples[-1][0]
        if t - newest > self.settings.stale_seconds:
            why = f"; last scrape error: {ep.last_error}" if ep.last_error else ""
            return {"error": f"GPU samples for pod stop at {format_epoch(newest)} (stale){why}"}
        window_start = t - self.settings.lookback_minutes * 60
        watched_from = ep.run_start if ep.run_start is not None else newest
        whole_window = watched_from <= window_start
        whole_life = pod.appeared is not None and pod.appeared >= watched_from
        if not (whole_window or whole_life) or pod.lost_until >= window_start:
            since = max(watched_from, pod.lost_until)
            return {"error": f"GPU history incomplete: watched only since {format_epoch(since)}, needs "
                             f"{self.settings.lookback_minutes:g} min or the pod's start"}
        points = [(s, u, m) for s, u, m, _ in pod.samples if s >= window_start]
        result = answer(points, pod.samples[-1][3], "dcgm-exporter")
        result["watchedSince"] = format_epoch(pod.appeared if whole_life and pod.appeared else watched_from)
        return result

    def _why_missing(self, key: Key) -> str:
        if not self._endpoints and not self.settings.endpoints:
            return "no dcgm-exporter endpoints are configured (dcgm.endpoints)"
        if any(ep.last_pods and key in ep.last_pods for ep in self._endpoints.values()):
            return f"GPU pod not tracked: more than dcgm.maxPods ({self.settings.max_pods}) GPU pods"
        errors = [ep.last_error for ep in self._endpoints.values() if ep.last_error]
        if errors and len(errors) == len(self._endpoints):
            return f"no dcgm-exporter endpoint answered: {errors[0]}"
        return "no GPU series for pod"


def source_for(settings: Settings) -> DcgmScraper | None:
    """A scraper when `dcgm.endpoints` are configured, else None."""
    dcgm = settings.operations.dcgm
    return DcgmScraper(dcgm) if dcgm.endpoints else None
