"""The documentation describes what exists: every configuration key is documented, every documented
command exists, and the shipped examples load."""

from __future__ import annotations

import argparse
import re
import shlex
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


# --- the docs' kf-culler commands, as written --------------------------------------------------------------

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SHELL_BLOCKS = ("", "sh", "bash", "shell", "console")
# `kf-culler` as a command: at the start, after a shell operator, or after kubectl exec's `--`.
COMMAND = re.compile(r"(?:^|&&|;|\||--|\$)\s*kf-culler\s+(.*)$")


def _subcommands() -> dict[str, argparse.ArgumentParser]:
    (sub,) = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(sub.choices)


def _argv(rest: str) -> list[str] | None:
    """The arguments after `kf-culler`, up to a shell operator or comment; None for a line that is not a command
    (a log line such as `kf-culler run: config.yaml: unknown key ...`)."""
    argv = []
    for token in shlex.split(rest, comments=True):
        if token in ("&&", "||", "|", ";") or token.startswith((">", "2>")):
            break
        argv.append(token)
    return argv if argv and re.fullmatch(r"[a-z][a-z-]*", argv[0]) else None


def shell_commands(text: str) -> list[list[str]]:
    """Every `kf-culler ...` command line in the shell (or unmarked) code blocks, continuation lines joined."""
    out = []
    for lang, body in re.findall(r"```([a-z]*)\n(.*?)```", text, re.S):
        if lang in SHELL_BLOCKS:
            for line in body.replace("\\\n", " ").splitlines():
                if (m := COMMAND.search(line.strip())) and (argv := _argv(m.group(1))) is not None:
                    out.append(argv)
    return out


def inline_commands(text: str) -> list[list[str]]:
    """Every `kf-culler ...` in an inline code span (a command named in a sentence, often with a flag or two)."""
    out = []
    for span in re.findall(r"`([^`]+)`", re.sub(r"```.*?```", "", text, flags=re.S)):
        if (m := COMMAND.search(span.replace("\n", " ").strip())) and (argv := _argv(m.group(1))) is not None:
            out.append(argv)
    return out


@pytest.mark.parametrize("path", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_kf_culler_command_line_in_the_docs_parses_as_written(path: Path) -> None:
    """A command line in a shell block is copy-pasteable: the culler's own parser takes it whole."""
    for argv in shell_commands(path.read_text()):
        try:
            build_parser().parse_args(argv)
        except SystemExit as e:
            raise AssertionError(f"{path.name}: `kf-culler {shlex.join(argv)}` does not parse") from e


@pytest.mark.parametrize("path", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_kf_culler_command_named_in_the_docs_exists_with_its_options(path: Path) -> None:
    """A command named in a sentence (`kf-culler check -o wide`) is a real command, and each option it shows
    is one of that command's."""
    commands = _subcommands()
    for argv in inline_commands(path.read_text()):
        assert argv[0] in commands, f"{path.name}: `kf-culler {shlex.join(argv)}`: no command {argv[0]!r}"
        options = set(commands[argv[0]]._option_string_actions)
        for token in argv[1:]:
            if token.startswith("-"):
                assert token.split("=", 1)[0] in options, f"{path.name}: `kf-culler {shlex.join(argv)}`: no {token}"


def test_the_docs_have_kf_culler_command_lines() -> None:
    """The two tests above read something: the docs' shell blocks give every cluster command and replay's."""
    found = {argv[0] for path in DOCS for argv in shell_commands(path.read_text())}
    assert found >= {"check", "explain", "release-brakes", "demo", "fleet", "replay"}
