"""The bounded HTTP GET every probe shares: connect/read timeouts, a size cap, transient-only retries.

It never raises: the answer is the decoded JSON, or `{"error": "..."}` naming what went wrong.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from kf_culler.config import ProbeSettings
from kf_culler.errors import Permanent, Transient

REQUESTS_PER_NOTEBOOK = 3  # Jupyter: api/status, api/kernels, api/terminals


# The body of the 403 an Istio sidecar sends when an AuthorizationPolicy refuses the request (RBAC filter).
ISTIO_DENIED_BODY = b"RBAC: access denied"
ISTIO_DENIED = ("HTTP 403 from the Istio sidecar (RBAC: access denied): kf-culler is not allowed to probe this "
                "namespace; apply kustomize/overlays/kubeflow/profile-namespace or turn on "
                "istio.manageAuthorizationPolicies")


async def _istio_denied(resp: aiohttp.ClientResponse) -> bool:
    """Whether a 403 is Istio's refusal: its body is exactly `RBAC: access denied` (read at most 64 bytes)."""
    if resp.content_length is not None and resp.content_length > 64:
        return False
    body = b""
    while len(body) < 64:
        chunk = await resp.content.read(64 - len(body))
        if not chunk:
            break
        body += chunk
    return body.strip() == ISTIO_DENIED_BODY


@dataclass
class Call:
    """What one GET did, for traces, metrics and `explain`."""

    url: str
    status: int | None = None
    seconds: float = 0.0
    attempts: int = 0
    error: str | None = None


@dataclass
class Fetcher:
    """Holds the client session and the limits for one pass."""

    settings: ProbeSettings
    session: aiohttp.ClientSession
    calls: list[Call] = field(default_factory=list)

    @classmethod
    def open(cls, settings: ProbeSettings, concurrency: int) -> Fetcher:
        # `concurrency` notebooks are probed at once and one notebook asks up to REQUESTS_PER_NOTEBOOK
        # endpoints at once: the pool holds them all, or a request would wait for a connection inside
        # its own time budget and a few hanging notebooks would time out their neighbours. No limit per
        # host: with URL templates through one gateway every notebook shares that host.
        connector = aiohttp.TCPConnector(limit=concurrency * REQUESTS_PER_NOTEBOOK, limit_per_host=0,
                                         ttl_dns_cache=300, enable_cleanup_closed=True)
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=settings.connect_timeout_seconds,
                                        sock_read=settings.timeout_seconds)
        session = aiohttp.ClientSession(connector=connector, timeout=timeout, auto_decompress=True,
                                        headers={"Accept": "application/json",
                                                 "User-Agent": "kf-culler"})
        return cls(settings, session)

    async def close(self) -> None:
        await self.session.close()

    async def get_json(self, url: str, headers: dict[str, str] | None = None) -> tuple[Any, Call]:
        """GET url within the probe's time budget; returns (JSON or {"error": ...}, call record)."""
        call = Call(url=url)
        budget = self.settings.timeout_seconds
        start = time.monotonic()

        try:
            async with asyncio.timeout(budget):
                # Transient failures get up to `retries` more tries, 0.2 s apart, inside the same budget.
                # (A plain loop: a retry library's per-call set-up cost a fifth of a probe's CPU.)
                while True:
                    call.attempts += 1
                    try:
                        body = await self._once(url, headers, call, budget - (time.monotonic() - start))
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
        self.calls.append(call)
        return result, call

    async def _once(self, url: str, headers: dict[str, str] | None, call: Call, left: float) -> Any:
        if left <= 0:
            raise TimeoutError
        try:
            async with self.session.get(url, headers=headers, allow_redirects=False) as resp:
                call.status = resp.status
                if resp.status in (502, 503, 504):
                    raise Transient(f"HTTP {resp.status}")
                if resp.status == 403 and await _istio_denied(resp):
                    raise Permanent(ISTIO_DENIED)
                if resp.status != 200:
                    raise Permanent(f"HTTP {resp.status}")
                limit = self.settings.max_response_bytes
                if resp.content_length is not None and resp.content_length > limit:
                    raise Permanent(f"response of {resp.content_length} bytes exceeds the {limit}-byte cap")
                chunks: list[bytes] = []
                size = 0
                async for chunk in resp.content.iter_chunked(65536):
                    size += len(chunk)
                    if size > limit:
                        raise Permanent(f"response exceeds the {limit}-byte cap")
                    chunks.append(chunk)
        except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError) as err:
            raise Transient(f"{type(err).__name__}: {err}"[:300]) from None
        except aiohttp.ClientError as err:
            raise Permanent(f"{type(err).__name__}: {err}"[:300]) from None
        try:
            return json.loads(b"".join(chunks))
        except (ValueError, UnicodeDecodeError):
            raise Permanent("the answer is not JSON") from None
