"""Who is calling: a bearer token checked with a TokenReview (authentication.k8s.io/v1), cached briefly.

The review asks for the audience AUDIENCE ("kf-culler"): only a token minted for it (a projected
ServiceAccount token with `audience: kf-culler`) is accepted, so a pod's default token, which any
workload holding it may forward to any service, never reads a verdict.

Only ServiceAccount identities (`system:serviceaccount:<namespace>:<name>`) carry a namespace; any
other authenticated user has none. An API server that cannot be asked is an error, never a verdict, and is
not cached.

What a TokenReview costs is bounded, whatever callers send:
- A token is read first without its signature (nothing is accepted on that reading: acceptance is the
  TokenReview's): one that is not a JWT whose header names an algorithm and whose claims name a
  ServiceAccount (`sub`), the audience kf-culler (`aud`) and an expiry still ahead (`exp`) is refused
  without a TokenReview.
- Answers are cached apart: accepted tokens in one cache, refused ones in another, so refused tokens, however
  many, never push an accepted one out.
- Each caller's address has a small budget of refused TokenReviews (REFUSED_REVIEWS_BURST, one more every
  REFUSED_REVIEW_REFILL_SECONDS); an address that spent it gets ReviewThrottled (429) without a TokenReview
  until it refills. An accepted token costs nothing from the budget.
- At most MAX_REVIEWS_IN_FLIGHT TokenReviews run at once.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
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
REFUSED_REVIEWS_BURST = 4  # TokenReviews that may answer "no" for one address before it must wait
REFUSED_REVIEW_REFILL_SECONDS = 15.0  # and then one more per this many seconds
MAX_ADDRESSES = 4096  # addresses whose budget is remembered (a full budget needs no entry)
CLOCK_SKEW_SECONDS = 60  # a token's `exp` may be this far behind the culler's clock


class ReviewThrottled(ReviewUnavailable):
    """The caller's address spent its budget of refused TokenReviews: no TokenReview now."""


@dataclass(frozen=True)
class Identity:
    authenticated: bool
    username: str = ""
    namespace: str | None = None  # set for ServiceAccounts only
    service_account: str | None = None
    error: str = ""
    # The pod the token is bound to (a projected token is; TokenReview's `extra`), for writes of one session only
    pod_name: str | None = None
    pod_uid: str | None = None


POD_NAME_EXTRA = "authentication.kubernetes.io/pod-name"
POD_UID_EXTRA = "authentication.kubernetes.io/pod-uid"


def _one(extra: Any, key: str) -> str | None:
    values = extra.get(key) if isinstance(extra, dict) else None
    return str(values[0]) if isinstance(values, list) and len(values) == 1 and values[0] else None


def identity_from(username: str, extra: Any = None) -> Identity:
    """The identity of a TokenReview's user; `extra`: its `extra` (the pod a projected token is bound to)."""
    if username.startswith(SA_PREFIX):
        ns, _, sa = username[len(SA_PREFIX):].partition(":")
        if ns and sa and ":" not in sa:
            return Identity(True, username, ns, sa, pod_name=_one(extra, POD_NAME_EXTRA),
                            pod_uid=_one(extra, POD_UID_EXTRA))
    return Identity(True, username)


def _segment(part: str) -> Any:
    """One JWT segment's JSON, or None."""
    try:
        return json.loads(base64.urlsafe_b64decode(part + "=" * (-len(part) % 4)))
    except (binascii.Error, ValueError):
        return None


def unverified_problem(token: str, audience: str, now: float) -> str | None:
    """Why the token cannot be a ServiceAccount token for `audience` valid at `now` (seconds since the epoch),
    read without checking its signature; None when it may be one (only a TokenReview can say it is)."""
    if not token or len(token) > MAX_TOKEN_BYTES or not JWT.match(token):
        return "no usable token"
    head, claims, _sig = token.split(".")
    header, payload = _segment(head), _segment(claims)
    if not isinstance(header, dict) or not isinstance(header.get("alg"), str) or header["alg"].lower() == "none":
        return "not a signed JWT"
    if not isinstance(payload, dict):
        return "not a JWT"
    aud = payload.get("aud")
    if audience not in ([aud] if isinstance(aud, str) else aud if isinstance(aud, list) else []):
        return f"token not minted for the audience {audience}"
    exp = payload.get("exp")
    if isinstance(exp, bool) or not isinstance(exp, int | float) or exp + CLOCK_SKEW_SECONDS <= now:
        return "token expired (or without an expiry)"
    sub = payload.get("sub")
    if not isinstance(sub, str) or not sub.startswith(SA_PREFIX):
        return "not a ServiceAccount token"
    return None


class _Cache:
    """Answers by token hash until their expiry, the oldest dropped past `max_entries`."""

    def __init__(self, max_entries: int) -> None:
        self.max_entries = max_entries
        self.entries: OrderedDict[str, tuple[float, Identity]] = OrderedDict()

    def get(self, key: str, now: float) -> Identity | None:
        hit = self.entries.get(key)
        return hit[1] if hit is not None and hit[0] > now else None

    def put(self, key: str, until: float, ident: Identity) -> None:
        self.entries[key] = (until, ident)
        self.entries.move_to_end(key)
        while len(self.entries) > self.max_entries:
            self.entries.popitem(last=False)


class TokenReviewer:
    """`review(token, client)` -> Identity, asking the API server at most once per token per `ttl` seconds."""

    def __init__(self, api_client: Any, audience: str = AUDIENCE, ttl: float = 10.0, negative_ttl: float = 30.0,
                 max_entries: int = 4096, timeout: float = 5.0, clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = time.time) -> None:
        self.api_client = api_client
        self.audience = audience
        self.ttl, self.negative_ttl, self.max_entries, self.timeout = ttl, negative_ttl, max_entries, timeout
        self.clock, self.wall = clock, wall
        self.reviews = 0  # TokenReviews sent (for tests and curiosity)
        self._lock = threading.Lock()
        self._accepted, self._refused = _Cache(max_entries), _Cache(max_entries)
        self._budgets: OrderedDict[str, tuple[float, float]] = OrderedDict()  # address -> (tokens, at)
        self._slots = threading.BoundedSemaphore(MAX_REVIEWS_IN_FLIGHT)
        self.refused_unasked = 0  # tokens refused for their shape or claims, without a TokenReview
        self.throttled = 0  # tokens refused without a TokenReview: their address spent its budget

    def review(self, token: str, client: str = "") -> Identity:
        """The caller's identity (`client`: its address). A token that cannot be a ServiceAccount token for the
        audience is refused without asking the API server; answers are cached, accepted and refused apart; an
        address that spent its budget of refused TokenReviews gets ReviewThrottled (429); at most
        MAX_REVIEWS_IN_FLIGHT TokenReviews run at once, and a caller that cannot get a slot within
        REVIEW_WAIT_SECONDS gets ReviewUnavailable (503), not a queue of TokenReviews."""
        problem = unverified_problem(token, self.audience, self.wall())
        if problem is not None:
            self.refused_unasked += 1
            return Identity(False, error=problem)
        key = hashlib.sha256(token.encode()).hexdigest()  # the token itself is never kept
        now = self.clock()
        with self._lock:
            hit = self._accepted.get(key, now) or self._refused.get(key, now)
            if hit is not None:
                return hit
            if not self._spend(client, now):
                self.throttled += 1
                raise ReviewThrottled(f"too many refused tokens from {client or 'this caller'}: try later")
        if not self._slots.acquire(timeout=REVIEW_WAIT_SECONDS):
            self._refund(client)
            raise ReviewUnavailable("TokenReview busy: too many callers at once")
        try:
            ident = self._ask(token)
        except ReviewUnavailable:
            self._refund(client)
            raise
        finally:
            self._slots.release()
        with self._lock:
            if ident.authenticated:
                self._accepted.put(key, now + self.ttl, ident)
            else:
                self._refused.put(key, now + self.negative_ttl, ident)
        if ident.authenticated:
            self._refund(client)
        return ident

    def _spend(self, client: str, now: float) -> bool:
        """Take one refused review from the address's budget (under the lock); False when it has none left."""
        tokens, at = self._budgets.pop(client, (float(REFUSED_REVIEWS_BURST), now))
        tokens = min(float(REFUSED_REVIEWS_BURST), tokens + (now - at) / REFUSED_REVIEW_REFILL_SECONDS)
        ok = tokens >= 1.0
        if ok:
            tokens -= 1.0
        if tokens < REFUSED_REVIEWS_BURST:
            self._budgets[client] = (tokens, now)
            while len(self._budgets) > MAX_ADDRESSES:
                self._budgets.popitem(last=False)
        return ok

    def _refund(self, client: str) -> None:
        """Give back what `_spend` took: the review was accepted, or never answered."""
        with self._lock:
            found = self._budgets.get(client)
            if found is not None:
                tokens = min(float(REFUSED_REVIEWS_BURST), found[0] + 1.0)
                if tokens >= REFUSED_REVIEWS_BURST:
                    del self._budgets[client]
                else:
                    self._budgets[client] = (tokens, found[1])

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
        return identity_from(str(status.user.username or ""), status.user.extra)
