"""API calls that back off when the API server says "too many requests" (429, API Priority and Fairness).

A pass that warns or stops thousands of notebooks writes with several requests in flight; when the API
server's fairness queues are full it answers 429 with a Retry-After. Such a write waits and is sent again,
rather than failing or being retried at once.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

from tenacity import RetryCallState, Retrying, retry_if_exception, stop_after_attempt
from tenacity.stop import stop_base

T = TypeVar("T")
ATTEMPTS = 6  # the first try and five more after a 429
MAX_WAIT_SECONDS = 10.0  # a Retry-After longer than this is waited this long


class _GiveUp(stop_base):
    def __init__(self, give_up: Callable[[], bool]) -> None:
        self.give_up = give_up

    def __call__(self, retry_state: RetryCallState) -> bool:
        return self.give_up()


def _throttled(err: BaseException) -> bool:
    return getattr(err, "status", None) == 429


def _retry_after(err: BaseException | None) -> float | None:
    headers: Any = getattr(err, "headers", None)
    try:
        value = headers.get("Retry-After") if headers is not None else None
        return float(value) if value is not None else None
    except (TypeError, ValueError, AttributeError):
        return None


def _wait_after(err: BaseException | None, attempt: int) -> float:
    """After the `attempt`th try answered 429: the server's Retry-After (at least 0.1 s, at most MAX_WAIT_SECONDS),
    else 0.5 s doubled per attempt."""
    asked = _retry_after(err)
    if asked is not None:
        return min(max(asked, 0.1), MAX_WAIT_SECONDS)
    return min(0.5 * 2.0 ** (attempt - 1), MAX_WAIT_SECONDS)


def with_backoff(call: Callable[[], T], sleep: Callable[[float], None] | None = None,
                 give_up: Callable[[], bool] | None = None) -> T:
    """`call()`, sent again after a 429 as the server asks, at most ATTEMPTS times in all; any other error,
    and the last 429, are raised as they are. `give_up()` true after a 429 (this replica lost its Lease,
    the process is stopping): the 429 is raised instead of waiting to send again.

    The first try is a plain call: the retry machinery is set up only once the server said 429 (set up for
    every request, it was a share of a write's CPU, docs/performance.md)."""
    try:
        return call()
    except Exception as err:
        if not _throttled(err) or (give_up is not None and give_up()):
            raise
        (sleep or time.sleep)(_wait_after(err, 1))
    kwargs: dict[str, Any] = {"sleep": sleep} if sleep is not None else {}
    stop: stop_base = stop_after_attempt(ATTEMPTS - 1)  # the tries after the first

    def wait(state: RetryCallState) -> float:
        return _wait_after(state.outcome.exception() if state.outcome is not None else None, state.attempt_number + 1)

    if give_up is not None:
        stop = stop | _GiveUp(give_up)
    retrying = Retrying(stop=stop, retry=retry_if_exception(_throttled), wait=wait, reraise=True, **kwargs)
    return retrying(call)
