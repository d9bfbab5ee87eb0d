"""A small synchronous client for the Prometheus HTTP query API, shared by the GPU and RStudio sources.

Each bulk source makes a constant number of queries per cycle, so a blocking client is enough; the
cycle runs it in a worker thread. The bearer token is read from its file on every query, so a
rotated token is picked up without a restart. Every failure is a `PromError` with a short message.

A range query may be capped (`max_series`): the answer is counted while it streams in and reading stops
at the first series over the cap (`TooManySeries`), so an answer flooded with series costs at most the
cap's worth of bytes and no parsing; the caller then asks again for less (kf_culler/sources/gpu.py).
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import requests
import urllib3

from kf_culler.config import PrometheusSettings
from kf_culler.errors import PromError as PromError
from kf_culler.text import SNIPPET, cut

MAX_RESPONSE_BYTES = 64 << 20
# Each series of a matrix or vector answer has exactly one "metric" key. Inside a JSON string a quote is
# escaped (\"), so these bytes occur only as a key: as the series' own key or as a label named
# `metric`, which can only over-count (the caller then reads less, never more).
_SERIES_MARK = b'"metric"'


class TooManySeries(PromError):
    """A capped query's answer holds more series than the cap (or more bytes than MAX_RESPONSE_BYTES)."""


@dataclass
class Series:
    """One series of a query answer: its labels and its (unix time, value) points, finite values only."""

    labels: dict[str, str]
    points: list[tuple[float, float]] = field(default_factory=list)


def duration(seconds: float) -> str:
    """A PromQL duration in whole milliseconds (`90s`, `1500ms`)."""
    ms = max(1, round(seconds * 1000))
    return f"{ms // 1000}s" if ms % 1000 == 0 else f"{ms}ms"


class PrometheusClient:
    """Runs instant and range queries against one Prometheus; counts the queries it sends."""

    def __init__(self, settings: PrometheusSettings, session: requests.Session | None = None) -> None:
        self.settings = settings
        self.session = session or requests.Session()
        self.session.headers.update({"Accept": "application/json", "User-Agent": "kf-culler"})
        self.queries = 0
        if settings.insecure_skip_verify:
            # The admin chose not to verify; say it once in the docs, not in every cycle's log.
            urllib3.disable_warnings(urllib3.exceptions.InsecureRequestWarning)

    def close(self) -> None:
        self.session.close()

    # -- public queries -------------------------------------------------------------------------

    def query(self, expr: str, at: datetime) -> list[Series]:
        """An instant query evaluated at `at`; a vector answer (a scalar becomes one label-less series)."""
        data = self._post("query", {"query": expr, "time": f"{at.timestamp():.3f}"})
        kind = data.get("resultType")
        result = data.get("result")
        if kind == "scalar" and isinstance(result, list):
            return [Series({}, _points([result]))]
        if kind != "vector" or not isinstance(result, list):
            raise PromError(f"expected a vector answer, got {str(kind)[:20]!r}")
        out = []
        for item in result:
            if not isinstance(item, dict) or not isinstance(item.get("metric"), dict):
                raise PromError("a vector element has no metric labels")
            out.append(Series(_labels(item["metric"]), _points([item.get("value")])))
        return out

    def query_range(self, expr: str, start: datetime, end: datetime, step: float,
                    max_series: int | None = None) -> list[Series]:
        """A range query over [start, end] every `step` seconds; a matrix answer. With `max_series`, an
        answer of more series (or more than MAX_RESPONSE_BYTES) is `TooManySeries`, read no further."""
        data = self._post("query_range", {
            "query": expr, "start": f"{start.timestamp():.3f}", "end": f"{end.timestamp():.3f}",
            "step": f"{step:g}",
        }, max_series)
        if data.get("resultType") != "matrix" or not isinstance(data.get("result"), list):
            raise PromError(f"expected a matrix answer, got {str(data.get('resultType'))[:20]!r}")
        out = []
        for item in data["result"]:
            if not isinstance(item, dict) or not isinstance(item.get("metric"), dict):
                raise PromError("a matrix element has no metric labels")
            values = item.get("values")
            if not isinstance(values, list):
                raise PromError("a matrix element has no values")
            out.append(Series(_labels(item["metric"]), _points(values)))
        return out

    # -- transport ------------------------------------------------------------------------------

    def _headers(self) -> dict[str, str]:
        path = self.settings.bearer_token_file
        if not path:
            return {}
        try:
            token = Path(path).read_text(encoding="utf-8").strip()
        except OSError as err:
            raise PromError(f"cannot read bearerTokenFile {path}: {err.strerror or err}") from None
        if not token:
            raise PromError(f"bearerTokenFile {path} is empty")
        return {"Authorization": f"Bearer {token}"}

    def _verify(self) -> bool | str:
        if self.settings.insecure_skip_verify:
            return False
        return self.settings.ca_file or True

    def _post(self, api: str, form: dict[str, str], max_series: int | None = None) -> dict[str, Any]:
        if not self.settings.url:
            raise PromError("no Prometheus URL is configured (prometheus.url)")
        problem = url_problem(self.settings.url)
        if problem is not None:
            raise PromError(f"{UNUSABLE_URL}: {problem}")
        url = self.settings.url.rstrip("/") + "/api/v1/" + api
        budget = self.settings.timeout_seconds
        form = {**form, "timeout": duration(budget)}
        headers = self._headers()
        self.queries += 1
        started = time.monotonic()
        try:
            with self.session.post(url, data=form, headers=headers, timeout=(min(budget, 5.0), budget),
                                   verify=self._verify(), stream=True, allow_redirects=False) as resp:
                body = _read_capped(resp, started, budget, max_series)
                status = resp.status_code
        except requests.exceptions.SSLError as err:
            raise PromError(f"TLS error talking to Prometheus: {without_url(_short(err), self.settings.url)}") from None
        except requests.exceptions.ConnectionError as err:
            raise PromError(f"cannot reach Prometheus: {without_url(_short(err), self.settings.url)}") from None
        except requests.exceptions.Timeout:
            raise PromError(f"Prometheus did not answer within {budget:g}s") from None
        except (requests.exceptions.InvalidURL, requests.exceptions.MissingSchema, requests.exceptions.InvalidSchema,
                requests.exceptions.URLRequired, urllib3.exceptions.LocationValueError) as err:
            # their message repeats the URL, or part of it (it may hold a token)
            raise PromError(f"{UNUSABLE_URL}: requests cannot use it ({type(err).__name__})") from None
        except requests.exceptions.RequestException as err:
            raise PromError(f"{type(err).__name__}: {without_url(_short(err), self.settings.url)}") from None
        try:
            doc = json.loads(body)
        except (ValueError, UnicodeDecodeError):
            doc = None
        if status != 200:
            detail = ""
            if isinstance(doc, dict) and doc.get("error"):
                detail = f": {str(doc.get('errorType', ''))[:40]} {str(doc['error'])[:200]}".rstrip()
            raise PromError(f"Prometheus answered HTTP {status}{detail}")
        if not isinstance(doc, dict):
            raise PromError("the Prometheus answer is not a JSON object")
        if doc.get("status") != "success":
            raise PromError(f"Prometheus query failed: {str(doc.get('error', doc.get('status')))[:200]}")
        data = doc.get("data")
        if not isinstance(data, dict):
            raise PromError("the Prometheus answer has no data")
        return data


def _read_capped(resp: requests.Response, started: float, budget: float, max_series: int | None = None) -> bytes:
    chunks: list[bytes] = []
    size = 0
    series = 0
    tail = b""  # the end of the bytes before this chunk: a mark split across two chunks is counted once
    for chunk in resp.iter_content(65536):
        size += len(chunk)
        if size > MAX_RESPONSE_BYTES:
            if max_series is not None:
                raise TooManySeries(f"the Prometheus answer exceeds {MAX_RESPONSE_BYTES} bytes")
            raise PromError(f"the Prometheus answer exceeds {MAX_RESPONSE_BYTES} bytes")
        if time.monotonic() - started > budget:
            raise PromError(f"Prometheus did not answer within {budget:g}s")
        if max_series is not None:
            joined = tail + chunk
            series += joined.count(_SERIES_MARK)
            if series > max_series:
                raise TooManySeries(f"the Prometheus answer holds more than {max_series} series")
            tail = joined[-(len(_SERIES_MARK) - 1):]
        chunks.append(chunk)
    return b"".join(chunks)


def _short(err: Exception) -> str:
    text = str(err)
    # urllib3 wraps the cause in long reprs; the last part names it.
    if "Caused by" in text:
        text = text.split("Caused by", 1)[1]
    return text.strip(" ():'\"")[:200]


def _labels(raw: dict[Any, Any]) -> dict[str, str]:
    return {str(k): str(v) for k, v in raw.items()}


def _points(raw: list[Any]) -> list[tuple[float, float]]:
    out = []
    for pair in raw:
        if not isinstance(pair, list | tuple) or len(pair) != 2:
            raise PromError("a sample is not a [time, value] pair")
        try:
            ts = float(pair[0])
            value = float(pair[1])
        except (TypeError, ValueError):
            raise PromError(f"a sample is not numeric: {str(pair)[:60]}") from None
        if math.isfinite(ts) and math.isfinite(value):
            out.append((ts, value))
    return out


UNUSABLE_URL = "the Prometheus URL (prometheus.url) is not usable"


def url_problem(url: str) -> str | None:
    """Why `url` cannot be Prometheus' base URL, in words that never repeat it (it may hold a token, and
    the text becomes every GPU notebook's no-signal reason); None when it looks usable."""
    if any(c.isspace() or not c.isprintable() for c in url):
        return "it contains whitespace or a control character"
    try:
        parts = urlsplit(url)
        _ = parts.port  # raises on a port that is not a number from 0 to 65535
    except ValueError:
        return "it is not a URL, or its port is not a number from 0 to 65535"
    if parts.scheme not in ("http", "https"):
        return "it does not start with http:// or https://"
    if "@" in parts.netloc:
        return "it carries a user name or password (use prometheus.bearerTokenFile)"
    if not parts.hostname:
        return "it names no host"
    return None


def without_url(text: str, url: str | None) -> str:
    """`text` with the configured URL (and anything built on it) replaced by the key's name."""
    base = (url or "").rstrip("/")  # what every request URL starts with
    return text.replace(base, "prometheus.url") if base else text


def error_for_all(pods: Sequence[tuple[str, str]], err: Exception,
                  url: str | None = None) -> dict[tuple[str, str], dict[str, Any]]:
    """The answer when a bulk query failed: the same `{"error": ...}` for every pod asked; `url`, the
    configured Prometheus URL, never appears in it."""
    text = f"prometheus: {err}" if isinstance(err, PromError) else f"prometheus: {type(err).__name__}: {err}"
    return {p: {"error": cut(without_url(text, url), SNIPPET)} for p in pods}
