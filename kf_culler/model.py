"""Plain data shared by every layer: annotation keys, rule ids and the verdict (notebook view: notebook.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from kf_culler.errors import InputError as InputError
from kf_culler.ide import IDE_SOURCES
from kf_culler.ide import SERVER_SOURCES as SERVER_SOURCES
from kf_culler.timeutil import format_time

# Kubeflow's keys
STOP_ANNOTATION = "kubeflow-resource-stopped"
SERVER_TYPE_ANNOTATION = "notebooks.kubeflow.org/server-type"
LAST_ACTIVITY_ANNOTATION = "notebooks.kubeflow.org/last-activity"

# Ours: every key contains "notebook", so the notebook-controller does not copy it into the pod.
PREFIX = "notebook-culler.io/"
EXEMPT_ANNOTATION = PREFIX + "exempt"
KEEP_UNTIL_ANNOTATION = PREFIX + "keep-until"
STATE_ANNOTATION = PREFIX + "state"
REASON_ANNOTATION = PREFIX + "reason"
IDLE_SINCE_ANNOTATION = PREFIX + "idle-since"
WARNED_AT_ANNOTATION = PREFIX + "warned-at"
STOPPED_BY_ANNOTATION = PREFIX + "stopped-by"
STOPPED_AT_ANNOTATION = PREFIX + "stopped-at"
TRACE_ANNOTATION = PREFIX + "trace-id"
# When the culler saw a notebook it had stopped started again: the start-up grace counts from here.
RESTARTED_AT_ANNOTATION = PREFIX + "restarted-at"
OWN_ANNOTATIONS = (
    STATE_ANNOTATION, REASON_ANNOTATION, IDLE_SINCE_ANNOTATION, WARNED_AT_ANNOTATION,
    STOPPED_BY_ANNOTATION, STOPPED_AT_ANNOTATION, TRACE_ANNOTATION,
)
STOPPED_BY_VALUE = "kf-culler"

Action = Literal["keep", "warn", "stop"]
State = Literal["active", "connected", "idle", "no-signal", "starting", "exempt", "stopped", "broken"]
# The rule that decided (docs/decisions.md, "The rules, in order"); public: a metrics label, Events.
RuleId = Literal[
    "1-stopped", "1-stop-not-taken", "2-exempt", "3-restarted", "3-starting", "5-positive-evidence", "6-no-signal",
    "6-half-evidence", "9-connected", "9-connected-gpu-idle", "10-idle", "13-lifetime-cap", "14-broken",
    "16-access-problem", "16-no-signal-gpu-idle",
]
SOURCES = (*IDE_SOURCES, "gpu")


@dataclass(frozen=True)
class Verdict:
    action: Action
    state: State
    reason: str
    rule_id: RuleId
    server_type: str | None = None
    gpu_notebook: bool = False
    idle_since: datetime | None = None
    idle_seconds: float | None = None
    stop_at: datetime | None = None
    warn_at: datetime | None = None
    evidence: dict[str, Any] = field(default_factory=dict)
    # What chose the policy (kf_culler/policy.py): a rule's name, namespaceOverrides.<ns> or default; set
    # by whoever selected the policy (the cycle, kf-culler decide), not by the rules.
    policy_rule: str | None = None
    # The latest time keep-until can move `stop_at` to (rule 12: the stop without extension plus
    # maxExtendMinutes); None when the policy allows no extension or no extendable stop is planned.
    extend_until: datetime | None = None

    def to_dict(self) -> dict[str, Any]:
        def t(x: datetime | None) -> str | None:
            return format_time(x) if x else None

        return {
            "action": self.action,
            "state": self.state,
            "reason": self.reason,
            "rule": self.rule_id,
            "policyRule": self.policy_rule,
            "serverType": self.server_type,
            "gpuNotebook": self.gpu_notebook,
            "idleSince": t(self.idle_since),
            "idleSeconds": None if self.idle_seconds is None else round(self.idle_seconds),
            "stopAt": t(self.stop_at),
            "warnAt": t(self.warn_at),
            "extendUntil": t(self.extend_until),
            "evidence": self.evidence,
        }
