"""A hostile notebook server (its user runs it) cannot blow up the culler's memory or stall its loop.

Against real loopback servers (tests/support/faulty.py): an endless response header, one header line
that never ends, too many header lines, 1 MiB of `[{},{},...]` (under the body cap), JSON nested 25 deep,
and a kernel list over `probe.maxListItems` each give that source `{"error": ...}` (no signal, rule 6)
with bounded memory, and do not hold up another notebook probed on the same Fetcher. A real
jupyter_server still reads, and the slimmed answer the sources keep gives the same reading as the full
one (hypothesis). The bounds and their sizes: docs/faults.md, "Hostile tenant".
"""

from __future__ import annotations

import asyncio
import itertools
import json
import sys
import time
import tracemalloc
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.faulty import FLAT_BODY, FaultyServer

from kf_culler.config import ProbeSettings, load_mapping
from kf_culler.cycle import Cycle, run_async
from kf_culler.local import objects as obj
from kf_culler.local.jupyter import JupyterServer
from kf_culler.readings import Unreadable, parse_code_server, parse_jupyter
from kf_culler.sources import codeserver, jupyter
from kf_culler.sources.http import MAX_HEADER_LINES, Call, Fetcher, _ValueCount, json_shape_error

TIMEOUT = 2.0
PROBE = ProbeSettings.model_validate({"timeoutSeconds": TIMEOUT, "connectTimeoutSeconds": 1.0, "retries": 1})
MiB = 1 << 20
HEADER_FAULTS = {"endlesshead": "response headers over 64 KiB", "longline": "response headers over 64 KiB",
                 "manyheaders": f"response headers over {MAX_HEADER_LINES} lines"}
BODY_FAULTS = {"flat": "the JSON answer has over 50000 values", "deep": "the JSON answer nests deeper than 20"}


@pytest.fixture(scope="module")
def faulty() -> Iterator[FaultyServer]:
    with FaultyServer(slow_delay=0.05) as server:
        yield server


def probe(kind: str, url: str, fetcher: Fetcher | None = None) -> tuple[dict[str, Any], list[Call]]:
    async def go() -> tuple[dict[str, Any], list[Call]]:
        f = fetcher or Fetcher.open(PROBE, 8)
        try:
            if kind == "jupyter":
                return await jupyter.probe(f, url)
            return await codeserver.probe(f, url)
        finally:
            await f.close()

    return run_async(go())  # the culler's own loop (uvloop)


def traced(kind: str, url: str) -> tuple[dict[str, Any], list[Call], int]:
    """One probe, and the peak of Python memory allocated while it ran."""
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        base, _ = tracemalloc.get_traced_memory()
        answer, calls = probe(kind, url)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return answer, calls, peak - base


def unreadable(kind: str, answer: dict[str, Any]) -> str:
    with pytest.raises(Unreadable) as err:
        (parse_jupyter if kind == "jupyter" else parse_code_server)(answer)
    return str(err.value)


# -- headers ----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["jupyter", "codeServer"])
@pytest.mark.parametrize("fault", sorted(HEADER_FAULTS))
def test_an_endless_header_is_cut_off(faulty: FaultyServer, kind: str, fault: str) -> None:
    """The server writes header bytes forever (lines of 1 KiB, one line that never ends, or a thousand
    short lines): the call fails at the header cap, once (not retried), within the probe timeout; the
    client's memory stays bounded and the server could push only a little before the hang-up."""
    before = faulty.body_bytes[fault]
    answer, calls, peak = traced(kind, faulty.url(f"{kind[:3]}{len(faulty.seen)}-{fault}"))
    assert set(answer) == {"error"} and HEADER_FAULTS[fault] in answer["error"], answer
    assert unreadable(kind, answer)  # no signal
    assert len(calls) == 1 and calls[0].attempts == 1 and calls[0].error, calls
    assert calls[0].seconds <= TIMEOUT + 0.5, calls
    assert peak < 5 * MiB, f"peak {peak / MiB:.1f} MiB while refusing an endless header"
    time.sleep(0.3)  # let the server notice the closed connection
    assert faulty.body_bytes[fault] - before < 8 * MiB  # the cap and the socket buffers; not without end


def test_a_header_that_drips_forever_times_out(faulty: FaultyServer) -> None:
    """A header line every 50 ms never reaches the caps before the timeout: the timeout ends it."""
    answer, calls, peak = traced("jupyter", faulty.url("jup-slowhead"))
    assert answer == {"error": f"api/status: timeout after {TIMEOUT:g}s"}, answer
    assert calls[0].seconds <= TIMEOUT + 0.5 and peak < 5 * MiB


# -- bodies -------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["jupyter", "codeServer"])
@pytest.mark.parametrize("fault", sorted(BODY_FAULTS))
def test_an_absurd_json_answer_is_refused_before_decoding(faulty: FaultyServer, kind: str, fault: str) -> None:
    """1 MiB of `[{},{},...]` (under the 1 MiB body cap: decoded it was ~24x that) or a list nested 25
    deep, for api/kernels (api/status is valid) or /healthz: an error for the source, no signal, and far
    less memory than decoding (tracemalloc peak for the probe < 10 MiB)."""
    answer, calls, peak = traced(kind, faulty.url(f"{kind[:3]}-{fault}"))
    where = "api/kernels" if kind == "jupyter" else "/healthz"
    assert answer == {"error": f"{where}: {BODY_FAULTS[fault]}"}, answer
    assert unreadable(kind, answer) == answer["error"]
    assert calls[-1].status == 200 and calls[-1].attempts == 1
    assert peak < 10 * MiB, f"peak {peak / MiB:.1f} MiB for a {len(FLAT_BODY) / MiB:.1f} MiB answer"


def test_a_kernel_list_over_the_cap_is_an_error(faulty: FaultyServer) -> None:
    """2,000 valid idle kernels (330 KB, 12,000 values: under the body and value caps) are over
    probe.maxListItems (1,000): an error, not a reading, and not a huge list kept for the pass."""
    answer, _, _ = traced("jupyter", faulty.url("jup-many"))
    assert answer == {"error": "api/kernels: 2000 items, over the cap of 1000 (probe.maxListItems)"}, answer
    assert unreadable("jupyter", answer)


def test_a_pass_over_hostile_notebooks_stops_none(faulty: FaultyServer) -> None:
    """A whole pass (gather, decide, plan) over every hostile kind: each notebook is kept with no signal;
    the idle control on the same server is stopped by the same pass."""
    hostile = ["endlesshead", "longline", "manyheaders", "slowhead", "flat", "deep", "many"]
    settings = load_mapping({
        "idleMinutes": 1, "warnMinutes": 0, "startupGraceMinutes": 0,
        "urls": {"jupyter": faulty.base + "/{name}/", "codeServer": faulty.base + "/{name}/"},
        "probe": {"timeoutSeconds": TIMEOUT, "connectTimeoutSeconds": 1.0, "retries": 1}}, "test")
    started = (datetime.now(UTC) - timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
    items: list[tuple[dict[str, Any], dict[str, Any] | None]] = []
    names = [f"jup-{h}" for h in hostile] + [f"cs-{h}" for h in hostile if h != "many"] + ["jup-ok", "cs-ok"]
    for name in names:
        nb = obj.notebook(name, server_type="group-one" if name.startswith("cs-") else "jupyter")
        nb["metadata"]["namespace"] = "team-a"
        items.append((nb, {"metadata": {"name": f"{name}-0", "namespace": "team-a"},
                           "status": {"phase": "Running", "startTime": started}}))
    result = Cycle(settings).run(items)
    by_name = {r.name: r for r in result.results}
    assert set(by_name) == set(names)
    for name in names[:-2]:
        r = by_name[name]
        source = "jupyter" if name.startswith("jup-") else "codeServer"
        assert set(r.observations[source]) == {"error"}, (name, r.observations)
        assert (r.verdict.action, r.verdict.state) == ("keep", "no-signal"), (name, r.verdict)
    for name in ("jup-ok", "cs-ok"):
        assert by_name[name].verdict.action == "stop", by_name[name].verdict


# -- one hostile notebook does not hold up another -----------------------------------------------------------------

def test_hostile_notebooks_do_not_delay_another_on_the_same_fetcher(faulty: FaultyServer) -> None:
    """The good notebook is probed concurrently with every hostile kind on one Fetcher and one loop: it
    answers (no error, a reading), and the loop is never blocked for long (a ticker every 10 ms)."""
    hostile = ["endlesshead", "longline", "manyheaders", "slowhead", "flat", "deep", "many"]

    async def go() -> tuple[list[tuple[dict[str, Any], list[Call]]], float]:
        fetcher = Fetcher.open(PROBE, 16)
        gaps = [0.0]
        done = asyncio.Event()

        async def ticker() -> None:
            last = time.monotonic()
            while not done.is_set():
                await asyncio.sleep(0.01)
                now = time.monotonic()
                gaps.append(now - last - 0.01)
                last = now

        tick = asyncio.create_task(ticker())
        try:
            probes = [jupyter.probe(fetcher, faulty.url(f"hostile{i}-{h}")) for i, h in enumerate(hostile)]
            results = await asyncio.gather(jupyter.probe(fetcher, faulty.url("good-ok")), *probes)
        finally:
            done.set()
            await tick
            await fetcher.close()
        return list(results), max(gaps)

    results, worst_gap = run_async(go())
    (good, good_calls), hostile_results = results[0], results[1:]
    assert all(c.error is None and c.status == 200 for c in good_calls), good_calls
    assert parse_jupyter(good).summary["kernels"] == 0
    for (answer, _), h in zip(hostile_results, hostile, strict=True):
        assert set(answer) == {"error"}, (h, answer)
    # A generous bound (the measured figure is tens of ms; an endless header alone once blocked 1.1 s).
    assert worst_gap < 1.0, f"the event loop was blocked for {worst_gap:.2f}s"


# -- a real Jupyter server: the control ----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def real_jupyter() -> Iterator[JupyterServer]:
    with JupyterServer("team-a", "nb-hostile-control") as s:
        yield s


def test_a_real_jupyter_server_still_reads(real_jupyter: JupyterServer) -> None:
    kid = real_jupyter.start_kernel()
    term = real_jupyter.new_terminal()
    answer, calls = probe("jupyter", real_jupyter.url)
    assert all(c.error is None for c in calls), calls
    assert {k["id"]: k for k in answer["kernels"]}[kid]["execution_state"] == "idle"
    assert term in [t["name"] for t in answer["terminals"]]
    reading = parse_jupyter(answer)
    assert reading.summary["kernels"] >= 1 and reading.summary["terminals"] >= 1
    # Kept for the pass: the fields the reading uses, nothing else, a few hundred bytes a kernel.
    assert set(answer["kernels"][0]) <= set(jupyter.KERNEL)
    assert len(json.dumps(answer)) < 400 * (len(answer["kernels"]) + len(answer["terminals"]) + 1)


# -- the shape scan ---------------------------------------------------------------------------------------------

def nest(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


@pytest.mark.parametrize(("body", "refused"), [
    (nest(20), None), (nest(21), "deeper than 20"), (b'{"a":' * 20 + b"0" + b"}" * 20, None),
    (b'{"a":' * 21 + b"0" + b"}" * 21, "deeper than 20"),
    (b'["' + b"[" * 100 + b'"]', None),  # brackets inside a string are no nesting
    (b'["\\"' + b"[" * 100 + b'\\\\"]', None),  # nor after escaped quotes and backslashes
    (b"[" + b"0," * 49_998 + b"0]", None),  # 49,999 values and the list: at the cap
    (b"[" + b"0," * 49_999 + b"0]", "over 50000 values"),
    (b'["' + b',' * 100_000 + b'"]', None),  # commas inside a string are no values
    (b"[" + b'"",' * 50_000 + b'""]', "over 50000 values (strings)"),
    (b"[[[[" + b"]" * 3, None), (b"not json", None), (b"", None),  # not JSON: json.loads says so
])
def test_the_shape_scan(body: bytes, refused: str | None) -> None:
    error = json_shape_error(body, 20, 50_000)
    assert (error is None) if refused is None else (error is not None and refused in error), error


def test_the_shape_scan_is_cheap_for_a_mebibyte() -> None:
    """It runs on the event loop: the worst 1 MiB measured takes ~15 ms; the bound is generous."""
    worst = [FLAT_BODY, b"[" + b'"a\\"b",' * (MiB // 7 - 1) + b'""]', b'"' + b"\\\\" * (MiB // 2 - 1) + b'"',
             b"[" + b",".join([nest(19)] * (MiB // 40)) + b"]"]
    for body in worst:
        t0 = time.perf_counter()
        json_shape_error(body, 20, 50_000)
        assert time.perf_counter() - t0 < 0.25


def counted(body: bytes, cuts: list[int], max_values: int) -> str | None:
    """The first refusal of a body's values counted as it arrives, cut at `cuts`."""
    count = _ValueCount(max_values)
    edges = [0, *sorted(c % (len(body) + 1) for c in cuts), len(body)]
    return next((r for a, b in itertools.pairwise(edges) if (r := count.feed(body[a:b])) is not None), None)


@settings(max_examples=1500, deadline=None, database=None)
@given(st.one_of(st.binary(max_size=60), st.text(alphabet=st.sampled_from('[]{},"\\:a'), max_size=60).map(str.encode)),
       st.lists(st.integers(0, 61), max_size=8), st.integers(1, 12))
def test_the_value_count_as_the_body_arrives_agrees_with_the_shape_scan(body: bytes, cuts: list[int],
                                                                         max_values: int) -> None:
    """However the body is cut into reads (escapes and strings across them), the values counted as it
    arrives refuse it exactly when the scan of the whole body refuses it for its values."""
    whole = json_shape_error(body, 100, max_values)
    assert (counted(body, cuts, max_values) is not None) == (whole is not None and "values" in whole), whole


def test_a_flat_answer_is_refused_at_the_read_that_passes_the_cap() -> None:
    """1 MiB of `[{},{},...]` in 64 KiB reads: refused at the second read (50,000 values are 73 KiB of it),
    so only what came before it is held, never the whole answer and a joined copy of it."""
    count = _ValueCount(50_000)
    reads = [FLAT_BODY[i:i + 65536] for i in range(0, len(FLAT_BODY), 65536)]
    assert [count.feed(r) for r in reads[:2]] == [None, "the JSON answer has over 50000 values"]


def true_shape(value: Any, depth: int = 1) -> tuple[int, int, int]:
    """(depth, `{`/`[`/`,` count plus one, strings) of a decoded value, as the scan counts them."""
    if isinstance(value, list | dict):
        items = list(value.values()) if isinstance(value, dict) else value
        shapes = [true_shape(v, depth + 1) for v in items]
        return (max([depth, *(s[0] for s in shapes)]), 2 + max(len(items) - 1, 0) + sum(s[1] - 1 for s in shapes),
                (len(value) if isinstance(value, dict) else 0) + sum(s[2] for s in shapes))
    return depth - 1, 1, int(isinstance(value, str))


json_values: st.SearchStrategy[Any] = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False),
              st.text(alphabet=st.sampled_from('[]{},"\\:ab\u00e9'), max_size=8)),
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=4), inner, max_size=4)),
    max_leaves=40)


@settings(max_examples=1500, deadline=None, database=None)
@given(json_values, st.integers(1, 8), st.integers(1, 60))
def test_the_shape_scan_agrees_with_the_decoded_value(value: Any, max_depth: int, max_values: int) -> None:
    depth, values, strings = true_shape(value)
    error = json_shape_error(json.dumps(value, ensure_ascii=False).encode(), max_depth, max_values)
    expected = strings > max_values or values > max_values or depth > max_depth
    assert (error is not None) == expected, (error, depth, values, strings)


# -- what the sources keep ------------------------------------------------------------------------------------------

long_text = st.one_of(st.text(max_size=8), st.text(min_size=55, max_size=90),
                      st.builds(lambda s: "2026-11-29T11:00:00Z" + s, st.text(min_size=40, max_size=50)))
leaf: st.SearchStrategy[Any] = st.one_of(st.none(), st.booleans(), st.integers(), st.sampled_from([10**400, -0.0]),
                                         st.floats(), long_text,
                                         st.sampled_from(["busy", "idle", "alive", "expired",
                                                          "2026-11-29T11:00:00.123456Z", "2026-11-29T11:00:00"]))
anything: st.SearchStrategy[Any] = st.recursive(
    leaf, lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=4), inner, max_size=3)),
    max_leaves=10)


def maybe(value: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(value, value, value, anything)


def fields(**required: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return maybe(st.fixed_dictionaries({}, optional={k: maybe(v) for k, v in required.items()}))


times = st.one_of(st.sampled_from(["2026-11-29T11:00:00.123456Z", "2026-11-29T12:00:00+00:00"]), long_text, leaf)
counts = st.one_of(st.integers(0, 3), leaf)
error = st.builds(lambda e: {"error": e}, anything)
kernel = fields(id=long_text, name=long_text, last_activity=times, connections=counts, extra=anything,
                execution_state=st.one_of(st.sampled_from(["idle", "busy"]), long_text, leaf))
jupyter_answers = st.one_of(error, fields(
    status=st.one_of(error, fields(started=times, last_activity=times, connections=counts, kernels=anything)),
    kernels=st.one_of(error, st.lists(kernel, max_size=4)),
    terminals=st.one_of(error, st.lists(fields(name=long_text, last_activity=times), max_size=3))))
healthz_bodies = fields(status=st.one_of(st.sampled_from(["alive", "expired"]), long_text, leaf),
                        lastHeartbeat=st.one_of(st.integers(0, 2**45), leaf, times))


def outcome(parse: Any, raw: Any) -> Any:
    try:
        return parse(raw)
    except Unreadable as err:
        return ("unreadable", str(err))


SLIM = settings(max_examples=2000, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])


@SLIM
@given(jupyter_answers)
def test_the_slimmed_jupyter_answer_reads_the_same(answer: Any) -> None:
    if isinstance(answer, dict):  # the probe builds a dict; anything else is never slimmed
        assert outcome(parse_jupyter, jupyter.slim(answer)) == outcome(parse_jupyter, answer)


@SLIM
@given(healthz_bodies)
def test_the_slimmed_healthz_reads_the_same(body: Any) -> None:
    assert outcome(parse_code_server, {"healthz": codeserver.slim(body)}) == outcome(parse_code_server,
                                                                                     {"healthz": body})


def deep_size(value: Any, seen: set[int] | None = None) -> int:
    seen = set() if seen is None else seen
    if id(value) in seen:
        return 0
    seen.add(id(value))
    size = sys.getsizeof(value)
    if isinstance(value, dict):
        size += sum(deep_size(k, seen) + deep_size(v, seen) for k, v in value.items())
    elif isinstance(value, list):
        size += sum(deep_size(v, seen) for v in value)
    return size


def test_what_is_kept_per_notebook_is_bounded() -> None:
    """The worst answer that passes every cap (1,000 kernels and 1,000 terminals of long, distinct,
    4-byte-character fields and junk besides, each list under 1 MiB) keeps under 2 MiB; a real
    notebook with 100 kernels and 100 terminals about 80 KiB; `[{},{},...]` a pointer an item."""
    def worst_kernel(i: int) -> dict[str, Any]:
        return {"id": f"{i:064d}" + "x" * 100, "name": "\U0001f600" * 80, "last_activity": f"{i}" + "\u00e9" * 80,
                "execution_state": f"{i:064d}\U0001f600", "connections": 10**200 + i, "junk": ["x"] * 5}

    kernels = [worst_kernel(i) for i in range(1000)]
    terminals = [{"name": f"{i:064d}\U0001f600", "last_activity": {"a": 10**200 + i}} for i in range(1000)]
    assert len(json.dumps(kernels, ensure_ascii=False).encode()) < MiB
    status = {"started": "2026-12-01T10:21:31.713229Z", "last_activity": "2026-12-01T10:21:31.713229Z",
              "connections": 0, "kernels": 1000}
    kept = jupyter.slim({"status": status, "kernels": kernels, "terminals": terminals})
    assert deep_size(kept) < 2 * MiB, deep_size(kept)
    assert outcome(parse_jupyter, kept) == outcome(parse_jupyter, {"status": status, "kernels": kernels,
                                                                   "terminals": terminals})

    real_kernel = {"id": "26b89948-81da-4321-af31-7a772f5139b0", "name": "python3",
                   "last_activity": "2026-12-01T10:21:31.713229Z", "execution_state": "idle", "connections": 0}
    real = jupyter.slim(json.loads(json.dumps({
        "status": status, "kernels": [dict(real_kernel, id=f"{i:08d}{real_kernel['id'][8:]}") for i in range(100)],
        "terminals": [{"name": str(i), "last_activity": status["started"]} for i in range(100)]})))
    assert deep_size(real) < 100 << 10, deep_size(real)
    flat = jupyter.slim({"status": status, "kernels": [{}] * 1000, "terminals": [{}] * 1000})
    assert deep_size(flat) < 20 << 10, deep_size(flat)
