"""Which policy a notebook gets: namespaceOverrides, then the `rules` in order, then the top level.

The one place a notebook's policy is chosen. Pure: `select(view, namespace_labels, settings) -> (Policy,
rule name)`, and `selection(...)`, the pass's step that reads a notebook once and gives its view and its
policy together (the cycle, notices, long-stopped counts, metrics and replay all take the policy from
here). The namespace's labels are read by the shell (kf_culler/kube/namespaces.py) and passed in.
docs/configuration.md, "Policy rules".
"""

from __future__ import annotations

import dataclasses
import fnmatch
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kf_culler.config import DEFAULT_RULE, OVERRIDE_RULE_PREFIX, LabelSelector, Policy, RuleMatch, Settings
from kf_culler.model import InputError
from kf_culler.record import CullerRecord
from kf_culler.session import SessionView, gpu_count, metadata_of, server_type, string_labels
from kf_culler.targets import SessionKey, controlled_by_kind, is_workload


def selector_matches(selector: LabelSelector, labels: Mapping[str, str]) -> bool:
    """Kubernetes label selector semantics: every matchLabels pair and every expression holds."""
    for key, value in selector.match_labels.items():
        if labels.get(key) != value:
            return False
    for req in selector.match_expressions:
        present = req.key in labels
        if req.operator == "In" and not (present and labels[req.key] in req.values):
            return False
        if req.operator == "NotIn" and present and labels[req.key] in req.values:
            return False
        if req.operator == "Exists" and not present:
            return False
        if req.operator == "DoesNotExist" and present:
            return False
    return True


def rule_matches(match: RuleMatch, view: SessionView, namespace_labels: Mapping[str, str] | None) -> bool:
    """Every condition given holds. Unknown namespace labels (None) match no namespaceSelector at all,
    not even one made only of NotIn or DoesNotExist."""
    if match.namespace_selector is not None and (
            namespace_labels is None or not selector_matches(match.namespace_selector, namespace_labels)):
        return False
    if match.notebook_selector is not None and not selector_matches(match.notebook_selector, view.labels):
        return False
    if match.server_types is not None and view.server_type not in match.server_types:
        return False
    if match.gpu is not None and view.gpu_notebook != match.gpu:
        return False
    if match.gpu_resources is not None and not view.resources.intersection(match.gpu_resources):
        return False
    return match.gpu_models is None or any(
        fnmatch.fnmatchcase(model, pattern) for model in view.gpu_models for pattern in match.gpu_models)


def select(view: SessionView, namespace_labels: Mapping[str, str] | None, settings: Settings) -> tuple[Policy, str]:
    """The policy for one notebook and the name of what chose it: `namespaceOverrides.<namespace>` (an
    override is a rule matching one namespace by name, and comes first), else the first rule that matches,
    else `default` (the top-level policy). `view` is read with the top-level policy (gpuResources,
    serverTypeByImage)."""
    if view.namespace is not None and view.namespace in settings.overrides:
        return settings.overrides[view.namespace], OVERRIDE_RULE_PREFIX + view.namespace
    for rule in settings.rules:
        if rule_matches(rule.match, view, namespace_labels):
            return rule.policy, rule.name
    return settings.policy, DEFAULT_RULE


def select_for(notebook: dict[str, Any], pod: dict[str, Any] | None, namespace_labels: Mapping[str, str] | None,
               settings: Settings, node: dict[str, Any] | None = None) -> tuple[Policy, str]:
    """`select` from the API objects (and the pod's Node, for its GPU model); raises InputError when they are
    not a notebook and a pod at all."""
    if not settings.rules:  # no rule: the namespace decides, and nothing else needs reading
        ns = metadata_of(notebook).get("namespace")
        if isinstance(ns, str) and ns in settings.overrides:
            return settings.overrides[ns], OVERRIDE_RULE_PREFIX + ns
        return settings.policy, DEFAULT_RULE
    return select(SessionView.of(notebook, pod, settings.policy, node=node), namespace_labels, settings)


def policy_of(notebook: dict[str, Any], pod: dict[str, Any] | None, settings: Settings,
              namespace_labels: Mapping[str, str] | None = None, node: dict[str, Any] | None = None
              ) -> tuple[Policy, str]:
    """`select_for`, and for objects that are not a notebook at all, the namespace's override or the top level
    (deciding such a notebook says what is wrong with it)."""
    try:
        return select_for(notebook, pod, namespace_labels, settings, node)
    except InputError:
        ns = metadata_of(notebook).get("namespace") if isinstance(notebook, dict) else None
        if isinstance(ns, str) and ns in settings.overrides:
            return settings.overrides[ns], OVERRIDE_RULE_PREFIX + ns
        return settings.policy, DEFAULT_RULE


@dataclass(frozen=True)
class Selected:
    """One notebook as a pass sees it: its view, the policy chosen for it, and what chose that policy."""

    view: SessionView
    policy: Policy
    policy_rule: str

    @property
    def key(self) -> SessionKey:
        return self.view.key


def _reads_alike(a: Policy, b: Policy) -> bool:
    """Whether a view read with `a` is the view read with `b` (the policy keys a view depends on)."""
    return a.gpu_resources == b.gpu_resources and a.server_type_by_image == b.server_type_by_image


def selection(notebook: dict[str, Any], pod: dict[str, Any] | None, settings: Settings, *,
              namespace_labels: Mapping[str, str] | None = None, node: dict[str, Any] | None = None,
              record: CullerRecord | None = None, access_problem: str | None = None) -> Selected:
    """The notebook read once, its policy chosen from that reading, and the view completed for the chosen
    policy (its GPU count and server type, when the policy counts GPUs or images differently from the top
    level). InputError when the objects are not a notebook and a pod at all."""
    view = SessionView.of(notebook, pod, settings.policy, node=node, record=record, access_problem=access_problem)
    policy, rule = select(view, namespace_labels, settings)
    if not _reads_alike(policy, settings.policy):
        view = dataclasses.replace(view, server_type=server_type(notebook, policy, pod),
                                   gpus=gpu_count(notebook, pod, policy.gpu_resources))
    return Selected(view, policy, rule)


def selects_workload(workload: dict[str, Any], settings: Settings) -> bool:
    """Whether a Deployment or StatefulSet may be a session (`targets: [workloads]`, docs/targets.md): of a kind
    `workloads.kinds` names, not controlled by a kind of `workloads.skipControlledBy` in a namespace named with it,
    and with the labels of `workloads.selector` or, with `workloads.gpuWorkloads`, a pod template asking for a GPU
    (its owner cannot relabel that away). The StatefulSets Notebook and Workspace sessions are paired with are left
    out later (kf_culler/targets/ `session_statefulset`): other ownerReferences are their owner's to write."""
    chosen = settings.operations.workloads
    if chosen is None or not isinstance(workload, dict) or controlled_by_kind(workload, chosen.skips):
        return False
    if not is_workload(workload) or workload.get("kind") not in chosen.kinds:
        return False
    if chosen.selector is not None and selector_matches(chosen.selector, string_labels(workload)):
        return True
    return chosen.gpu_workloads and gpu_count(workload, None, settings.policy.gpu_resources) > 0
