"""Typed policy and settings: loaded and validated once, then passed explicitly.

One YAML (or JSON) mapping holds both the decision policy (the keys the scenario files use) and the
operational settings. Unknown or ill-typed keys are errors that name the key and the file.
"""

from __future__ import annotations

import fnmatch
import json
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Literal, TypeAlias

import yaml
from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError, model_validator

from kf_culler.brakes import BrakeLimits, limits_problem
from kf_culler.errors import ConfigError as ConfigError

TEN_YEARS_MIN = 10 * 366 * 24 * 60
ServerType = Literal["jupyter", "group-one", "group-two", "coder"]
# What a GPU notebook's missing GPU metrics mean when no GPU source is configured (docs/configuration.md).
GpuWithoutMetrics = Literal["keep", "ide-only"]
# The label GPU feature discovery puts on GPU nodes; a notebook names its model in its pod template's
# nodeSelector or required node affinity (policy rules' `gpuModels`).
GPU_MODEL_LABEL = "nvidia.com/gpu.product"
DEFAULT_RULE = "default"  # the policy rule name of the top-level policy
OVERRIDE_RULE_PREFIX = "namespaceOverrides."  # namespaceOverrides.<namespace>


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, populate_by_name=True)


class NoSignal(_Model):
    action: Literal["keep", "stop"] = "keep"
    after_minutes: float | None = Field(default=None, alias="afterMinutes", gt=0, le=TEN_YEARS_MIN)

    @model_validator(mode="after")
    def _stop_needs_after(self) -> NoSignal:
        if self.action == "stop" and self.after_minutes is None:
            raise ValueError("noSignal.action 'stop' needs noSignal.afterMinutes")
        return self


class GpuThresholds(_Model):
    util_percent: float = Field(default=5, alias="utilPercent", ge=0, le=100)
    memory_mib: float = Field(default=256, alias="memoryMiB", ge=0)


class ImageMatch(_Model):
    pattern: str = Field(min_length=1)
    type: ServerType


class Policy(_Model):
    """Everything `decide` reads. Field aliases are the config-file names."""

    idle_minutes: float = Field(default=60, alias="idleMinutes", gt=0, le=TEN_YEARS_MIN)
    warn_minutes: float = Field(default=10, alias="warnMinutes", ge=0, le=TEN_YEARS_MIN)
    startup_grace_minutes: float = Field(default=10, alias="startupGraceMinutes", ge=0, le=TEN_YEARS_MIN)
    connected_gpu_idle_minutes: float | None = Field(
        default=None, alias="connectedGpuIdleMinutes", gt=0, le=TEN_YEARS_MIN
    )
    busy_kernel_gpu_idle_minutes: float | None = Field(
        default=None, alias="busyKernelGpuIdleMinutes", gt=0, le=TEN_YEARS_MIN
    )
    no_signal: NoSignal = Field(default_factory=NoSignal, alias="noSignal")
    gpu: GpuThresholds = Field(default_factory=GpuThresholds)
    allow_exempt: bool = Field(default=False, alias="allowExempt")
    max_extend_minutes: float = Field(default=0, alias="maxExtendMinutes", ge=0, le=TEN_YEARS_MIN)
    # The lifetime cap (rule 13): stop even an active notebook once its pod has run this long.
    max_running_minutes: float | None = Field(default=None, alias="maxRunningMinutes", gt=0, le=TEN_YEARS_MIN)
    # Broken GPU notebooks (rule 14): crash-looping or not Ready this long while holding a GPU.
    broken_minutes: float | None = Field(default=None, alias="brokenMinutes", ge=0, le=TEN_YEARS_MIN)
    broken_action: Literal["report", "stop"] = Field(default="report", alias="brokenAction")
    gpu_resources: tuple[str, ...] = Field(default=("nvidia.com/gpu",), alias="gpuResources", strict=False)
    server_type_by_image: tuple[ImageMatch, ...] = Field(default=(), alias="serverTypeByImage", strict=False)
    gpu_without_metrics: GpuWithoutMetrics = Field(default="keep", alias="gpuWithoutMetrics")
    # Rule 16: a GPU notebook whose IDE gives no signal is no longer protected once its readable GPU metrics
    # showed no work this long. Not given: twice idleMinutes (`no_signal_gpu_idle_limit`); null: off.
    no_signal_gpu_idle_minutes: float | None = Field(default=None, alias="noSignalGpuIdleMinutes", gt=0,
                                                     le=TEN_YEARS_MIN)

    @property
    def no_signal_gpu_idle_limit(self) -> float | None:
        """Rule 16's limit in minutes, or None when it is off."""
        if "no_signal_gpu_idle_minutes" in self.model_fields_set:
            return self.no_signal_gpu_idle_minutes
        return 2 * self.idle_minutes

    def server_type_for_image(self, image: str) -> ServerType | None:
        for rule in self.server_type_by_image:
            if fnmatch.fnmatchcase(image, rule.pattern):
                return rule.type
        return None


class AuthProxySettings(_Model):
    """Probing each workbench through its kube-rbac-proxy sidecar (Open Data Hub / OpenShift AI): the Jupyter and
    code-server probes of Notebooks go to the `urls.jupyter` and `urls.codeServer` templates, which must then be
    https://, with `Authorization: Bearer <a prober token>`; no other URL ever gets the token. The token is of a
    ServiceAccount that may only `get` notebooks in the namespace it is sent to (what the proxy's
    SubjectAccessReview checks), never the culler's own: the proxy runs in a pod its user controls.
    docs/install.md, "OpenShift AI and Open Data Hub"; kf_culler/kube/prober.py."""

    enabled: bool = False
    # Where the tokens come from, exactly one: per probed namespace N, a TokenRequest for the ServiceAccount
    # `<serviceAccount>.<N>` in the culler's own namespace, bound in N (RoleBinding `<serviceAccount>`) to
    # `clusterRole`, all made by the culler; or a file re-read whenever it changes (one identity: only when exactly
    # one namespace is probed, see Operations). A DNS label, so that `<serviceAccount>.<N>` names one N only.
    service_account: Annotated[str, StringConstraints(pattern=r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")] | None = (
        Field(default=None, alias="serviceAccount"))
    cluster_role: Annotated[str, StringConstraints(pattern=r"^[a-z0-9]([-a-z0-9.:]{0,251}[a-z0-9])?$")] = Field(
        default="kf-culler-prober", alias="clusterRole")
    expiration_seconds: int = Field(default=600, alias="expirationSeconds", ge=600, le=86400)
    token_file: str | None = Field(default=None, alias="tokenFile", min_length=1)
    # The CA bundle the proxies' serving certificates are verified against (OpenShift's service CA); None: the
    # system's trust store.
    ca_file: str | None = Field(default=None, alias="caFile", min_length=1)

    @model_validator(mode="after")
    def _one_token_source(self) -> AuthProxySettings:
        if self.enabled and (self.service_account is None) == (self.token_file is None):
            raise ValueError("probe.authProxy.enabled needs exactly one of probe.authProxy.serviceAccount and "
                             "probe.authProxy.tokenFile")
        return self


class ProbeSettings(_Model):
    connect_timeout_seconds: float = Field(default=2.0, alias="connectTimeoutSeconds", gt=0, le=60)
    timeout_seconds: float = Field(default=5.0, alias="timeoutSeconds", gt=0, le=300)
    max_response_bytes: int = Field(default=1 << 20, alias="maxResponseBytes", ge=1024, le=1 << 30)
    retries: int = Field(default=1, ge=0, le=5)
    # Bounds on what a notebook server (which its user controls) can make the culler hold; see
    # docs/faults.md. Real answers: headers < 1 KiB in 10 lines, JSON 2 deep, 6 values per kernel.
    max_header_bytes: int = Field(default=64 << 10, alias="maxHeaderBytes", ge=1024, le=1 << 20)
    max_json_depth: int = Field(default=20, alias="maxJsonDepth", ge=2, le=100)
    max_json_values: int = Field(default=50_000, alias="maxJsonValues", ge=100, le=10_000_000)
    max_list_items: int = Field(default=1_000, alias="maxListItems", ge=10, le=1_000_000)
    # Connect to the ClusterIP the watch cache holds for a probed Service instead of looking its name up in DNS
    # (a lookup per notebook per pass, and CoreDNS's load); the request still names the Service (Host header).
    service_cluster_ip: bool = Field(default=True, alias="serviceClusterIP")
    auth_proxy: AuthProxySettings = Field(default_factory=AuthProxySettings, alias="authProxy")


class Urls(_Model):
    """Probe URL templates, one per IDE kind probed by URL (its `url_key`, kf_culler/ide.py)."""

    jupyter: str = "http://{name}.{namespace}.svc.{clusterDomain}/notebook/{namespace}/{name}/"
    code_server: str = Field(default="http://{name}.{namespace}.svc.{clusterDomain}/", alias="codeServer")
    # A Workspace's IDE (Kubeflow Notebooks 2.0, docs/targets.md): its own Service, the port its WorkspaceKind
    # gives, and `path`, the connect prefix `/workspace/connect/<namespace>/<name>/<portId>/` (or `/` for a
    # port the kind serves at the root); `{name}` is the Workspace's.
    workspace: str = "http://{service}.{namespace}.svc.{clusterDomain}:{port}{path}"
    # A plain workload's IDE (`targets: [workloads]`): through the Service named like the workload, which must
    # select the workload's own pods; `{name}` is the workload's.
    workload: str = "http://{name}.{namespace}.svc.{clusterDomain}/"

    @model_validator(mode="after")
    def _placeholders(self) -> Urls:
        """Each template names only the placeholders it is filled with (a typo fails here, not every pass)."""
        plain = {"name": "n", "namespace": "ns", "clusterDomain": "d"}
        for key, template, fill in (("jupyter", self.jupyter, plain), ("codeServer", self.code_server, plain),
                                    ("workload", self.workload, plain),
                                    ("workspace", self.workspace, {**plain, "service": "s", "port": 1, "path": "/"})):
            try:
                template.format(**fill)
            except (KeyError, IndexError, ValueError) as err:
                raise ValueError(f"urls.{key}: {template[:200]!r} uses a placeholder other than "
                                 f"{', '.join('{' + k + '}' for k in fill)} ({type(err).__name__}: {err})") from None
        return self

    def template_for(self, url_key: str | None) -> str | None:
        """The template of a `urls` key (`jupyter`, `codeServer`), or None."""
        if url_key is None:
            return None
        found = self.model_dump(by_alias=True).get(url_key)
        return found if isinstance(found, str) else None


class Namespaces(_Model):
    include: tuple[str, ...] = Field(default=(), strict=False)  # YAML lists
    exclude: tuple[str, ...] = Field(default=(), strict=False)

    def selects(self, namespace: str) -> bool:
        if self.include and namespace not in self.include:
            return False
        return namespace not in self.exclude


class PrometheusSettings(_Model):
    url: str | None = None
    lookback_minutes: float = Field(default=30, alias="lookbackMinutes", gt=0, le=24 * 60)
    step_seconds: float = Field(default=60, alias="stepSeconds", gt=0, le=3600)
    timeout_seconds: float = Field(default=10, alias="timeoutSeconds", gt=0, le=300)
    bearer_token_file: str | None = Field(default=None, alias="bearerTokenFile")
    ca_file: str | None = Field(default=None, alias="caFile")
    insecure_skip_verify: bool = Field(default=False, alias="insecureSkipVerify")
    # Also read DCGM_FI_PROF_GR_ENGINE_ACTIVE (a GPU's utilisation is the larger of the two).
    gpu_engine_active: bool = Field(default=True, alias="gpuEngineActive")
    # PromQL label matchers (written without the braces) ANDed into every GPU query: only the admin's
    # dcgm-exporter job is read, never a series a user's pod published (docs/configuration.md, "GPU
    # series that users cannot forge"). The default admits the dcgm-exporter Helm chart's
    # (`dcgm-exporter`, `<release>-dcgm-exporter`) and the GPU Operator's (`nvidia-dcgm-exporter`) jobs.
    gpu_series_selector: str = Field(default='job=~".*dcgm.*"', alias="gpuSeriesSelector", max_length=2000)
    # At most this many series read per GPU query; over it, whole namespaces are left out, the ones with
    # the most series first (10,000 one-GPU pods x 2 metrics read, the third one where it exists).
    max_series: int = Field(default=30_000, alias="maxSeries", ge=10, le=1_000_000)

    @model_validator(mode="after")
    def _series_selector(self) -> PrometheusSettings:
        PrometheusSettings.check_series_selector(self.gpu_series_selector)
        return self

    @staticmethod
    def check_series_selector(value: str) -> str:
        """gpuSeriesSelector normalised (`a="b",c=~"d"`), or ValueError saying what is wrong with it.

        Terms: `label="value"`, `label=~"regex"`, `label!="value"`, separated by commas; a label name is
        `[a-zA-Z_][a-zA-Z0-9_]*` (not `__…`); a value is a double-quoted PromQL string whose only escapes
        are `\\` and `\"`; no `{` or `}` anywhere (nothing can end the selector it is written into).
        """
        import re

        if "}" in value or "{" in value:
            raise ValueError('prometheus.gpuSeriesSelector: write the label matchers without braces, e.g. '
                             'job=~".*dcgm.*" (no { or } anywhere)')
        term = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!=|=)\s*"((?:[^"\\\n]|\\[\\"])*)"\s*')
        terms: list[str] = []
        pos = 0
        while pos < len(value) and value[pos:].strip():
            m = term.match(value, pos)
            if m is None:
                raise ValueError(f'prometheus.gpuSeriesSelector: {value[pos:].strip()[:60]!r} does not start '
                                 'with label="value", label=~"regex" or label!="value" (inside the quotes, '
                                 'the only escapes are \\\\ and \\")')
            name, op, quoted = m.groups()
            if name.startswith("__"):
                raise ValueError(f"prometheus.gpuSeriesSelector: label {name!r}: labels starting with __ "
                                 "cannot be matched")
            if op == "=~":
                try:
                    re.compile(re.sub(r'\\([\\"])', r"\1", quoted))
                except re.error as err:
                    raise ValueError(f"prometheus.gpuSeriesSelector: {name}=~{quoted[:40]!r} is not a regular "
                                     f"expression: {err}") from None
            terms.append(f'{name}{op}"{quoted}"')
            pos = m.end()
            if pos < len(value):
                if value[pos] != ",":
                    raise ValueError(f"prometheus.gpuSeriesSelector: expected a comma before {value[pos:][:40]!r}")
                pos += 1
        return ",".join(terms)


# A Kubernetes name that may be written into a PromQL matcher (no quotes, no regex syntax).
K8sName = Annotated[str, StringConstraints(pattern=r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")]


class RStudioSettings(_Model):
    """RStudio activity read from Prometheus: container CPU (cAdvisor) and, optionally, Istio requests."""

    enabled: bool = True
    lookback_minutes: float = Field(default=240, alias="lookbackMinutes", gt=0, le=7 * 24 * 60)
    step_seconds: float = Field(default=60, alias="stepSeconds", ge=1, le=3600)
    rate_window_seconds: float = Field(default=120, alias="rateWindowSeconds", ge=10, le=3600)
    cpu_busy_cores: float = Field(default=0.2, alias="cpuBusyCores", gt=0, le=1024)
    exclude_containers: tuple[K8sName, ...] = Field(default=("istio-proxy",), alias="excludeContainers",
                                                    strict=False)  # a YAML list
    istio: bool = True
    connected_window_seconds: float = Field(default=180, alias="connectedWindowSeconds", ge=30, le=3600)
    exclude_source_workloads: tuple[K8sName, ...] = Field(
        default=("notebook-controller-deployment",), alias="excludeSourceWorkloads", strict=False)


class DcgmSettings(_Model):
    """dcgm-exporter endpoints scraped directly, for clusters without Prometheus."""

    endpoints: tuple[str, ...] = Field(default=(), strict=False)  # a YAML list
    lookback_minutes: float = Field(default=30, alias="lookbackMinutes", gt=0, le=24 * 60)
    timeout_seconds: float = Field(default=5, alias="timeoutSeconds", gt=0, le=60)
    stale_seconds: float = Field(default=180, alias="staleSeconds", gt=0, le=3600)
    max_pods: int = Field(default=10000, alias="maxPods", ge=1, le=1_000_000)
    max_samples_per_pod: int = Field(default=2048, alias="maxSamplesPerPod", ge=2, le=100_000)
    ca_file: str | None = Field(default=None, alias="caFile")
    insecure_skip_verify: bool = Field(default=False, alias="insecureSkipVerify")


class BrakeSettings(_Model):
    """Brakes for when the culler is likely wrong about the whole fleet at once (kf_culler/brakes.py), and
    plain caps on stops and warnings per pass. docs/faults.md, "When the culler is likely wrong"."""

    enabled: bool = True
    fleet_fraction: float = Field(default=0.5, alias="fleetFraction", gt=0, le=1)
    min_namespaces: int = Field(default=3, alias="minNamespaces", ge=1, le=100_000)
    hold_minutes: float = Field(default=60, alias="holdMinutes", ge=0, le=10 * 24 * 60)
    recount_minutes: float = Field(default=1440, alias="recountMinutes", ge=0, le=30 * 24 * 60)
    max_stops_per_pass: int = Field(default=500, alias="maxStopsPerPass", ge=0, le=1_000_000)
    max_warnings_per_pass: int = Field(default=1000, alias="maxWarningsPerPass", ge=0, le=1_000_000)

    @model_validator(mode="after")
    def _one_tenant_cannot_trip(self) -> BrakeSettings:
        problem = limits_problem(self.limits)
        if problem:
            raise ValueError(problem)
        return self

    @property
    def limits(self) -> BrakeLimits:
        return BrakeLimits(self.enabled, self.fleet_fraction, self.min_namespaces, self.hold_minutes,
                           self.recount_minutes, self.max_stops_per_pass, self.max_warnings_per_pass)


class IstioSettings(_Model):
    """The culler keeps its own AuthorizationPolicy kf-culler-probes in every namespace with notebooks (off by
    default; needs kustomize/components/istio-policies for the RBAC)."""

    manage_authorization_policies: bool = Field(default=False, alias="manageAuthorizationPolicies")
    # The culler's identity in the mesh: <trust domain>/ns/<namespace>/sa/<service account>.
    principal: Annotated[str, StringConstraints(
        pattern=r"^[A-Za-z0-9.-]+/ns/[a-z0-9]([-a-z0-9]*[a-z0-9])?/sa/[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")] = (
        "cluster.local/ns/kubeflow/sa/kf-culler")
    reconcile_every_passes: int = Field(default=1, alias="reconcileEveryPasses", ge=1, le=1440)


NotifyKind = Literal["warn", "stop", "restart"]


class EmailSettings(_Model):
    """Mail to the notebook's owner over SMTP. The password comes from a file (a mounted Secret)."""

    enabled: bool = False
    host: str | None = Field(default=None, min_length=1)
    port: int = Field(default=587, ge=1, le=65535)
    tls: Literal["starttls", "implicit", "none"] = "starttls"
    username: str | None = Field(default=None, min_length=1)
    password_file: str | None = Field(default=None, alias="passwordFile", min_length=1)
    sender: str | None = Field(default=None, alias="from", min_length=3)
    cc: tuple[str, ...] = Field(default=(), strict=False)  # a YAML list
    ca_file: str | None = Field(default=None, alias="caFile")
    profile_owner: bool = Field(default=True, alias="profileOwner")
    owner_cache_seconds: float = Field(default=300, alias="ownerCacheSeconds", ge=0, le=86400)

    @model_validator(mode="after")
    def _complete(self) -> EmailSettings:
        if self.enabled and (self.host is None or self.sender is None):
            raise ValueError("notifications.email.enabled needs notifications.email.host and .from")
        if self.password_file is not None and self.username is None:
            raise ValueError("notifications.email.passwordFile needs notifications.email.username")
        return self


class Webhook(_Model):
    name: Annotated[str, StringConstraints(pattern=r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")]
    format: Literal["generic", "slack", "teams"] = "generic"
    url_file: str | None = Field(default=None, alias="urlFile", min_length=1)
    url_env: str | None = Field(default=None, alias="urlEnv", min_length=1)
    namespaces: Namespaces = Field(default_factory=Namespaces)

    @model_validator(mode="after")
    def _one_source(self) -> Webhook:
        if (self.url_file is None) == (self.url_env is None):
            raise ValueError(f"webhook '{self.name}' needs exactly one of urlFile and urlEnv")
        return self


class Templates(_Model):
    """string.Template texts; None: the built-in text (kf_culler/notify/message.py)."""

    warn_subject: str | None = Field(default=None, alias="warnSubject")
    warn_body: str | None = Field(default=None, alias="warnBody")
    stop_subject: str | None = Field(default=None, alias="stopSubject")
    stop_body: str | None = Field(default=None, alias="stopBody")
    restart_subject: str | None = Field(default=None, alias="restartSubject")
    restart_body: str | None = Field(default=None, alias="restartBody")


class Notifications(_Model):
    """Notices of warnings and stops to the notebook's owner (email) and to webhooks. Off by default."""

    kinds: tuple[NotifyKind, ...] = Field(default=("warn", "stop"), strict=False)
    queue_size: int = Field(default=1000, alias="queueSize", ge=1, le=100_000)
    # One namespace's share: its own queue bound and its notices per hour (kf_culler/notify/fairqueue.py).
    queue_per_namespace: int = Field(default=100, alias="queuePerNamespace", ge=1, le=100_000)
    per_namespace_per_hour: int = Field(default=120, alias="perNamespacePerHour", ge=1, le=100_000)
    attempts: int = Field(default=3, ge=1, le=10)
    backoff_seconds: float = Field(default=2, alias="backoffSeconds", ge=0, le=300)
    max_backoff_seconds: float = Field(default=30, alias="maxBackoffSeconds", ge=0, le=3600)
    timeout_seconds: float = Field(default=10, alias="timeoutSeconds", gt=0, le=300)
    dashboard_url: str | None = Field(default=None, alias="dashboardUrl")
    templates: Templates = Field(default_factory=Templates)
    email: EmailSettings = Field(default_factory=EmailSettings)
    webhooks: tuple[Webhook, ...] = Field(default=(), strict=False)  # a YAML list

    @model_validator(mode="after")
    def _unique_names(self) -> Notifications:
        names = [w.name for w in self.webhooks]
        if len(names) != len(set(names)):
            raise ValueError("notifications.webhooks: names must be unique")
        return self

    @property
    def enabled(self) -> bool:
        return self.email.enabled or bool(self.webhooks)


class SelectorRequirement(_Model):
    """One `matchExpressions` entry of a Kubernetes label selector."""

    key: str = Field(min_length=1)
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist"]
    values: tuple[str, ...] = Field(default=(), strict=False)  # a YAML list

    @model_validator(mode="after")
    def _values_fit_operator(self) -> SelectorRequirement:
        if self.operator in ("In", "NotIn") and not self.values:
            raise ValueError(f"operator {self.operator} needs values")
        if self.operator in ("Exists", "DoesNotExist") and self.values:
            raise ValueError(f"operator {self.operator} takes no values")
        return self


class LabelSelector(_Model):
    """A Kubernetes label selector: every matchLabels pair and every matchExpressions entry must hold."""

    match_labels: dict[str, str] = Field(default_factory=dict, alias="matchLabels")
    match_expressions: tuple[SelectorRequirement, ...] = Field(default=(), alias="matchExpressions",
                                                               strict=False)


class SkipControlledBy(_Model):
    """One `workloads.skipControlledBy` entry: workloads whose controller is of `kind` (`<API group>/<Kind>`), in
    one of `namespaces`, are an operator's, never sessions."""

    kind: Annotated[str, StringConstraints(pattern=r"^[a-z0-9.-]+/[A-Za-z0-9]+$")]
    namespaces: tuple[Annotated[str, StringConstraints(pattern=r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")], ...] = (
        Field(strict=False, min_length=1))

    @model_validator(mode="before")
    @classmethod
    def _not_a_kind_alone(cls, data: Any) -> Any:
        if isinstance(data, str):
            raise ValueError(
                f"{data!r} is a kind alone; give {{kind: {data}, namespaces: [...]}} with the namespaces where only "
                "admins or the operator create such objects: a profile user can create objects of many kinds in "
                "their own namespace (an InferenceService with kubeflow-edit) and point their workload's "
                "ownerReference at one")
        return data


class WorkloadSettings(_Model):
    """Plain Deployments and StatefulSets as sessions (`targets: [workloads]`, docs/targets.md)."""

    # Workloads with these labels (their owners can remove them: pair with an admission policy, or gpuWorkloads).
    selector: LabelSelector | None = None
    # Also every workload whose pod template requests a GPU (gpuResources), whatever its labels.
    gpu_workloads: bool = Field(default=False, alias="gpuWorkloads")
    kinds: tuple[Literal["Deployment", "StatefulSet"], ...] = Field(default=("Deployment", "StatefulSet"),
                                                                    strict=False, min_length=1)
    # Controllers whose workloads are theirs to scale (an operator's), never sessions, in the namespaces named with
    # each (`docs/targets.md`, "Plain workloads"): namespaces where profile users cannot create objects, since a
    # user can point an ownerReference at any object of their own (a small InferenceService of theirs, say).
    skip_controlled_by: tuple[SkipControlledBy, ...] = Field(default=(), alias="skipControlledBy", strict=False)

    @property
    def skips(self) -> tuple[tuple[str, frozenset[str]], ...]:
        """(`<API group>/<Kind>`, its namespaces) of every skipControlledBy entry."""
        return tuple((s.kind, frozenset(s.namespaces)) for s in self.skip_controlled_by)

    @model_validator(mode="after")
    def _chooses(self) -> WorkloadSettings:
        if self.selector is None and not self.gpu_workloads:
            raise ValueError("workloads: give a selector, or gpuWorkloads: true (or both)")
        return self


class CoderSettings(_Model):
    """Coder workspaces as sessions (`targets: [coder]`, docs/targets.md, "Coder workspaces"): Coder's API, the
    token the culler stops with (a file: a mounted Secret, never the ConfigMap) and the one Kubernetes namespace
    Coder's templates deploy workspaces into, which Coder's users have no rights in."""

    url: str = Field(min_length=1, max_length=2000)  # Coder's access URL, e.g. http://coder.coder.svc
    token_file: str = Field(alias="tokenFile", min_length=1)  # an Owner's API token (`coder tokens create`)
    namespace: Annotated[str, StringConstraints(pattern=r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")]
    page_size: int = Field(default=100, alias="pageSize", ge=1, le=1000)  # workspaces per list request
    timeout_seconds: float = Field(default=15, alias="timeoutSeconds", gt=0, le=300)  # per request
    max_workspaces: int = Field(default=20_000, alias="maxWorkspaces", ge=1, le=1_000_000)  # listed per pass

    @model_validator(mode="after")
    def _http_url(self) -> CoderSettings:
        if not self.url.startswith(("http://", "https://")):
            raise ValueError("coder.url must start with http:// or https://")
        return self


class Operations(_Model):
    """Settings that shape how the culler runs, not what it decides."""

    check_period_seconds: float = Field(default=60, alias="checkPeriodSeconds", gt=0, le=86400)
    concurrency: int = Field(default=512, ge=1, le=4096)
    probe: ProbeSettings = Field(default_factory=ProbeSettings)
    urls: Urls = Field(default_factory=Urls)
    cluster_domain: str = Field(default="cluster.local", alias="clusterDomain", min_length=1)
    namespaces: Namespaces = Field(default_factory=Namespaces)
    dry_run: bool = Field(default=False, alias="dryRun")
    gpu_only: bool = Field(default=False, alias="gpuOnly")
    last_activity_step_minutes: float = Field(default=10, alias="lastActivityStepMinutes", ge=0, le=1440)
    # `check` lists, and a gauge counts, notebooks stopped longer than this (the culler never deletes them).
    long_stopped_days: float = Field(default=30, alias="longStoppedDays", gt=0, le=3660)
    # How long after the culler's own stop the session's GPU pod must be gone before the stop counts as not taken
    # (rule 1, kf_culler/rules/untaken.py). Not given: three check periods, at least 2 minutes.
    stop_deadline_minutes: float | None = Field(default=None, alias="stopDeadlineMinutes", gt=0, le=1440)
    prometheus: PrometheusSettings = Field(default_factory=PrometheusSettings)
    rstudio: RStudioSettings = Field(default_factory=RStudioSettings)
    dcgm: DcgmSettings = Field(default_factory=DcgmSettings)
    notifications: Notifications = Field(default_factory=Notifications)
    istio: IstioSettings = Field(default_factory=IstioSettings)
    brakes: BrakeSettings = Field(default_factory=BrakeSettings)
    # Notebook writes (patches, records, Events) in flight at once; each write backs off on 429 (API Priority
    # and Fairness). docs/performance.md, "Storms", has what a pass of thousands of stops costs.
    writes_in_flight: int = Field(default=16, alias="writesInFlight", ge=1, le=256)
    # Split the notebooks by namespace into this many shards, each held by one replica through its own
    # Lease (`run --leader-elect`); 1: one Lease, one writer (docs/install.md, "Scaling out").
    shards: int = Field(default=1, ge=1, le=256)
    # What the culler culls (kf_culler/targets/, docs/targets.md): Kubeflow v1 Notebooks, Kubeflow
    # Notebooks 2.0 Workspaces, or both.
    targets: tuple[Literal["notebooks", "workspaces", "workloads", "coder"], ...] = Field(
        default=("notebooks",), strict=False, min_length=1)
    workloads: WorkloadSettings | None = None  # required with `targets: [workloads]`
    coder: CoderSettings | None = None  # required with `targets: [coder]`

    @property
    def stop_deadline_seconds(self) -> float:
        """`stopDeadlineMinutes` in seconds; not given: three check periods, at least 2 minutes."""
        if self.stop_deadline_minutes is not None:
            return self.stop_deadline_minutes * 60
        return max(3 * self.check_period_seconds, 120.0)

    @model_validator(mode="after")
    def _stop_deadline_spans_a_pass(self) -> Operations:
        if self.stop_deadline_minutes is not None and self.stop_deadline_minutes * 60 < self.check_period_seconds:
            raise ValueError(f"stopDeadlineMinutes {self.stop_deadline_minutes:g} is shorter than one pass "
                             f"(checkPeriodSeconds {self.check_period_seconds:g}): a stop would be reported as not "
                             "taken before the culler could see its pod go")
        return self

    @model_validator(mode="after")
    def _workloads_chosen(self) -> Operations:
        if "workloads" in self.targets and self.workloads is None:
            raise ValueError("targets: workloads needs a `workloads:` section saying which ones (selector, "
                             "gpuWorkloads)")
        if "coder" in self.targets and self.coder is None:
            raise ValueError("targets: coder needs a `coder:` section (url, tokenFile, namespace)")
        if "coder" in self.targets and self.coder is not None and self.namespaces.include \
                and self.coder.namespace not in self.namespaces.include:
            raise ValueError(f"coder.namespace {self.coder.namespace!r} is not in namespaces.include: its "
                             "workspaces would never be culled")
        return self

    @model_validator(mode="after")
    def _proxy_urls_are_https(self) -> Operations:
        """The prober token never travels in clear text: with probe.authProxy on, the templates it goes to are
        https://."""
        if self.probe.auth_proxy.enabled:
            for key, template in (("jupyter", self.urls.jupyter), ("codeServer", self.urls.code_server)):
                if not template.startswith("https://"):
                    raise ValueError(f"urls.{key}: probe.authProxy sends a token to this template, which must "
                                     f"start with https:// (the workbench's kube-rbac-proxy), not {template[:80]!r}")
            # One file is one identity: sent to several namespaces, a token captured in one would open the others.
            if self.probe.auth_proxy.token_file is not None and len(set(self.namespaces.include)) != 1:
                raise ValueError("probe.authProxy.tokenFile is one token for every namespace probed: it needs "
                                 "namespaces.include to name exactly one namespace (use probe.authProxy.serviceAccount "
                                 "for one prober per namespace)")
        return self


class RuleMatch(_Model):
    """What a policy rule applies to; every condition given must hold (none given: every notebook)."""

    namespace_selector: LabelSelector | None = Field(default=None, alias="namespaceSelector")
    notebook_selector: LabelSelector | None = Field(default=None, alias="notebookSelector")
    server_types: tuple[ServerType, ...] | None = Field(default=None, alias="serverTypes", strict=False)
    gpu: bool | None = None
    gpu_resources: tuple[str, ...] | None = Field(default=None, alias="gpuResources", strict=False)
    gpu_models: tuple[str, ...] | None = Field(default=None, alias="gpuModels", strict=False)


class _RuleHead(_Model):
    name: Annotated[str, StringConstraints(pattern=r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")]
    match: RuleMatch = Field(default_factory=RuleMatch)


class ScopedPolicy:
    """One entry of `rules`: a name, what it matches, and the policy it gives (top level + its keys)."""

    def __init__(self, name: str, match: RuleMatch, policy: Policy) -> None:
        self.name = name
        self.match = match
        self.policy = policy


_POLICY_KEYS = {f.alias or n for n, f in Policy.model_fields.items()}
_OPS_KEYS = {f.alias or n for n, f in Operations.model_fields.items()}
_OVERRIDES_KEY = "namespaceOverrides"
_RULES_KEY = "rules"


class Settings:
    """The validated configuration: a default policy, per-namespace overrides, ordered policy rules
    (kf_culler/policy.py picks one per notebook), and operations."""

    def __init__(self, policy: Policy, operations: Operations, overrides: dict[str, Policy],
                 rules: tuple[ScopedPolicy, ...] = ()) -> None:
        self.policy = policy
        self.operations = operations
        self.overrides = overrides
        self.rules = rules

    def policies(self) -> list[Policy]:
        """Every policy a notebook can get: the top level, the overrides, the rules'."""
        return [self.policy, *self.overrides.values(), *(r.policy for r in self.rules)]

    @property
    def selector_label_keys(self) -> frozenset[str]:
        """The label keys the rules' namespaceSelector and notebookSelector read."""
        keys: set[str] = set()
        for rule in self.rules:
            for sel in (rule.match.namespace_selector, rule.match.notebook_selector):
                if sel is not None:
                    keys.update(sel.match_labels)
                    keys.update(req.key for req in sel.match_expressions)
        return frozenset(keys)

    @property
    def needs_namespace_labels(self) -> bool:
        return any(r.match.namespace_selector is not None for r in self.rules)

    @property
    def gpu_source_configured(self) -> bool:
        return bool(self.operations.prometheus.url or self.operations.dcgm.endpoints)

    def gpu_source_warning(self) -> str | None:
        """What GPU notebooks get when no GPU source is configured (None when one is)."""
        if self.gpu_source_configured:
            return None
        choices = sorted({p.gpu_without_metrics for p in self.policies()})
        what = {"keep": "GPU notebooks are never stopped for idleness (kept as no-signal)",
                "ide-only": "GPU notebooks are judged by their IDE alone, like CPU notebooks"}
        return ("no GPU metrics source is configured (prometheus.url, dcgm.endpoints): "
                + "; ".join(f"gpuWithoutMetrics: {c}: {what[c]}" for c in choices))


# Where a key came from: one file's name, or a function of the key (dotted, e.g. `coder.url`, `rules[0]`) naming
# the file that set it (the admin's file and the fragments merged into it, kf_culler/config_layers.py).
Source: TypeAlias = str | Callable[[str], str]


def _at(source: Source, key: str) -> str:
    return source if isinstance(source, str) else source(key)


def _describe(err: ValidationError, source: Source, prefix: str = "") -> str:
    parts = []
    for e in err.errors():
        loc = ".".join(str(p) for p in e["loc"] if p != "__root__")
        key = f"{prefix}{loc}" if loc else prefix.rstrip(".") or "(top level)"
        parts.append(f"{_at(source, key)}: key '{key}': {e['msg']}")
    return "; ".join(parts)


# Credentials never sit in the ConfigMap: these keys are refused with a message naming the file key to use.
_INLINE_SECRETS = {"password": "passwordFile", "url": "urlFile (or urlEnv)"}


def _refuse_inline_secrets(raw: object, source: Source) -> None:
    if not isinstance(raw, dict):
        return
    places: list[tuple[str, object]] = [("notifications.email", raw.get("email"))]
    hooks = raw.get("webhooks")
    if isinstance(hooks, list):
        places += [(f"notifications.webhooks[{i}]", h) for i, h in enumerate(hooks)]
    for where, section in places:
        if not isinstance(section, dict):
            continue
        for key, instead in _INLINE_SECRETS.items():
            if key in section:
                raise ConfigError(
                    f"{_at(source, f'{where}.{key}')}: key '{where}.{key}': credentials are not read from the "
                    f"configuration (it is a ConfigMap); put the value in the Secret kf-culler-notifications and "
                    f"set {instead}")


# Every URL-valued key, and where its credential belongs instead: a URL's user name or password would be
# echoed wherever the URL is (errors, logs, `explain`), so `user:pass@` is refused in all of them.
_URL_KEYS: tuple[tuple[str, str, str], ...] = (
    ("prometheus", "url", "prometheus.bearerTokenFile (a mounted Secret)"),
    ("coder", "url", "coder.tokenFile (a mounted Secret)"),
    ("urls", "jupyter", "a Secret file"), ("urls", "codeServer", "a Secret file"),
    ("dcgm", "endpoints", "a Secret file"), ("notifications", "dashboardUrl", "a Secret file"),
)


def _has_userinfo(url: str) -> bool:
    """Whether the URL's authority (after `scheme://`, before the path) holds `user[:password]@`."""
    rest = url.split("://", 1)[1] if "://" in url else url
    for end in "/?#\\":
        rest = rest.split(end, 1)[0]
    return "@" in rest


def _refuse_userinfo(data: dict[Any, Any], source: Source) -> None:
    for section, key, instead in _URL_KEYS:
        raw = data.get(section)
        value = raw.get(key) if isinstance(raw, dict) else None
        urls = [(f"{section}.{key}[{i}]", v) for i, v in enumerate(value)] if isinstance(value, list) else [
            (f"{section}.{key}", value)]
        for where, url in urls:
            if isinstance(url, str) and _has_userinfo(url):
                raise ConfigError(f"{_at(source, where)}: key '{where}': a URL with a user name or password "
                                  f"(user:pass@host) is refused, it would be shown wherever the URL is; put the "
                                  f"credential in {instead} instead")


def load_mapping(data: object, source: Source) -> Settings:
    """Validate a decoded mapping (from a file or a scenario's `config`)."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{_at(source, '')}: the configuration must be a mapping, not {type(data).__name__}")
    unknown = unknown_keys(data)
    if unknown:
        raise ConfigError(f"{_at(source, unknown[0])}: unknown key '{unknown[0]}'" + (
            f" (and {len(unknown) - 1} more)" if len(unknown) > 1 else ""))
    _refuse_inline_secrets(data.get("notifications"), source)
    _refuse_userinfo(data, source)
    base_raw = {k: v for k, v in data.items() if k in _POLICY_KEYS}
    try:
        policy = Policy.model_validate(base_raw)
        operations = Operations.model_validate({k: v for k, v in data.items() if k in _OPS_KEYS})
    except ValidationError as err:
        raise ConfigError(_describe(err, source)) from None
    overrides_raw = data.get(_OVERRIDES_KEY) or {}
    if not isinstance(overrides_raw, dict):
        raise ConfigError(f"{_at(source, _OVERRIDES_KEY)}: key '{_OVERRIDES_KEY}' must map namespaces to policy keys")
    overrides: dict[str, Policy] = {}
    for namespace, raw in overrides_raw.items():
        where = f"{_OVERRIDES_KEY}.{namespace}"
        if not isinstance(raw, dict):
            raise ConfigError(f"{_at(source, where)}: key '{where}' must be a mapping of policy keys")
        bad = sorted(str(k) for k in raw if k not in _POLICY_KEYS)
        if bad:
            raise ConfigError(f"{_at(source, where)}: unknown key '{where}.{bad[0]}' (only policy keys may be "
                              "overridden)")
        try:
            overrides[str(namespace)] = Policy.model_validate({**base_raw, **raw})
        except ValidationError as err:
            raise ConfigError(_describe(err, source, prefix=f"{where}.")) from None
    return Settings(policy, operations, overrides, _load_rules(data.get(_RULES_KEY), base_raw, source))


def _load_rules(raw: object, base_raw: dict[str, Any], source: Source) -> tuple[ScopedPolicy, ...]:
    """`rules`: an ordered list of {name, match, policy}; a rule's policy is the top level plus its keys."""
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise ConfigError(f"{_at(source, _RULES_KEY)}: key '{_RULES_KEY}' must be a list of {{name, match, policy}}")
    rules: list[ScopedPolicy] = []
    for i, entry in enumerate(raw):
        where = f"{_RULES_KEY}[{i}]"
        if not isinstance(entry, dict):
            raise ConfigError(f"{_at(source, where)}: key '{where}' must be a mapping with name, match and policy")
        bad = sorted(str(k) for k in entry if k not in ("name", "match", "policy"))
        if bad:
            raise ConfigError(f"{_at(source, where)}: unknown key '{where}.{bad[0]}' (a rule has name, match and "
                              "policy)")
        try:
            head = _RuleHead.model_validate({k: v for k, v in entry.items() if k != "policy"})
        except ValidationError as err:
            raise ConfigError(_describe(err, source, prefix=f"{where}.")) from None
        if head.name == DEFAULT_RULE or head.name in (r.name for r in rules):
            raise ConfigError(f"{_at(source, where)}: key '{where}.name': {head.name!r} is "
                              + ("reserved for the top-level policy" if head.name == DEFAULT_RULE else "used twice"))
        keys = entry.get("policy") or {}
        if not isinstance(keys, dict):
            raise ConfigError(f"{_at(source, where)}: key '{where}.policy' must be a mapping of policy keys")
        unknown = sorted(str(k) for k in keys if k not in _POLICY_KEYS)
        if unknown:
            raise ConfigError(f"{_at(source, where)}: unknown key '{where}.policy.{unknown[0]}' in rule '{head.name}' "
                              "(only policy keys may be set)")
        try:
            policy = Policy.model_validate({**base_raw, **keys})
        except ValidationError as err:
            raise ConfigError(_describe(err, source, prefix=f"{where}.policy.")) from None
        rules.append(ScopedPolicy(head.name, head.match, policy))
    return tuple(rules)


def read_data(path: str | Path) -> Any:
    """A YAML or JSON configuration file's decoded content (not validated)."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as err:
        raise ConfigError(f"{p}: cannot read: {err.strerror or err}") from None
    try:
        return json.loads(text) if p.suffix == ".json" else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError) as err:
        raise ConfigError(f"{p}: not valid {'JSON' if p.suffix == '.json' else 'YAML'}: "
                          f"{str(err).splitlines()[0]}") from None


def unknown_keys(data: dict[Any, Any]) -> list[str]:
    """The top-level keys of a configuration mapping that are no configuration key, sorted."""
    return sorted(str(k) for k in data if k not in _POLICY_KEYS | _OPS_KEYS | {_OVERRIDES_KEY, _RULES_KEY})


def load_file(path: str | Path) -> Settings:
    """Read and validate a YAML or JSON configuration file."""
    return load_mapping(read_data(path), str(Path(path)))
