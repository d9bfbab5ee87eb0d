"""Policy rules (kf_culler/policy.py): which policy a notebook gets, purely from the notebook, its pod and
its namespace's labels. The configurations here are the examples in docs/configuration.md."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from kf_culler.config import ConfigError, Settings, load_mapping
from kf_culler.policy import select
from kf_culler.session import SessionView

# docs/configuration.md, "Policy rules" (the same text: test_docs_example_is_this_config checks it).
EXAMPLE = """
idleMinutes: 60
namespaceOverrides:
  team-legacy:
    idleMinutes: 480
rules:
  - name: research-gpu
    match:
      namespaceSelector:
        matchLabels: {culler.example.com/tier: research}
      gpu: true
    policy:
      idleMinutes: 240
      connectedGpuIdleMinutes: 120
  - name: a100-short
    match:
      gpuModels: ["NVIDIA-A100*"]
    policy:
      idleMinutes: 30
  - name: students
    match:
      namespaceSelector:
        matchExpressions:
          - {key: culler.example.com/tier, operator: In, values: [course, workshop]}
          - {key: culler.example.com/keep-long, operator: DoesNotExist}
      serverTypes: [jupyter, group-one]
    policy:
      idleMinutes: 20
      warnMinutes: 5
"""


def settings(text: str = EXAMPLE) -> Settings:
    return load_mapping(yaml.safe_load(text), "test")


def notebook(ns: str = "team-a", gpus: int = 0, labels: dict[str, str] | None = None,
             server_type: str | None = None, node_selector: dict[str, str] | None = None,
             affinity_models: list[str] | None = None, resource: str = "nvidia.com/gpu") -> dict[str, Any]:
    limits: dict[str, Any] = {"cpu": "1"}
    if gpus:
        limits[resource] = str(gpus)
    spec: dict[str, Any] = {"containers": [{"name": "nb", "image": "jupyter", "resources": {"limits": limits}}]}
    if node_selector:
        spec["nodeSelector"] = node_selector
    if affinity_models:
        spec["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [
                {"key": "nvidia.com/gpu.product", "operator": "In", "values": affinity_models}]}]}}}
    ann = {"notebooks.kubeflow.org/server-type": server_type} if server_type else {}
    return {"metadata": {"namespace": ns, "name": "nb", "labels": labels or {}, "annotations": ann},
            "spec": {"template": {"spec": spec}}}


def chosen(nb: dict[str, Any], ns_labels: dict[str, str] | None, s: Settings | None = None) -> tuple[float, str]:
    s = s or settings()
    policy, name = select(SessionView.of(nb, None, s.policy), ns_labels, s)
    return policy.idle_minutes, name


RESEARCH = {"culler.example.com/tier": "research"}


def test_no_rule_matches_gives_the_top_level_policy() -> None:
    assert chosen(notebook(), {}) == (60, "default")
    assert chosen(notebook(), None) == (60, "default")


def test_first_match_wins() -> None:
    # A research GPU notebook on an A100 matches research-gpu and a100-short: the first one listed decides.
    nb = notebook(gpus=1, node_selector={"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB"})
    assert chosen(nb, RESEARCH) == (240, "research-gpu")
    assert chosen(nb, {}) == (30, "a100-short")
    reordered = yaml.safe_load(EXAMPLE)
    reordered["rules"] = reordered["rules"][1::-1] + reordered["rules"][2:]
    assert chosen(nb, RESEARCH, load_mapping(reordered, "test")) == (30, "a100-short")


def test_a_rules_policy_is_the_top_level_plus_its_keys() -> None:
    s = settings()
    policy, name = select(SessionView.of(notebook(gpus=1), None, s.policy), RESEARCH, s)
    assert name == "research-gpu"
    assert (policy.idle_minutes, policy.connected_gpu_idle_minutes, policy.warn_minutes) == (240, 120, 10)


def test_gpu_condition() -> None:
    assert chosen(notebook(gpus=0), RESEARCH) == (60, "default")
    assert chosen(notebook(gpus=2), RESEARCH) == (240, "research-gpu")


def test_gpu_models_from_node_affinity_and_patterns() -> None:
    assert chosen(notebook(gpus=1, affinity_models=["Tesla-T4", "NVIDIA-A100-PCIE-80GB"]), {}) == (30, "a100-short")
    assert chosen(notebook(gpus=1, affinity_models=["Tesla-T4"]), {}) == (60, "default")
    assert chosen(notebook(gpus=1), {}) == (60, "default")  # no model named: gpuModels never matches


def test_gpu_resources_condition() -> None:
    s = settings("""
gpuResources: [nvidia.com/gpu, nvidia.com/mig-1g.5gb]
rules:
  - name: mig
    match: {gpuResources: [nvidia.com/mig-1g.5gb]}
    policy: {idleMinutes: 15}
""")
    assert chosen(notebook(gpus=1, resource="nvidia.com/mig-1g.5gb"), {}, s) == (15, "mig")
    assert chosen(notebook(gpus=1), {}, s) == (60, "default")


def test_views_share_their_resource_sets_and_a_tenant_cannot_grow_the_shared_ones() -> None:
    """A pass holds thousands of views: equal sets of resource names are one object (kf_culler/session.py
    `shared_set`), and no more than SHARED_SETS of them are kept, whatever names tenants give resources."""
    from kf_culler import session

    s = settings()
    a, b = (SessionView.of(notebook(gpus=1), None, s.policy) for _ in range(2))
    assert a.resources == frozenset({"cpu", "nvidia.com/gpu"}) and a.resources is b.resources
    views = [SessionView.of(notebook(gpus=1, resource=f"example.com/r{i}"), None, s.policy)
             for i in range(session.SHARED_SETS + 10)]
    assert len(session._shared_sets) == session.SHARED_SETS
    assert views[-1].resources == frozenset({"cpu", f"example.com/r{session.SHARED_SETS + 9}"})  # still read
    assert chosen(notebook(gpus=1, resource="nvidia.com/mig-1g.5gb"), {}, settings("""
gpuResources: [nvidia.com/mig-1g.5gb]
rules:
  - name: mig
    match: {gpuResources: [nvidia.com/mig-1g.5gb]}
    policy: {idleMinutes: 15}
""")) == (15, "mig")  # a set past the shared ones still chooses its policy


@pytest.mark.parametrize(("labels", "expected"), [
    ({"culler.example.com/tier": "course"}, "students"),  # In
    ({"culler.example.com/tier": "workshop"}, "students"),
    ({"culler.example.com/tier": "staff"}, "default"),  # not In
    ({}, "default"),  # In needs the label
    ({"culler.example.com/tier": "course", "culler.example.com/keep-long": ""}, "default"),  # DoesNotExist
])
def test_match_expressions_in_and_does_not_exist(labels: dict[str, str], expected: str) -> None:
    assert chosen(notebook(server_type="jupyter"), labels)[1] == expected


@pytest.mark.parametrize(("labels", "expected"), [
    ({"env": "prod"}, "not-dev"),
    ({}, "default"),  # Exists fails first
    ({"env": "dev"}, "default"),  # NotIn
    ({"env": "test"}, "default"),
])
def test_match_expressions_not_in_and_exists(labels: dict[str, str], expected: str) -> None:
    s = settings("""
rules:
  - name: not-dev
    match:
      namespaceSelector:
        matchExpressions:
          - {key: env, operator: Exists}
          - {key: env, operator: NotIn, values: [dev, test]}
    policy: {idleMinutes: 90}
""")
    assert chosen(notebook(), labels, s)[1] == expected


def test_not_in_alone_matches_a_missing_label_but_not_unknown_labels() -> None:
    s = settings("""
rules:
  - name: not-dev
    match: {namespaceSelector: {matchExpressions: [{key: env, operator: NotIn, values: [dev]}]}}
    policy: {idleMinutes: 90}
""")
    assert chosen(notebook(), {}, s) == (90, "not-dev")
    assert chosen(notebook(), None, s) == (60, "default")  # the namespace's labels could not be read


def test_server_types_and_notebook_selector() -> None:
    s = settings("""
rules:
  - name: vscode-batch
    match:
      serverTypes: [group-one]
      notebookSelector: {matchLabels: {workload: batch}}
    policy: {idleMinutes: 10}
""")
    assert chosen(notebook(server_type="group-one", labels={"workload": "batch"}), {}, s) == (10, "vscode-batch")
    assert chosen(notebook(server_type="jupyter", labels={"workload": "batch"}), {}, s)[1] == "default"
    assert chosen(notebook(server_type="group-one"), {}, s)[1] == "default"
    # students is Jupyter and code-server only
    assert chosen(notebook(server_type="group-two"), {"culler.example.com/tier": "course"})[1] == "default"


def test_namespace_overrides_come_before_every_rule() -> None:
    # team-legacy also carries the research label and runs a GPU: its override still wins.
    nb = notebook(ns="team-legacy", gpus=1)
    assert chosen(nb, RESEARCH) == (480, "namespaceOverrides.team-legacy")


@pytest.mark.parametrize(("rules", "needle"), [
    ([{"name": "r", "policy": {"idleMinutez": 5}}], "unknown key 'rules[0].policy.idleMinutez' in rule 'r'"),
    ([{"name": "r", "policy": {"checkPeriodSeconds": 5}}], "'rules[0].policy.checkPeriodSeconds'"),
    ([{"name": "r", "policy": {"idleMinutes": "60"}}], "'rules[0].policy.idleMinutes'"),
    ([{"name": "r"}, {"name": "r"}], "'rules[1].name': 'r' is used twice"),
    ([{"name": "default"}], "reserved for the top-level policy"),
    ([{"name": "Bad Name"}], "'rules[0].name'"),
    ([{"name": "r", "when": {}}], "unknown key 'rules[0].when'"),
    ([{"name": "r", "match": {"namespaces": ["a"]}}], "'rules[0].match.namespaces'"),
    ([{"name": "r", "match": {"serverTypes": ["vscode"]}}], "'rules[0].match.serverTypes.0'"),
    ([{"name": "r", "match": {"namespaceSelector": {"matchExpressions": [
        {"key": "k", "operator": "Exists", "values": ["v"]}]}}}], "Exists takes no values"),
    ([{"name": "r", "match": {"namespaceSelector": {"matchExpressions": [
        {"key": "k", "operator": "Gt", "values": ["1"]}]}}}], "'rules[0].match.namespaceSelector"),
    ({"name": "r"}, "key 'rules' must be a list"),
])
def test_bad_rules_are_refused_with_the_key_named(rules: object, needle: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_mapping({"rules": rules}, "config.yaml")
    assert needle in str(err.value) and str(err.value).startswith("config.yaml: ")


def test_docs_example_is_this_config() -> None:
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "docs" / "configuration.md").read_text()
    assert EXAMPLE.strip() in text
