"""Policy rules a notebook's owner can opt into: warnings for rules that loosen the top-level policy and match
only on keys the owner writes (docs/configuration.md, "Who controls a match key").

Pure, no I/O: `loosening_rule_warnings(settings) -> list[str]`, printed by `kf-culler check` and logged by
`kf-culler run` at start-up.
"""

from __future__ import annotations

from collections.abc import Callable

from kf_culler.config import Policy, RuleMatch, ScopedPolicy, Settings

# A profile user can edit every label, annotation and the spec of their own Notebook.
OWNER_WRITABLE_MATCH_KEYS = ("notebookSelector", "serverTypes", "gpuResources")
# Namespace labels are set by admins; whether the pod holds a GPU and the model of the node it runs on
# (the node's nvidia.com/gpu.product label) are facts a user cannot change without holding that GPU.
ADMIN_CONTROLLED_MATCH_KEYS = ("namespaceSelector", "gpu", "gpuModels")


def _given_match_keys(match: RuleMatch) -> list[str]:
    """The config-file names of the match conditions a rule gives, in RuleMatch's order."""
    return [field.alias or name for name, field in RuleMatch.model_fields.items()
            if getattr(match, name) is not None]


def _num(value: float) -> str:
    return f"{value:g}"


def _larger(key: str, rule: float, top: float) -> str | None:
    return f"{key} ({_num(rule)} > {_num(top)})" if rule > top else None


def _smaller(key: str, rule: float, top: float) -> str | None:
    return f"{key} ({_num(rule)} < {_num(top)})" if rule < top else None


def _larger_or_off(key: str, rule: float | None, top: float | None, note: str = "") -> str | None:
    """A limit where null means never: looser when the top level has a number and the rule a larger one
    or null."""
    if top is None:
        return None
    if rule is None:
        return f"{key} (null: off, top level {_num(top)})"
    return f"{key} ({_num(rule)} > {_num(top)}{note})" if rule > top else None


def _changed_to(key: str, rule: object, top: object, loose: object, strict: object) -> str | None:
    return f"{key} ({rule}, top level {top})" if rule == loose and top == strict else None


def _no_signal_limit(rule: Policy, top: Policy) -> str | None:
    # Not set in the rule (nor at the top level, whose keys a rule inherits): twice the rule's idleMinutes.
    derived = "no_signal_gpu_idle_minutes" not in rule.model_fields_set
    return _larger_or_off("noSignalGpuIdleMinutes", rule.no_signal_gpu_idle_limit, top.no_signal_gpu_idle_limit,
                          ", twice idleMinutes" if derived else "")


def _no_signal(rule: Policy, top: Policy) -> str | None:
    if top.no_signal.action != "stop":
        return None
    if rule.no_signal.action == "keep":
        return "noSignal.action (keep, top level stop)"
    if rule.no_signal.after_minutes is None or top.no_signal.after_minutes is None:  # stop always has one
        return None
    return _larger("noSignal.afterMinutes", rule.no_signal.after_minutes, top.no_signal.after_minutes)


_CHECKS: tuple[Callable[[Policy, Policy], str | None], ...] = (
    lambda r, t: _larger("idleMinutes", r.idle_minutes, t.idle_minutes),
    lambda r, t: _larger("startupGraceMinutes", r.startup_grace_minutes, t.startup_grace_minutes),
    lambda r, t: _larger_or_off("connectedGpuIdleMinutes", r.connected_gpu_idle_minutes,
                                t.connected_gpu_idle_minutes),
    lambda r, t: _larger_or_off("busyKernelGpuIdleMinutes", r.busy_kernel_gpu_idle_minutes,
                                t.busy_kernel_gpu_idle_minutes),
    _no_signal_limit,
    _no_signal,
    # A lower threshold lets less GPU use count as work.
    lambda r, t: _smaller("gpu.utilPercent", r.gpu.util_percent, t.gpu.util_percent),
    lambda r, t: _smaller("gpu.memoryMiB", r.gpu.memory_mib, t.gpu.memory_mib),
    lambda r, t: _changed_to("allowExempt", str(r.allow_exempt).lower(), str(t.allow_exempt).lower(),
                             "true", "false"),
    lambda r, t: _larger("maxExtendMinutes", r.max_extend_minutes, t.max_extend_minutes),
    lambda r, t: _larger_or_off("maxRunningMinutes", r.max_running_minutes, t.max_running_minutes),
    lambda r, t: _larger_or_off("brokenMinutes", r.broken_minutes, t.broken_minutes),
    lambda r, t: _changed_to("brokenAction", r.broken_action, t.broken_action, "report", "stop"),
    lambda r, t: _changed_to("gpuWithoutMetrics", r.gpu_without_metrics, t.gpu_without_metrics, "keep",
                             "ide-only"),
)


def loosened_keys(rule: Policy, top: Policy) -> list[str]:
    """What `rule` makes looser than `top`, each as `key (rule value vs top value)`; empty when nothing."""
    return [found for check in _CHECKS if (found := check(rule, top)) is not None]


def rule_warning(rule: ScopedPolicy, top: Policy) -> str | None:
    """The warning for one rule, or None when it loosens nothing or matches on an admin-controlled key."""
    given = _given_match_keys(rule.match)
    owner_keys = [k for k in given if k in OWNER_WRITABLE_MATCH_KEYS]
    if not owner_keys or any(k in ADMIN_CONTROLLED_MATCH_KEYS for k in given):
        return None
    loosened = loosened_keys(rule.policy, top)
    if not loosened:
        return None
    return (f"rule '{rule.name}' loosens {', '.join(loosened)} and matches only on keys a notebook's owner can "
            f"write ({', '.join(owner_keys)}): any user can opt into it; add a namespaceSelector")


def loosening_rule_warnings(settings: Settings) -> list[str]:
    """One warning per policy rule that loosens the top-level policy and matches only on keys a notebook's
    owner can write (notebookSelector, serverTypes, gpuResources), in the rules' order."""
    return [w for rule in settings.rules if (w := rule_warning(rule, settings.policy)) is not None]
