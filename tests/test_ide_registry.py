"""The IDE registry (kf_culler/ide.py) is the one place an IDE kind is named: every kind has a probe or a
bulk source, a URL template when it is probed by URL, a server-type value the configuration accepts and a
name in `check`'s table; and outside the files that must spell them, no module names an IDE's source or
server type."""

from __future__ import annotations

import re
from pathlib import Path
from typing import get_args

from kf_culler import gather
from kf_culler.config import ServerType, Urls
from kf_culler.ide import IDE_KINDS, KNOWN_SERVER_TYPES
from kf_culler.report import TYPE_NAMES

PACKAGE = Path(__file__).resolve().parents[1] / "kf_culler"
# Files allowed to spell an IDE's source or server type: the registry, the configuration's accepted values
# and URL keys, the gather's probe table, the probe adapters themselves, the synthetic fleet generator, and the
# local Coder server for the tests (where "coder" names Coder's binary, its build and its database user).
ALLOWED = {"ide.py", "config.py", "gather.py", "sources/jupyter.py", "sources/codeserver.py", "sources/rstudio.py",
           "replay/fleet.py", "local/coder.py"}


def test_every_kind_has_a_way_to_be_read() -> None:
    for kind in IDE_KINDS:
        if kind.url_key is not None:
            assert Urls().template_for(kind.url_key), kind
            assert kind.source in gather.PROBES, kind
        else:
            assert kind.source in gather.BULK_IDE_SOURCES, kind
    assert set(gather.PROBES) == {k.source for k in IDE_KINDS if k.url_key is not None}


def test_the_configuration_and_the_report_know_every_kind() -> None:
    assert set(get_args(ServerType)) == KNOWN_SERVER_TYPES
    assert set(TYPE_NAMES) == KNOWN_SERVER_TYPES


def test_no_other_module_names_an_ide() -> None:
    names = {k.source for k in IDE_KINDS if k.source != "jupyter"} | {k.server_type for k in IDE_KINDS
                                                                     if k.server_type != "jupyter"}
    pattern = re.compile("|".join(rf"[\"']{re.escape(n)}[\"']" for n in sorted(names)))
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if rel in ALLOWED:
            continue
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if pattern.search(line):
                found.append(f"{rel}:{n}: {line.strip()}")
    assert not found, "IDE names outside the registry:\n" + "\n".join(found)
