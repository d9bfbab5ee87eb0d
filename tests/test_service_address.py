"""Probes through a notebook's Service connect to the Service's ClusterIP from the watch cache instead of looking
its name up in DNS (`probe.serviceClusterIP`, on by default): a lookup per notebook per pass costs the culler CPU
and CoreDNS a query or more (docs/performance.md). The request still names the Service (Host header, TLS
name), only a URL whose host is exactly that Service's DNS name goes to the address, and only a Service that
passed its checks (controlled by the Notebook, selecting its pods) gives one.

Against a real Jupyter server on loopback that answers any Host (as one listening on its pod's address does);
the ClusterIP stands in with 127.0.0.1, under the `cluster.invalid` domain, which no resolver answers."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from kubernetes import client
from support.passes import Passes

from kf_culler import cycle as cycle_module
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
def test_the_pass_takes_the_address_from_the_cached_service(api: Any, namespace: str,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """Through the real API server and watch cache: the request for the controller's Service carries the ClusterIP
    the API server allocated; with the setting off, none. No kube-proxy routes that address here, so the gather
    gets the requests without it and looks the names up (cluster.invalid: none answers, nothing leaves the
    machine); the connect to the address is proven above against a real Jupyter server."""
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
    asked: list[Request] = []

    async def recorded(requests: list[Request], *args: Any, **kwargs: Any) -> Any:
        asked.extend(requests)
        return await gather([dataclasses.replace(r, address=None) for r in requests], *args, **kwargs)

    monkeypatch.setattr(cycle_module, "gather", recorded)
    time.sleep(1)
    addresses = {}
    for on in (True, False):
        asked.clear()
        settings = load_mapping({"namespaces": {"include": [namespace]}, "idleMinutes": 600, "clusterDomain": DOMAIN,
                                 "probe": {"timeoutSeconds": 2, "connectTimeoutSeconds": 1, "retries": 0,
                                           "serviceClusterIP": on}}, "test")
        with Passes(build_runner(settings, api)) as runner:
            (result,) = [r for r in runner.once().results if r.name == "own"]
        assert result.calls, "the controller's Service is probed"
        addresses[on] = {r.name: r.address for r in asked}
    assert addresses == {True: {"own": (service_host("own", namespace, DOMAIN), ip)}, False: {"own": None}}
