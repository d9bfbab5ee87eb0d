"""Probes through a notebook's Service connect to the Service's ClusterIP from the watch cache instead of looking
its name up in DNS (`probe.serviceClusterIP`, on by default): a lookup per notebook per pass costs the culler CPU
and CoreDNS a query or more (docs/performance.md). The request still names the Service (Host header, TLS
name), only a URL whose host is exactly that Service's DNS name goes to the address, and only a Service that
passed its checks (controlled by the Notebook, selecting its pods) gives one.

Against a real Jupyter server on loopback that answers any Host (as one listening on its pod's address does);
the ClusterIP stands in with 127.0.0.1, under the `cluster.invalid` domain, which no resolver answers."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from kubernetes import client
from support.passes import Passes

from kf_culler.config import Operations, load_mapping
from kf_culler.gather import Request, gather, service_host
from kf_culler.local import objects as obj
from kf_culler.local.jupyter import JupyterServer
from kf_culler.runner import build_runner
from kf_culler.targets.pairing import cluster_ip

NS, DOMAIN = "team", "cluster.invalid"


@pytest.fixture(scope="module")
def server() -> Iterator[JupyterServer]:
    with JupyterServer(NS, "nb", remote=True) as s:
        yield s


def ops(server: JupyterServer, **probe: Any) -> Operations:
    return Operations.model_validate({
        "clusterDomain": DOMAIN, "probe": {"timeoutSeconds": 3, "connectTimeoutSeconds": 1, "retries": 0, **probe},
        "urls": {"jupyter": "http://{name}.{namespace}.svc.{clusterDomain}:" + str(server.port)
                            + "/notebook/{namespace}/{name}/"}})


def probe(server: JupyterServer, address: tuple[str, str] | None, **probe: Any) -> dict[str, Any]:
    got = asyncio.run(gather([Request(NS, "nb", "nb-0", "jupyter", False, address=address)], ops(server, **probe),
                             datetime.now(UTC)))
    return dict(got.observations[(NS, "nb")]["jupyter"])


def test_a_probe_connects_to_the_services_address(server: JupyterServer) -> None:
    """The name resolves nowhere, the address answers; the Host header sent is the URL's (tests/test_http_split.py)."""
    host = service_host("nb", NS, DOMAIN)
    answer = probe(server, (host, "127.0.0.1"))
    assert "error" not in answer and "last_activity" in str(answer), answer
    looked_up = probe(server, None)
    assert "error" in looked_up and "ClusterIP" not in looked_up["error"], looked_up  # cluster.invalid: no answer


def test_only_the_services_own_host_goes_to_the_address(server: JupyterServer) -> None:
    """The address is for the Service's DNS name alone: a URL naming another host is looked up as usual."""
    answer = probe(server, (service_host("other", NS, DOMAIN), "127.0.0.1"))
    assert "error" in answer and "ClusterIP" not in answer["error"], answer


@pytest.mark.parametrize("spec,ip", [
    ({"clusterIP": "10.96.0.9"}, "10.96.0.9"),
    ({"clusterIP": "fd00::9"}, "fd00::9"),
    ({"clusterIP": "None"}, None),  # headless: its name resolves to the pods
    ({"clusterIP": ""}, None),
    ({"clusterIP": "10.96.0.9; evil"}, None),
    ({}, None),
])
def test_cluster_ip_is_an_address_or_none(spec: dict[str, Any], ip: str | None) -> None:
    assert cluster_ip({"spec": spec}) == ip
    assert cluster_ip(None) is None


@pytest.mark.cluster
def test_the_pass_probes_the_cached_services_cluster_ip(api: Any, namespace: str) -> None:
    """Through the real API server and watch cache: LocalCluster's ClusterIPs are loopback addresses, so a real
    Jupyter server listening on port 80 of the one the API server gave the notebook's Service stands where
    kube-proxy would lead. With the shipped templates (port 80, the Service's name under `cluster.invalid`, which
    no resolver answers) the pass reads the server; with the setting off it looks the name up and gets nothing."""
    started = datetime.now(UTC) - timedelta(hours=2)
    obj.create_notebook(api, namespace, obj.notebook("own"))
    obj.running_pod(api, namespace, "own", started)
    nb = obj.get_notebook(api, namespace, "own")
    client.CoreV1Api(api).create_namespaced_service(namespace, {
        "metadata": {"name": "own", "ownerReferences": [{"apiVersion": "kubeflow.org/v1", "kind": "Notebook",
                                                         "name": "own", "uid": nb["metadata"]["uid"],
                                                         "controller": True}]},
        "spec": {"selector": {"statefulset": "own"}, "ports": [{"port": 80, "targetPort": 8888}]}})
    ip = client.CoreV1Api(api).read_namespaced_service("own", namespace).spec.cluster_ip
    assert ip.startswith("127."), ip
    answers = {}
    with JupyterServer(namespace, "own", ip=ip, port=80, remote=True):
        for on in (True, False):
            settings = load_mapping({"namespaces": {"include": [namespace]}, "idleMinutes": 600,
                                     "clusterDomain": DOMAIN,
                                     "probe": {"timeoutSeconds": 3, "connectTimeoutSeconds": 1, "retries": 0,
                                               "serviceClusterIP": on}}, "test")
            with Passes(build_runner(settings, api)) as runner:
                (result,) = [r for r in runner.once().results if r.name == "own"]
            answers[on] = (result.observations.get("jupyter") or {}, result.verdict.state)
    assert "error" not in answers[True][0] and answers[True][1] != "no-signal", answers[True]
    assert "error" in answers[False][0] and answers[False][1] == "no-signal", answers[False]
