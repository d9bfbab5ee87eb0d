"""The one interface of the bulk sources: one query (or one scrape) for many pods per pass.

GPU from Prometheus (`sources.gpu.PrometheusGpu`), GPU from dcgm-exporter directly
(`sources.dcgm.DcgmScraper`) and RStudio through Prometheus (`sources.rstudio.PrometheusRStudio`) do
not probe each notebook: each asks once per pass for every pod it is given and answers per pod.
`gather` runs each one in a worker thread next to the per-notebook HTTP probes.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any, Protocol

Key = tuple[str, str]  # (namespace, pod name)
Answers = dict[Key, dict[str, Any]]


class BulkSource(Protocol):
    def samples(self, pods: Sequence[Key], now: datetime) -> tuple[Answers, int]:
        """For each pod asked about, its answer or `{"error": ...}`; and the number of queries (or scrapes)
        made. Never raises: a failure is an error answer for every pod."""
        ...
