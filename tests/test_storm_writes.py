"""A pass that stops many notebooks at once: at most `writesInFlight` notebook patches in flight, every one
landing; each write waits out a 429 (API Priority and Fairness) as the server asks, instead of failing."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from kubernetes.client.rest import ApiException
from support.faulty import FaultyServer

from kf_culler.config import load_mapping
from kf_culler.kube import backoff
from kf_culler.kube.backoff import with_backoff
from kf_culler.local import objects as obj
from kf_culler.model import STOP_ANNOTATION
from kf_culler.runner import Runner


def throttled(retry_after: str | None) -> ApiException:
    err = ApiException(status=429, reason="Too Many Requests")
    err.headers = {"Retry-After": retry_after} if retry_after is not None else {}
    return err


def test_a_429_is_waited_out_as_the_server_asks() -> None:
    answers: list[Any] = [throttled("2"), throttled("0"), "done"]
    waits: list[float] = []

    def call() -> str:
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return str(answer)

    assert with_backoff(call, sleep=waits.append) == "done"
    assert waits == [2.0, 0.1]  # Retry-After, at least 0.1 s


def test_without_retry_after_the_wait_doubles_and_is_capped() -> None:
    waits: list[float] = []

    def call() -> None:
        raise throttled(None)

    with pytest.raises(ApiException) as err:
        with_backoff(call, sleep=waits.append)
    assert err.value.status == 429
    assert waits == [0.5, 1.0, 2.0, 4.0, 8.0]  # then the last 429 is raised: ATTEMPTS tries in all
    assert len(waits) == backoff.ATTEMPTS - 1
    waits.clear()
    answers: list[ApiException | None] = [throttled("3600"), None]

    def once_throttled() -> None:
        answer = answers.pop(0)
        if answer is not None:
            raise answer

    with_backoff(once_throttled, sleep=waits.append)
    assert waits == [backoff.MAX_WAIT_SECONDS]  # an hour asked, 10 s waited


def test_other_errors_are_not_retried() -> None:
    calls = [0]

    def call() -> None:
        calls[0] += 1
        raise ApiException(status=409, reason="Conflict")

    with pytest.raises(ApiException):
        with_backoff(call, sleep=lambda _s: None)
    assert calls[0] == 1


@pytest.mark.cluster
@pytest.mark.parametrize("in_flight", [1, 4])
def test_a_mass_stop_keeps_at_most_writes_in_flight_patches_at_once(api: Any, namespace: str,
                                                                     in_flight: int) -> None:
    names = [f"nb{i:02d}-ok" for i in range(40)]
    start = datetime.now(UTC)
    peak, now_in = [0], [0]
    lock = threading.Lock()
    original = api.call_api

    def counting(method: str, url: str, *args: Any, **kwargs: Any) -> Any:
        if method != "PATCH" or "/notebooks/" not in url:
            return original(method, url, *args, **kwargs)
        with lock:
            now_in[0] += 1
            peak[0] = max(peak[0], now_in[0])
        try:
            time.sleep(0.05)  # a slow API server: overlapping writes show
            return original(method, url, *args, **kwargs)
        finally:
            with lock:
                now_in[0] -= 1

    with FaultyServer(idle_since=start - timedelta(hours=1)) as faulty:
        for name in names:
            obj.create_notebook(api, namespace, obj.notebook(name))
            obj.running_pod(api, namespace, name, start - timedelta(hours=3))
        settings = load_mapping({
            "idleMinutes": 30, "warnMinutes": 0, "startupGraceMinutes": 0, "writesInFlight": in_flight,
            "namespaces": {"include": [namespace]}, "urls": {"jupyter": faulty.base + "/{name}/"}}, "storm")
        api.call_api = counting
        with Runner(settings, api, records_namespace=namespace) as runner:
            result = runner.once()
    stops = [r for r in result.results if r.verdict.action == "stop"]
    assert len(stops) == len(names)
    assert all(r.write is not None and r.write.outcome == "patched" for r in stops)
    assert peak[0] == in_flight  # bounded, and used
    for name in names:
        got = obj.get_notebook(api, namespace, name)
        assert STOP_ANNOTATION in got["metadata"]["annotations"], name


def test_a_writer_that_lost_its_lease_stops_waiting_out_429s() -> None:
    calls, waits = [0], []

    def call() -> None:
        calls[0] += 1
        raise throttled("5")

    leader = [True]

    def lose_lease(seconds: float) -> None:
        waits.append(seconds)
        leader[0] = False  # the Lease lapsed during the wait

    with pytest.raises(ApiException):
        with_backoff(call, sleep=lose_lease, give_up=lambda: not leader[0])
    assert calls[0] == 2 and waits == [5.0]  # tried, waited once, tried again, then gave up
