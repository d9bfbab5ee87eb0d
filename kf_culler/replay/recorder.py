"""TraceRecorder: append what the culler observed to a trace file, so a real week can be replayed.

`kf-culler run --record FILE` calls `recorder.record(now, notebook, pod, observations, context)` once per
notebook per check (`context`: the namespace's labels and the Node's GPU model, what the policy choice
reads beyond the two objects). The file is append-only: a restarted culler appends to the same trace. With a hash key,
namespaces and names are replaced by keyed hashes (HMAC-SHA256), and objects are cut down to the
fields the decision reads, so a trace can leave the cluster.
"""

from __future__ import annotations

import copy
import hashlib
import hmac
import threading
from datetime import datetime
from pathlib import Path
from types import TracebackType
from typing import IO, Any

from kf_culler.config import GPU_MODEL_LABEL
from kf_culler.model import LAST_ACTIVITY_ANNOTATION, PREFIX, SERVER_TYPE_ANNOTATION, STOP_ANNOTATION
from kf_culler.replay.trace import TraceHeader, TraceWriter, notebook_id, open_text, read_header
from kf_culler.session import (
    annotations_of,
    as_dict,
    containers,
    metadata_of,
    pod_containers,
    string_labels,
    template_containers,
)

_KEPT = (STOP_ANNOTATION, SERVER_TYPE_ANNOTATION, LAST_ACTIVITY_ANNOTATION)
Objects = tuple[dict[str, Any], dict[str, Any] | None, dict[str, Any], dict[str, Any]]


def _keep_annotation(key: str) -> bool:
    return key.startswith(PREFIX) or key in _KEPT


def _slim(c: dict[str, Any], keys: tuple[str, ...] = ("name", "image", "resources", "restartPolicy")
          ) -> dict[str, Any]:
    return {k: c[k] for k in keys if k in c}


def minimal_notebook(notebook: dict[str, Any]) -> dict[str, Any]:
    """The parts of a Notebook the decision and the policy choice read: identity, labels (policy rules'
    notebookSelector), the annotations that matter, containers' and init containers' images and resources
    (native sidecars hold GPUs too), the node selector's GPU model, status. managedFields, env and volumes
    are dropped."""
    meta = metadata_of(notebook)
    ann = annotations_of(notebook)
    out_meta: dict[str, Any] = {k: meta[k] for k in ("name", "namespace", "uid", "creationTimestamp")
                                if k in meta}
    out_meta["annotations"] = {k: v for k, v in ann.items() if _keep_annotation(str(k))}
    labels = string_labels(notebook)
    if labels:
        out_meta["labels"] = labels
    pod_spec = as_dict(as_dict(as_dict(notebook.get("spec")).get("template")).get("spec"))
    spec: dict[str, Any] = {"containers": [_slim(c) for c in template_containers(notebook)]}
    init = [_slim(c) for c in containers(notebook, "spec", "template", "spec", "initContainers")]
    if init:
        spec["initContainers"] = init
    if isinstance(pod_spec.get("nodeSelector"), dict):
        spec["nodeSelector"] = {k: v for k, v in pod_spec["nodeSelector"].items() if k == GPU_MODEL_LABEL}
    out: dict[str, Any] = {
        "apiVersion": notebook.get("apiVersion", "kubeflow.org/v1"),
        "kind": notebook.get("kind", "Notebook"),
        "metadata": out_meta,
        # What "stopped" is read from for other targets (kf_culler/targets/): a Workspace's paused, a
        # workload's replicas.
        "spec": {"template": {"spec": spec},
                 **{k: v for k, v in as_dict(notebook.get("spec")).items() if k in ("paused", "replicas")}},
    }
    if isinstance(notebook.get("status"), dict):
        status = notebook["status"]
        out["status"] = {k: status[k] for k in ("readyReplicas", "containerState") if k in status}
    return out


def minimal_pod(pod: dict[str, Any]) -> dict[str, Any]:
    """The parts of a pod the decision reads: identity, containers' and init containers' resources, phase and
    start time."""
    meta = metadata_of(pod)
    status = as_dict(pod.get("status"))
    spec: dict[str, Any] = {"containers": [_slim(c, ("name", "resources")) for c in pod_containers(pod)]}
    init = [_slim(c, ("name", "resources", "restartPolicy")) for c in containers(pod, "spec", "initContainers")]
    if init:
        spec["initContainers"] = init
    return {
        "apiVersion": pod.get("apiVersion", "v1"),
        "kind": pod.get("kind", "Pod"),
        "metadata": {k: meta[k] for k in ("name", "namespace") if k in meta},
        "spec": spec,
        "status": {k: status[k] for k in ("phase", "startTime") if k in status},
    }


class Hasher:
    """Keyed hashes of namespaces and names: stable for one key, not reversible without it."""

    def __init__(self, key: bytes) -> None:
        if not key:
            raise ValueError("the hash key must not be empty")
        self._key = key
        self._cache: dict[str, str] = {}

    def digest(self, kind: str, value: str) -> str:
        token = f"{kind}\0{value}"
        found = self._cache.get(token)
        if found is None:
            found = hmac.new(self._key, token.encode("utf-8"), hashlib.sha256).hexdigest()[:16]
            self._cache[token] = found
        return found

    def namespace(self, value: str) -> str:
        return "ns-" + self.digest("namespace", value)

    def name(self, namespace: str, value: str) -> str:
        return "nb-" + self.digest("name", f"{namespace}/{value}")


def _scrub_errors(value: Any, replacements: list[tuple[str, str]]) -> Any:
    """A copy of an observation in which the names are replaced inside error messages."""
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for k, v in value.items():
            if k == "error" and isinstance(v, str):
                for old, new in replacements:
                    v = v.replace(old, new)
                out[k] = v
            else:
                out[k] = _scrub_errors(v, replacements)
        return out
    if isinstance(value, list):
        return [_scrub_errors(v, replacements) for v in value]
    return value


class TraceRecorder:
    """Append-only JSON Lines trace writer for the culler.

    path: the trace file (`.gz` for gzip). A new or empty file gets a header; an existing trace is
      appended to.
    hash_key: when given (bytes, or a string used as UTF-8), namespaces and names are replaced by keyed
      hashes, objects are cut down to the fields the decision reads (`minimal_notebook`, `minimal_pod`),
      and error messages are scrubbed.
    minimize: cut objects down even without hashing (default), which keeps traces small.
    label_keys: with a hash key, the only Notebook and namespace label keys kept (their values in clear):
      those the configuration's policy rules select on (Settings.selector_label_keys), so a replay chooses
      the same policies; every other label is dropped. Without a hash key every label is kept.
    """

    def __init__(self, path: str | Path, *, hash_key: bytes | str | None = None, minimize: bool = True,
                 check_period_seconds: float = 60, flush_every: int = 1000,
                 label_keys: frozenset[str] = frozenset()) -> None:
        self._label_keys = label_keys
        self.path = Path(path)
        if isinstance(hash_key, str):
            hash_key = hash_key.encode("utf-8")
        self._hasher = Hasher(hash_key) if hash_key is not None else None
        self._minimize = minimize or self._hasher is not None
        self._flush_every = max(1, flush_every)
        self._lock = threading.Lock()
        self._stream: IO[str] | None = None
        self._check_period = check_period_seconds
        self._writer: TraceWriter | None = None

    def _open(self, now: datetime) -> TraceWriter:
        exists = self.path.exists() and self.path.stat().st_size > 0
        if exists:
            header = read_header(self.path)  # refuse to append to something that is not a trace
            if header.hashed != (self._hasher is not None):
                raise ValueError(f"{self.path}: the trace was recorded with hashed={header.hashed}; "
                                 "append with the same setting")
        self._stream = open_text(self.path, "a")
        new_header = None if exists else TraceHeader(
            start=now, check_period_seconds=self._check_period, synthetic=False,
            hashed=self._hasher is not None)
        return TraceWriter(self._stream, new_header)

    def record(self, now: datetime, notebook: dict[str, Any], pod: dict[str, Any] | None,
               observations: dict[str, Any], context: dict[str, Any] | None = None) -> None:
        """Append one notebook's check. Objects are not modified."""
        nb, p, obs, ctx = self._prepare(notebook, pod, observations, context or {})
        with self._lock:
            if self._writer is None:
                self._writer = self._open(now)
            self._writer.write(now, nb, p, obs, context=ctx)
            if self._writer.records % self._flush_every == 0:
                self._writer.flush()

    def _prepare(self, notebook: dict[str, Any], pod: dict[str, Any] | None,
                 observations: dict[str, Any], context: dict[str, Any]) -> Objects:
        if not self._minimize:
            return notebook, pod, observations, context
        nb = minimal_notebook(notebook)
        p = minimal_pod(pod) if isinstance(pod, dict) else None
        if self._hasher is None:
            return nb, p, observations, context
        keep = self._label_keys
        context = dict(context)
        if "namespaceLabels" in context:
            context["namespaceLabels"] = {k: v for k, v in context["namespaceLabels"].items() if k in keep}
        ns, name = notebook_id(nb).split("/", 1)
        hns, hname = self._hasher.namespace(ns), self._hasher.name(ns, name)
        nb = copy.deepcopy(nb)
        nb["metadata"].update(namespace=hns, name=hname)
        nb["metadata"].pop("uid", None)
        labels = {k: v for k, v in nb["metadata"].pop("labels", {}).items() if k in keep}
        if labels:
            nb["metadata"]["labels"] = labels
        for i, c in enumerate(nb["spec"]["template"]["spec"]["containers"]):
            c["name"] = f"container-{i}"
        if p is not None:
            p = copy.deepcopy(p)
            p["metadata"].update(namespace=hns, name=f"{hname}-0")
            for i, c in enumerate(p["spec"]["containers"]):
                c["name"] = f"container-{i}"
        # longest first, so `name-0` and `name` do not leave a half-replaced string
        replacements = sorted([(f"{name}-0", f"{hname}-0"), (name, hname), (ns, hns)],
                              key=lambda r: -len(r[0]))
        return nb, p, _scrub_errors(observations, replacements), context

    def flush(self) -> None:
        with self._lock:
            if self._writer is not None:
                self._writer.flush()

    def close(self) -> None:
        with self._lock:
            if self._stream is not None:
                self._stream.close()
            self._stream = None
            self._writer = None

    def __enter__(self) -> TraceRecorder:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()
