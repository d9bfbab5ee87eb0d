"""Which policy a notebook gets: namespaceOverrides, then the `rules` in order, then the top level.

Pure: `select(view, namespace_labels, settings) -> (Policy, rule name)`; the namespace's labels are read
by the shell (kf_culler/kube/namespaces.py) and passed in. docs/configuration.md, "Policy rules".
"""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping
from typing import Any

from kf_culler.config import DEFAULT_RULE, OVERRIDE_RULE_PREFIX, LabelSelector, Policy, RuleMatch, Settings
from kf_culler.notebook import NotebookView, metadata_of


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


def rule_matches(match: RuleMatch, view: NotebookView, namespace_labels: Mapping[str, str] | None) -> bool:
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


def select(view: NotebookView, namespace_labels: Mapping[str, str] | None, settings: Settings) -> tuple[Policy, str]:
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
    return select(NotebookView.of(notebook, pod, settings.policy, node=node), namespace_labels, settings)
