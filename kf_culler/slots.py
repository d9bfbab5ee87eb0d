"""The connection slots of the culler's HTTP ports (kf_culler/metrics.py), shared so that no tenant holds them all.

Every pod may reach the verdict API's port, and a connection that sends nothing costs its client nothing. So a
connection has two phases, with limits of their own:

- *reading*: accepted, its request line and headers not read yet. These share a pool of MAX_READING slots, at
  most MAX_READING_PER_CLIENT from one address, and each must finish its headers within
  HEADER_DEADLINE_SECONDS. When the pool is full, a newcomer from an address that holds fewer reading slots
  than the address holding most takes the oldest of that address's slots (that connection is cut): many pods
  that send nothing keep one another out, never a caller that sends its request.
- *answering*: the request read. On the verdict API, once the caller's token named its namespace (a
  TokenReview: nothing the caller can choose), the connection takes one of MAX_PER_NAMESPACE slots of that
  namespace; past them it is answered 429. So one namespace's pods, however many, hold at most
  MAX_PER_NAMESPACE answering slots, and another namespace's request is still answered.

Whatever the phase: at most MAX_CONNECTIONS connections in all, MAX_PER_CLIENT from one address, each ended
at CONNECTION_DEADLINE_SECONDS however slowly it trickles.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

MAX_CONNECTIONS = 256  # connections served at once; more are closed at once, not queued on threads
MAX_PER_CLIENT = 8  # from one address, whatever their phase
MAX_READING = 64  # connections whose request is not read yet, from all addresses
MAX_READING_PER_CLIENT = 4  # of those, from one address
MAX_PER_NAMESPACE = 16  # verdict API connections answering one namespace's callers at once
HEADER_DEADLINE_SECONDS = 5.0  # from the accept to the end of the request's headers
CONNECTION_DEADLINE_SECONDS = 20.0  # a whole connection, however slowly it trickles


@dataclass
class _Conn:
    sock: Any
    client: str
    opened: float
    reading: bool = True
    namespace: str | None = None
    cut: bool = False  # past a deadline or evicted: its server cuts it


@dataclass(frozen=True)
class Peer:
    """What an answer may know of its connection: the caller's address, and `claim(namespace)`, which takes one of
    the namespace's answering slots (False: the namespace holds all of its slots now)."""

    client: str
    claim: Callable[[str], bool] = field(default=lambda _ns: True)


class Slots:
    """The table of open connections of one server. `open` admits (or refuses) a new connection and says which
    connections to cut for it; `read` marks its headers read; `claim` gives it a namespace's slot; `close`
    frees it; `overdue` lists those past a deadline. Sockets are only named here: the server cuts them."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._lock = threading.Lock()
        self._conns: dict[int, _Conn] = {}  # by id(socket)
        self._by_client: dict[str, int] = {}
        self._reading: dict[str, list[_Conn]] = {}  # reading connections by address, oldest first
        self._reading_total = 0
        self._by_namespace: dict[str, int] = {}
        self.refused = 0  # connections closed at once: past a cap
        self.evicted = 0  # reading connections cut to make room for another address's
        self.busy = 0  # claims refused: the namespace held all of its slots

    def open(self, sock: Any, client: str) -> tuple[bool, list[Any]]:
        """(admitted, the sockets to cut to make room for it)."""
        with self._lock:
            mine = self._reading.get(client, [])
            if (len(self._conns) >= MAX_CONNECTIONS or self._by_client.get(client, 0) >= MAX_PER_CLIENT
                    or len(mine) >= MAX_READING_PER_CLIENT):
                self.refused += 1
                return False, []
            cut: list[Any] = []
            if self._reading_total >= MAX_READING:
                victim = self._most_reading()
                if victim is None or len(victim) <= len(mine):  # nobody holds more than this address: no room
                    self.refused += 1
                    return False, []
                oldest = victim[0]
                oldest.cut = True
                self._forget_reading(oldest)
                self.evicted += 1
                cut.append(oldest.sock)
            conn = _Conn(sock, client, self.clock())
            self._conns[id(sock)] = conn
            self._by_client[client] = self._by_client.get(client, 0) + 1
            self._reading.setdefault(client, []).append(conn)
            self._reading_total += 1
            return True, cut

    def _most_reading(self) -> list[_Conn] | None:
        """The reading connections of the address that holds most of them (of two, the one with the older)."""
        best: list[_Conn] | None = None
        for conns in self._reading.values():
            if conns and (best is None or (len(conns), -conns[0].opened) > (len(best), -best[0].opened)):
                best = conns
        return best

    def _forget_reading(self, conn: _Conn) -> None:
        if not conn.reading:
            return
        conn.reading = False
        mine = self._reading.get(conn.client, [])
        if conn in mine:
            mine.remove(conn)
            self._reading_total -= 1
        if not mine:
            self._reading.pop(conn.client, None)

    def read(self, sock: Any) -> bool:
        """The connection's request line and headers are read: its reading slot is free. False when it was cut
        meanwhile (what was read is then not the whole request)."""
        with self._lock:
            conn = self._conns.get(id(sock))
            if conn is None:
                return False
            self._forget_reading(conn)
            return not conn.cut

    def claim(self, sock: Any, namespace: str) -> bool:
        """Take one of `namespace`'s answering slots for the connection (once; a second claim is the first)."""
        with self._lock:
            conn = self._conns.get(id(sock))
            if conn is None:
                return False
            if conn.namespace is not None:
                return conn.namespace == namespace
            if self._by_namespace.get(namespace, 0) >= MAX_PER_NAMESPACE:
                self.busy += 1
                return False
            conn.namespace = namespace
            self._by_namespace[namespace] = self._by_namespace.get(namespace, 0) + 1
            return True

    def close(self, sock: Any) -> None:
        with self._lock:
            conn = self._conns.pop(id(sock), None)
            if conn is None:
                return
            self._forget_reading(conn)
            left = self._by_client.get(conn.client, 1) - 1
            if left > 0:
                self._by_client[conn.client] = left
            else:
                self._by_client.pop(conn.client, None)
            if conn.namespace is not None:
                n = self._by_namespace.get(conn.namespace, 1) - 1
                if n > 0:
                    self._by_namespace[conn.namespace] = n
                else:
                    self._by_namespace.pop(conn.namespace, None)

    def overdue(self) -> list[Any]:
        """The sockets past HEADER_DEADLINE_SECONDS still reading, or past CONNECTION_DEADLINE_SECONDS."""
        now = self.clock()
        whole = CONNECTION_DEADLINE_SECONDS
        headers = min(HEADER_DEADLINE_SECONDS, whole)
        with self._lock:
            late = [c for c in self._conns.values() if now - c.opened >= (headers if c.reading else whole)]
            for c in late:
                c.cut = True
            return [c.sock for c in late]

    def held(self) -> dict[str, int]:
        """Open connections by phase (for tests and curiosity)."""
        with self._lock:
            return {"open": len(self._conns), "reading": self._reading_total,
                    "namespaced": sum(self._by_namespace.values())}
