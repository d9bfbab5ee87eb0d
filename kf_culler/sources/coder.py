"""Coder's API (`targets: [coder]`, docs/targets.md, "Coder workspaces"): the workspaces, listed once per pass,
and the stop build.

    client = CoderClient(settings.operations.coder)
    listing = client.list_workspaces()               # GET /api/v2/workspaces?limit=&offset=, every page
    answer = client.stop(workspace_id)               # POST /api/v2/workspaces/{id}/builds {"transition":"stop"}

Every request has a connect and a read timeout and a bounded body; a list that cannot be had raises
`CoderError`, whose text never holds the token (it is read from `coder.tokenFile` at each request, a mounted
Secret, and sent only in the `Coder-Session-Token` header). A list page that fails for a transient reason
(connection, timeout, 5xx) is asked once more.

More workspaces than `coder.maxWorkspaces` do not fail the list: the listing keeps the first `maxWorkspaces`
in a stable order (by owner, then name, then id; Coder's own order puts running workspaces first, which moves
as they start and stop), and says how many it left out (`CoderListing.unjudged`): the culler judges those it
kept and reports the others (a log line, `kf_culler_coder_workspaces_unjudged`), never as idle. Reading stops
after READ_FACTOR x `maxWorkspaces` workspaces (then `unjudged` is a lower bound).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import requests
from tenacity import Retrying, retry_if_exception_type, stop_after_attempt, wait_fixed

from kf_culler.config import CoderSettings

MAX_PAGE_BYTES = 32 << 20  # one page of `pageSize` workspaces (about 4 KiB each with their resources and agents)
MAX_ANSWER_BYTES = 1 << 20  # a build's answer
READ_FACTOR = 4  # at most this many times coder.maxWorkspaces workspaces are read in one listing


class CoderError(Exception):
    """Coder's API could not be read; the text says why, never with the token."""


class _Transient(CoderError):
    """Worth one more try: no connection, a timeout, a 5xx."""


@dataclass(frozen=True)
class CoderListing:
    workspaces: list[dict[str, Any]]  # at most coder.maxWorkspaces, in the stable order (`order_key`)
    unjudged: int = 0  # workspaces Coder listed beyond coder.maxWorkspaces (at least this many, when `complete`
    # is False)
    complete: bool = True  # every page was read


def order_key(ws: dict[str, Any]) -> tuple[str, str, str]:
    """The stable order in which the first coder.maxWorkspaces workspaces are kept."""
    return str(ws.get("owner_name") or ""), str(ws.get("name") or ""), str(ws.get("id") or "")


@dataclass(frozen=True)
class StopAnswer:
    status: int | None  # HTTP status; None: no answer at all
    message: str  # Coder's message, or what went wrong
    build: dict[str, Any] | None = None  # the stop build Coder made (201)


class CoderClient:
    """One Coder deployment's API, with the admin's token."""

    def __init__(self, settings: CoderSettings, session: requests.Session | None = None) -> None:
        self.settings = settings
        self.session = session or requests.Session()
        self.session.headers.update({"Accept": "application/json", "User-Agent": "kf-culler"})
        self.requests = 0

    def close(self) -> None:
        self.session.close()

    def _token(self) -> str:
        path = self.settings.token_file
        try:
            token = Path(path).read_text(encoding="utf-8").strip()
        except OSError as err:
            raise CoderError(f"cannot read coder.tokenFile {path}: {err.strerror or type(err).__name__}") from None
        if not token:
            raise CoderError(f"coder.tokenFile {path} is empty")
        return token

    def _scrub(self, text: str, token: str | None) -> str:
        """`text` without the token (a library's message could quote a header) and without the base URL."""
        if token:
            text = text.replace(token, "<token>")
        return text.replace(self.settings.url.rstrip("/"), "coder.url")[:300]

    def _call(self, method: str, path: str, body: Any = None, limit: int = MAX_ANSWER_BYTES) -> tuple[int, Any]:
        """(status, decoded JSON or None) of one request; CoderError when there is no answer to read."""
        token = self._token()
        url = self.settings.url.rstrip("/") + path
        budget = self.settings.timeout_seconds
        self.requests += 1
        started = time.monotonic()
        try:
            with self.session.request(method, url, json=body, headers={"Coder-Session-Token": token},
                                      timeout=(min(budget, 5.0), budget), stream=True,
                                      allow_redirects=False) as resp:
                chunks: list[bytes] = []
                size = 0
                for chunk in resp.iter_content(65536):
                    size += len(chunk)
                    if size > limit:
                        raise CoderError(f"Coder's answer to {method} {path.split('?')[0]} exceeds {limit} bytes")
                    if time.monotonic() - started > budget:
                        raise _Transient(f"Coder did not answer {method} {path.split('?')[0]} within {budget:g}s")
                    chunks.append(chunk)
                status = resp.status_code
        except requests.exceptions.Timeout:
            raise _Transient(f"Coder did not answer within {budget:g}s") from None
        except requests.exceptions.ConnectionError as err:
            raise _Transient(f"cannot reach Coder: {self._scrub(_short(err), token)}") from None
        except requests.exceptions.RequestException as err:
            raise CoderError(f"{type(err).__name__}: {self._scrub(_short(err), token)}") from None
        try:
            doc = json.loads(b"".join(chunks)) if chunks else None
        except (ValueError, UnicodeDecodeError):
            doc = None
        if status >= 500:
            raise _Transient(f"Coder answered HTTP {status}{_message(doc)}")
        return status, doc

    def list_workspaces(self) -> CoderListing:
        """The workspaces the token may read, page by page (`limit`/`offset`): the first `maxWorkspaces` of them by
        `order_key`, and how many more there were (see the module's docstring)."""
        size, cap = self.settings.page_size, self.settings.max_workspaces
        kept: list[dict[str, Any]] = []  # the first `cap` by order_key, and at most 2 x cap before a cut
        listed = offset = 0
        while True:
            retrying = Retrying(stop=stop_after_attempt(2), wait=wait_fixed(0.5),
                                retry=retry_if_exception_type(_Transient), reraise=True)
            status, doc = retrying(self._call, "GET", f"/api/v2/workspaces?limit={size}&offset={offset}",
                                   limit=MAX_PAGE_BYTES)
            if status != 200:
                raise CoderError(f"listing workspaces: Coder answered HTTP {status}{_message(doc)}"
                                 + (" (coder.tokenFile holds no valid token)" if status == 401 else ""))
            page = doc.get("workspaces") if isinstance(doc, dict) else None
            if not isinstance(page, list) or not all(isinstance(w, dict) for w in page):
                raise CoderError("listing workspaces: Coder's answer has no list of workspaces")
            kept.extend(page)
            listed += len(page)
            if len(kept) >= 2 * cap:
                kept = sorted(kept, key=order_key)[:cap]
            count = doc.get("count") if isinstance(doc, dict) else None
            offset += len(page)
            done = len(page) < size or (isinstance(count, int) and offset >= count) or not page
            if done or listed >= READ_FACTOR * cap:
                workspaces = sorted(kept, key=order_key)[:cap]
                return CoderListing(workspaces, listed - len(workspaces), done)

    def me(self) -> dict[str, Any]:
        """The token's user (`GET /api/v2/users/me`): its roles say whether it may stop others' workspaces."""
        status, doc = self._call("GET", "/api/v2/users/me")
        if status != 200 or not isinstance(doc, dict):
            raise CoderError(f"reading the token's user: Coder answered HTTP {status}{_message(doc)}")
        return doc

    def stop(self, workspace_id: str) -> StopAnswer:
        """A stop build (201: made). Never raises; not retried here (the next pass decides again)."""
        try:
            status, doc = self._call("POST", f"/api/v2/workspaces/{workspace_id}/builds", {"transition": "stop"})
        except CoderError as err:
            return StopAnswer(None, str(err))
        return StopAnswer(status, _message(doc).lstrip(": ") or f"HTTP {status}",
                          doc if status == 201 and isinstance(doc, dict) else None)


def _message(doc: object) -> str:
    if isinstance(doc, dict) and isinstance(doc.get("message"), str):
        return f": {doc['message'][:200]}"
    return ""


def _short(err: Exception) -> str:
    text = str(err)
    if "Caused by" in text:
        text = text.split("Caused by", 1)[1]
    return text.strip(" ():'\"")[:200]
