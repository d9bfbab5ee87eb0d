"""Kubeflow v1 Notebooks (`targets: [notebooks]`, docs/targets.md): stopped with `kubeflow-resource-stopped`,
which their notebook-controller turns into a StatefulSet of 0; the pod is `<name>-0` of the StatefulSet `<name>`
(kf_culler/targets/pairing.py); the IDE is probed through the Service `<name>`. Pure."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kf_culler.model import KEEP_UNTIL_ANNOTATION, STOP_ANNOTATION
from kf_culler.targets.base import BARE_KIND, Pairing, Scope, Seen, Target, Watched, _dict
from kf_culler.targets.fields import SERVICES, STATEFULSET_PODS, STATEFULSETS_METADATA, template_fields
from kf_culler.targets.pairing import Orphan, named_service_address, pairs, service_problem


@dataclass(frozen=True)
class NotebookTarget(Target):
    def is_stopped(self, obj: Mapping[str, Any]) -> bool:
        """`kubeflow-resource-stopped` is set (whoever set it)."""
        return STOP_ANNOTATION in _dict(_dict(obj.get("metadata")).get("annotations"))

    def stop_body(self, obj: Mapping[str, Any], annotations: Mapping[str, str | None]) -> dict[str, Any]:
        return {"metadata": {"annotations": dict(annotations)}}

    def start_command(self, namespace: str, name: str) -> str:
        return f"kubectl annotate notebook {name} -n {namespace} {STOP_ANNOTATION}-"

    def keep_command(self, namespace: str, name: str, until: str) -> str | None:
        return f"kubectl annotate notebook {name} -n {namespace} {KEEP_UNTIL_ANNOTATION}={until} --overwrite"

    def watches(self, scope: Scope) -> tuple[Watched, ...]:
        return (Watched(self.plural, self.group, self.version, self.plural, notebook_fields, session_kind=self.kind),
                STATEFULSETS_METADATA, STATEFULSET_PODS, SERVICES)

    def pair(self, seen: Seen) -> Pairing:
        """Every Notebook with the pod its StatefulSet `<name>` controls (kf_culler/targets/pairing.py), made as they
        are read; the orphans are all known once every pair is read."""
        orphans: list[Orphan] = []
        return Pairing(pairs(seen[self.plural], seen["statefulsets"], seen["pods"], orphans), orphans)

    def service_problem(self, session: Mapping[str, Any], seen: Seen) -> str | None:
        meta = _dict(session.get("metadata"))
        return service_problem(session, seen.now("services", (str(meta.get("namespace")), str(meta.get("name")))))

    def service_address(self, session: Mapping[str, Any], seen: Seen) -> tuple[str, str] | None:
        return named_service_address(session, seen, service_problem)


NOTEBOOKS = NotebookTarget("notebooks", BARE_KIND, "kubeflow.org", "v1", "notebooks", route="notebooks", rbac=None,
                           reach="service", where_to_start="Kubeflow's Notebooks page", stop_is_annotation=True,
                           paired_by_name=True, old_marks=True)


def notebook_fields(obj: dict[str, Any]) -> dict[str, Any]:
    """What the culler reads of a Notebook (kf_culler/targets/fields.py `template_fields`)."""
    return template_fields(obj, NOTEBOOKS.api_version, NOTEBOOKS.kind)
