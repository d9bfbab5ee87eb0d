"""The IDE kinds a notebook can run, in one place: which server type reads which source, and how.

Rule 4 (docs/decisions.md): the annotation `notebooks.kubeflow.org/server-type` picks the kind; only that
kind's source is evidence about the IDE. A new IDE is one more `IdeKind` here, plus its source: a probe in
kf_culler/gather.py `PROBES` (keyed by `source`) when it is probed by URL (`url_key`, a key of the `urls`
config), else a bulk source; its `ServerType` value in kf_culler/config.py. tests/test_ide_registry.py
checks that every kind has what it needs and that nothing else names an IDE.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from kf_culler.readings import IdeReading, parse_code_server, parse_coder, parse_jupyter, parse_rstudio


@dataclass(frozen=True)
class IdeKind:
    server_type: str  # the value of notebooks.kubeflow.org/server-type
    source: str  # the observations key of its source
    name: str  # as users know it (lower-cased in `check`'s table)
    parse: Callable[[object], IdeReading]
    idle_words: str  # what "idle" means for it, in a reason
    busy_words: str  # what "busy" means for it, in a reason
    connected_words: str  # what "connected" means for it, in a reason
    url_key: str | None  # the `urls` config key of its probe URL template; None: not probed by URL
    connection_is_only_signal: bool = False  # when connected, the IDE says nothing else about idleness


# A Coder workspace (docs/targets.md, "Coder workspaces") is its own IDE: its signal is what Coder's API says
# of it (agents, `last_used_at`), listed once per pass with the workspaces; the Coder target has this name too.
CODER_SERVER_TYPE = "coder"

IDE_KINDS: tuple[IdeKind, ...] = (
    IdeKind("jupyter", "jupyter", "Jupyter", parse_jupyter,
            idle_words="no kernel, terminal or server activity",
            busy_words="A kernel is running code",
            connected_words="A client is connected to a kernel",
            url_key="jupyter"),
    IdeKind("group-one", "codeServer", "code-server", parse_code_server,
            idle_words="no browser connected to code-server",
            busy_words="code-server is running work",
            connected_words="A browser is connected",
            url_key="codeServer", connection_is_only_signal=True),
    IdeKind("group-two", "rstudio", "RStudio", parse_rstudio,
            idle_words="no RStudio activity",
            busy_words="RStudio is running work",
            connected_words="A browser is connected",
            url_key=None),
    IdeKind(CODER_SERVER_TYPE, CODER_SERVER_TYPE, "Coder", parse_coder,
            idle_words="no connection to the Coder workspace",
            busy_words="Coder reports work in the workspace",
            connected_words="Coder reports a connection to the workspace",
            url_key=None, connection_is_only_signal=True),
)
BY_SERVER_TYPE: dict[str, IdeKind] = {k.server_type: k for k in IDE_KINDS}
DEFAULT_SERVER_TYPE = "jupyter"  # a notebook without the annotation (or a matching image rule), or an unknown one
KNOWN_SERVER_TYPES: frozenset[str] = frozenset(BY_SERVER_TYPE)
# What a Notebook, a Workspace or a workload can be: not Coder, whose signal only a Coder workspace has (its
# server-type annotation written on anything else is an unknown value, read as Jupyter: rule 16).
NOTEBOOK_SERVER_TYPES: frozenset[str] = KNOWN_SERVER_TYPES - {CODER_SERVER_TYPE}

# Derived views, for code that wants one fact only.
SERVER_SOURCES: dict[str, str] = {k.server_type: k.source for k in IDE_KINDS}
IDE_SOURCES: tuple[str, ...] = tuple(k.source for k in IDE_KINDS)


def for_server_type(server_type: str) -> IdeKind | None:
    return BY_SERVER_TYPE.get(server_type)
