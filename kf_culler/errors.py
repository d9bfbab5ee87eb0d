"""Every error kf-culler raises on purpose, in one place. `KfCullerError` is the root.

    KfCullerError
    ├── InputError        a scenario or object that is not a notebook at all (decide; CLI exit 2)
    ├── ConfigError       a configuration that cannot be used: the message names the key and the file
    ├── TraceError        a replay trace that cannot be read: the message names the file and line
    ├── Unreadable        a source's answer that cannot be read (becomes "no signal", never raised out)
    ├── SourceError       a source that could not be asked
    │   ├── Transient     worth one more try (connection refused/reset, HTTP 502/503/504)
    │   ├── Permanent     another try will not fix it
    │   ├── PromError     Prometheus could not answer a query
    │   └── ScrapeError   a dcgm-exporter endpoint could not be scraped
    ├── SendError         a notice that could not be delivered (`transient`: worth another attempt)
    └── ReviewUnavailable the API server could not review a token (nothing is known about it)

The ones that describe bad input are also ValueErrors, as callers of the standard library expect.
"""

from __future__ import annotations


class KfCullerError(Exception):
    """The root of kf-culler's own errors."""


class InputError(KfCullerError, ValueError):
    """An input that is not a notebook/scenario at all (as opposed to a broken observation)."""


class ConfigError(KfCullerError, ValueError):
    """A configuration that cannot be used; the message names the key and the source."""


class TraceError(KfCullerError, ValueError):
    """A trace that cannot be read; the message names the file and line."""


class Unreadable(KfCullerError, ValueError):
    """The answer cannot be read; the message says why."""


class SourceError(KfCullerError):
    """A source could not be asked or did not answer."""


class Transient(SourceError):
    """A failure worth one more try (connection refused/reset, 502/503/504)."""


class Permanent(SourceError):
    """A failure that another try will not fix."""


class PromError(SourceError):
    """Prometheus could not answer this query; the message says why."""


class ScrapeError(SourceError):
    """A dcgm-exporter endpoint could not be scraped; the message says why."""


class SendError(KfCullerError):
    """A delivery that failed. `transient`: worth another attempt (timeouts, 4xx SMTP, 429/5xx HTTP).

    The message never carries a webhook URL or a password: it is shown in metrics, logs, Events and
    `kf-culler explain`.
    """

    def __init__(self, message: str, transient: bool) -> None:
        super().__init__(message)
        self.transient = transient


class ReviewUnavailable(KfCullerError, RuntimeError):
    """The API server could not be asked (or answered with an error); nothing is known about the token."""
