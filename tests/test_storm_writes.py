"""A pass that stops many notebooks at once: at most `writesInFlight` notebook patches in flight, every one
landing; each write waits out a 429 (API Priority and Fairness) as the server asks, instead of failing."""

from __future__ import annotations

import json
import threading
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException
from support.faulty import FaultyServer
from support.passes import Passes

from kf_culler.config import load_mapping
from kf_culler.kube import backoff
from kf_culler.kube.backoff import with_backoff
from kf_culler.kube.records import bucket_names, bucket_of
from kf_culler.local import objects as obj
from kf_culler.model import STOP_ANNOTATION
from kf_culler.runner import build_runner


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


def test_a_call_the_server_takes_at_once_sets_up_no_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    """Most requests are never throttled: those are one plain call (the retry machinery, set up for each, was a share
    of a write's CPU); a 429 still gets the retries, ATTEMPTS tries in all."""
    made: list[object] = []
    real = backoff.Retrying

    def counted(*args: Any, **kwargs: Any) -> Any:
        made.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr(backoff, "Retrying", counted)
    assert with_backoff(lambda: "at once", sleep=lambda _s: None) == "at once"
    assert made == []
    answers: list[Any] = [throttled("1"), "then"]

    def call() -> str:
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return str(answer)

    assert with_backoff(call, sleep=lambda _s: None) == "then" and len(made) == 1


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
        with Passes(build_runner(settings, api, records_namespace=namespace)) as runner:
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


def storm_of(api: Any, namespace: str, names: list[str], faulty: FaultyServer) -> Any:
    start = datetime.now(UTC)
    for name in names:
        obj.create_notebook(api, namespace, obj.notebook(name))
        obj.running_pod(api, namespace, name, start - timedelta(hours=3))
    return load_mapping({
        "idleMinutes": 30, "warnMinutes": 0, "startupGraceMinutes": 0, "writesInFlight": 4,
        "namespaces": {"include": [namespace]}, "urls": {"jupyter": faulty.base + "/{name}/"}}, "storm")


def record_patches(api: Any) -> tuple[list[dict[str, Any]], Any]:
    """Every ConfigMap merge patch the API server took, as (bucket, data) bodies; the original call_api."""
    seen: list[dict[str, Any]] = []
    original = api.call_api

    def watching(method: str, url: str, *args: Any, **kwargs: Any) -> Any:
        if method == "PATCH" and "/configmaps/" in url:
            body = kwargs["body"] if "body" in kwargs else args[1]
            body = json.loads(body) if isinstance(body, str | bytes) else body
            answer = original(method, url, *args, **kwargs)
            if getattr(answer, "status", 200) >= 400:  # a 404 (no bucket yet): created, then patched again
                return answer
            seen.append({"bucket": url.split("?")[0].rsplit("/", 1)[-1], "data": dict(body["data"])})
            return answer
        return original(method, url, *args, **kwargs)

    api.call_api = watching
    return seen, original


@pytest.mark.cluster
def test_a_storm_stores_its_stop_records_in_one_patch_per_bucket(api: Any, namespace: str) -> None:
    """40 stops in one pass: each stop's record is stored before its patch, all of them in at most one merge
    patch per record bucket (16), not one patch per stop."""
    names = [f"nb{i:02d}-ok" for i in range(40)]
    with FaultyServer(idle_since=datetime.now(UTC) - timedelta(hours=1)) as faulty:
        settings = storm_of(api, namespace, names, faulty)
        seen, _ = record_patches(api)
        with Passes(build_runner(settings, api, records_namespace=namespace)) as runner:
            result = runner.once()
    assert sum(r.write is not None and r.write.outcome == "patched" for r in result.results) == len(names)
    with_stops = [p for p in seen if any(v and "stoppedAt" in v for v in p["data"].values())]
    assert 0 < len(with_stops) <= len(bucket_names())
    assert len({p["bucket"] for p in with_stops}) == len(with_stops)  # one patch per bucket
    stop_values = [uid for p in with_stops for uid, v in p["data"].items() if v and "stoppedAt" in v]
    uids = {obj.get_notebook(api, namespace, n)["metadata"]["uid"] for n in names}
    assert sorted(stop_values) == sorted(uids)  # every stop's record, each once


@pytest.mark.cluster
def test_a_stop_whose_patch_fails_gets_its_record_back(api: Any, namespace: str) -> None:
    """The records are stored first; a notebook whose patch then fails (here the API server answers 500 to
    it) has its record taken back, so no restart is seen later where there was no stop."""
    names = [f"nb{i:02d}-ok" for i in range(6)]
    with FaultyServer(idle_since=datetime.now(UTC) - timedelta(hours=1)) as faulty:
        settings = storm_of(api, namespace, names, faulty)
        seen, original = record_patches(api)
        watching = api.call_api

        def refusing(method: str, url: str, *args: Any, **kwargs: Any) -> Any:
            if method == "PATCH" and url.endswith("/notebooks/nb03-ok"):
                raise ApiException(status=500, reason="Internal Server Error")
            return watching(method, url, *args, **kwargs)

        api.call_api = refusing
        with Passes(build_runner(settings, api, records_namespace=namespace)) as runner:
            result = runner.once()
        api.call_api = original
    outcome = {r.name: r.write.outcome if r.write is not None else None for r in result.results}
    assert outcome.pop("nb03-ok") == "failed"
    assert set(outcome.values()) == {"patched"}
    refused = obj.get_notebook(api, namespace, "nb03-ok")["metadata"]["uid"]
    assert STOP_ANNOTATION not in (obj.get_notebook(api, namespace, "nb03-ok")["metadata"].get("annotations") or {})
    first = next(p for p in seen if refused in p["data"])
    assert "stoppedAt" in (first["data"][refused] or "")  # stored before the patch was tried
    cm = client.CoreV1Api(api).read_namespaced_config_map(bucket_of(refused), namespace)
    kept = (cm.data or {}).get(refused)
    assert kept is None or "stoppedAt" not in json.loads(kept)  # and taken back
    for name in names:
        if name == "nb03-ok":
            continue
        uid = obj.get_notebook(api, namespace, name)["metadata"]["uid"]
        cm = client.CoreV1Api(api).read_namespaced_config_map(bucket_of(uid), namespace)
        assert "stoppedAt" in json.loads(cm.data[uid])


@pytest.mark.cluster
def test_a_storm_writes_every_stop_before_the_first_event(api: Any, namespace: str) -> None:
    """The Events of a pass go out after all its patches (kf_culler/kube/event_tail.py): the last of 40 stops
    does not wait for 39 Events. Each stop still gets its one Event, and the pass's result says so."""
    names = [f"nb{i:02d}-ok" for i in range(40)]
    order: list[str] = []
    lock = threading.Lock()
    original = api.call_api

    def ordering(method: str, url: str, *args: Any, **kwargs: Any) -> Any:
        answer = original(method, url, *args, **kwargs)
        what = "patch" if method == "PATCH" and "/notebooks/" in url else \
            "event" if method == "POST" and url.endswith("/events") else None
        if what is not None:
            with lock:
                order.append(what)
        return answer

    with FaultyServer(idle_since=datetime.now(UTC) - timedelta(hours=1)) as faulty:
        settings = storm_of(api, namespace, names, faulty)
        api.call_api = ordering
        try:
            with Passes(build_runner(settings, api, records_namespace=namespace)) as runner:
                result = runner.once()
        finally:
            api.call_api = original
    assert order.count("patch") == len(names) and order.count("event") == len(names), order
    assert order.index("event") == len(names)  # every patch, then every Event
    assert all(r.write is not None and r.write.event == "created" for r in result.results)
    assert "events" not in result.phases  # the Runner's passes leave their Events to the tail
    events = client.CoreV1Api(api).list_namespaced_event(namespace).items
    assert sorted(e.involved_object.name for e in events if e.reason == "IdleNotebookStopped") == names


@pytest.mark.cluster
def test_an_event_that_could_not_be_sent_is_sent_by_the_next_pass(api: Any, namespace: str) -> None:
    """The API server answers 503 to the Event of one stop (its patch landed): the next pass sends it again, once;
    an Event refused for good (403) is not sent again."""
    names = ["nb00-ok", "nb01-ok", "nb02-ok"]
    original = api.call_api
    refuse = {"nb00-ok": 503, "nb01-ok": 403}

    def refusing(method: str, url: str, *args: Any, **kwargs: Any) -> Any:
        if method == "POST" and url.endswith("/events"):
            body = kwargs["body"] if "body" in kwargs else args[1]
            status = refuse.get(str(body["involvedObject"]["name"]))
            if status is not None:
                raise ApiException(status=status, reason="refused by the test")
        return original(method, url, *args, **kwargs)

    with FaultyServer(idle_since=datetime.now(UTC) - timedelta(hours=1)) as faulty:
        settings = storm_of(api, namespace, names, faulty)
        api.call_api = refusing
        try:
            with Passes(build_runner(settings, api, records_namespace=namespace)) as runner:
                first = runner.once()
                events = {r.name: r.write.event if r.write else None for r in first.results}
                assert events == {"nb00-ok": "failed: HTTP 503", "nb01-ok": "failed: HTTP 403",
                                  "nb02-ok": "created"}, events
                refuse.clear()  # the API server takes Events again
                second = runner.once()
        finally:
            api.call_api = original
    assert all(r.verdict.action == "keep" for r in second.results)  # stopped stays stopped: nothing new
    stopped = [e.involved_object.name for e in client.CoreV1Api(api).list_namespaced_event(namespace).items
               if e.reason == "IdleNotebookStopped"]
    assert sorted(stopped) == ["nb00-ok", "nb02-ok"]  # the 503 sent again once; the 403 not
    assert first.results[0].write is not None and first.results[0].write.event == "created"


def test_chunks_count_only_the_notebooks_that_store_records_first() -> None:
    from kf_culler.cycle import _chunks

    items = list(range(10))
    assert _chunks(items, lambda i: i % 3 == 0, 2) == [[0, 1, 2, 3, 4, 5], [6, 7, 8, 9]]  # type: ignore[arg-type]
    assert _chunks(items, lambda _i: False, 2) == [items]  # type: ignore[arg-type]
    assert _chunks([], lambda _i: True, 2) == []


@pytest.mark.cluster
def test_a_pass_stopped_mid_chunk_takes_back_the_records_stored_ahead(api: Any, namespace: str) -> None:
    """One writer: chunks of 16 stops, the second chunk's records stored while the first is written. SIGTERM after
    the third stop: the records of every notebook not stopped, those of the chunk stored ahead included, are
    taken back, so that no later pass reads a stop that never happened as a restart."""
    names = [f"nb{i:02d}-ok" for i in range(40)]
    with FaultyServer(idle_since=datetime.now(UTC) - timedelta(hours=1)) as faulty:
        settings = storm_of(api, namespace, names, faulty)
        settings = load_mapping({"idleMinutes": 30, "warnMinutes": 0, "startupGraceMinutes": 0, "writesInFlight": 1,
                                 "namespaces": {"include": [namespace]},
                                 "urls": {"jupyter": faulty.base + "/{name}/"}}, "storm")
        seen, original = record_patches(api)
        written: list[str] = []
        with Passes(build_runner(settings, api, records_namespace=namespace)) as runner:
            def stop_after_three(r: Any) -> None:
                written.append(r.name)
                if len(written) == 3:
                    runner.stop.set()

            runner.change(on_result=stop_after_three)
            result = runner.once()
        api.call_api = original
    assert result.interrupted and len(written) == 3
    ahead = {uid for p in seen for uid, v in p["data"].items() if v and "stoppedAt" in v}
    assert len(ahead) == 32  # both chunks' records were stored before their patches
    for name in names:
        nb = obj.get_notebook(api, namespace, name)
        uid = nb["metadata"]["uid"]
        try:
            kept = (client.CoreV1Api(api).read_namespaced_config_map(bucket_of(uid), namespace).data or {}).get(uid)
        except ApiException as err:  # a bucket no stored record needed
            assert err.status == 404
            kept = None
        stopped = STOP_ANNOTATION in (nb["metadata"].get("annotations") or {})
        assert stopped == (name in written), name
        assert (kept is not None and "stoppedAt" in json.loads(kept)) == stopped, name
