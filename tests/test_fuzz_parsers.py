"""Fuzzing with hypothesis: `decide` and every parser of a source's answer.

Whatever a source answers (a broken server, a hostile user's own server on the notebook's port, a
misconfigured Prometheus), the parsers give a reading or `Unreadable`, the bulk sources give
`{"samples": ...}`/`{"error": ...}` per pod, and `decide` gives a verdict: never another exception.
Each parser gets 10,000 examples; the inputs mix arbitrary JSON with near-valid answers whose leaves
are mutated, so that the deep branches (timestamps, counts, kernels, samples) are reached too.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kf_culler.config import (
    DcgmSettings,
    Policy,
    PrometheusSettings,
    RStudioSettings,
)
from kf_culler.decide import decide
from kf_culler.model import (
    EXEMPT_ANNOTATION,
    KEEP_UNTIL_ANNOTATION,
    LAST_ACTIVITY_ANNOTATION,
    SERVER_TYPE_ANNOTATION,
    STOP_ANNOTATION,
    InputError,
    Verdict,
)
from kf_culler.readings import (
    GpuSample,
    IdeReading,
    Unreadable,
    parse_code_server,
    parse_gpu,
    parse_jupyter,
    parse_rstudio,
)
from kf_culler.sources.dcgm import DcgmScraper
from kf_culler.sources.gpu import MEMORY, UTIL, PrometheusGpu
from kf_culler.sources.prometheus import PromError, PrometheusClient
from kf_culler.sources.rstudio import PrometheusRStudio
from kf_culler.timeutil import MAX_TIME, MIN_TIME, add_minutes, clock_text, format_time, from_epoch_ms, parse_time

EXAMPLES = 10_000
FUZZ = settings(max_examples=EXAMPLES, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.filter_too_much])

# -- values -----------------------------------------------------------------------------------------------

# Numbers at the edges: huge integers (valid JSON: `json.loads` turns a 400-digit literal into an int
# that no float can hold), infinities, NaN, negatives, floats near the limits of a datetime.
numbers = st.one_of(
    st.integers(-10, 10**6),
    st.integers(-(10**30), 10**30),
    st.sampled_from([0, 1, -1, 10**400, -(10**400), 2**63, 253402300800000, 253402300799999, 1e308, -1e308]),
    st.floats(allow_nan=True, allow_infinity=True),
)
# Timestamps: valid ones across the whole calendar, with offsets that push them past its ends, and
# near-misses (no zone, no 'T', garbage, too long).
valid_times = st.builds(
    lambda d, off, frac: d.strftime("%Y-%m-%dT%H:%M:%S") + frac + off,
    st.datetimes(min_value=datetime(1, 1, 1), max_value=datetime(9999, 12, 31, 23, 59, 59)),
    st.sampled_from(["Z", "+00:00", "+23:59", "-23:59", "+05:30", "z"]),
    st.sampled_from(["", ".123456", ".1", ".999999999"]),
)
odd_times = st.sampled_from([
    "", "T", "2026-11-29", "2026-11-29T11:00:00", "2026-13-40T25:61:61Z", "0000-01-01T00:00:00Z",
    "0001-01-01T00:00:00+01:00", "9999-12-31T23:59:59-01:00", "9999-12-31T23:59:59Z",
    "2026-11-29T11:00:00Z" + " " * 100, "now", "2026-11-29T11:00:00Zjunk", "\x00T\x00",
])
times: st.SearchStrategy[Any] = st.one_of(valid_times, odd_times, st.text(max_size=40), numbers, st.none())

json_leaf: st.SearchStrategy[Any] = st.one_of(st.none(), st.booleans(), numbers, st.text(max_size=20), times)
json_any: st.SearchStrategy[Any] = st.recursive(
    json_leaf,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=12), inner, max_size=4)),
    max_leaves=8,
)


def maybe(value: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """Mostly the near-valid value, sometimes a value of another type (whole trees come in at the top)."""
    return st.one_of(value, value, value, json_leaf, st.just([]), st.just({}))


def fields(required: dict[str, st.SearchStrategy[Any]],
           optional: dict[str, st.SearchStrategy[Any]] | None = None) -> st.SearchStrategy[Any]:
    """An object with these fields, any of which may be dropped or replaced by something else."""
    return maybe(st.fixed_dictionaries(
        {}, optional={**{k: maybe(v) for k, v in required.items()},
                      **{k: maybe(v) for k, v in (optional or {}).items()}}))


counts = st.one_of(st.integers(0, 3), numbers)
error_answer = st.builds(lambda e: {"error": e}, st.one_of(st.text(max_size=20), json_leaf))

# -- near-valid answers of each source ----------------------------------------------------------------------

kernel = fields({"id": st.text(max_size=8), "name": st.just("python3"), "last_activity": times,
                 "execution_state": st.sampled_from(["idle", "busy", "starting", "dead", "", "BUSY"]),
                 "connections": counts})
terminal = fields({"name": st.text(max_size=4), "last_activity": times})
jupyter_answer = st.one_of(error_answer, fields({
    "status": st.one_of(fields({"started": times, "last_activity": times, "connections": counts,
                                "kernels": counts}), error_answer),
    "kernels": st.one_of(st.lists(kernel, max_size=4), error_answer),
}, {"terminals": st.one_of(st.lists(terminal, max_size=3), error_answer)}))

healthz = fields({"status": st.sampled_from(["alive", "expired", "dead", ""]),
                  "lastHeartbeat": st.one_of(st.integers(0, 2**45), numbers, times)})
codeserver_answer = st.one_of(error_answer, fields({"healthz": healthz}))

rstudio_answer = st.one_of(error_answer, fields(
    {"lastActivity": times},
    {"connected": st.one_of(st.booleans(), json_leaf), "busy": st.one_of(st.booleans(), json_leaf),
     "lastConnected": times, "via": st.text(max_size=10)}))

gpu_sample = fields({"time": times, "utilPercent": st.one_of(st.floats(0, 100), numbers),
                     "memoryUsedMiB": st.one_of(st.floats(0, 80_000), numbers)})
gpu_answer = st.one_of(error_answer, fields({"samples": st.lists(gpu_sample, max_size=5)},
                                            {"gpus": counts, "source": st.text(max_size=5)}))

ANSWERS: dict[str, st.SearchStrategy[Any]] = {
    "jupyter": jupyter_answer, "codeServer": codeserver_answer, "rstudio": rstudio_answer, "gpu": gpu_answer}


# -- the parsers ----------------------------------------------------------------------------------------------

def _ide_reading_ok(r: IdeReading) -> None:
    assert isinstance(r, IdeReading)
    assert all(isinstance(t, datetime) and t.tzinfo is not None for t in r.activity)
    assert r.connected_at is None or r.connected_at.tzinfo is not None
    json.dumps(r.summary)  # what `explain` and the evidence print


def _parse(parser: Any, raw: Any) -> Any:
    try:
        return parser(raw)
    except Unreadable as err:
        assert str(err)
        return None


@FUZZ
@given(j=st.one_of(jupyter_answer, json_any), c=st.one_of(codeserver_answer, json_any),
       r=st.one_of(rstudio_answer, json_any), g=st.one_of(gpu_answer, json_any), t=st.one_of(times, json_leaf))
def test_response_parsers(j: Any, c: Any, r: Any, g: Any, t: Any) -> None:
    """Each example gives every parser its own input: a reading, or Unreadable with a message."""
    for parser, raw in ((parse_jupyter, j), (parse_code_server, c), (parse_rstudio, r)):
        reading = _parse(parser, raw)
        if reading is not None:
            _ide_reading_ok(reading)
    samples = _parse(parse_gpu, g)
    if samples is not None:
        assert samples and all(isinstance(s, GpuSample) for s in samples)
        assert all(math.isfinite(s.util_percent) and math.isfinite(s.memory_mib) for s in samples)
        assert [s.time for s in samples] == sorted(s.time for s in samples)
    for parsed in (parse_time(t), from_epoch_ms(t)):
        assert parsed is None or (isinstance(parsed, datetime) and parsed.utcoffset() == timedelta(0))


# -- Prometheus (GPU and RStudio sources) -------------------------------------------------------------------

class _Response:
    def __init__(self, status: int, body: bytes) -> None:
        self.status_code = status
        self.body = body

    def __enter__(self) -> _Response:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def iter_content(self, size: int) -> Iterator[bytes]:
        for i in range(0, len(self.body), size):
            yield self.body[i:i + size]


class _Session:
    """Stands in for requests.Session: answers every request with the next canned (status, body)."""

    def __init__(self, answers: list[tuple[int, bytes]]) -> None:
        self.answers = answers
        self.headers: dict[str, str] = {}
        self.sent = 0

    def _next(self) -> _Response:
        status, body = self.answers[self.sent % len(self.answers)]
        self.sent += 1
        return _Response(status, body)

    def post(self, url: str, **_: Any) -> _Response:
        return self._next()

    def get(self, url: str, **_: Any) -> _Response:
        return self._next()

    def close(self) -> None:
        return None


NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
PODS = [("team-a", "nb-0"), ("team-b", "nb-1-0"), ("team-a", "other")]
label_values = st.sampled_from(["team-a", "team-b", "nb-0", "nb-1-0", "nb-1", "", "x"])
labels = st.one_of(
    st.fixed_dictionaries({}, optional={
        "__name__": st.sampled_from([UTIL, MEMORY, "DCGM_FI_PROF_GR_ENGINE_ACTIVE", "up"]),
        **{k: label_values for k in (
            "namespace", "pod", "exported_namespace", "exported_pod", "destination_workload_namespace",
            "destination_workload", "gpu", "UUID", "Hostname", "GPU_I_ID")}}),
    json_any)
prom_time = st.one_of(st.floats(NOW.timestamp() - 3600, NOW.timestamp()), numbers, st.text(max_size=8))
prom_value = st.one_of(st.sampled_from(["0", "1", "55.5", "1024", "NaN", "+Inf", "-Inf", "1e400", "x", ""]),
                       numbers)
prom_pair = maybe(st.tuples(prom_time, prom_value).map(list))
prom_series = fields({"metric": labels, "values": st.lists(prom_pair, max_size=4),
                      "value": prom_pair})
prom_doc = fields({
    "status": st.sampled_from(["success", "error"]),
    "data": fields({"resultType": st.sampled_from(["matrix", "vector", "scalar", "string"]),
                    "result": st.one_of(st.lists(prom_series, max_size=4), prom_pair)}),
}, {"error": st.text(max_size=10), "errorType": st.text(max_size=5)})
prom_body = st.one_of(prom_doc.map(lambda d: json.dumps(d).encode()),
                      st.binary(max_size=40), st.just(b"{" * 30), st.just(b""))
prom_answer = st.tuples(st.sampled_from([200, 200, 200, 400, 422, 500, 503]), prom_body)
PROM = PrometheusSettings.model_validate({"url": "http://127.0.0.1:9/", "timeoutSeconds": 5})


@FUZZ
@given(answers=st.lists(prom_answer, min_size=1, max_size=4), kind=st.sampled_from(["query", "query_range"]))
def test_prometheus_sources(answers: list[tuple[int, bytes]], kind: str) -> None:
    """Any Prometheus answers, through the client's own parsing and both bulk sources: series of finite
    points or PromError; per pod `{"samples": ...}`/an RStudio answer or `{"error": ...}`, which then
    parse or are Unreadable."""
    client = PrometheusClient(PROM, session=_Session(answers[:1]))  # type: ignore[arg-type]
    try:
        series = client.query("up", NOW) if kind == "query" else client.query_range(
            "up", NOW - timedelta(hours=1), NOW, 60)
        for one in series:
            assert all(isinstance(k, str) and isinstance(v, str) for k, v in one.labels.items())
            assert all(math.isfinite(t) and math.isfinite(v) for t, v in one.points)
    except PromError as err:
        assert str(err)

    client = PrometheusClient(PROM, session=_Session(answers))  # type: ignore[arg-type]
    gpu, queries = PrometheusGpu(PROM, client).samples(PODS, NOW)
    assert set(gpu) == set(PODS) and queries <= 3
    for answer in gpu.values():
        assert set(answer) == {"error"} or "samples" in answer, answer
        json.dumps(answer)
        _parse(parse_gpu, answer)

    client = PrometheusClient(PROM, session=_Session(answers))  # type: ignore[arg-type]
    rstudio, queries = PrometheusRStudio(PROM, RStudioSettings(), client).samples(PODS, NOW)
    assert set(rstudio) == set(PODS) and queries <= 4
    for answer in rstudio.values():
        json.dumps(answer)
        _parse(parse_rstudio, answer)


# -- dcgm-exporter scraped directly ---------------------------------------------------------------------------

metric_name = st.sampled_from([UTIL, MEMORY, "DCGM_FI_PROF_GR_ENGINE_ACTIVE", "DCGM_FI_DEV_SM_CLOCK", "x"])
label_text = st.one_of(
    st.lists(st.tuples(st.sampled_from(["gpu", "UUID", "pod", "namespace", "exported_pod", "exported_namespace",
                                        "Hostname", "container", "bad-name", ""]), label_values),
             max_size=5).map(lambda kv: "{" + ",".join(f'{k}="{v}"' for k, v in kv) + "}"),
    st.text(max_size=15))
sample_value = st.one_of(prom_value.map(str), st.text(max_size=6))
exposition_line = st.one_of(
    st.tuples(metric_name, label_text, sample_value).map(lambda t: f"{t[0]}{t[1]} {t[2]}"),
    st.sampled_from([f"# TYPE {UTIL} gauge", f"# HELP {MEMORY} help", "# TYPE x counter", "", "#"]),
    st.text(max_size=30))
exposition = st.lists(exposition_line, max_size=8).map(lambda lines: "\n".join(lines).encode())


@pytest.mark.slow
@FUZZ
@given(scrapes=st.lists(st.tuples(st.sampled_from([200, 200, 200, 404, 500]),
                                  st.one_of(exposition, st.binary(max_size=40))), min_size=1, max_size=3))
def test_dcgm_scraper(scrapes: list[tuple[int, bytes]]) -> None:
    """Any exposition text, over a few scrapes: answers per pod, never an exception."""
    dcgm = DcgmSettings.model_validate({"endpoints": ["http://127.0.0.1:9/metrics"], "lookbackMinutes": 1,
                                        "staleSeconds": 120})
    scraper = DcgmScraper(dcgm, session=_Session(scrapes))  # type: ignore[arg-type]
    pods = [("team-a", "nb-0"), ("team-b", "nb-1-0")]
    for i in range(len(scrapes)):
        out, made = scraper.samples(pods, NOW + timedelta(seconds=30 * i))
        assert set(out) == set(pods) and made == 1
        for answer in out.values():
            json.dumps(answer)
            _parse(parse_gpu, answer)


# -- decide ---------------------------------------------------------------------------------------------------

quantities = st.one_of(st.sampled_from(["0", "1", "2", "1e400", "inf", "-1", "nan", "1e308", "0.5", "1Gi", ""]),
                       numbers, json_leaf)
resources = fields({"limits": fields({"nvidia.com/gpu": quantities, "cpu": st.just("1")}),
                    "requests": fields({"nvidia.com/gpu": quantities})})
containers = st.lists(fields({"name": st.just("main"), "image": st.sampled_from(
    ["kubeflownotebookswg/jupyter-scipy:v1.10.0", "kubeflownotebookswg/codeserver-python:v1.10.0",
     "kubeflownotebookswg/rstudio-tidyverse:v1.10.0", ""]), "resources": resources}), max_size=3)
annotation_value = st.one_of(st.text(max_size=12), times, json_leaf, st.sampled_from(["true", "True ", "false"]))
annotation_maps: st.SearchStrategy[Any] = st.dictionaries(
    st.one_of(st.sampled_from([STOP_ANNOTATION, EXEMPT_ANNOTATION, KEEP_UNTIL_ANNOTATION, LAST_ACTIVITY_ANNOTATION,
                               SERVER_TYPE_ANNOTATION, "notebook-culler.io/warned-at",
                               "notebook-culler.io/stopped-by"]), st.text(max_size=10)),
    st.one_of(annotation_value,
              st.sampled_from(["jupyter", "group-one", "group-two", "group-three", "", "JUPYTER"])),
    max_size=5)
notebooks = st.one_of(
    st.fixed_dictionaries({
        "metadata": st.fixed_dictionaries({"name": st.just("nb"), "namespace": st.just("team-a")},
                                          optional={"annotations": st.one_of(annotation_maps, st.none())}),
        "spec": maybe(st.fixed_dictionaries({"template": maybe(st.fixed_dictionaries(
            {"spec": maybe(st.fixed_dictionaries({"containers": maybe(containers)}))}))}))}),
    json_any)
pods = st.one_of(st.none(), fields({
    "metadata": st.just({"name": "nb-0"}),
    "status": fields({"phase": st.sampled_from(["Running", "Running", "Pending", "Succeeded", "running"]),
                      "startTime": times}),
    "spec": fields({"containers": containers}),
}), json_any)
observations = st.one_of(
    st.fixed_dictionaries({}, optional={k: maybe(v) for k, v in ANSWERS.items()}), json_any)
minutes = st.one_of(st.floats(0.001, 10 * 366 * 24 * 60), st.sampled_from([0.001, 1, 60, 10 * 366 * 24 * 60]))
policies = st.builds(
    lambda idle, warn, grace, conn, busy, nosig, after, util, mem, exempt, extend: Policy.model_validate({
        "idleMinutes": idle, "warnMinutes": warn, "startupGraceMinutes": grace,
        "connectedGpuIdleMinutes": conn, "busyKernelGpuIdleMinutes": busy,
        "noSignal": {"action": nosig, "afterMinutes": after} if nosig == "stop" else {"action": "keep"},
        "gpu": {"utilPercent": util, "memoryMiB": mem}, "allowExempt": exempt, "maxExtendMinutes": extend,
        "serverTypeByImage": [{"pattern": "*codeserver*", "type": "group-one"},
                              {"pattern": "*rstudio*", "type": "group-two"}]}),
    minutes, st.one_of(st.just(0.0), minutes), st.one_of(st.just(0.0), minutes),
    st.one_of(st.none(), minutes), st.one_of(st.none(), minutes), st.sampled_from(["keep", "stop"]), minutes,
    st.floats(0, 100), st.floats(0, 1e6), st.booleans(), st.one_of(st.just(0.0), minutes))
nows = st.one_of(st.just(NOW), st.datetimes(min_value=datetime(1, 1, 3), max_value=datetime(9999, 12, 29),
                                            timezones=st.just(UTC)))


def _verdict_ok(v: Verdict) -> None:
    assert v.action in ("keep", "warn", "stop")
    assert v.state in ("active", "connected", "idle", "no-signal", "starting", "exempt", "stopped", "broken")
    assert v.action == "keep" or v.reason.strip()
    json.dumps(v.to_dict())  # what `kf-culler decide` prints


@pytest.mark.slow
@FUZZ
@given(notebook=notebooks, pod=pods, obs=observations, policy=policies, now=nows)
def test_decide(notebook: Any, pod: Any, obs: Any, policy: Policy, now: datetime) -> None:
    """Any notebook, pod and observations: a verdict, or InputError when the input is not a notebook."""
    try:
        v = decide(notebook, pod, obs, policy, now)
    except InputError:
        meta = notebook.get("metadata") if isinstance(notebook, dict) else None
        assert not isinstance(notebook, dict) or not isinstance(obs, dict) or (
            pod is not None and not isinstance(pod, dict)) or (meta is not None and (
                not isinstance(meta, dict) or not isinstance(meta.get("annotations") or {}, dict)))
        return
    _verdict_ok(v)
    ann = (notebook.get("metadata") or {}).get("annotations") or {}
    if STOP_ANNOTATION in ann:  # rule 1, whatever the value
        assert (v.action, v.state) == ("keep", "stopped")
    if v.action == "stop" and policy.no_signal.action == "keep":
        assert v.state in ("idle", "connected"), v  # rule 6: no signal never stops under this policy
        # The IDE's own source answered readably: a stop is never made on a broken answer.
        parser = {"jupyter": parse_jupyter, "group-one": parse_code_server, "group-two": parse_rstudio}
        assert v.server_type in parser
        ide_key = {"jupyter": "jupyter", "group-one": "codeServer", "group-two": "rstudio"}[v.server_type]
        parser[v.server_type](obs[ide_key])
        if v.gpu_notebook:
            parse_gpu(obs["gpu"])  # half the evidence never stops a GPU notebook


@settings(max_examples=1_000, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(notebook=notebooks, pod=pods, obs=observations, policy=policies, now=nows,
       forged=st.one_of(times, st.text(max_size=30)))
def test_last_activity_annotation_is_not_evidence(notebook: Any, pod: Any, obs: Any, policy: Policy,
                                                  now: datetime, forged: Any) -> None:
    """Rule 11 under fuzzing: setting, changing or removing the display annotation changes nothing."""
    if not isinstance(notebook, dict) or not isinstance(notebook.get("metadata"), dict):
        return
    meta = notebook["metadata"]
    ann = meta.get("annotations") if isinstance(meta.get("annotations"), dict) else {}
    without = {**notebook, "metadata": {**meta, "annotations": {
        k: v for k, v in ann.items() if k != LAST_ACTIVITY_ANNOTATION}}}
    with_forged = {**notebook, "metadata": {**meta, "annotations": {**ann, LAST_ACTIVITY_ANNOTATION: forged}}}
    try:
        base = decide(without, pod, obs, policy, now)
    except InputError:
        return
    assert decide(with_forged, pod, obs, policy, now) == base


@pytest.mark.parametrize("value", [10**400, -(10**400), float("inf"), float("nan")])
def test_numbers_no_float_holds(value: Any) -> None:
    """The fuzzers' sharpest finds, kept as plain cases: JSON numbers no float holds are unreadable."""
    with pytest.raises(Unreadable):
        parse_code_server({"healthz": {"status": "alive", "lastHeartbeat": value}})
    with pytest.raises(Unreadable):
        parse_gpu({"samples": [{"time": "2026-11-29T11:00:00Z", "utilPercent": value, "memoryUsedMiB": 1}]})
    assert from_epoch_ms(value) is None


@pytest.mark.parametrize("quantity", ["1e400", "inf", "-inf", "nan", 1e308])
def test_absurd_gpu_quantity_in_the_template_gives_a_verdict(quantity: Any) -> None:
    """A user's own Notebook spec may hold any value (the CRD keeps unknown fields): still a verdict."""
    nb = {"metadata": {"name": "nb", "namespace": "team-a"}, "spec": {"template": {"spec": {"containers": [
        {"name": "a", "resources": {"limits": {"nvidia.com/gpu": quantity}}},
        {"name": "b", "resources": {"limits": {"nvidia.com/gpu": quantity}}}]}}}}
    _verdict_ok(decide(nb, None, {}, Policy(), NOW))


@settings(max_examples=300, deadline=None)
@given(st.datetimes(timezones=st.just(UTC)), st.datetimes(timezones=st.just(UTC)))
def test_clock_text_is_the_strftime_form(t: datetime, now: datetime) -> None:
    """Reasons show a time of now's day as `%H:%M UTC` (with `:%S` when it has seconds), another day's in full."""
    expected = (format_time(t) if t.date() != now.date()
                else t.strftime("%H:%M UTC") if t.second == 0 else t.strftime("%H:%M:%S UTC"))
    assert clock_text(t, now) == expected
    assert clock_text(t, t.replace(hour=0, minute=0, second=0)) == t.strftime(
        "%H:%M UTC" if t.second == 0 else "%H:%M:%S UTC")


@settings(max_examples=300, deadline=None)
@given(st.datetimes(timezones=st.just(UTC)), st.floats(allow_nan=False) | st.integers(-10**12, 10**12))
def test_add_minutes_is_the_sum_or_the_calendar_end(moment: datetime, minutes: float) -> None:
    """add_minutes keeps the timedeltas it built: the second call gives what the first did, the plain sum."""
    try:
        expected = moment + timedelta(minutes=minutes)
    except OverflowError:
        expected = MAX_TIME if minutes > 0 else MIN_TIME
    assert add_minutes(moment, minutes) == expected
    assert add_minutes(moment, minutes) == expected
