"""Coder workspaces (`targets: [coder]`, docs/targets.md, "Coder workspaces"): not Kubernetes objects but what
Coder's API lists, each made into a synthetic session object (kf_culler/coder_sessions.py) and stopped by a stop
build through Coder's API (kf_culler/kube/coder.py), never patched. A Coder workspace is its own IDE, so the
target is named like its IDE kind. Pure."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kf_culler.errors import InputError
from kf_culler.ide import CODER_SERVER_TYPE
from kf_culler.targets.base import Target, _dict


@dataclass(frozen=True)
class CoderTarget(Target):
    def is_stopped(self, obj: Mapping[str, Any]) -> bool:
        """Its latest build stops or deletes it (whoever asked: its user, Coder's autostop, the culler)."""
        return _dict(obj.get("spec")).get("transition") in ("stop", "delete")

    def stop_body(self, obj: Mapping[str, Any], annotations: Mapping[str, str | None]) -> dict[str, Any]:
        raise InputError("a Coder workspace is stopped by a stop build through Coder's API, never patched")

    def start_command(self, namespace: str, name: str) -> str:
        owner, _, workspace = name.partition(".")  # `<owner>.<workspace>`: a dot is in neither
        return f"coder start {owner}/{workspace}"

    def keep_command(self, namespace: str, name: str, until: str) -> str | None:
        return None  # its user extends its deadline in Coder, which maxExtendMinutes bounds (rule 12)


# Its RBAC component (kustomize/components/coder) is named like the target.
CODER = CoderTarget(CODER_SERVER_TYPE, "CoderWorkspace", "coder.com", "v2", "workspaces", route="coderworkspaces",
                    rbac=CODER_SERVER_TYPE, reach="carried", where_to_start="Coder's dashboard",
                    server_type=CODER_SERVER_TYPE)
