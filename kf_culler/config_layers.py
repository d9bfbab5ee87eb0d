"""The configuration the culler runs with: the admin's file plus the fragments components add beside it.

A kustomize component never replaces the admin's `config.yaml`: it adds a fragment, a file of its own named
`<component>.fragment.yaml`, to the same ConfigMap, so both land in the directory the ConfigMap is mounted at.
The culler reads `--config FILE` and every `*.fragment.yaml` in FILE's directory, merged in this order:

1. the fragments, by file name; a key two fragments both set to different values is an error naming both
   files and the key, unless the admin's file sets it; mappings are merged key by key, so two fragments may
   fill different keys of one section;
2. `targets` is a union: the admin's `targets` (or the default, `[notebooks]`, when the admin's file sets none),
   then each target a fragment adds, in fragment order;
3. the admin's file last: every other key it sets (at any depth of a mapping) wins over the fragments'.

A key is then reported with the file that set it (`workspaces.fragment.yaml: key 'targets[0]': ...`).
docs/configuration.md, "Fragments".
"""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

from kf_culler.config import ConfigError, Operations, Settings, load_mapping, read_data, unknown_keys

FRAGMENT_SUFFIX = ".fragment.yaml"
_UNION_KEYS = ("targets",)


def fragment_paths(config: str | Path) -> list[Path]:
    """The fragments beside the admin's file, in the order they are merged (by name)."""
    own = Path(config)
    return sorted((p for p in own.parent.glob(f"*{FRAGMENT_SUFFIX}")
                   if p.is_file() and not p.name.startswith(".") and p.name != own.name), key=lambda p: p.name)


class Origins:
    """Which file set each key: called with a dotted key (`coder.url`, `rules[0].policy.idleMinutes`), the file
    that set it or the nearest mapping holding it; with '' (the whole configuration), every file."""

    def __init__(self, files: list[str]) -> None:
        self.files = files
        self.by_key: dict[str, str] = {}

    def set(self, key: str, source: str) -> None:
        for k in [k for k in self.by_key if k.startswith(f"{key}.") or k.startswith(f"{key}[")]:
            del self.by_key[k]
        self.by_key[key] = source

    def __call__(self, key: str) -> str:
        key = re.sub(r"\.(\d+)(?=\.|\[|$)", r"[\1]", key)  # pydantic's `targets.0` is `targets[0]`
        while key:
            if key in self.by_key:
                return self.by_key[key]
            cut = max(key.rfind("."), key.rfind("["))
            key = key[:cut] if cut > 0 else ""
        return " + ".join(self.files)


def _mapping(data: object, source: str) -> dict[str, Any]:
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: the configuration must be a mapping, not {type(data).__name__}")
    unknown = unknown_keys(data)
    if unknown:
        raise ConfigError(f"{source}: unknown key '{unknown[0]}'" + (
            f" (and {len(unknown) - 1} more)" if len(unknown) > 1 else ""))
    return {str(k): v for k, v in data.items()}


def _add_fragment(into: dict[str, Any], data: dict[str, Any], source: str, origins: Origins, prefix: str,
                  conflicts: list[str]) -> None:
    for key, value in data.items():
        where = f"{prefix}{key}"
        if key not in into:
            into[key] = copy.deepcopy(value)
            origins.set(where, source)
        elif isinstance(into[key], dict) and isinstance(value, dict):
            _add_fragment(into[key], value, source, origins, f"{where}.", conflicts)
        elif into[key] != value:
            conflicts.append(where)
            conflicts.append(f"{source}: key '{where}': set to {value!r} here and to {into[key]!r} in "
                             f"{origins(where)}; two fragments may not set one key differently (set it in the "
                             "admin's file, which wins over both, or drop one of the components)")


def _add_admin(into: dict[str, Any], data: dict[str, Any], source: str, origins: Origins, prefix: str) -> None:
    for key, value in data.items():
        where = f"{prefix}{key}"
        if isinstance(into.get(key), dict) and isinstance(value, dict):
            _add_admin(into[key], value, source, origins, f"{where}.")
        else:
            into[key] = copy.deepcopy(value)
            origins.set(where, source)


def merge(admin: tuple[str, object], fragments: list[tuple[str, object]]) -> tuple[dict[str, Any], Origins]:
    """The merged configuration mapping and where each key came from (module docstring for the order)."""
    admin_name, admin_raw = admin
    mine = _mapping(admin_raw, admin_name)
    origins = Origins([admin_name, *(name for name, _ in fragments)])
    merged: dict[str, Any] = {}
    added: dict[str, list[tuple[str, Any]]] = {k: [] for k in _UNION_KEYS}
    conflicts: list[str] = []  # key, message, key, message, ...
    for name, raw in fragments:
        data = _mapping(raw, name)
        for key in _UNION_KEYS:
            if key in data:
                value = data.pop(key)
                if not isinstance(value, list):
                    raise ConfigError(f"{name}: key '{key}' must be a list")
                added[key] += [(name, v) for v in value]
        _add_fragment(merged, data, name, origins, "", conflicts)
    _add_admin(merged, {k: v for k, v in mine.items() if k not in _UNION_KEYS}, admin_name, origins, "")
    for where, message in zip(conflicts[::2], conflicts[1::2], strict=True):
        if origins(where) != admin_name:  # the admin's file did not settle it
            raise ConfigError(message)
    for key in _UNION_KEYS:
        if not added[key]:
            if key in mine:
                merged[key] = copy.deepcopy(mine[key])
                origins.set(key, admin_name)
            continue
        if key in mine and not isinstance(mine[key], list):
            raise ConfigError(f"{admin_name}: key '{key}' must be a list")
        union = list(mine[key]) if key in mine else list(Operations.model_fields[key].default)
        names = [admin_name] * len(union)
        for name, value in added[key]:
            if value not in union:
                union.append(value)
                names.append(name)
        merged[key] = union
        for i, name in enumerate(names):
            origins.set(f"{key}[{i}]", name)
    return merged, origins


def load_layered(config: str | Path) -> Settings:
    """The admin's file `config` with the fragments beside it (module docstring), validated; a bad key is named
    with the file that set it. Without fragments, exactly `load_file(config)`."""
    fragments = fragment_paths(config)
    admin = (str(Path(config)), read_data(config))
    if not fragments:
        return load_mapping(admin[1], admin[0])
    merged, origins = merge(admin, [(str(p), read_data(p)) for p in fragments])
    return load_mapping(merged, origins)
