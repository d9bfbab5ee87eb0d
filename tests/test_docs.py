"""The documentation describes what exists: every configuration key is documented, every documented
command exists, and the shipped examples load."""

from __future__ import annotations

import re
import typing
from pathlib import Path

import pytest
from pydantic import BaseModel

from kf_culler import config
from kf_culler.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]


def keys(model: type[BaseModel], prefix: str = "") -> list[str]:
    out = []
    for name, field in model.model_fields.items():
        key = prefix + (field.alias or name)
        ann = field.annotation
        inner = [a for a in typing.get_args(ann) if a is not type(None)]  # `Section | None`: the section's keys
        if len(inner) == 1 and isinstance(inner[0], type) and issubclass(inner[0], BaseModel):
            ann = inner[0]
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            out += keys(ann, key + ".")
        else:
            out.append(key)
    return out


ALL_KEYS = keys(config.Policy) + keys(config.Operations)


@pytest.mark.parametrize("key", ALL_KEYS)
def test_every_config_key_is_documented(key: str) -> None:
    assert f"`{key}`" in (ROOT / "docs" / "configuration.md").read_text()


def test_documented_keys_exist() -> None:
    text = (ROOT / "docs" / "configuration.md").read_text()
    documented = set(re.findall(r"^\| `([A-Za-z.]+)` \|", text, re.M))
    assert documented and documented <= set(ALL_KEYS)


def test_readme_commands_exist() -> None:
    text = (ROOT / "README.md").read_text()
    subcommands = set(build_parser()._subparsers._group_actions[0].choices)  # type: ignore[union-attr]
    for name in re.findall(r"`kf-culler ([a-z][a-z-]*[a-z])", text):
        assert name in subcommands, name
    for path in re.findall(r"`((?:docs|kustomize|examples|hack)/[^`\s]*)`", text):
        assert (ROOT / path.rstrip("/")).exists(), path


@pytest.mark.parametrize("path", sorted((ROOT / "examples").glob("*.yaml")), ids=lambda p: p.name)
def test_examples_load(path: Path) -> None:
    config.load_file(path)
