"""The policy a sweep replays at each of its points: a configuration, decided as a pass of the culler decides.

kf_culler/replay/sweep.py replays these through kf_culler/replay/cohorts.py; `SweptPolicy.check` is the plain
way one of them checks one notebook (what kf_culler/replay/simulate.py `replay` calls), and what the cohort
replay's figures are compared with (tests/test_replay_cohorts.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from kf_culler.config import Policy
from kf_culler.decide import decide_view
from kf_culler.ide import IDE_KINDS
from kf_culler.model import InputError
from kf_culler.policy import Selected, selection
from kf_culler.readings import Unreadable, parse_gpu
from kf_culler.replay.contenders import Check, ConfiguredPolicy


def work_at_stop(observations: Mapping[str, Any], policy: Policy) -> bool:
    """Whether the recorded world shows running work: an IDE saying something runs, or the latest GPU sample
    over the policy's thresholds."""
    for kind in IDE_KINDS:
        if kind.source in observations:
            try:
                if kind.parse(observations[kind.source]).busy:
                    return True
            except Unreadable:
                pass
    if "gpu" in observations:
        try:
            s = parse_gpu(observations["gpu"])[-1]
        except Unreadable:
            return False
        return s.util_percent >= policy.gpu.util_percent and s.memory_mib >= policy.gpu.memory_mib
    return False


@dataclass
class SweptPolicy(ConfiguredPolicy):
    """A ConfiguredPolicy that also notes, per notebook, the stops made while the recorded world showed running
    work and (for grouping by rule) the rule that chose the notebook's policy."""

    work_stops: dict[str, int] = field(default_factory=dict)
    rules: dict[str, str] = field(default_factory=dict)

    def check(self, memo: dict[str, Any], notebook: dict[str, Any], pod: dict[str, Any] | None,
              observations: dict[str, Any], now: datetime, started: datetime, context: Mapping[str, Any]) -> Check:
        """As ConfiguredPolicy.check, but the way a pass of the culler calls the decision (kf_culler/cycle.py):
        the notebook read once into its view with its policy (kf_culler/policy.py `selection`), kept while the
        notebook, pod and context objects stay the same, then `decide_view` at each check."""
        seen = memo.get("selected")
        if seen is None or seen[0] is not notebook or seen[1] is not pod or (seen[2] is not context
                                                                            and seen[2] != context):
            labels, node = context.get("namespaceLabels"), context.get("node")
            try:
                chosen: Selected | None = selection(notebook, pod, self.settings,
                                                    namespace_labels=labels if isinstance(labels, dict) else None,
                                                    node=node if isinstance(node, dict) else None)
            except InputError:
                chosen = None
            seen = memo["selected"] = (notebook, pod, context, chosen)
        chosen = seen[3]
        if chosen is None:  # not a notebook at all: decide says what is wrong with it
            result = super().check(memo, notebook, pod, observations, now, started, context)
        else:
            key = "/".join(chosen.key)
            if key not in self.rules:
                self.rules[key] = chosen.policy_rule
            ops = self.settings.operations
            if not ops.namespaces.selects(chosen.key[0]):
                return Check("keep", "exempt", "namespace not selected by this configuration")
            if ops.gpu_only and chosen.view.gpus == 0:
                return Check("keep", "exempt", "gpuOnly: the notebook has no GPU")
            self.calls += 1
            verdict = decide_view(chosen.view, observations, chosen.policy, now)
            result = Check(verdict.action, verdict.state, verdict.reason)
            if result.action == "stop" and work_at_stop(observations, chosen.policy):
                self.work_stops[key] = self.work_stops.get(key, 0) + 1
        return result
