"""List+watch what the targets ask for into memory, so a cycle needs no per-notebook GET.

The targets (kf_culler/targets/) say which collections their sessions need (`Target.watches`: the API path,
metadata only or not, what of each object is read) and how a session is paired with its pod (`Target.pair`);
this module does the I/O: one thread per watched collection, in each namespace the culler reads or
cluster-wide. A broken watch is resumed from its resourceVersion, and a 410 Gone (or any other failure) leads
to a fresh list. Objects are kept as the target's projection of the API's JSON (kf_culler/targets/fields.py),
each encoded (`marshal`: a fifth of the memory the same dicts and strings take) and decoded when read, so that
between passes the cache holds bytes, and a pass holds decoded only what it keeps (its sessions and their
pods), never the StatefulSets and Services its pairing and Service checks look up one by one.
"""

from __future__ import annotations

import contextlib
import logging
import marshal
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from kf_culler.config import GPU_MODEL_LABEL
from kf_culler.kube.liststream import list_items
from kf_culler.memory import release
from kf_culler.targets import TARGETS, Scope, Seen, Target, Watched, identity, kind_of, target_of
from kf_culler.targets.base import Item

log = logging.getLogger(__name__)
Key = tuple[str, str]
LIST_PAGE = 500  # objects per list request at most (as kubectl pages, --chunk-size=500)
STREAM_CHUNK = 64 * 1024  # a list answer is read in chunks this size and split into its items as it comes
# Collections of which the culler reads metadata only (`Watched.metadata_only`: StatefulSets, their owner): the
# API server sends PartialObjectMetadata, never the pod template, which the notebook-controller copies from the
# Notebook.
METADATA_LIST = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"
METADATA_WATCH = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1"
Slimmer = Callable[[dict[str, Any]], dict[str, Any] | None]


def _slim(obj: dict[str, Any]) -> dict[str, Any]:
    """Drop metadata.managedFields, which nothing here reads (the culler's own record ConfigMaps)."""
    meta = obj.get("metadata")
    if isinstance(meta, dict):
        meta.pop("managedFields", None)
    return obj


def _dict(value: object) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _slim_node(obj: dict[str, Any]) -> dict[str, Any] | None:
    """A Node's name and its GPU model label (rule 17); nothing else of a Node is read."""
    meta = _dict(obj.get("metadata"))
    labels = _dict(meta.get("labels"))
    kept = {GPU_MODEL_LABEL: labels[GPU_MODEL_LABEL]} if GPU_MODEL_LABEL in labels else {}
    return {"metadata": {"name": meta.get("name"), "labels": kept}}


def _key(obj: dict[str, Any]) -> Key:
    meta = obj.get("metadata") or {}
    return (str(meta.get("namespace", "")), str(meta.get("name", "")))


class _Decoded(Mapping[Key, dict[str, Any]]):
    """Encoded objects (`marshal`) read as objects: each read decodes a new copy, which its reader may change and
    which is freed when its reader drops it. With `recent`, the last few copies are kept with the bytes they were
    decoded from (`encoded_as`), so that a pairing's reader can hold the cache's own bytes for a pair instead of
    encoding it again."""

    __slots__ = ("_raw", "_recent")

    def __init__(self, raw: Mapping[Key, bytes], recent: int = 0) -> None:
        self._raw = raw
        self._recent: deque[tuple[dict[str, Any], bytes]] | None = deque(maxlen=recent) if recent else None

    def _decoded(self, raw: bytes) -> dict[str, Any]:
        obj = decoded(raw)
        if self._recent is not None:
            self._recent.append((obj, raw))
        return obj

    def __getitem__(self, key: Key) -> dict[str, Any]:
        return self._decoded(self._raw[key])

    def get(self, key: Key, default: Any = None) -> Any:
        raw = self._raw.get(key)
        return default if raw is None else self._decoded(raw)

    def encoded_as(self, obj: object) -> bytes | None:
        """The bytes `obj` was decoded from, when it is one of the last few copies this mapping gave (the same
        object, not an equal one); None otherwise."""
        if self._recent is None:
            return None
        for i in range(len(self._recent) - 1, -1, -1):
            held, raw = self._recent[i]
            if held is obj:
                return raw
        return None

    def __contains__(self, key: object) -> bool:
        return key in self._raw

    def __iter__(self) -> Iterator[Key]:
        return iter(self._raw)

    def __len__(self) -> int:
        return len(self._raw)


def packed_pair(item: Item) -> bytes:
    """A session and its pod as one `marshal` bytes (`packed_pairs` where a target made them itself, and Coder's
    workspaces beside them); `unpacked_pair` decodes it. What was decoded from JSON can always be encoded again
    (marshal takes twice the nesting Python's JSON decoder does, and a projection never nests deeper than what it
    projects)."""
    return marshal.dumps(item)


def unpacked_pair(raw: bytes) -> Item:
    nb, pod = marshal.loads(raw)
    assert isinstance(nb, dict) and (pod is None or isinstance(pod, dict))
    return nb, pod


# A session and its pod as the cache holds them encoded (the same bytes objects, not copies): (session, pod or None).
Encoded = tuple[bytes, "bytes | None"]
# A pair as `packed_pairs` gives it: the cache's own bytes of its session and pod, or one `packed_pair` bytes where
# a target made the pair's objects itself.
PackedPair = bytes | Encoded


class UnpackedPairs(Iterator[Item]):
    """The pairs of `packed_pairs` decoded one at a time, in order, each let go of by the list as it is given: the
    list is empty once read to its end. `encoded` is the cache's bytes of the pair last given (the pass may hold
    them instead of encoding the pair again), None when the pair was encoded for the pass."""

    def __init__(self, items: list[PackedPair]) -> None:
        items.reverse()
        self._items = items
        self.encoded: Encoded | None = None

    def __next__(self) -> Item:
        if not self._items:
            self.encoded = None
            raise StopIteration
        entry = self._items.pop()
        if isinstance(entry, bytes):
            self.encoded = None
            return unpacked_pair(entry)
        self.encoded = entry
        return decoded(entry[0]), None if entry[1] is None else decoded(entry[1])


def unpacked_pairs(items: list[PackedPair]) -> UnpackedPairs:
    return UnpackedPairs(items)


# A session of a lean pass as the runner holds it through the pass (`ClusterCache.packed_pairs`): the bytes the cache
# holds for it, or its identity with no pod.
Kept = bytes | Item


def identities(kept: list[Kept]) -> list[Item]:
    """Each session of `kept` as its identity with no pod (kf_culler/targets/ `identity`), decoded one at a time."""
    return [(identity(decoded(k)), None) if isinstance(k, bytes) else k for k in kept]


def decoded(raw: bytes) -> dict[str, Any]:
    """An object kept encoded (`marshal`), decoded: a new copy."""
    obj = marshal.loads(raw)  # the strings written interned (fields.py `shared`) are interned again
    assert isinstance(obj, dict)
    return obj


# How many decoded objects of each collection a lean pass's pairing remembers the bytes of (`_Decoded.encoded_as`): a
# Notebook's pairing decodes the notebook, then its StatefulSet's member pods, and gives the pair.
PAIR_RECENT = 8


def _encoded_as(seen: Seen, obj: dict[str, Any]) -> bytes | None:
    """The bytes the cache holds for `obj` when it is an object one of `seen`'s collections just decoded."""
    for collection in seen.collections.values():
        if isinstance(collection, _Decoded):
            raw = collection.encoded_as(obj)
            if raw is not None:
                return raw
    return None


class _Collection:
    """One list+watch loop feeding a dict of objects (`encoded`: each kept as its `marshal` bytes)."""

    def __init__(self, name: str, lister: Callable[..., Any], stop: threading.Event,
                 label_selector: str | None = None, watch_timeout: int = 240,
                 slim: Callable[[dict[str, Any]], dict[str, Any] | None] = _slim, optional: bool = False,
                 metadata_only: bool = False, encoded: bool = False) -> None:
        self.name = name
        self.encoded = encoded
        self.metadata_only = metadata_only
        # optional: a collection the culler works without (Nodes, when its RBAC has none): a 403 ends it.
        self.optional = optional
        self.forbidden = False
        self.slim = slim
        self.lister = lister
        self.stop = stop
        self.selector = label_selector
        self.watch_timeout = watch_timeout
        self.objects: dict[Key, Any] = {}  # dicts, or their marshal bytes (`encoded`)
        self.lock = threading.Lock()
        self.synced = threading.Event()
        self.lists = 0
        self.watch_events = 0
        self.errors = 0
        self.thread = threading.Thread(target=self._run, name=f"watch-{name}", daemon=True)
        self.watch: Any = None  # the watch in progress, so close() can cut its connection

    def interrupt(self) -> None:
        """Cut the connection of the watch in progress (best effort; the thread then sees `stop`)."""
        resp = getattr(self.watch, "_resp", None)
        sock = getattr(getattr(resp, "connection", None), "sock", None)
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def _kept(self, obj: dict[str, Any]) -> Any:
        """What the collection keeps of an object: its slim form (`slim`), encoded when `encoded`; None: nothing."""
        kept = self.slim(obj)
        return None if kept is None else marshal.dumps(kept) if self.encoded else kept

    def _kwargs(self, accept: str = METADATA_LIST) -> dict[str, Any]:
        out: dict[str, Any] = {"label_selector": self.selector} if self.selector else {}
        if self.metadata_only:
            out["_headers"] = {"Accept": accept}
        return out

    def _list(self) -> str:
        """List in pages of LIST_PAGE objects, each page read as a stream and split into its objects as it
        comes (kf_culler/kube/liststream.py): one object is decoded at a time and slimmed at once, so neither a
        relist of 10,000 notebooks nor a tenant's hundreds of 1.5 MiB Notebooks is ever held whole.
        An expired continue token is a 410, which the loop answers with a fresh list.

        What a list decoded and dropped (each big object whole for a moment, the previous dict on a relist)
        is free C heap that glibc keeps; it is given back at the end of the list (kf_culler/memory.py), not at
        the end of the next pass, on top of which it would otherwise count (20 stopped Notebooks of 1.4 MiB
        left 11 MiB more resident after the sync, docs/performance.md)."""
        items: dict[Key, Any] = {}
        token = ""
        while True:
            kwargs = {**self._kwargs(), "limit": LIST_PAGE, **({"_continue": token} if token else {})}
            resp = self.lister(_preload_content=False, **kwargs)
            try:
                objects, page = list_items(resp.stream(STREAM_CHUNK))
                for o in objects:
                    kept = self._kept(o)
                    if kept is not None:
                        items[_key(o)] = kept
            finally:
                resp.release_conn()
            meta = page.rest().get("metadata") or {}
            token = str(meta.get("continue") or "")
            if not token:
                break
        with self.lock:
            self.objects = items
        release()
        self.lists += 1
        self.synced.set()
        return str(meta.get("resourceVersion", ""))

    def _run(self) -> None:
        from kubernetes import watch
        from kubernetes.client.rest import ApiException

        backoff = 0.5
        rv = ""
        while not self.stop.is_set():
            progressed = False  # whether this watch delivered anything before it ended or broke
            try:
                if not rv:
                    rv = self._list()
                w = self.watch = watch.Watch()
                for event in w.stream(self.lister, resource_version=rv, timeout_seconds=self.watch_timeout,
                                      allow_watch_bookmarks=True, deserialize=False,
                                      **self._kwargs(METADATA_WATCH)):
                    progressed = True
                    if self.stop.is_set():
                        w.stop()
                        break
                    kind, obj = event["type"], event["object"]
                    if kind == "ERROR":
                        rv = ""  # usually 410 Gone: relist
                        break
                    rv = str(obj.get("metadata", {}).get("resourceVersion", rv))
                    if kind == "BOOKMARK":
                        continue
                    self.watch_events += 1
                    kept = None if kind == "DELETED" else self._kept(obj)
                    with self.lock:
                        if kept is None:
                            self.objects.pop(_key(obj), None)
                        else:
                            self.objects[_key(obj)] = kept
                backoff = 0.5
            except ApiException as err:
                if self.stop.is_set():
                    return
                self.errors += 1
                if err.status == 410:
                    rv = ""
                    continue
                if err.status == 403 and self.optional:
                    self.forbidden = True
                    log.warning("watch %s refused (HTTP 403): working without it", self.name)
                    return
                log.warning("watch %s failed: %s; retrying", self.name, err.reason)
                rv = ""
                self.stop.wait(backoff)
                backoff = min(backoff * 2, 10)
            except Exception as err:  # connection lost, API server restarting, ...
                if self.stop.is_set():
                    return
                self.errors += 1
                if not progressed:
                    # A watch that fails before delivering anything is not worth resuming from the same
                    # resourceVersion: after an API server restart it is often too old (410), and with
                    # deserialize=False the client reports that ERROR event as a KeyError, not a 410.
                    rv = ""
                log.warning("watch %s broke (%s); %s", self.name, type(err).__name__,
                            "resuming" if rv else "listing again")
                self.stop.wait(backoff)
                backoff = min(backoff * 2, 10)

    def put(self, obj: dict[str, Any]) -> None:
        """Record an object the culler itself just wrote (the watch will confirm it)."""
        kept = self._kept(obj)
        with self.lock:
            if kept is not None:
                self.objects[_key(obj)] = kept

    def snapshot(self) -> dict[Key, Any]:
        """The objects as kept (encoded when `encoded`)."""
        with self.lock:
            return dict(self.objects)


# The list and watch parameters the cache passes, as the API server names them.
_QUERY = {"label_selector": "labelSelector", "limit": "limit", "_continue": "continue",
          "resource_version": "resourceVersion", "timeout_seconds": "timeoutSeconds",
          "allow_watch_bookmarks": "allowWatchBookmarks", "watch": "watch"}


def _lister(api_client: Any, path: str) -> Callable[..., Any]:
    """A list (and, with `watch=True`, watch) function of the collection at `path`, called as the kubernetes
    client's own list functions are (`kubernetes.watch` calls it so): its answer is the HTTP response, unread;
    an answer other than 2xx is an ApiException."""
    def call(_preload_content: bool = False, _headers: Mapping[str, str] | None = None,
             _request_timeout: Any = None, **kwargs: Any) -> Any:
        from kubernetes.client.exceptions import ApiException

        query = [(_QUERY[k], v) for k, v in kwargs.items() if v is not None]
        request = api_client.param_serialize("GET", path, query_params=query,
                                             header_params={"Accept": "application/json", **(_headers or {})},
                                             auth_settings=["BearerToken"])
        answer = api_client.call_api(*request, _request_timeout=_request_timeout)
        if not 200 <= answer.status <= 299:
            answer.read()
            raise ApiException.from_response(http_resp=answer, body=None, data=None)
        return answer.response

    return call  # no docstring: kubernetes.watch then leaves objects as plain dicts


def _path(w: Watched, namespace: str | None) -> str:
    root = f"/apis/{w.group}/{w.version}" if w.group else f"/api/{w.version}"
    return f"{root}/namespaces/{namespace}/{w.plural}" if namespace else f"{root}/{w.plural}"


def _merged(asks: list[Watched]) -> tuple[Watched, Slimmer]:
    """One collection several targets ask for, asked alike: its projection keeps an object any of them keeps."""
    first = asks[0]
    for w in asks[1:]:
        if (w.group, w.version, w.plural, w.project, w.metadata_only, w.cluster_scoped) != (
                first.group, first.version, first.plural, first.project, first.metadata_only, first.cluster_scoped):
            raise ValueError(f"the targets ask for the collection {first.name!r} in different ways")
    keeps = [w.keep for w in asks]
    project = first.project
    if any(k is None for k in keeps):
        return first, project
    some = tuple(k for k in keeps if k is not None)

    def slim(obj: dict[str, Any]) -> dict[str, Any] | None:
        return project(obj) if any(k(obj) for k in some) else None

    return first, slim


# How long `ClusterCache.close` waits for its watch threads to end.
CLOSE_SECONDS = 5.0


class ClusterCache:
    """What the configured targets watch, cluster-wide or for a fixed list of namespaces, and the culler's
    own record and the Nodes."""

    def __init__(self, api_client: Any, namespaces: tuple[str, ...] = (), records_namespace: str | None = None,
                 targets: tuple[str, ...] = ("notebooks",),
                 workloads: Callable[[dict[str, Any]], bool] | None = None,
                 workload_kinds: tuple[str, ...] = ("Deployment", "StatefulSet"),
                 coder_namespace: str | None = None) -> None:
        from kf_culler.kube.records import RECORDS_SELECTOR

        self.stop_event = threading.Event()
        # The registry's order: a target pairs after the ones before it (a workload is not a session's own
        # StatefulSet).
        self.targets: tuple[Target, ...] = tuple(t for name, t in TARGETS.items() if name in targets)
        scope = Scope(workload_kinds=workload_kinds if workloads is not None else (),
                      selects_workload=workloads or (lambda _o: False), coder_namespace=coder_namespace)
        asked: dict[str, list[Watched]] = {}
        for t in self.targets:
            for w in t.watches(scope):
                asked.setdefault(w.name, []).append(w)
        # Each collection by its name: one per namespace read, or one cluster-wide.
        self.collections: dict[str, list[_Collection]] = {}
        self._sessions: dict[str, str] = {}  # a session kind -> the collection of those sessions
        for name, asks in asked.items():
            w, slim = _merged(asks)
            if w.session_kind is not None:
                self._sessions[w.session_kind] = name
            where: tuple[str | None, ...] = namespaces if namespaces and not w.cluster_scoped else (None,)
            self.collections[name] = [_Collection(f"{name}/{ns}" if ns else name, _lister(api_client, _path(w, ns)),
                                                  self.stop_event, slim=slim, metadata_only=w.metadata_only,
                                                  encoded=True)
                                      for ns in where]
        # The culler's own record (kf_culler/kube/records.py): ConfigMaps in its own namespace, each kept as one
        # `marshal` blob. Each of a pass's record patches brings its bucket back through the watch, hundreds of
        # records' texts at once, while the pass runs: held decoded, those small strings outlived the pass among
        # its own short-lived objects and kept their memory from going back (docs/performance.md).
        self.records: list[_Collection] = [] if records_namespace is None else [_Collection(
            f"records/{records_namespace}", _lister(api_client, f"/api/v1/namespaces/{records_namespace}/configmaps"),
            self.stop_event, RECORDS_SELECTOR, encoded=True)]
        # Nodes for their GPU model (rule 17); optional: without the RBAC to read them, models come from the
        # notebook's template as before, and the culler says so once.
        self.nodes = _Collection("nodes", _lister(api_client, "/api/v1/nodes"), self.stop_event, slim=_slim_node,
                                 optional=True)
        self._last_read: tuple[bytes, dict[str, Any]] | None = None  # `_now`'s last object, as bytes and decoded
        self.seen = Seen(now=self._now)  # the last snapshot, for the Service checks and endpoints
        self.orphans: list[Any] = []  # pods named like a session's that its stop cannot reach (`Pairing.orphans`)
        self._started = False
        self._starting = threading.Lock()

    def _all(self) -> list[_Collection]:
        """The collections a pass needs synced (Nodes are optional: see `nodes`)."""
        return [c for cs in self.collections.values() for c in cs] + self.records

    def start(self) -> bool:
        """Start the watches, once (False: they were started already)."""
        with self._starting:
            if self._started:
                return False
            self._started = True
        for c in [*self._all(), self.nodes]:
            c.thread.start()
        return True

    def wait_synced(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        return all(c.synced.wait(max(0.0, deadline - time.monotonic())) for c in self._all())

    @property
    def synced(self) -> bool:
        return all(c.synced.is_set() for c in self._all())

    def close(self, timeout: float = CLOSE_SECONDS) -> None:
        """Stop watching: the watch threads end and their connections close now, not at their timeout
        (an API server shutting down waits for open watches). Waits up to `timeout` for the threads to end: a
        command that exits right after must not leave one inside a TLS read while the interpreter shuts down
        (that aborted `kf-culler check` now and then, exit -6)."""
        self.stop_event.set()
        for c in [*self._all(), self.nodes]:
            c.interrupt()
        deadline = time.monotonic() + timeout
        for c in [*self._all(), self.nodes]:
            if c.thread.is_alive():
                c.thread.join(max(0.0, deadline - time.monotonic()))

    def _raw(self, name: str) -> dict[Key, bytes]:
        """A collection's objects as kept (encoded), every namespace's together."""
        out: dict[Key, bytes] = {}
        for c in self.collections.get(name, []):
            out.update(c.snapshot())
        return out

    def objects(self, name: str) -> dict[Key, dict[str, Any]]:
        """A collection as the cache holds it now, every namespace's together, decoded."""
        return {k: decoded(v) for k, v in self._raw(name).items()}

    def _now(self, name: str, key: Key) -> dict[str, Any] | None:
        """An object as the cache holds it now (`Seen.now`: the Service checks, the endpoints), decoded; the object
        last read is decoded again only when the cache holds other bytes for it since (a session's Service is read
        for its check, then for its address). Its readers only read it."""
        found = None
        for c in self.collections.get(name, []):
            with c.lock:
                found = c.objects.get(key, found)
        if found is None:
            return None
        last = self._last_read
        if last is not None and last[0] is found:
            return last[1]
        obj = decoded(found)
        self._last_read = (found, obj)
        return obj

    def snapshot(self) -> list[tuple[dict[str, Any], dict[str, Any] | None]]:
        """Every session of the configured targets with its pod (or None), each target's sorted, as the targets
        pair them (`Target.pair`), decoded for the caller; the pods that look like a session's but that its stop
        cannot reach are kept in `orphans` until the next snapshot. The snapshot kept for the Service checks and
        endpoints (`seen`) reads the collections encoded, and keeps none of the pairs it returned."""
        items: list[Item] = []
        self._pair(items.append, lambda item, _seen: item)
        return items

    def packed_pairs(self) -> tuple[list[PackedPair], list[Kept]]:
        """`snapshot` for a lean pass (kf_culler/cycle.py, through `unpacked_pairs`): each pair as its target pairs
        it, held as the bytes the cache holds for its session and pod (no copy: they were decoded from them, and a
        pairing only reads), or encoded (`packed_pair`) where the target made its objects itself, so that no more
        than a pair is held decoded at once where a target pairs one at a time (a Notebook's); and, in the same
        order, each session as `identities` reads it after the pass: the cache's bytes of it where it has them (no
        copy), else its identity (kf_culler/targets/ `identity`) with no pod."""
        items: list[PackedPair] = []
        sessions: list[Kept] = []

        def keep(item: Item, seen: Seen) -> Item:
            nb, pod = item
            raw = _encoded_as(seen, nb)
            raw_pod = None if pod is None else _encoded_as(seen, pod)
            items.append(packed_pair(item) if raw is None or (pod is not None and raw_pod is None) else (raw, raw_pod))
            kept: Item = (identity(nb), None)
            sessions.append(kept if raw is None else raw)
            return kept

        self._pair(None, keep, recent=PAIR_RECENT)
        return items, sessions

    def _pair(self, out: Callable[[Item], None] | None, keep: Callable[[Item, Seen], Item], recent: int = 0) -> None:
        """Pair every target's sessions, each given to `keep` as it is paired (what it returns is what the targets
        paired after it read in `seen.paired`) and then to `out`. `recent`: each collection remembers the bytes of
        its last `recent` decoded objects (`_encoded_as`)."""
        self.seen = Seen(now=self._now)  # the last snapshot's indexes go before this one's are made
        seen = Seen({name: _Decoded(self._raw(name), recent) for name in self.collections}, now=self._now)
        orphans: list[Any] = []
        for t in self.targets:
            paired = t.pair(seen)
            for item in paired.items:  # a pairing may make them as they are read
                kept = keep(item, seen)
                seen.paired.append(kept)
                if out is not None:
                    out(item)
            orphans += paired.orphans  # all known once every item is read
        seen.paired = []
        self.seen, self.orphans = seen, orphans

    def sessions(self) -> Iterator[dict[str, Any]]:
        """Every object in the configured targets' own collections (their sessions, unpaired), as the cache holds
        it now, decoded one at a time: for what reads sessions alone after a pass (metrics), without a second
        snapshot's pairing or holding them all decoded at once."""
        for name in dict.fromkeys(self._sessions.values()):
            for raw in self._raw(name).values():
                yield decoded(raw)

    @property
    def endpoints(self) -> bool:
        """Whether a configured target's IDE is reached through an endpoint its controller made."""
        return any(t.reach == "endpoint" for t in self.targets)

    def endpoint(self, session: dict[str, Any]) -> tuple[str, int, str] | str:
        """(Service name, port, path) of a session's IDE as of the last snapshot, or why it cannot be reached
        safely (`Target.endpoint`)."""
        return target_of(session).endpoint(session, self.seen)

    def service_problem(self, session: dict[str, Any]) -> str | None:
        """Why the Service a session's IDE is probed through cannot be trusted to reach its own pod, or None
        (`Target.service_problem`: the Service as the cache has it now)."""
        return target_of(session).service_problem(session, self.seen)

    def service_address(self, session: dict[str, Any]) -> tuple[str, str] | None:
        """(name, ClusterIP) of the Service a session's IDE is probed through, once it passed its checks
        (`Target.service_address`: the Service as the cache has it now), or None."""
        return target_of(session).service_address(session, self.seen)

    def node(self, name: object) -> dict[str, Any] | None:
        """The cached Node (its GPU model label), or None when unknown or Nodes cannot be read."""
        if not isinstance(name, str) or not name:
            return None
        with self.nodes.lock:
            return self.nodes.objects.get(("", name))

    @property
    def reads_nodes(self) -> bool:
        return self.nodes.synced.is_set() and not self.nodes.forbidden

    def record_objects(self) -> list[dict[str, Any]]:
        """The ConfigMaps that hold the culler's records, as the watch has them (decoded for the caller)."""
        return [decoded(cm) for c in self.records for cm in c.snapshot().values()]

    def record_notebook(self, obj: dict[str, Any]) -> None:
        """Keep a session as the culler's own patch left it (the watch will confirm it)."""
        name = self._sessions.get(kind_of(obj))
        if name is None:
            return
        ns = _key(obj)[0]
        for c in self.collections.get(name, []):
            if c.name in (name, f"{name}/{ns}"):
                c.put(obj)

    def stats(self) -> dict[str, int]:
        cols = self._all()
        return {"lists": sum(c.lists for c in cols), "watchEvents": sum(c.watch_events for c in cols),
                "watchErrors": sum(c.errors for c in cols)}

