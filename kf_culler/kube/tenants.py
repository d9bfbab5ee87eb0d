"""Whose namespace it is, where the user cannot forge it: the tenant the brakes and the notices' queue weigh.

One user may hold several namespaces: on OpenShift AI anyone may create Data Science Projects at will; on
Kubeflow a user may own or contribute to several profiles. Weighed per namespace, such a user alone meets
`brakes.minNamespaces` (kf_culler/brakes.py). So a namespace's tenant is its owner, from what only an admin or
a controller writes:

- a Kubeflow profile namespace (annotation `owner`, written by the profile-controller): the `spec.owner.name` of
  its Profile (`kubeflow.org/v1`, cluster-scoped, named like the namespace), read by name; the annotation when
  the Profile cannot be read (the controller copies it from that field);
- an OpenShift project: its annotation `openshift.io/requester`, set by the project request API to the user
  who asked for the project (a request carries only a display name and a description);
- otherwise, or when the Namespace cannot be read: none, and the namespace is its own tenant.

A profile user cannot write these: Namespaces and Profiles are cluster-scoped, and the roles given in a
namespace (Kubernetes' `admin` and `edit`, which `kubeflow-admin`/`kubeflow-edit` aggregate, OpenShift's
project `admin`) allow `get`/`list`/`watch` of the Namespace, never `update` or `patch`; an update through
OpenShift's Project API may change only its display name and description annotations. The Namespace is the
read kf_culler/kube/namespaces.py makes for policy rules (one `get` per namespace per TTL); a Profile is read
once per TTL, and only for a namespace with the profile-controller's annotation.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from kf_culler.kube import core
from kf_culler.kube.namespaces import NamespaceLabels

log = logging.getLogger(__name__)
PROFILE_OWNER_ANNOTATION = "owner"  # the Kubeflow profile-controller's, on the Namespace it creates
REQUESTER_ANNOTATION = "openshift.io/requester"  # OpenShift's project request API's
PROFILE_GROUP, PROFILE_VERSION, PROFILE_PLURAL = "kubeflow.org", "v1", "profiles"
MAX_OWNER = 253  # longer owner names are cut: a name is only compared, never shown


def owner_of(annotations: Mapping[str, str] | None, profile_owner: str | None) -> str | None:
    """The namespace's owner from its annotations and its Profile's `spec.owner.name`; None: no owner known (the
    namespace is its own tenant)."""
    annotations = annotations or {}
    if PROFILE_OWNER_ANNOTATION in annotations:
        found = profile_owner or annotations[PROFILE_OWNER_ANNOTATION]
    else:
        found = annotations.get(REQUESTER_ANNOTATION, "")
    found = found.strip()[:MAX_OWNER]
    return found or None


class NamespaceOwners:
    """`owners(namespace)` -> the namespace's owner or None, cached for `ttl` seconds (errors for `retry`)."""

    def __init__(self, api_client: Any, namespaces: NamespaceLabels, ttl: float = 300.0, retry: float = 30.0,
                 timeout: float = 5.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.api_client = api_client
        self.namespaces = namespaces
        self.ttl, self.retry, self.timeout, self.clock = ttl, retry, timeout, clock
        self._profiles: dict[str, tuple[float, str | None]] = {}  # namespace -> (read at, spec.owner.name)
        self.profile_reads = 0
        self._forbidden = False  # the culler may not read Profiles (said once)

    def __call__(self, namespace: str) -> str | None:
        annotations = self.namespaces.annotations(namespace)
        profile = self._profile_owner(namespace) if annotations and PROFILE_OWNER_ANNOTATION in annotations else None
        return owner_of(annotations, profile)

    def _profile_owner(self, namespace: str) -> str | None:
        """The Profile's `spec.owner.name`; None when there is none or it cannot be read."""
        now = self.clock()
        known = self._profiles.get(namespace)
        if known is not None and now - known[0] < self.ttl:
            return known[1]
        self.profile_reads += 1
        try:
            profile = core.read_cluster_object(self.api_client, PROFILE_GROUP, PROFILE_VERSION, PROFILE_PLURAL,
                                               namespace, timeout=self.timeout)
        except Exception as err:
            status = getattr(err, "status", None)
            if status in (401, 403):  # not granted (the read-only dry-run install): said once, kept for the TTL
                if not self._forbidden:
                    log.warning("cannot read Profiles (HTTP %s); the profile-controller's owner annotation on "
                                "each namespace stands for its Profile", status)
                self._forbidden = True
                self._profiles[namespace] = (now, None)
                return None
            if status != 404:
                log.warning("cannot read the Profile %s (%s); its namespace's owner annotation stands for it",
                            namespace, f"HTTP {status}" if status else type(err).__name__)
                self._profiles[namespace] = (now - self.ttl + self.retry, None)
                return None
            profile = None
        spec = profile.get("spec") if isinstance(profile, dict) else None
        owner = spec.get("owner") if isinstance(spec, dict) else None
        name = owner.get("name") if isinstance(owner, dict) else None
        found = name if isinstance(name, str) and name.strip() else None
        self._profiles[namespace] = (now, found)
        return found
