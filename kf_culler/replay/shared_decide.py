"""One `decide` call for every policy that would decide alike: the sweep's shared decisions.

`decide_view(view, observations, policy, now)` is a pure function, and it reads the policy only through its
attributes. It is run here with the policy behind a proxy that notes every attribute read and the value it
gave (a nested setting, such as `policy.gpu`, gives a proxy of its own). Run on the same view, observations
and time, a policy that gives the same value at every one of those reads takes the same path through
`decide` and gets the same verdict: nothing else it holds was looked at. So the policies of a sweep that
check one notebook at one record are sorted by the values they give at the reads of a first call; those
that give the first call's values share its verdict, and each other set gets a call of its own (and is
sorted again by that call's reads). The evidence (kf_culler/rules/evidence.py `read_evidence`, decide's first
half) is kept the same way: read once, with the reads it made, and given to every later call whose policy gives
the same values there; only the rules (`decide_evidence`) run again. The rules stay in `decide` alone; nothing
here knows them.

A policy read that is a method (not a value) cannot be compared: then every policy gets its own call.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from operator import itemgetter
from typing import Any, cast

from pydantic import BaseModel

from kf_culler.config import Policy
from kf_culler.model import Verdict
from kf_culler.rules import decide_view
from kf_culler.rules.evidence import Evidence, read_evidence
from kf_culler.rules.table import decide_evidence
from kf_culler.session import SessionView

Path = tuple[str, ...]
Reads = tuple[tuple[Path, ...], tuple[object, ...]]  # the paths read, in order, and the (type, value) of each


class _Opaque(Exception):
    """decide used something of the policy that is not a plain value."""


class _Known:
    """One policy as the proxy reads it: what each path gave (a policy's values never change, so each is got
    once), the proxy itself (kept, with its nested settings' proxies) and the reads of the call under way."""

    __slots__ = ("log", "policy", "reading", "values")

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self.values: dict[Path, object] = {}  # path -> (type, value), as value_at gives it
        self.log: list[tuple[Path, object]] = []  # the reads of one traced_decide call, in order
        self.reading = _reading(policy, (), self)

    def at(self, path: Path) -> object:
        """value_at(self.policy, path), got once."""
        found = self.values.get(path)
        if found is None:
            found = self.values[path] = value_at(self.policy, path)
        return found


class _Reading:
    """A policy (or one of its nested settings) that notes every attribute read through it in its _Known's log.
    Made by `_reading`, as an instance of a subclass with a property for each of the model's fields."""

    __slots__ = ("_known", "_obj", "_path", "_seen")

    def __init__(self, obj: BaseModel, path: Path, known: _Known) -> None:
        self._obj, self._path, self._known = obj, path, known
        self._seen: dict[str, _Reading | tuple[Path, object]] = {}  # name -> its proxy, or (path, (type, value))

    def _read(self, name: str) -> Any:
        seen = self._seen.get(name)
        if seen is None:
            seen = self._seen[name] = self._first_read(name)
        if isinstance(seen, _Reading):
            return seen
        self._known.log.append(seen)
        return cast(tuple[type, Any], seen[1])[1]

    __getattr__ = _read  # what is not a field (a property or a method of the model): read the slow way

    def _first_read(self, name: str) -> _Reading | tuple[Path, object]:
        value = getattr(self._obj, name)
        path = (*self._path, name)
        if isinstance(value, BaseModel):
            return _reading(value, path, self._known)
        if callable(value):
            raise _Opaque(".".join(path))
        noted = self._known.values[path] = (type(value), value)
        return path, noted


_READINGS: dict[type[BaseModel], type[_Reading]] = {}


def _field(name: str) -> property:
    return property(lambda self: self._read(name))


def _reading(obj: BaseModel, path: Path, known: _Known) -> _Reading:
    """A proxy of obj. Its class has a property for each field of obj's model: a read found on the class costs a
    fraction of one that goes through __getattr__ (Python tries the usual lookup first and raises inside)."""
    model = type(obj)
    cls = _READINGS.get(model)
    if cls is None:
        cls = _READINGS[model] = type(f"_Reading{model.__name__}", (_Reading,),
                                      {"__slots__": (), **{name: _field(name) for name in model.model_fields}})
    return cls(obj, path, known)


def value_at(policy: Policy, path: Path) -> object:
    """What reading path of policy gives, as the proxy notes it."""
    obj: Any = policy
    for name in path:
        obj = getattr(obj, name)
    return (type(obj), obj)


class Evidences:
    """The evidence read for one notebook's observations at one time, kept with the policy reads reading it made:
    a policy that gives the same values at those reads reads the same evidence (read_evidence is pure)."""

    def __init__(self) -> None:
        self.parsed: dict[str, object] = {}  # each source parsed once (decide_view's `parsed`)
        self.read: list[tuple[tuple[Path, ...], tuple[object, ...], Evidence]] = []

    def of(self, known: _Known) -> tuple[tuple[Path, ...], tuple[object, ...], Evidence] | None:
        for paths, values, ev in self.read:
            if tuple(map(known.at, paths)) == values:
                return paths, values, ev
        return None


def _split(log: list[tuple[Path, object]]) -> Reads:
    """The paths read, and the values they gave, of a log."""
    return tuple(map(itemgetter(0), log)), tuple(map(itemgetter(1), log))


def traced_decide(view: SessionView, observations: dict[str, Any], policy: Policy, now: datetime,
                  evidences: Evidences | None = None, known: _Known | None = None) -> tuple[Verdict, Reads | None]:
    """decide_view's verdict, and the policy reads it made (None when one could not be compared). `evidences`:
    what earlier calls on the same view, observations and time read; `known`: the policy's proxy, kept between
    calls (Signatures)."""
    evidences = evidences if evidences is not None else Evidences()
    known = known if known is not None else _Known(policy)
    log = known.log
    log.clear()
    reading = cast(Policy, known.reading)
    try:
        found = evidences.of(known)
        if found is None:
            ev = read_evidence(view, observations, reading, now, evidences.parsed)
            evidences.read.append((*_split(log), ev))
        else:
            paths, values, ev = found
            log.extend(zip(paths, values, strict=True))
        verdict = decide_evidence(ev, reading, now)
    except _Opaque:
        return decide_view(view, observations, policy, now, parsed=evidences.parsed), None
    return verdict, _split(log)


class _Sorted:
    """The policies of one list, with their proxies, sorted by the values they give at each set of reads asked."""

    def __init__(self, known: list[_Known]) -> None:
        self.known = known
        self._parts: dict[tuple[Path, ...], dict[tuple[object, ...], list[int]]] = {}

    def partition(self, paths: tuple[Path, ...]) -> dict[tuple[object, ...], list[int]]:
        """values -> the positions in the list of the policies that give them at paths."""
        found = self._parts.get(paths)
        if found is None:
            found = self._parts[paths] = {}
            for i, known in enumerate(self.known):
                found.setdefault(tuple(map(known.at, paths)), []).append(i)
        return found


class Signatures:
    """What the sweep knows of its policies (a policy's values never change; the policies are the sweep's, alive
    while it runs): each one's proxy and the values it gave, and the policies of each list sorted by the values
    they give at a set of reads."""

    def __init__(self) -> None:
        self._known: dict[int, _Known] = {}
        self._sorted: dict[tuple[int, ...], _Sorted] = {}

    def known(self, policy: Policy) -> _Known:
        """The policy's proxy and the values it gave (kept with it, so its id stays its own)."""
        found = self._known.get(id(policy))
        if found is None:
            found = self._known[id(policy)] = _Known(policy)
        return found

    def sorted(self, policies: Sequence[Policy]) -> _Sorted:
        key = tuple(map(id, policies))
        found = self._sorted.get(key)
        if found is None:
            found = self._sorted[key] = _Sorted([self.known(p) for p in policies])
        return found


def shared_verdicts(view: SessionView, observations: dict[str, Any], policies: Sequence[Policy], now: datetime,
                    signatures: Signatures) -> tuple[list[tuple[Verdict, list[int]]], int]:
    """The verdicts of policies for one notebook (its view and observations) at now, each exactly as decide_view
    gives it, with the positions in policies of those it is for; and the number of decide calls made."""
    out: list[tuple[Verdict, list[int]]] = []
    pending = set(range(len(policies)))
    calls = 0
    evidences = Evidences()  # each source parsed, and the evidence read, once for all these decisions
    known = signatures.sorted(policies)
    while pending:
        first = min(pending)
        verdict, reads = traced_decide(view, observations, policies[first], now, evidences, known.known[first])
        calls += 1
        if reads is None:
            out.append((verdict, [first]))
            for i in sorted(pending - {first}):
                out.append((decide_view(view, observations, policies[i], now, parsed=evidences.parsed), [i]))
                calls += 1
            break
        paths, values = reads
        same = [i for i in known.partition(paths).get(values, ()) if i in pending]
        if first not in same:  # not reached: a policy gives its own values
            same.append(first)
        pending.difference_update(same)
        out.append((verdict, same))
    return out, calls
