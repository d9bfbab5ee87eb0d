"""GPU series a profile user cannot forge: a real Prometheus (the Debian package) scraping the admin's
dcgm-exporter and a hostile pod's exporter.

Where Prometheus scrapes user pods (the annotation-driven `kubernetes-pods` job, with `honor_labels:
true`), a user's pod can publish `DCGM_FI_DEV_*` series labelled with another profile's namespace, pod
and GPU. The stand-ins here:

- `nvidia-dcgm-exporter`: the GPU Operator's job name (its Service and ServiceMonitor are named so;
  the dcgm-exporter Helm chart's is `dcgm-exporter`), scraped without honor_labels with the exporter's
  own pod as target labels, so the GPU's pod arrives as `exported_namespace`/`exported_pod`. It serves a
  working GPU for team-b/victim-0 and one for team-c/bystander-0.
- `kubernetes-pods`: the hostile pod's scrape (honor_labels: true; the target labels are the hostile
  pod's own), serving an IDLE series for victim-0's GPU (same UUID, node and labels).
- `dcgm-static`: a job the default selector admits, serving a series whose pod is ambiguous
  (`exported_*` labels without the target's own pair).
- `flood-pods`: another hostile scrape serving 30,000 series in its own namespace team-x.

The default `prometheus.gpuSeriesSelector` (`job=~".*dcgm.*"`) reads only the first and third; the tests
widen it to admit the hostile jobs and show what is left of the attack then.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
from test_gpu_prometheus import latest, now, prometheus_binary  # noqa: F401 (a fixture)
from test_gpu_prometheus import source as gpu_source

from kf_culler.config import ConfigError, PrometheusSettings, load_mapping
from kf_culler.local.prometheus import (
    Exposition,
    FakeGpu,
    Prometheus,
    dcgm_exposition,
    flood_exposition,
    labelled_exposition,
    static_job,
)
from kf_culler.sources import prometheus as promclient
from kf_culler.sources.gpu import PrometheusGpu, pod_identity

VICTIM = ("team-b", "victim-0")
BYSTANDER = ("team-c", "bystander-0")
FLOODED = ("team-x", "flood-00000-0")
REAL_JOB = "nvidia-dcgm-exporter"
HOSTILE_JOB = "kubernetes-pods"
FLOOD_JOB = "flood-pods"
FLOOD_GPUS = 15_000  # x 2 metrics = 30,000 series


def victim_gpu(util: float, mem: float) -> FakeGpu:
    return FakeGpu(0, "GPU-8f1c0a52-victim", util=util, used_mib=mem, namespace=VICTIM[0], pod=VICTIM[1],
                   container="victim", hostname="gpu-node-7")


class Cluster:
    def __init__(self, prom: Prometheus, real: str, hostile: str) -> None:
        self.prom = prom
        self.real = real  # the instance labels of the two scrapes
        self.hostile = hostile

    @property
    def url(self) -> str:
        return self.prom.url


@pytest.fixture(scope="module")
def cluster(prometheus_binary: str) -> Iterator[Cluster]:  # noqa: F811 (the imported fixture)
    bystander = FakeGpu(1, "GPU-bystander", util=70, used_mib=8000, namespace=BYSTANDER[0], pod=BYSTANDER[1],
                        container="bystander", hostname="gpu-node-7")
    ambiguous = labelled_exposition("DCGM_FI_DEV_GPU_UTIL", {
        "gpu": "0", "UUID": "GPU-8f1c0a52-victim", "Hostname": "gpu-node-7",
        "exported_namespace": VICTIM[0], "exported_pod": VICTIM[1]}, 0)
    with Exposition(dcgm_exposition([victim_gpu(93, 30000), bystander])) as real, \
            Exposition(dcgm_exposition([victim_gpu(0, 0)])) as hostile, \
            Exposition(dcgm_exposition([]) + ambiguous) as static, \
            Exposition(flood_exposition("team-x", FLOOD_GPUS)) as flood:
        jobs = [static_job(REAL_JOB, [real.stub.address], honor_labels=False,
                           labels={"namespace": "gpu-operator", "pod": "nvidia-dcgm-exporter-q8t2v"}),
                static_job(HOSTILE_JOB, [hostile.stub.address], honor_labels=True,
                           labels={"namespace": "team-a", "pod": "mallory-0"}),
                static_job("dcgm-static", [static.stub.address], honor_labels=True),
                static_job(FLOOD_JOB, [flood.stub.address], honor_labels=True,
                           labels={"namespace": "team-x", "pod": "flooder-0"})]
        with Prometheus(jobs, binary=prometheus_binary, scrape_interval="2s") as prom:
            prom.wait_for(f'count_over_time(DCGM_FI_DEV_FB_USED{{exported_pod="{VICTIM[1]}"}}[1m]) >= 6',
                          timeout=120)
            prom.wait_for(f'count_over_time(DCGM_FI_DEV_FB_USED{{job="{HOSTILE_JOB}"}}[1m]) >= 6', timeout=60)
            prom.wait_for('count_over_time(DCGM_FI_DEV_GPU_UTIL{job="dcgm-static"}[1m]) >= 3', timeout=60)
            prom.wait_for(f'count(DCGM_FI_DEV_GPU_UTIL{{job="{FLOOD_JOB}"}}) >= {FLOOD_GPUS}', timeout=120)
            yield Cluster(prom, real.stub.address, hostile.stub.address)


def source(url: str, **kw: Any) -> PrometheusGpu:
    return gpu_source(url, **{"timeoutSeconds": 20, **kw})  # a flood answer takes longer to read


def test_the_forged_series_is_in_prometheus(cluster: Cluster) -> None:
    """The attack is real: Prometheus holds an idle series for victim-0's GPU from the hostile scrape,
    with the victim's namespace and pod as plain labels (honor_labels kept them)."""
    forged = cluster.prom.query(f'DCGM_FI_DEV_GPU_UTIL{{job="{HOSTILE_JOB}"}}')
    assert [(s["metric"]["namespace"], s["metric"]["pod"], s["value"][1]) for s in forged] == [
        (*VICTIM, "0")]


def test_default_selector_reads_the_exporters_job_only(cluster: Cluster) -> None:
    src = source(cluster.url)
    assert src.selector == 'job=~".*dcgm.*"'
    answers, queries = src.samples([VICTIM, BYSTANDER, ("team-a", "mallory-0")], now())
    assert queries == 1
    assert latest(answers[VICTIM]) == (93.0, 30000.0)  # working: the hostile job is not read
    assert answers[VICTIM]["gpus"] == 1
    assert latest(answers[BYSTANDER]) == (70.0, 8000.0)
    assert answers[("team-a", "mallory-0")] == {"error": "no GPU series for pod"}
    assert src.contested == [] and src.unread == []
    # dcgm-static's exported_* series without the target's own namespace/pod: ignored, counted
    assert src.ambiguous >= 1
    assert "dcgm-static" in src.ambiguous_example and "without the target's own" in src.ambiguous_example


def test_a_selector_admitting_both_jobs_makes_the_victim_contested(cluster: Cluster) -> None:
    src = source(cluster.url, gpuSeriesSelector=f'job=~"{REAL_JOB}|{HOSTILE_JOB}"')
    answers, _ = src.samples([VICTIM, BYSTANDER], now())
    error = answers[VICTIM]["error"]
    assert set(answers[VICTIM]) == {"error"} and error.startswith("contested: "), answers[VICTIM]
    assert len(error) <= 300  # what kf_culler.readings keeps of an error
    for words in (REAL_JOB, HOSTILE_JOB, cluster.real, cluster.hostile, "GPU-8f1c0a52-victim", "team-b/victim-0"):
        assert words in error, (words, error)
    assert re.search(r"\((93|30000)\).*\(0\)|\(0\).*\((93|30000)\)", error), error  # both values
    assert latest(answers[BYSTANDER]) == (70.0, 8000.0)  # the other pods' GPUs are read as before
    assert [(ns, pod) for ns, pod, _ in src.contested] == [VICTIM]
    assert src.contested[0][2] in error
    # The next pass (reading only what is new) still says contested: the mark lasts the look-back.
    again, queries = src.samples([VICTIM], now())
    assert queries == 1 and again[VICTIM]["error"].startswith("contested: ")


def test_a_flood_of_series_blinds_only_its_own_namespace(cluster: Cluster) -> None:
    """30,000 series in team-x and maxSeries 1,000: the first answer is cut off at 1,000 series, the
    namespaces asked about are counted, and only those that fit are read again; team-x is left out
    and answers an error (no signal), the victim and the bystander read as before."""
    src = source(cluster.url, gpuSeriesSelector=f'job=~"{REAL_JOB}|{FLOOD_JOB}"', maxSeries=1000)
    answers, queries = src.samples([VICTIM, BYSTANDER, FLOODED], now())
    assert queries == 3  # the capped answer, the count by namespace, the namespaces that fit
    assert latest(answers[VICTIM]) == (93.0, 30000.0)
    assert latest(answers[BYSTANDER]) == (70.0, 8000.0)
    error = answers[FLOODED]["error"]
    assert "team-x" in error and "prometheus.maxSeries (1000)" in error and "not read" in error, error
    assert src.unread == [("team-x", 2 * FLOOD_GPUS)]
    # Asking about the victim alone: team-x is not asked about, so it is not even counted.
    alone = source(cluster.url, gpuSeriesSelector=f'job=~"{REAL_JOB}|{FLOOD_JOB}"', maxSeries=1000)
    answers, queries = alone.samples([VICTIM], now())
    assert queries == 3 and latest(answers[VICTIM]) == (93.0, 30000.0) and alone.unread == []


def test_without_a_cap_problem_the_flood_job_is_not_read_at_all(cluster: Cluster) -> None:
    """The default selector never reads the flood (its job is not dcgm-exporter's): one query."""
    src = source(cluster.url, maxSeries=1000)
    answers, queries = src.samples([VICTIM, FLOODED], now())
    assert queries == 1 and latest(answers[VICTIM]) == (93.0, 30000.0)
    assert answers[FLOODED] == {"error": "no GPU series for pod"}


# -- without Prometheus ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("selector, words", [
    ('{job="dcgm-exporter"}', "without braces"),
    ('job="a"} or {job=~".+"', "without braces"),
    ('job="a" foo', "expected a comma"),
    ('job~"a"', "does not start with"),
    ('job!~"a"', "does not start with"),
    ("job='a'", "does not start with"),
    ('1job="a"', "does not start with"),
    ('job="a\\.b"', "the only escapes"),
    ('job="a\nb"', "does not start with"),
    ('__name__="DCGM_FI_DEV_GPU_UTIL"', "starting with __"),
    ('job=~"(dcgm"', "not a regular expression"),
])
def test_bad_selectors_are_config_errors(selector: str, words: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_mapping({"prometheus": {"url": "http://prom:9090", "gpuSeriesSelector": selector}}, "culler.yaml")
    text = str(err.value)
    assert "culler.yaml" in text and "prometheus.gpuSeriesSelector" in text and words in text, text


@pytest.mark.parametrize("selector, normal", [
    ('job=~".*dcgm.*"', 'job=~".*dcgm.*"'),
    (' job = "dcgm-exporter" , namespace!="gpu-operator", ', 'job="dcgm-exporter",namespace!="gpu-operator"'),
    ('job=~"a\\\\.b",service="x\\"y"', 'job=~"a\\\\.b",service="x\\"y"'),
    ("", ""),
])
def test_good_selectors_are_normalised(selector: str, normal: str) -> None:
    ops = load_mapping({"prometheus": {"gpuSeriesSelector": selector}}, "culler.yaml").operations
    assert PrometheusSettings.check_series_selector(ops.prometheus.gpu_series_selector) == normal
    assert PrometheusGpu(ops.prometheus).selector == normal


def test_the_default_selector_admits_the_usual_dcgm_exporter_jobs() -> None:
    default = PrometheusSettings().gpu_series_selector
    regex = re.fullmatch(r'job=~"(.*)"', default)
    assert regex is not None
    admitted = ["dcgm-exporter", "nvidia-dcgm-exporter", "gpu-operator/nvidia-dcgm-exporter", "dcgm",
                "monitoring/dcgm-exporter", "my-release-dcgm-exporter"]
    refused = ["kubernetes-pods", "kubernetes-service-endpoints", "serviceMonitor/kubeflow/x/0", "gpu-metrics"]
    assert all(re.fullmatch(regex.group(1), job) for job in admitted)  # PromQL regexes are anchored
    assert not any(re.fullmatch(regex.group(1), job) for job in refused)
    assert PrometheusSettings().max_series == 30_000  # 10,000 one-GPU pods x 3 metrics read


@pytest.mark.parametrize("labels, identity", [
    ({"namespace": "team-b", "pod": "nb-0"}, ("team-b", "nb-0")),  # honor_labels: true
    ({"namespace": "gpu-operator", "pod": "dcgm-x", "exported_namespace": "team-b", "exported_pod": "nb-0"},
     ("team-b", "nb-0")),  # honor_labels: false: the target's pair and the GPU's pair
    ({"namespace": "gpu-operator", "pod": "dcgm-x"}, ("gpu-operator", "dcgm-x")),  # a GPU no pod holds
    ({"exported_namespace": "team-b", "exported_pod": "nb-0"}, "ambiguous"),
    ({"namespace": "x", "exported_namespace": "team-b", "exported_pod": "nb-0"}, "ambiguous"),
    ({"namespace": "x", "pod": "y", "exported_pod": "nb-0"}, "ambiguous"),
    ({"pod": "nb-0"}, "ambiguous"),
    ({"namespace": "team-b"}, None),
    ({}, None),
])
def test_pod_identity(labels: dict[str, str], identity: Any) -> None:
    got = pod_identity(labels)
    if identity == "ambiguous":
        assert isinstance(got, str) and got, got
    else:
        assert got == identity


class _Chunks:
    def __init__(self, chunks: list[bytes]) -> None:
        self.chunks = chunks

    def iter_content(self, size: int) -> Iterator[bytes]:
        return iter(self.chunks)


def test_the_series_cap_counts_across_chunk_boundaries() -> None:
    body = b'{"status":"success","data":{"resultType":"matrix","result":[' + b",".join(
        b'{"metric":{"pod":"p%d"},"values":[[1,"1"]]}' % i for i in range(5)) + b"]}}"
    chunks = [body[i:i + 7] for i in range(0, len(body), 7)]  # every "metric" mark split somewhere
    assert promclient._read_capped(_Chunks(chunks), 1e18, 1e18, 5) == body  # type: ignore[arg-type]
    with pytest.raises(promclient.TooManySeries):
        promclient._read_capped(_Chunks(chunks), 1e18, 1e18, 4)  # type: ignore[arg-type]
