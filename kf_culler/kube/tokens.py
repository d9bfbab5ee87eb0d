"""Who is calling: a bearer token checked with a TokenReview (authentication.k8s.io/v1), cached briefly.

The review asks for the audience AUDIENCE ("kf-culler"): only a token minted for it (a projected
ServiceAccount token with `audience: kf-culler`) is accepted, so a pod's default token, which any
workload holding it may forward to any service, never reads a verdict.

Only ServiceAccount identities (`system:serviceaccount:<namespace>:<name>`) carry a namespace; any
other authenticated user has none. A token the API server rejects is cached for a shorter time than
one it accepts; an API server that cannot be asked is an error, never a verdict, and is not cached.
"""

from __future__ import annotations

import hashlib
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kf_culler.errors import ReviewUnavailable as ReviewUnavailable

SA_PREFIX = "system:serviceaccount:"
AUDIENCE = "kf-culler"  # the audience a caller's token must be minted for
MAX_TOKEN_BYTES = 8 * 1024  # a ServiceAccount token (a JWT) is 1-2 KiB
# A JWT: three base64url segments (RFC 7515 compact form). Anything else is refused without a TokenReview.
JWT = re.compile(r"^[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}$")
MAX_REVIEWS_IN_FLIGHT = 4  # TokenReviews at once: garbage tokens cannot crowd the culler's own API requests
REVIEW_WAIT_SECONDS = 2.0  # how long a caller waits for a slot before "busy"


@dataclass(frozen=True)
class Identity:
    authenticated: bool
    username: str = ""
    namespace: str | None = None  # set for ServiceAccounts only
    service_account: str | None = None
    error: str = ""


def identity_from(username: str) -> Identity:
    if username.startswith(SA_PREFIX):
        ns, _, sa = username[len(SA_PREFIX):].partition(":")
        if ns and sa and ":" not in sa:
            return Identity(True, username, ns, sa)
    return Identity(True, username)


class TokenReviewer:
    """`review(token)` -> Identity, asking the API server at most once per token per `ttl` seconds."""

    def __init__(self, api_client: Any, audience: str = AUDIENCE, ttl: float = 10.0, negative_ttl: float = 30.0,
                 max_entries: int = 4096, timeout: float = 5.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.api_client = api_client
        self.audience = audience
        self.ttl, self.negative_ttl, self.max_entries, self.timeout = ttl, negative_ttl, max_entries, timeout
        self.clock = clock
        self.reviews = 0  # TokenReviews sent (for tests and curiosity)
        self._lock = threading.Lock()
        self._cache: OrderedDict[str, tuple[float, Identity]] = OrderedDict()
        self._slots = threading.BoundedSemaphore(MAX_REVIEWS_IN_FLIGHT)
        self.refused_unasked = 0  # tokens refused for their shape, without a TokenReview

    def review(self, token: str) -> Identity:
        """The caller's identity. A token that is not a JWT of sane size is refused without asking the API
        server; a negative answer is cached (`negative_ttl`) like a positive one; at most
        MAX_REVIEWS_IN_FLIGHT TokenReviews run at once, and a caller that cannot get a slot within
        REVIEW_WAIT_SECONDS gets ReviewUnavailable (503), not a queue of TokenReviews."""
        if not token or len(token) > MAX_TOKEN_BYTES or not JWT.match(token):
            self.refused_unasked += 1
            return Identity(False, error="no usable token")
        key = hashlib.sha256(token.encode()).hexdigest()  # the token itself is never kept
        now = self.clock()
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None and hit[0] > now:
                return hit[1]
        if not self._slots.acquire(timeout=REVIEW_WAIT_SECONDS):
            raise ReviewUnavailable("TokenReview busy: too many callers at once")
        try:
            ident = self._ask(token)
        finally:
            self._slots.release()
        with self._lock:
            self._cache[key] = (now + (self.ttl if ident.authenticated else self.negative_ttl), ident)
            self._cache.move_to_end(key)
            while len(self._cache) > self.max_entries:
                self._cache.popitem(last=False)
        return ident

    def _ask(self, token: str) -> Identity:
        from kubernetes import client
        from kubernetes.client.rest import ApiException

        body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
                "spec": {"token": token, "audiences": [self.audience]}}
        try:
            self.reviews += 1
            out = client.AuthenticationV1Api(self.api_client).create_token_review(
                body, _request_timeout=self.timeout)
        except ApiException as err:
            raise ReviewUnavailable(f"TokenReview failed: HTTP {err.status} {err.reason}") from err
        except Exception as err:  # connection refused, timeout, TLS: nothing known about the token
            raise ReviewUnavailable(f"TokenReview failed: {type(err).__name__}") from err
        status = out.status
        if status is None or not status.authenticated or status.user is None:
            return Identity(False, error=(status.error if status is not None else "") or "not authenticated")
        if self.audience not in (status.audiences or []):  # an API server that ignored the audience asked for
            return Identity(False, error=f"token not minted for the audience {self.audience}")
        return identity_from(str(status.user.username or ""))
