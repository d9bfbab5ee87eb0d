"""The probes' request line and Host header (kf_culler/sources/http.py `_split`): plain URLs are cut without
`urlsplit`'s general parse, and every URL, plain or not, gives what `urlsplit` reads of it (scheme, host name,
port, path and query, Host header), or the same refusal."""

from __future__ import annotations

from urllib.parse import urlsplit

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from kf_culler.errors import Permanent
from kf_culler.sources.http import _split


def by_urlsplit(url: str) -> tuple[str, str, int, str, str] | None:
    try:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            return None
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        return None
    return (parts.scheme, parts.hostname, port, (parts.path or "/") + (f"?{parts.query}" if parts.query else ""),
            parts.netloc.rpartition("@")[2])


def ours(url: str) -> tuple[str, str, int, str, str] | None:
    try:
        return _split(url)
    except (Permanent, ValueError):
        return None


PIECES = st.sampled_from(["http", "https", "ftp", "HTTP", "://", ":", "/", "?", "#", "@", "[", "]", ".", "-",
                          "nb", "team-a", "svc", "cluster", "local", "NB", "80", "8888", "0", "65536", "99999",
                          "10.96.0.9", "::1", "api", "status", "no_track_activity=1", "%2F", " ", "\u00e9"])


@settings(max_examples=3000, deadline=None)
@given(st.lists(PIECES, max_size=14).map("".join))
@example("http://nb.team-a.svc.cluster.local/notebook/team-a/nb/api/status?no_track_activity=1")
@example("http://nb.team-a.svc.cluster.local")
@example("https://ws-svc.team.svc.cluster.local:8888/workspace/connect/team/ws/jupyterlab/api/kernels")
@example("http://10.96.0.9:80/")
@example("http://nb.team:/x")
@example("http://user@nb.team/x")
@example("http://NB.team/x#frag")
@example("http://nb.team:0/")
def test_split_reads_what_urlsplit_reads(url: str) -> None:
    assert ours(url) == by_urlsplit(url)


@pytest.mark.parametrize("url,want", [
    ("http://nb.team-a.svc.cluster.local/notebook/team-a/nb/api/status?no_track_activity=1",
     ("http", "nb.team-a.svc.cluster.local", 80, "/notebook/team-a/nb/api/status?no_track_activity=1",
      "nb.team-a.svc.cluster.local")),
    ("https://ws.team.svc.cluster.local:8888/", ("https", "ws.team.svc.cluster.local", 8888, "/",
                                                 "ws.team.svc.cluster.local:8888")),
    ("http://nb.team", ("http", "nb.team", 80, "/", "nb.team")),
])
def test_plain_urls(url: str, want: tuple[str, str, int, str, str]) -> None:
    assert _split(url) == want
