"""The contenders a replay compares: a kf-culler policy (the real `decide`) and two reference rules.

- `kubeflow-kernel[:MINUTES]`: the Kubeflow notebook-controller's culling. Its last-activity starts at the
  pod start; each check reads api/kernels: a busy kernel sets it to now, otherwise it becomes the most
  recent kernel `last_activity`. No answer, an unreadable answer, or no kernels leave it unchanged, so
  such a notebook is stopped MINUTES after it started, whatever it does. Stop when last-activity is more
  than MINUTES ago. Server type, terminals, connections and GPU are not looked at.
- `gpu-only[:MINUTES[:UTIL]]`: stop a GPU notebook whose GPU utilisation stayed under UTIL % for MINUTES
  (memory is not looked at; missing metrics count as under). Notebooks without a GPU are kept.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, NamedTuple, Protocol, cast

from kf_culler.config import ConfigError, Policy, Settings, load_file, load_mapping
from kf_culler.decide import decide, gpu_count
from kf_culler.model import InputError
from kf_culler.policy import policy_of
from kf_culler.timeutil import format_time, parse_time


class Check(NamedTuple):
    action: str  # keep | warn | stop
    state: str
    reason: str


class Contender(Protocol):
    name: str

    @property
    def idle_minutes(self) -> float: ...

    @property
    def gpu_lookback_minutes(self) -> float:
        """How many minutes of GPU samples the rule is given (0: the record's own, as they are)."""
        ...

    def gpu_thresholds(self, memo: dict[str, Any], notebook: dict[str, Any], pod: dict[str, Any] | None,
                       context: Mapping[str, Any]) -> tuple[float, float] | None:
        """(util %, memory MiB) at which a GPU sample shows work for this notebook, when the rule's
        verdict depends on its samples only through decide's reading of them; None: give all samples."""
        ...

    def check(self, memo: dict[str, Any], notebook: dict[str, Any], pod: dict[str, Any] | None,
              observations: dict[str, Any], now: datetime, started: datetime, context: Mapping[str, Any]) -> Check:
        """The verdict for one notebook whose pod runs since `started`. `memo` is this rule's state for
        this notebook (empty at the first check); `context` is the record's (the namespace's labels, the
        Node's GPU model)."""
        ...


def _namespace(notebook: dict[str, Any]) -> str:
    meta = notebook.get("metadata") or {}
    return str(meta.get("namespace", "")) if isinstance(meta, dict) else ""


@dataclass
class ConfiguredPolicy:
    """kf-culler's decision, `kf_culler.decide.decide`, with the policy a configuration file gives each
    notebook: chosen as `kf-culler run` chooses it (kf_culler/policy.py: namespaceOverrides, then `rules`,
    then the top level), from the recorded notebook, pod and context."""

    name: str
    settings: Settings
    calls: int = 0
    errors: int = 0

    @property
    def idle_minutes(self) -> float:
        return self.settings.policy.idle_minutes

    @property
    def gpu_lookback_minutes(self) -> float:
        """The culler's GPU query: prometheus.lookbackMinutes, widened to cover its longest limit."""
        from kf_culler.runner import gpu_window_minutes

        return max(self.settings.operations.prometheus.lookback_minutes,
                   min(gpu_window_minutes(self.settings), 24 * 60))

    def policy(self, memo: dict[str, Any], notebook: dict[str, Any], pod: dict[str, Any] | None,
               context: Mapping[str, Any]) -> Policy:
        """The notebook's policy, chosen again only when the notebook, pod or context object changed."""
        seen = memo.get("policy")
        if seen is not None and seen[0] is notebook and seen[1] is pod and (seen[2] is context or seen[2] == context):
            return cast(Policy, seen[3])
        labels = context.get("namespaceLabels")
        node = context.get("node")
        chosen = policy_of(notebook, pod, self.settings, labels if isinstance(labels, dict) else None,
                           node if isinstance(node, dict) else None)[0]
        memo["policy"] = (notebook, pod, context, chosen)
        return chosen

    def gpu_thresholds(self, memo: dict[str, Any], notebook: dict[str, Any], pod: dict[str, Any] | None,
                       context: Mapping[str, Any]) -> tuple[float, float] | None:
        gpu = self.policy(memo, notebook, pod, context).gpu
        return gpu.util_percent, gpu.memory_mib

    def check(self, memo: dict[str, Any], notebook: dict[str, Any], pod: dict[str, Any] | None,
              observations: dict[str, Any], now: datetime, started: datetime, context: Mapping[str, Any]) -> Check:
        namespace = _namespace(notebook)
        ops = self.settings.operations
        if not ops.namespaces.selects(namespace):
            return Check("keep", "exempt", "namespace not selected by this configuration")
        policy = self.policy(memo, notebook, pod, context)
        if ops.gpu_only and gpu_count(notebook, pod, policy.gpu_resources) == 0:
            return Check("keep", "exempt", "gpuOnly: the notebook has no GPU")
        self.calls += 1
        try:
            verdict = decide(notebook, pod, observations, policy, now)
        except InputError as err:
            self.errors += 1
            return Check("keep", "error", f"not a notebook: {err}")
        return Check(verdict.action, verdict.state, verdict.reason)


def _kernels(raw: object) -> list[dict[str, Any]] | None:
    """api/kernels as the notebook-controller reads it, or None when it could not be read."""
    if not isinstance(raw, dict) or "error" in raw:
        return None
    kernels = raw.get("kernels")
    if not isinstance(kernels, list) or not all(isinstance(k, dict) for k in kernels):
        return None
    return kernels


@dataclass
class KubeflowKernelRule:
    """The notebook-controller's kernel-only culling (CULL_IDLE_TIME = idle_minutes)."""

    idle_minutes: float = 1440
    name: str = "kubeflow-kernel"
    gpu_lookback_minutes: float = 0  # reads no GPU

    def gpu_thresholds(self, memo: dict[str, Any], notebook: dict[str, Any], pod: dict[str, Any] | None,
                       context: Mapping[str, Any]) -> tuple[float, float] | None:
        return None

    def check(self, memo: dict[str, Any], notebook: dict[str, Any], pod: dict[str, Any] | None,
              observations: dict[str, Any], now: datetime, started: datetime, context: Mapping[str, Any]) -> Check:
        if memo.get("started") != started:  # a new pod: last-activity starts again
            memo["started"], memo["last"] = started, started
        kernels = _kernels(observations.get("jupyter"))
        busy = bool(kernels) and any(k.get("execution_state") == "busy" for k in kernels or ())
        if kernels:
            if busy:
                memo["last"] = now
            else:
                times = [parse_time(k.get("last_activity")) for k in kernels]
                if all(t is not None for t in times):
                    memo["last"] = max(t for t in times if t is not None)
        last: datetime = memo["last"]
        if last + timedelta(minutes=self.idle_minutes) < now:
            return Check("stop", "idle", f"no kernel activity since {format_time(last)} "
                         f"(CULL_IDLE_TIME {self.idle_minutes:g} min)")
        return Check("keep", "active" if busy else "idle", f"last kernel activity {format_time(last)}")


def _busy_times(raw: object, util: float) -> list[datetime]:
    """Times of the samples at or over util % (unreadable samples are skipped)."""
    samples = raw.get("samples") if isinstance(raw, dict) else None
    out = []
    for s in samples if isinstance(samples, list) else ():
        if not isinstance(s, dict):
            continue
        u = s.get("utilPercent")
        if isinstance(u, int | float) and not isinstance(u, bool) and u >= util:
            t = parse_time(s.get("time"))
            if t is not None:
                out.append(t)
    return out


@dataclass
class GpuOnlyRule:
    """Stop a GPU notebook whose utilisation stayed under util_percent for idle_minutes."""

    idle_minutes: float = 60
    util_percent: float = 5
    name: str = "gpu-only"
    resources: tuple[str, ...] = ("nvidia.com/gpu",)

    @property
    def gpu_lookback_minutes(self) -> float:
        return self.idle_minutes + 10

    def gpu_thresholds(self, memo: dict[str, Any], notebook: dict[str, Any], pod: dict[str, Any] | None,
                       context: Mapping[str, Any]) -> tuple[float, float] | None:
        return None

    def check(self, memo: dict[str, Any], notebook: dict[str, Any], pod: dict[str, Any] | None,
              observations: dict[str, Any], now: datetime, started: datetime, context: Mapping[str, Any]) -> Check:
        if memo.get("gpus") is None or memo.get("pod") is not pod:
            memo["gpus"], memo["pod"] = gpu_count(notebook, pod, self.resources), pod
        if not memo["gpus"]:
            return Check("keep", "exempt", "no GPU")
        if memo.get("started") != started:
            memo["started"], memo["last"] = started, started
        busy = _busy_times(observations.get("gpu"), self.util_percent)
        if busy and max(busy) > memo["last"]:
            memo["last"] = min(max(busy), now)
        last: datetime = memo["last"]
        if now - last >= timedelta(minutes=self.idle_minutes):
            return Check("stop", "idle", f"GPU utilisation under {self.util_percent:g} % since "
                         f"{format_time(last)} ({self.idle_minutes:g} min limit)")
        return Check("keep", "active" if busy else "idle", f"GPU last busy {format_time(last)}")


BUILTINS = ("kubeflow-kernel", "gpu-only", "defaults")


def _number(text: str, what: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ConfigError(f"{what}: {text!r} is not a number") from None
    if not 0 < value <= 10 * 366 * 24 * 60:
        raise ConfigError(f"{what}: {text!r} is out of range")
    return value


def make_contender(spec: str, primary: Policy) -> Contender:
    """A rule from a --config/--compare value: a built-in name (with parameters) or a config file.

    Built-ins take their defaults from the primary policy (its idleMinutes and gpu.utilPercent), so the
    comparison is between rules, not limits.
    """
    head, _, params = spec.partition(":")
    args = params.split(":") if params else []
    if head == "kubeflow-kernel" and len(args) <= 1:
        minutes = _number(args[0], spec) if args else primary.idle_minutes
        return KubeflowKernelRule(minutes, name=f"kubeflow-kernel ({minutes:g} min)")
    if head == "gpu-only" and len(args) <= 2:
        minutes = _number(args[0], spec) if args else primary.idle_minutes
        util = _number(args[1], spec) if len(args) > 1 else primary.gpu.util_percent
        return GpuOnlyRule(minutes, util, name=f"gpu-only ({minutes:g} min, <{util:g} %)",
                           resources=primary.gpu_resources)
    if spec == "defaults":
        return ConfiguredPolicy("defaults", load_mapping({}, "defaults"))
    path = Path(spec)
    if not path.exists() and head in BUILTINS:
        raise ConfigError(f"{spec}: bad parameters (kubeflow-kernel[:MINUTES], gpu-only[:MINUTES[:UTIL]])")
    return ConfiguredPolicy(path.stem, load_file(path))


def make_contenders(config: str | None, compare: list[str]) -> list[Contender]:
    """The primary rule (config, or the built-in defaults) first, then the compared ones, names unique."""
    primary = make_contender(config or "defaults", Policy())
    base = primary.settings.policy if isinstance(primary, ConfiguredPolicy) else Policy()
    rules: list[Contender] = [primary] + [make_contender(c, base) for c in compare]
    seen: dict[str, int] = {}
    for rule in rules:
        n = seen.get(rule.name, 0) + 1
        seen[rule.name] = n
        if n > 1:
            rule.name = f"{rule.name} #{n}"
    return rules
