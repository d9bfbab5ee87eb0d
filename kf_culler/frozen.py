"""A frozen dataclass with some fields changed, copied without running its `__init__`.

A pass copies each session's view and selection several times (its record and stop deadline added, its pod taken
out while the pass holds it encoded and put back to judge and act it): `dataclasses.replace` calls the class's
generated `__init__` with every field by keyword, about 4 µs for a view's 22 fields, some 0.3 CPU s a pass at
10,000 sessions. For a class whose `__init__` only stores its fields (no `__post_init__`, no init-only or
non-init fields, no cached properties) the copy of its attributes with the changes applied is the same object
`replace` makes.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, TypeVar

T = TypeVar("T")

_plain: dict[type, frozenset[str]] = {}  # by class: its field names, when its __init__ only stores them


def _fields_of(cls: type) -> frozenset[str] | None:
    """The field names of a dataclass whose instances `replaced` may copy; None when it must use `replace`."""
    found = _plain.get(cls)
    if found is not None:
        return found
    if not dataclasses.is_dataclass(cls) or hasattr(cls, "__post_init__") or hasattr(cls, "__slots__"):
        return None
    fields = dataclasses.fields(cls)  # not its ClassVars and InitVars, which its __init__ would read
    if len(fields) != len(cls.__dataclass_fields__) or not all(f.init for f in fields) \
            or any(isinstance(v, functools.cached_property) for v in vars(cls).values()):
        return None
    found = _plain[cls] = frozenset(f.name for f in fields)
    return found


def replaced(obj: T, **changes: Any) -> T:
    """`dataclasses.replace(obj, **changes)`, faster for a plain frozen dataclass; TypeError for a name that is not
    one of its fields, as `replace` gives."""
    names = _fields_of(type(obj))
    if names is None:
        return dataclasses.replace(obj, **changes)  # type: ignore[type-var]
    unknown = changes.keys() - names
    if unknown:
        raise TypeError(f"{type(obj).__name__} has no field {sorted(unknown)[0]!r}")
    new: Any = object.__new__(type(obj))
    new.__dict__.update(obj.__dict__)
    new.__dict__.update(changes)
    return new  # type: ignore[no-any-return]
