"""dcgm-exporter scraped directly: bounded history, gaps, and restarts that must not fake idleness.

The endpoints are stand-ins served on loopback (no GPU exists here) in dcgm-exporter's text format,
written from NVIDIA/dcgm-exporter's README (4.x quick start: `# HELP`/`# TYPE` lines, labels gpu, UUID,
pci_bus_id, device, modelName, Hostname, DCGM_FI_DRIVER_VERSION, and container/namespace/pod when the
exporter maps GPUs to pods) and etc/default-counters.csv (DCGM_FI_DEV_GPU_UTIL in %, DCGM_FI_DEV_FB_USED
in MiB). The scraper takes its clock from the `now` each call passes, so the tests move time forward
without waiting for it.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from kf_culler.config import DcgmSettings, Policy
from kf_culler.decide import decide
from kf_culler.local.prometheus import Exposition, FakeGpu, StubServer, dcgm_exposition, text_reply
from kf_culler.readings import parse_gpu
from kf_culler.sources.dcgm import DcgmScraper

T0 = datetime(2026, 11, 29, 6, 0, tzinfo=UTC)
POD = ("team-a", "train-0")


def gpu(util: float, mem: float, pod: tuple[str, str] = POD, index: int = 0,
        uuid: str = "GPU-aaaa") -> FakeGpu:
    return FakeGpu(index, uuid, util=util, used_mib=mem, namespace=pod[0], pod=pod[1], container="train")


@pytest.fixture()
def exporter() -> Iterator[Exposition]:
    with Exposition(dcgm_exposition([gpu(0, 0)])) as exp:
        yield exp


def settings(url: str, **kw: Any) -> DcgmSettings:
    return DcgmSettings.model_validate({"endpoints": [f"{url}/metrics"], "lookbackMinutes": 30,
                                        "staleSeconds": 150, **kw})


def at(minutes: float) -> datetime:
    return T0 + timedelta(minutes=minutes)


def run(scraper: DcgmScraper, start: float, end: float, every: float = 1.0) -> dict[str, Any]:
    """Scrape once a minute from `start` to `end` (minutes after T0); the answer at `end`."""
    m = start
    last: dict[str, Any] = {}
    while m <= end + 1e-9:
        answers, made = scraper.samples([POD], at(m))
        assert made == 1
        last = answers[POD]
        m += every
    return last


# -- a pure notebook for `decide`: Jupyter idle for 3 h, pod running for 6 h, one GPU ------------

def notebook_inputs(now: datetime) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    started = (now - timedelta(hours=6)).strftime("%Y-%m-%dT%H:%M:%SZ")
    quiet = (now - timedelta(hours=3)).strftime("%Y-%m-%dT%H:%M:%S.000000Z")
    container = {"name": "train", "resources": {"limits": {"nvidia.com/gpu": "1"}}}
    notebook = {"apiVersion": "kubeflow.org/v1", "kind": "Notebook",
                "metadata": {"name": "train", "namespace": "team-a", "annotations": {}},
                "spec": {"template": {"spec": {"containers": [container]}}}}
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "train-0", "namespace": "team-a"},
           "spec": {"containers": [container]}, "status": {"phase": "Running", "startTime": started}}
    jupyter = {"status": {"started": started, "last_activity": quiet, "connections": 0, "kernels": 1},
               "kernels": [{"id": "k", "name": "python3", "last_activity": quiet, "execution_state": "idle",
                            "connections": 0}],
               "terminals": []}
    return notebook, pod, jupyter


POLICY = Policy.model_validate({"idleMinutes": 60, "warnMinutes": 0})


def test_history_starts_at_the_first_scrape_and_a_restart_never_shows_more_idleness(
        exporter: Exposition) -> None:
    """A culler that restarts must not report a GPU idle for longer than it has watched it."""
    # Before the restart: the GPU trains for 40 minutes, then goes idle (memory still held).
    exporter.set(dcgm_exposition([gpu(93, 30000)]))
    first = DcgmScraper(settings(exporter.stub.url))
    before = run(first, 0, 40)
    assert "samples" in before, before
    assert all(s["utilPercent"] == 93 for s in before["samples"])
    exporter.set(dcgm_exposition([gpu(0, 30000)]))
    run(first, 41, 45)

    # The culler restarts at minute 46: a new process, an empty history.
    second = DcgmScraper(settings(exporter.stub.url))
    answer = run(second, 46, 46)
    assert "error" in answer and "incomplete" in answer["error"], answer
    warming = run(second, 47, 60)
    assert "error" in warming and "incomplete" in warming["error"], warming

    # During the warm-up the notebook is kept: no GPU signal is not idleness.
    now = at(60)
    notebook, pod, jupyter = notebook_inputs(now)
    verdict = decide(notebook, pod, {"jupyter": jupyter, "gpu": warming}, POLICY, now)
    assert verdict.action == "keep" and verdict.state == "no-signal", verdict

    # What the warm-up prevents: the samples watched since the restart, read as if complete, show
    # 14 idle minutes and would stop a notebook whose GPU trained 20 minutes ago.
    naive = {"samples": [{"time": (at(46) + timedelta(minutes=i)).strftime("%Y-%m-%dT%H:%M:%SZ"),
                          "utilPercent": 0, "memoryUsedMiB": 30000} for i in range(15)]}
    assert decide(notebook, pod, {"jupyter": jupyter, "gpu": naive}, POLICY, now).action == "stop"

    # Once the whole window has been watched, the samples are given, and none predates the restart.
    later = run(second, 61, 76)
    assert "samples" in later, later
    times = [s.time for s in parse_gpu(later)]
    assert min(times) >= at(46), "a sample older than the first scrape after the restart"
    assert later["points"] == 31 and len(times) == 2  # minutes 46..76, one scrape each: one run of equal values
    assert later["watchedSince"] == "2026-11-29T06:46:00Z"


def test_a_pod_seen_appearing_is_answered_at_once(exporter: Exposition) -> None:
    scraper = DcgmScraper(settings(exporter.stub.url))
    exporter.set(dcgm_exposition([gpu(0, 0, pod=("team-b", "other-0"), uuid="GPU-bbbb")]))
    run(scraper, 0, 2)
    exporter.set(dcgm_exposition([gpu(0, 0, pod=("team-b", "other-0"), uuid="GPU-bbbb"), gpu(50, 1000)]))
    answer = run(scraper, 3, 3)
    assert answer.get("samples") == [{"time": "2026-11-29T06:03:00Z", "utilPercent": 50.0,
                                       "memoryUsedMiB": 1000.0}], answer


def test_a_gap_makes_samples_stale_then_incomplete() -> None:
    state = {"up": True, "text": dcgm_exposition([gpu(10, 500)])}

    def handle(_: Any) -> tuple[int, str, bytes]:
        return text_reply(state["text"]) if state["up"] else text_reply("down\n", 503)

    with StubServer(handle) as stub:
        scraper = DcgmScraper(settings(stub.url))
        assert "samples" in run(scraper, 0, 35)
        state["up"] = False
        answers, _ = scraper.samples([POD, ("x", "y")], at(36))
        assert "samples" in answers[POD]  # the last good sample is one minute old: still current
        stale = run(scraper, 37, 40)
        assert "stale" in stale["error"] and "HTTP 503" in stale["error"], stale
        answers, _ = scraper.samples([("x", "y")], at(41))
        assert "no dcgm-exporter endpoint answered" in answers[("x", "y")]["error"]
        state["up"] = True
        resumed = run(scraper, 42, 60)
        assert "incomplete" in resumed["error"], resumed  # the gap is inside the window
        assert "samples" in run(scraper, 61, 73)


def test_history_is_bounded_in_pods_and_samples(exporter: Exposition) -> None:
    pods = [("team-a", f"nb{i}-0") for i in range(5)]
    exporter.set(dcgm_exposition([gpu(20, 800, pod=p, index=i, uuid=f"GPU-{i}") for i, p in enumerate(pods)]))
    scraper = DcgmScraper(settings(exporter.stub.url, maxPods=3, maxSamplesPerPod=10))
    for m in range(40):
        answers, _ = scraper.samples(pods, at(m))
    tracked = [p for p in pods if "not tracked" not in answers[p].get("error", "")]
    assert len(tracked) == 3
    assert all("maxPods" in answers[p]["error"] for p in pods if p not in tracked)
    # Ten samples cannot cover a 30-minute window scraped every minute: the answer says so.
    assert all("incomplete" in answers[p]["error"] for p in tracked)
    assert max(len(pod.samples) for pod in scraper._pods.values()) == 10
    assert len(scraper._pods) == 3


def test_multi_gpu_and_engine_activity(exporter: Exposition) -> None:
    """Two GPUs in one pod: highest utilisation and highest memory; engine activity counts as use."""
    eng = ("team-c", "eng-0")
    gpus = [gpu(0, 300, index=0, uuid="GPU-0"), gpu(85, 9000, index=1, uuid="GPU-1"),
            gpu(0, 4096, pod=eng, index=2, uuid="GPU-2"), FakeGpu(3, "GPU-free")]
    gpus[2].engine_active = 0.6
    exporter.set(dcgm_exposition(gpus))
    scraper = DcgmScraper(settings(exporter.stub.url))
    for m in range(31):
        answers, _ = scraper.samples([POD, eng], at(m))
    assert answers[POD]["gpus"] == 2
    assert answers[POD]["samples"][-1] == {"time": "2026-11-29T06:30:00Z", "utilPercent": 85.0,
                                           "memoryUsedMiB": 9000.0}
    assert answers[eng]["samples"][-1]["utilPercent"] == 60.0
    assert set(scraper._pods) == {POD, eng}  # the unassigned GPU belongs to no pod


def test_unparsable_exposition_is_an_error(exporter: Exposition) -> None:
    exporter.set("DCGM_FI_DEV_GPU_UTIL{gpu=\"0\" 12\n")
    scraper = DcgmScraper(settings(exporter.stub.url))
    answers, made = scraper.samples([POD], at(0))
    assert made == 1
    assert "error" in answers[POD]
    assert "not Prometheus text format" in scraper._endpoints[f"{exporter.stub.url}/metrics"].last_error


def test_no_endpoints() -> None:
    scraper = DcgmScraper(DcgmSettings())
    answers, made = scraper.samples([POD], at(0))
    assert made == 0
    assert "no dcgm-exporter endpoints" in answers[POD]["error"]


def test_source_for() -> None:
    from kf_culler.config import load_mapping
    from kf_culler.sources.dcgm import source_for

    assert source_for(load_mapping({}, "t")) is None
    found = source_for(load_mapping({"dcgm": {"endpoints": ["http://10.0.0.5:9400/metrics"]}}, "t"))
    assert found is not None and found.settings.endpoints == ("http://10.0.0.5:9400/metrics",)
