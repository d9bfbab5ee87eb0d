"""The verdict API (docs/verdict-api.md), served on a port of its own (`--api-address`).

    GET /api/v1/namespaces/{namespace}/notebooks/{name}   one notebook's latest verdict
    GET /api/v1/namespaces/{namespace}/notebooks          the namespace's, sorted by name, paged
    GET /api/v1/namespaces/{namespace}/{workspaces|deployments|statefulsets}/{name}
                                                          another target's session (docs/targets.md)
    POST /api/v1/namespaces/{namespace}/{route}/{name}/extend   {"minutes": N}: ask for more time
                                                          (kf_culler/extend.py; only with an Extender)

The caller presents a ServiceAccount token for the audience kf-culler (`Authorization: Bearer ...`); a
TokenReview names its namespace, and only that namespace can be read. Order of checks: method (405), route
(404), token (401; 429 when the caller's address sent too many refused tokens), namespace (403), a slot of the
namespace's (429 while its callers hold all of them: kf_culler/slots.py), then the notebook (404). The reads
write nothing; a request to extend is checked further and written by kf_culler/extend.py.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs

from kf_culler.extend import Extender
from kf_culler.kube.tokens import ReviewThrottled, ReviewUnavailable, TokenReviewer
from kf_culler.slots import Peer
from kf_culler.targets import ROUTES, SessionKey
from kf_culler.timeutil import format_time
from kf_culler.verdicts import VerdictStore

log = logging.getLogger("kf_culler.api")
PREFIX = "/api/v1/"
MAX_LIST_ITEMS = 500  # items per list response (?limit= may ask for fewer)
MAX_LIST_BYTES = 1024 * 1024  # a list response stops before its body would pass this
_NAME = r"[a-z0-9](?:[-a-z0-9.]{0,251}[a-z0-9])?"
# A session's name: a Kubernetes name, or a Coder workspace's `<owner>.<workspace>`, whose names Coder allows in
# capitals too (no Kubernetes object matches one with capitals, so a Notebook route gains nothing from them).
_SESSION = r"[A-Za-z0-9](?:[-A-Za-z0-9.]{0,251}[A-Za-z0-9])?"
# One route per target (kf_culler/targets/ `ROUTES`: `notebooks`, `workspaces`, ..., `coderworkspaces`).
ONE = re.compile(rf"^/api/v1/namespaces/({_NAME})/({'|'.join(map(re.escape, ROUTES))})/({_SESSION})$")
EXTEND = re.compile(rf"^/api/v1/namespaces/({_NAME})/({'|'.join(map(re.escape, ROUTES))})/({_SESSION})/extend$")
LIST = re.compile(rf"^/api/v1/namespaces/({_NAME})/notebooks/?$")
JSON = "application/json"


def route_key(path: str) -> SessionKey | None:
    """The session a one-session route names (`/api/v1/namespaces/<ns>/<route>/<name>`, a route per target), or
    None when the path is not one."""
    one = ONE.match(path)
    return SessionKey.of(one.group(1), ROUTES[one.group(2)].kind, one.group(3)) if one else None


@dataclass
class Response:
    code: int
    body: bytes
    content_type: str = JSON
    headers: dict[str, str] = field(default_factory=dict)


def _json(code: int, doc: dict[str, Any], **headers: str) -> Response:
    return Response(code, (json.dumps(doc, ensure_ascii=False) + "\n").encode(), JSON, headers)


def _status(code: int, reason: str, message: str, **headers: str) -> Response:
    return _json(code, {"kind": "Status", "code": code, "reason": reason, "message": message}, **headers)


class VerdictApi:
    def __init__(self, store: VerdictStore, reviewer: TokenReviewer, extender: Extender | None = None) -> None:
        """`extender`: answers requests to extend (None: there is no such route)."""
        self.store = store
        self.reviewer = reviewer
        self.extender = extender

    def accepts_post(self, path: str) -> bool:
        """Whether a POST to `path` is read (a request to extend, when there is an Extender)."""
        return self.extender is not None and EXTEND.match(path) is not None

    def handle(self, method: str, target: str, headers: Mapping[str, str], peer: Peer | None = None,
               body: bytes = b"") -> Response:
        """The answer to one request; `peer`: its connection (the caller's address, its namespace's slots)."""
        path, _, query = target.partition("?")
        extend = EXTEND.match(path) if self.extender is not None else None
        if extend and method != "POST":
            return _status(405, "MethodNotAllowed", "ask for more time with POST", Allow="POST")
        if method not in ("GET", "HEAD") and not extend:
            return _status(405, "MethodNotAllowed", "read-only: only GET and HEAD", Allow="GET, HEAD")
        one, many = ONE.match(path), LIST.match(path)
        if not one and not many and not extend:
            return _status(404, "NotFound", "no such route (see docs/verdict-api.md)")
        auth = headers.get("Authorization") or ""
        scheme, _, token = auth.strip().partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            return _status(401, "Unauthorized", "a ServiceAccount token is required (Authorization: Bearer)",
                           **{"WWW-Authenticate": 'Bearer realm="kf-culler"'})
        try:
            who = self.reviewer.review(token.strip(), peer.client if peer else "")
        except ReviewThrottled as err:
            return _status(429, "TooManyRequests", str(err), **{"Retry-After": "15"})
        except ReviewUnavailable as err:
            log.warning("verdict API: %s", err)
            return _status(503, "ServiceUnavailable", "the token cannot be checked now", **{"Retry-After": "5"})
        if not who.authenticated:
            return _status(401, "Unauthorized", "the token was not accepted",
                           **{"WWW-Authenticate": 'Bearer realm="kf-culler", error="invalid_token"'})
        namespace = (one or many or extend).group(1)  # type: ignore[union-attr]
        if who.namespace != namespace:
            return _status(403, "Forbidden", f"{who.username} may read notebooks of its own namespace only")
        if peer is not None and not peer.claim(namespace):
            return _status(429, "TooManyRequests", f"namespace {namespace} holds all of its connections now",
                           **{"Retry-After": "1"})
        if self.store.passes == 0:
            return _status(503, "ServiceUnavailable", "no pass has completed yet", **{"Retry-After": "10"})
        if extend:
            assert self.extender is not None  # `extend` matched only with one
            code, doc = self.extender.extend(SessionKey.of(namespace, ROUTES[extend.group(2)].kind, extend.group(3)),
                                             extend.group(2), who, body)
            retry = doc.get("retryAfter")
            return _json(code, doc, **({"Retry-After": str(retry)} if retry is not None else {}))
        if one:
            key = route_key(path)
            assert key is not None  # `one` matched
            found = self.store.get(*key)
            if found is None:
                return _status(404, "NotFound", f"no verdict for {one.group(2)[:-1]} {namespace}/{one.group(3)}")
            return _json(200, {"kind": "NotebookVerdict", **found})
        return self._list(namespace, parse_qs(query))

    def _list(self, namespace: str, query: dict[str, list[str]]) -> Response:
        try:
            limit = int((query.get("limit") or [str(MAX_LIST_ITEMS)])[0])
        except ValueError:
            return _status(400, "BadRequest", "limit must be a whole number")
        limit = max(1, min(limit, MAX_LIST_ITEMS))
        after = (query.get("continue") or [""])[0][:253]
        items, more = self.store.page(namespace, after, limit)
        pass_time = self.store.pass_time
        doc: dict[str, Any] = {"kind": "NotebookVerdictList", "namespace": namespace,
                               "passTime": format_time(pass_time) if pass_time else None,
                               "items": [], "continue": None}
        size = len(json.dumps(doc)) + 64  # room for the continue token
        for i, item in enumerate(items):
            n = len(json.dumps(item, ensure_ascii=False).encode()) + 2
            if size + n > MAX_LIST_BYTES:
                more = True
                items = items[:i]
                break
            size += n
            doc["items"].append(item)
        if more and doc["items"]:
            doc["continue"] = doc["items"][-1]["name"]
        return _json(200, doc)
