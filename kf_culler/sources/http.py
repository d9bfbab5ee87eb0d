"""The bounded HTTP GET every probe shares: connect/read timeouts, a size cap, transient-only retries.

It never raises: the answer is the decoded JSON, or `{"error": "..."}` naming what went wrong.

The client is small on purpose: HTTP/1.1 GETs over asyncio connections, answers framed by httptools
(llhttp, the parser uvicorn uses). A general client spent about 0.4 ms of CPU setting up each request,
most of a 10,000-notebook pass (docs/performance.md); this one asks for what the probes need: one
GET at a time per connection, keep-alive within a pass, `Connection: close` when a probe asks for it,
no redirects, no cookies, no compression, no proxies.

A notebook server is run by its user, so everything it sends is bounded before it costs memory or
event-loop time: the status line and headers (`probe.maxHeaderBytes`, at most MAX_HEADER_LINES lines),
the body (`probe.maxResponseBytes`), all the bytes of one answer on the wire (framing included), and the
shape of the JSON (`probe.maxJsonDepth`, `probe.maxJsonValues`), checked on the raw bytes before
`json.loads` builds anything (`json_shape_error`); the values are also counted as the body arrives
(`_ValueCount`), so an answer with too many is dropped at the read that passes the cap. See docs/faults.md.
"""

from __future__ import annotations

import asyncio
import json
import re
import ssl
import time
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, cast
from urllib.parse import urlsplit

import httptools

from kf_culler.config import ProbeSettings
from kf_culler.errors import Permanent, Transient

# The body of the 403 an Istio sidecar sends when an AuthorizationPolicy refuses the request (RBAC filter).
ISTIO_DENIED_BODY = b"RBAC: access denied"
# Real headers: Jupyter (tornado) about 850 bytes in 10 lines, code-server about 200 bytes in 7.
MAX_HEADER_LINES = 100
ISTIO_DENIED = ("HTTP 403 from the Istio sidecar (RBAC: access denied): kf-culler is not allowed to probe this "
                "namespace; apply kustomize/overlays/kubeflow/profile-namespace or turn on "
                "istio.manageAuthorizationPolicies")


@dataclass(slots=True)
class Call:
    """What one GET did, for traces, metrics and `explain`."""

    url: str
    status: int | None = None
    seconds: float = 0.0
    attempts: int = 0
    error: str | None = None


@dataclass
class Answer:
    status: int
    body: bytes
    keep_alive: bool


class _ValueCount:
    """`json_shape_error`'s count of values, kept as the body arrives: an answer with more than max_values
    values is refused at the read that passes the cap, so what is held of it is bounded by the cap, not
    by `probe.maxResponseBytes` (a 1 MiB `[{},{},...]` was read and joined whole, twice its size, before
    the shape check refused it). Counted as `json_shape_error` counts the whole body, so the two agree."""

    def __init__(self, max_values: int) -> None:
        self.max_values = max_values
        self.escape = False  # an odd run of backslashes ended the last piece: it escapes the next byte
        self.in_string = False
        self.quotes = 0
        self.values = 1

    def feed(self, data: bytes) -> str | None:
        """Count one piece of the body; why the answer is refused, or None."""
        raw = b"\\" + data if self.escape else data
        kept = raw.rstrip(b"\\")
        self.escape = (len(raw) - len(kept)) % 2 == 1  # pairs of a trailing run cancel out, as in the whole body
        raw = kept
        if b"\\" in raw:
            raw = raw.replace(b"\\\\", b"").replace(b'\\"', b"")
        quotes = raw.count(b'"')
        if quotes:
            parts = raw.split(b'"')
            bare = b"".join(parts[1::2] if self.in_string else parts[::2])
            self.in_string ^= quotes % 2 == 1
            self.quotes += quotes
        else:
            bare = b"" if self.in_string else raw
        self.values += bare.count(b",") + bare.count(b"[") + bare.count(b"{")
        if self.quotes // 2 > self.max_values:
            return f"the JSON answer has over {self.max_values} values (strings)"
        if self.values > self.max_values:
            return f"the JSON answer has over {self.max_values} values"
        return None


class _NoCallbacks:
    """The callbacks of the parser closed connections hold: none."""


# The parser a connection holds once closed (`_Connection._let_go`): fed nothing, shared by all of them.
_CLOSED = httptools.HttpResponseParser(_NoCallbacks())


class _Connection(asyncio.Protocol):
    """One TCP (or TLS) connection to a notebook server, one GET at a time."""

    def __init__(self, limit: int, head_limit: int = 64 << 10, max_values: int = 0) -> None:
        self.limit = limit
        self.head_limit = head_limit
        self.max_values = max_values  # 0: the body's values are not counted as it comes
        # Every byte of one answer: headers, body and chunked framing (many tiny chunks, trailers).
        self.wire_limit = head_limit + 2 * limit
        self.parser = httptools.HttpResponseParser(self)
        self.transport: asyncio.Transport | None = None
        self.waiter: asyncio.Future[Answer] | None = None
        self.closed = False
        self._reset()

    def _reset(self) -> None:
        self.chunks: list[bytes] = []
        self.size = 0
        self.wire = 0  # bytes of the current answer fed to the parser
        self.header_lines = 0
        self.received = False  # any byte of the current answer
        self.headers_done = False
        self.framed = False  # Content-Length or chunked: the answer does not end with the connection
        self.count = _ValueCount(self.max_values) if self.max_values else None

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's transports do not subclass it

    def data_received(self, data: bytes) -> None:
        # `data` is one read of the transport (at most 256 KiB with uvloop). The parser gets at most
        # the header cap before the headers must be complete: httptools keeps an unfinished header
        # line in a buffer of its own, so an endless header would otherwise grow it without end.
        if self.closed:
            return
        self.received = True
        try:
            if not self.headers_done:
                room = self.head_limit - self.wire
                if len(data) > room:
                    self._feed(data[:room])
                    if self.closed:
                        return
                    if not self.headers_done:
                        self._fail(Permanent(f"response headers over {_kib(self.head_limit)}"))
                        return
                    data = data[room:]
            if self.wire + len(data) > self.wire_limit:
                self._fail(Permanent(f"response over {self.wire_limit} bytes on the wire (framing included)"))
                return
            self._feed(data)
        except httptools.HttpParserError as err:
            self._fail(Permanent(f"not an HTTP answer: {err}"[:300]))

    def _feed(self, data: bytes) -> None:
        self.wire += len(data)
        self.parser.feed_data(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.headers_done and not self.framed:  # an answer that ends with its connection
            self._finish(keep_alive=False)
        elif not self.received:
            self._fail(_Stale(f"connection closed before an answer{f': {exc}' if exc else ''}"[:300]))
        else:
            self._fail(Transient(f"connection closed in the middle of the answer{f': {exc}' if exc else ''}"[:300]))
        self._let_go()

    # httptools callbacks
    def on_header(self, name: bytes, value: bytes) -> None:
        self.header_lines += 1  # trailers of a chunked body count too
        if self.header_lines > MAX_HEADER_LINES:
            self._fail(Permanent(f"response headers over {MAX_HEADER_LINES} lines"))
            return
        key = name.lower()
        if key == b"content-length":
            self.framed = True
            try:
                length = int(value)
            except ValueError:
                return
            if length > self.limit:
                self._fail(Permanent(f"response of {length} bytes exceeds the {self.limit}-byte cap"))
        elif key == b"transfer-encoding":
            self.framed = True

    def on_headers_complete(self) -> None:
        self.headers_done = True
        if self.parser.get_status_code() != 200:
            self.count = None  # only a 200's body is decoded; any other is refused by its status

    def on_body(self, body: bytes) -> None:
        if self.closed:
            return
        self.size += len(body)
        if self.size > self.limit:
            self._fail(Permanent(f"response exceeds the {self.limit}-byte cap"))
            return
        refused = self.count.feed(body) if self.count is not None else None
        if refused is not None:
            self._fail(_Refused(refused))
        else:
            self.chunks.append(body)

    def on_message_complete(self) -> None:
        self._finish(self.parser.should_keep_alive())

    def _finish(self, keep_alive: bool) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(Answer(self.parser.get_status_code(), b"".join(self.chunks), keep_alive))
            self.chunks = []

    def _fail(self, err: Exception) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(err)
        self.abort()
        self.chunks = []  # what was read of the refused answer is released now, not with the connection

    def abort(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.abort()
        self._let_go()

    def _let_go(self) -> None:
        """A closed connection's parser is the shared one of closed connections: its own refers to this protocol
        (its callbacks), and this protocol to it, so the two would otherwise wait for the cycle collector with
        what the parser buffered (up to the header cap), and a pass closes thousands of connections between two
        collections. Freed by reference counting once the transport lets go of the protocol."""
        self.parser = _CLOSED
        self.chunks = []

    async def get(self, request: bytes, deadline: float) -> Answer:
        """Send `request` and wait for its answer until `deadline` (the loop's clock): then TimeoutError, and the
        connection is closed."""
        assert self.transport is not None
        self._reset()
        loop = asyncio.get_running_loop()
        self.waiter = loop.create_future()
        timer = loop.call_at(deadline, self._fail, TimeoutError())
        self.transport.write(request)
        try:
            return await self.waiter
        finally:
            timer.cancel()
            self.waiter = None  # the answer is the caller's alone: a closed connection does not keep it


class _Refused(Permanent):
    """A 200 whose body was refused as it arrived (`_ValueCount`): the call still records its status."""

    status = 200


class _Stale(Transient):
    """A kept-alive connection the server had already closed: the request is sent again on a new one."""


Target = tuple[str, str, int]  # scheme, host, port
PoolKey = tuple[Target, str | None]  # a kept-alive connection's server and the Authorization it was opened for


@dataclass
class Fetcher:
    """The connections and limits for one pass."""

    settings: ProbeSettings
    idle_limit: int
    idle: OrderedDict[PoolKey, list[_Connection]] = field(default_factory=OrderedDict)  # least recent first
    idle_count: int = 0
    _tls: ssl.SSLContext | None = None
    # The Authorization header this fetcher adds to every request (the prober token of probe.authProxy), sent
    # over https only, after the TLS handshake verified the server against `_tls`. A fetcher with it is used for
    # the kube-rbac-proxy URLs of one namespace alone (kf_culler/gather.py): its connections are never shared with
    # other URLs or another namespace's fetcher.
    authorization: str | None = None
    # A sibling's (`sibling`): the fetcher whose bound on kept-alive connections it shares.
    _root: Fetcher | None = None
    # By host name, the address to connect to instead of looking the name up (a Service's ClusterIP from the watch
    # cache, kf_culler/gather.py); the request still names the host, and TLS still verifies that name.
    addresses: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def open(cls, settings: ProbeSettings, concurrency: int, authorization: str | None = None,
             tls: ssl.SSLContext | None = None, addresses: Mapping[str, str] | None = None) -> Fetcher:
        # Kept-alive connections wait here for the next request to the same server (a notebook's
        # endpoints are asked one after another on one connection). With a host per notebook few are
        # asked again, so at most `concurrency` wait, the oldest closed first; with URL templates
        # through one gateway every notebook shares them.
        return cls(settings, idle_limit=max(1, concurrency), _tls=tls, authorization=authorization,
                   addresses=addresses or {})

    def sibling(self, authorization: str, tls: ssl.SSLContext | None) -> Fetcher:
        """A fetcher that adds `authorization` to its requests, verifies servers against `tls`, and counts its
        kept-alive connections within this one's `idle_limit`; a connection is reused only by requests with the
        same Authorization (one namespace's prober token), never by this fetcher or another sibling."""
        root = self._root or self
        return Fetcher(self.settings, self.idle_limit, _tls=tls, authorization=authorization, _root=root,
                       addresses=root.addresses)

    async def close(self) -> None:
        if self._root is not None:
            return  # its connections are its root's, closed with it
        for waiting in self.idle.values():
            for conn in waiting:
                conn.abort()
        self.idle.clear()
        self.idle_count = 0

    async def get_json(self, url: str, headers: dict[str, str] | None = None) -> tuple[Any, Call]:
        """GET url within the probe's time budget; returns (JSON or {"error": ...}, call record)."""
        call = Call(url=url)
        budget = self.settings.timeout_seconds
        start = time.monotonic()
        # The budget is a deadline on the loop's clock that each wait is given (the connect, the answer): a timer
        # per wait instead of an `asyncio.timeout` around the whole call, whose Python set-up and exit were about a
        # seventh of a Jupyter probe's instructions (docs/performance.md).
        deadline = asyncio.get_running_loop().time() + budget

        try:
            # Transient failures get up to `retries` more tries, 0.2 s apart, inside the same budget.
            # (A plain loop: a retry library's per-call set-up cost a fifth of a probe's CPU.)
            while True:
                call.attempts += 1
                try:
                    body = await self._once(url, headers, call, deadline)
                    break
                except Transient:
                    if call.attempts > self.settings.retries or time.monotonic() - start + 0.2 >= budget:
                        raise
                await asyncio.sleep(0.2)
            result: Any = body
        except TimeoutError:
            call.error = f"timeout after {budget:g}s"
        except (Transient, Permanent) as err:
            call.error = str(err)
        except Exception as err:  # never let a probe raise into the cycle
            call.error = f"{type(err).__name__}: {err}"[:300]
        call.seconds = time.monotonic() - start
        if call.error is not None:
            result = {"error": call.error}
        return result, call

    async def _once(self, url: str, headers: dict[str, str] | None, call: Call, deadline: float) -> Any:
        if self.authorization is not None:
            if not url.startswith("https://"):
                raise Permanent("the prober token is sent over https only; not probed")
            headers = {**(headers or {}), "Authorization": self.authorization}
        target, request, close = _request(url, headers)
        try:
            answer = await self._exchange(target, request, close, deadline)
        except _Refused as err:
            call.status = err.status
            raise
        call.status = answer.status
        if answer.status in (502, 503, 504):
            raise Transient(f"HTTP {answer.status}")
        if answer.status == 403 and answer.body.strip() == ISTIO_DENIED_BODY:
            raise Permanent(ISTIO_DENIED)
        if answer.status != 200:
            raise Permanent(f"HTTP {answer.status}")
        shape = json_shape_error(answer.body, self.settings.max_json_depth, self.settings.max_json_values)
        if shape is not None:
            raise Permanent(shape)
        try:
            return json.loads(answer.body)
        except (ValueError, UnicodeDecodeError, RecursionError):
            raise Permanent("the answer is not JSON") from None

    async def _exchange(self, target: Target, request: bytes, close: bool, deadline: float) -> Answer:
        """Send one request on a kept-alive connection to target, else a new one; once more on a new
        connection when the kept one turns out closed before answering. TimeoutError at `deadline`."""
        for reuse in (True, False):
            conn = self._take(target) if reuse else None
            fresh = conn is None
            if conn is None:
                conn = await self._connect(target, deadline)
            done = False
            try:
                answer = await conn.get(request, deadline)
                done = True
            except _Stale:
                if fresh:
                    raise Transient("the server closed the connection without answering") from None
                continue
            finally:
                if not done:
                    conn.abort()
            if answer.keep_alive and not close and not conn.closed:
                self._keep(target, conn)
            else:
                conn.abort()
            return answer
        raise AssertionError("unreachable")

    def _take(self, target: Target) -> _Connection | None:
        pool, key = self._root or self, (target, self.authorization)
        waiting = pool.idle.get(key)
        while waiting:
            conn = waiting.pop()
            pool.idle_count -= 1
            if not waiting:
                del pool.idle[key]
            if not conn.closed:
                return conn
        return None

    def _keep(self, target: Target, conn: _Connection) -> None:
        pool, key = self._root or self, (target, self.authorization)
        pool.idle.setdefault(key, []).append(conn)
        pool.idle.move_to_end(key)
        pool.idle_count += 1
        while pool.idle_count > pool.idle_limit:  # close the connection unused the longest
            oldest, waiting = next(iter(pool.idle.items()))
            waiting.pop(0).abort()
            pool.idle_count -= 1
            if not waiting:
                del pool.idle[oldest]

    async def _connect(self, target: Target, deadline: float) -> _Connection:
        """A new connection to target within `probe.connectTimeoutSeconds` (Transient past it), or TimeoutError when
        the call's deadline comes first."""
        scheme, host, port = target
        loop = asyncio.get_running_loop()
        wait = self.settings.connect_timeout_seconds
        budget_first = deadline - loop.time() <= wait
        limit, head_limit, values = (self.settings.max_response_bytes, self.settings.max_header_bytes,
                                     self.settings.max_json_values)
        tls = None
        if scheme == "https":
            tls = self._tls = self._tls or ssl.create_default_context()
        address = self.addresses.get(host)
        where = f"{host}:{port}" if address is None else f"{host}:{port} (ClusterIP {address})"
        try:
            async with asyncio.timeout_at(deadline if budget_first else loop.time() + wait):
                _, conn = await loop.create_connection(lambda: _Connection(limit, head_limit, values),
                                                       address or host, port,
                                                       ssl=tls, server_hostname=host if tls else None)
        except TimeoutError:
            if budget_first:
                raise
            raise Transient(f"cannot connect to {where}: no answer within {wait:g}s") from None
        except (OSError, ssl.SSLError) as err:
            raise Transient(f"cannot connect to {where}: {err}"[:300]) from None
        return conn


_PLAIN_HOST = re.compile(r"[a-z0-9.-]+(:[0-9]{1,5})?")  # a host name or IPv4 address, and its port


def _split(url: str) -> tuple[str, str, int, str, str]:
    """(scheme, host name, port, path with its query, Host header) of an http(s) URL, as `urlsplit` reads it. The
    probes' URLs are plain (`http://<name>.<namespace>.svc.<domain>/<path>?<query>`): those are cut where they
    split without `urlsplit`'s general parse, three times a notebook each pass; any other goes through it."""
    scheme, sep, rest = url.partition("://")
    netloc, slash, path = rest.partition("/")
    if sep and scheme in ("http", "https") and _PLAIN_HOST.fullmatch(netloc) and "#" not in path \
            and not netloc.startswith(".") and netloc.count(":") <= 1:
        host, _, port = netloc.partition(":")
        if host and (not port or 0 < int(port) <= 65535):
            return scheme, host, int(port) if port else (443 if scheme == "https" else 80), (slash + path) or "/", \
                netloc
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise Permanent(f"not an http(s) URL: {url[:200]}")
    port_number = parts.port or (443 if parts.scheme == "https" else 80)
    return (parts.scheme, parts.hostname, port_number, (parts.path or "/") + (f"?{parts.query}" if parts.query else ""),
            parts.netloc.rpartition("@")[2])


def _request(url: str, headers: dict[str, str] | None) -> tuple[Target, bytes, bool]:
    """(scheme, host, port), the request's bytes, and whether it asks to close the connection."""
    scheme, hostname, port, path, host_header = _split(url)
    lines = [f"GET {path} HTTP/1.1", f"Host: {host_header}", "Accept: application/json", "User-Agent: kf-culler"]
    close = False
    for k, v in (headers or {}).items():
        if "\r" in k or "\n" in k or "\r" in v or "\n" in v:
            raise Permanent(f"header {k!r} has a line break")
        lines.append(f"{k}: {v}")
        close = close or (k.lower() == "connection" and v.lower() == "close")
    return (scheme, hostname, port), ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"), close


def _kib(n: int) -> str:
    return f"{n >> 10} KiB" if n % 1024 == 0 else f"{n} bytes"


_BRACKETS = bytes.maketrans(b"{}", b"[]")
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")


def json_shape_error(body: bytes, max_depth: int, max_values: int) -> str | None:
    """Why `body` is refused before decoding: nested deeper than max_depth, or more than max_values
    values; None when it may be decoded (or is not JSON at all, which `json.loads` then says).

    Values are counted on the raw bytes as `{`, `[` and `,` outside strings, plus one (each container
    and each member of one), and the strings separately (the quotes, halved); the depth is found by
    deleting innermost `[]`/`{}` pairs, one nesting level a round. Everything is bytes methods in C,
    no Python loop per byte: about 15 ms for the worst 1 MiB measured (docs/faults.md), as much as
    `json.loads` of a real answer that size, and nothing the size of the decoded structure is built.
    """
    raw = body
    if b"\\" in raw:  # drop escapes first: then every `"` left opens or closes a string
        raw = raw.replace(b"\\\\", b"").replace(b'\\"', b"")
    quotes = raw.count(b'"')
    if quotes // 2 > max_values:
        return f"the JSON answer has over {max_values} values (strings)"
    bare = b"".join(raw.split(b'"')[::2]) if quotes else raw  # the bytes outside strings
    values = bare.count(b",") + bare.count(b"[") + bare.count(b"{") + 1
    if values > max_values:
        return f"the JSON answer has over {max_values} values"
    brackets = bare.translate(_BRACKETS, _NOT_BRACKETS)  # only the brackets, every one as `[` or `]`
    for _ in range(max_depth):
        if not brackets:
            return None
        inner = brackets.replace(b"[]", b"")  # every innermost container goes: one level less
        if len(inner) == len(brackets):
            return None  # unbalanced: not JSON, and json.loads says so
        brackets = inner
    return f"the JSON answer nests deeper than {max_depth}" if brackets else None
