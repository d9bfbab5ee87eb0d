"""The Coder harness (kf_culler.local.coder) against a real Coder v2.36.0 server on loopback: its own
PostgreSQL (Debian's), Terraform v1.14.5 and the coder/coder provider from a filesystem mirror, all built
by hack/coder/build.sh into the cache on first use (cold: about 13 minutes).

What a culler of Coder workspaces relies on, as the write-up found it on kind (shared/seeds): a stop is
a build (`POST /api/v2/workspaces/{id}/builds {"transition": "stop"}`) that the owner (site admin) token
may make for anyone's workspace and that another member's token is answered 404 for, as if the workspace
were not there.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from need import missing

from kf_culler.local import procs
from kf_culler.local.coder import (
    CODER_VERSION,
    CoderAPIError,
    CoderServer,
    CoderUnavailable,
    Session,
    ensure_binaries,
    postgres_bindir,
)


@pytest.fixture(scope="module")
def coder() -> Iterator[CoderServer]:
    """One Coder server for the module; built on first use, skipped (failed in CI) if it cannot be had."""
    try:
        postgres_bindir()
    except CoderUnavailable as why:
        missing("PostgreSQL", why)
    try:
        binaries = ensure_binaries(quiet=False)
    except CoderUnavailable as why:
        missing("Coder", why)
    with CoderServer(binaries) as server:  # a server that is built but does not start fails the test
        yield server


@pytest.fixture(scope="module")
def template(coder: CoderServer) -> dict[str, Any]:
    return coder.push_template("session")


def test_buildinfo_is_the_pinned_release(coder: CoderServer) -> None:
    info = coder.get("/api/v2/buildinfo", token="")
    assert info["version"].split("+")[0] == CODER_VERSION
    assert info["telemetry"] is False


def test_first_user_is_owner_and_logs_in(coder: CoderServer) -> None:
    assert coder.owner is not None
    me = coder.get("/api/v2/users/me")
    assert me["username"] == coder.owner.username
    assert "owner" in {r["name"] for r in me["roles"]}
    # a second login gives a token of its own, which works as well
    token = coder.login(coder.owner.email)
    assert token != coder.owner.token
    assert coder.get("/api/v2/users/me", token=token)["id"] == me["id"]
    with pytest.raises(CoderAPIError) as err:
        coder.get("/api/v2/users/me", token="not-a-token")
    assert err.value.status == 401


def _sockets_of(pids: set[int]) -> set[str]:
    inodes: set[str] = set()
    for pid in pids:
        fd_dir = Path(f"/proc/{pid}/fd")
        try:
            fds = os.listdir(fd_dir)
        except OSError:
            continue
        for fd in fds:
            try:
                link = os.readlink(fd_dir / fd)
            except OSError:  # closed meanwhile (the listing's own fd, for one)
                continue
            if link.startswith("socket:["):
                inodes.add(link[len("socket:["):-1])
    return inodes


def _listening(inodes: set[str], pid: int) -> list[str]:
    """Local addresses (hex, as /proc/net/tcp shows them) of the LISTEN (TCP) and unconnected (UDP)
    sockets among `inodes`, from the tables of pid's network namespace."""
    found = []
    for table in ("tcp", "tcp6", "udp", "udp6"):
        with open(f"/proc/{pid}/net/{table}") as fh:
            next(fh)
            for line in fh:
                f = line.split()
                listening = f[3] == "0A" if table.startswith("tcp") else f[3] == "07"
                if listening and f[9] in inodes:
                    found.append(f"{table}:{f[1]}")
    return found


def _group_pids(pgid: int) -> set[int]:
    pids = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.getpgid(int(entry)) == pgid:
                    pids.add(int(entry))
            except OSError:
                continue
    return pids


LOOPBACK = ("0100007F:", "00000000000000000000000001000000:")  # 127.0.0.1 and ::1, as /proc/net shows them


def test_nothing_listens_beyond_loopback(coder: CoderServer) -> None:
    assert coder.proc is not None and coder.pg is not None and coder.pg.proc is not None
    # PostgreSQL: no TCP or UDP socket at all (Coder reaches it through its Unix socket)
    pg_pids = _group_pids(coder.pg.proc.pid)
    assert pg_pids and all(not _listening(_sockets_of({p}), p) for p in pg_pids)
    # the relay in this process: Coder's URL, on 127.0.0.1 only
    mine = _listening(_sockets_of({os.getpid()}), os.getpid())
    ours = [a for a in mine if int(a.rsplit(":", 1)[1], 16) == coder.port]
    assert ours and all(a.split(":", 1)[1].startswith(LOOPBACK) for a in ours), mine
    # Coder itself: 127.0.0.1:port in its own namespace; its UDP wildcard sockets are there too
    inside = [a for p in _group_pids(coder.proc.pid) for a in _listening(_sockets_of({p}), p)]
    tcp = [a for a in inside if a.startswith("tcp")]
    assert tcp and all(a.split(":", 1)[1].startswith(LOOPBACK) for a in tcp), inside


def test_coder_listens_in_a_namespace_of_its_own(coder: CoderServer) -> None:
    """`coder server` binds UDP on 0.0.0.0 and [::] (tailnet's magicsock): in its namespace, only lo."""
    assert coder.proc is not None
    pids = _group_pids(coder.proc.pid)
    here = os.readlink("/proc/self/ns/net")
    namespaces = {os.readlink(f"/proc/{pid}/ns/net") for pid in pids}
    assert here not in namespaces and len(namespaces) == 1
    pid = next(iter(pids))
    assert _links_in(pid) == ["lo"]


def test_a_port_of_this_machine_is_reached_inside_coders_namespace_and_only_there(coder: CoderServer) -> None:
    """`reaching(port)`: what Terraform in Coder's namespace needs to reach a cluster's API server on this
    machine's 127.0.0.1 (tests/test_coder_kind.py). Reached there at the same address while it lasts, not
    before nor after; the relay in the namespace listens on its 127.0.0.1 only."""
    assert coder.proc is not None
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]

    def serve() -> None:
        with contextlib.suppress(OSError):
            while True:
                conn, _ = server.accept()
                with conn:
                    conn.sendall(b"here:" + conn.recv(64))

    threading.Thread(target=serve, daemon=True).start()
    inside = ["nsenter", f"--net=/proc/{coder.proc.pid}/ns/net", "--", sys.executable, "-c",
              f"import socket; s = socket.create_connection(('127.0.0.1', {port}), 5); s.sendall(b'ping'); "
              "print(s.recv(64).decode())"]
    try:
        assert subprocess.run(inside, capture_output=True, text=True).returncode != 0  # not before
        with coder.reaching(port):
            done = subprocess.run(inside, capture_output=True, text=True)
            assert done.stdout.strip() == "here:ping", done.stderr
            ports = [a for p in _pids_in_namespace_of(coder.proc.pid) for a in _listening(_sockets_of({p}), p)
                     if a.startswith("tcp") and int(a.rsplit(":", 1)[1], 16) == port]
            assert ports and all(a.split(":", 1)[1].startswith(LOOPBACK) for a in ports), ports
        assert subprocess.run(inside, capture_output=True, text=True).returncode != 0  # nor after
    finally:
        server.close()


def _pids_in_namespace_of(pid: int) -> set[int]:
    """Every process in pid's network namespace."""
    ns = os.readlink(f"/proc/{pid}/ns/net")
    found = set()
    for entry in os.listdir("/proc"):
        with contextlib.suppress(OSError):
            if entry.isdigit() and os.readlink(f"/proc/{entry}/ns/net") == ns:
                found.add(int(entry))
    return found


def _links_in(pid: int) -> list[str]:
    """Network interfaces of pid's namespace (/proc/PID/net/dev)."""
    with open(f"/proc/{pid}/net/dev") as fh:
        return sorted(line.split(":")[0].strip() for line in fh.readlines()[2:])


def _member(coder: CoderServer, name: str) -> Session:
    return coder.create_member(name)


def test_template_builds_with_the_mirrored_provider(coder: CoderServer, template: dict[str, Any]) -> None:
    version = coder.get(f"/api/v2/templateversions/{template['active_version_id']}")
    assert version["job"]["status"] == "succeeded"
    resources = coder.get(f"/api/v2/templateversions/{version['id']}/resources")
    assert {(r["type"], r["name"]) for r in resources} >= {("terraform_data", "session")}
    agents = [a["name"] for r in resources for a in r.get("agents") or []]
    assert agents == ["main"]


def test_workspace_stopped_by_owner_not_by_another_member(coder: CoderServer, template: dict[str, Any]) -> None:
    alice, bob = _member(coder, "alice"), _member(coder, "bob")
    ws = coder.create_workspace(alice, template["id"], "ws-a")
    build = ws["latest_build"]
    assert (build["transition"], build["status"]) == ("start", "running")
    assert ws["last_used_at"]
    session = [r for r in build["resources"] if r["type"] == "terraform_data"]
    assert len(session) == 1 and [a["name"] for a in session[0]["agents"]] == ["main"]
    # no agent ever connects here: the build is "running" all the same, and the workspace unhealthy
    assert session[0]["agents"][0]["status"] in ("connecting", "timeout")
    assert ws["health"]["healthy"] is False

    # another member: the workspace is not there for them, not even to read
    for call in (lambda: coder.build(ws["id"], "stop", token=bob.token),
                 lambda: coder.get(f"/api/v2/workspaces/{ws['id']}", token=bob.token)):
        with pytest.raises(CoderAPIError) as err:
            call()
        assert err.value.status == 404, err.value.body
    assert coder.get(f"/api/v2/workspaces/{ws['id']}")["latest_build"]["id"] == build["id"]

    # the owner (site admin) token: a stop build, made for alice's workspace
    stop = coder.build(ws["id"], "stop")
    assert stop["transition"] == "stop" and stop["build_number"] == build["build_number"] + 1
    done = coder.wait_job(f"/api/v2/workspacebuilds/{stop['id']}")
    assert done["status"] == "stopped"
    assert coder.owner is not None and done["initiator_name"] == coder.owner.username
    after = coder.get(f"/api/v2/workspaces/{ws['id']}")
    assert after["latest_build"]["status"] == "stopped"
    assert not [r for r in after["latest_build"]["resources"] if r["type"] == "terraform_data"]
    # and alice sees it stopped, in her own list
    mine = coder.get("/api/v2/workspaces?q=owner:me", token=alice.token)
    assert [w["latest_build"]["status"] for w in mine["workspaces"] if w["id"] == ws["id"]] == ["stopped"]


def test_agent_connects_and_a_stop_build_leaves_its_process(coder: CoderServer, template: dict[str, Any]) -> None:
    """`coder agent` with the token from the build's state connects (the workspace turns healthy); the stop
    build removes the session's resource, but the process is the pod's to end: Coder does not stop it."""
    carol = _member(coder, "carol")
    ws = coder.create_workspace(carol, template["id"], "ws-c")
    agent = coder.start_agent(coder.agent_token(ws["latest_build"]["id"]), coder.dir / "agent-c.log")
    try:
        deadline = time.monotonic() + 60
        while True:
            now = coder.get(f"/api/v2/workspaces/{ws['id']}")
            a = now["latest_build"]["resources"][0]["agents"][0]
            if a["status"] == "connected" and a["lifecycle_state"] == "ready":
                break
            assert agent.poll() is None, procs.tail(coder.dir / "agent-c.log")
            assert time.monotonic() < deadline, f"agent still {a['status']}/{a['lifecycle_state']}"
            time.sleep(0.5)
        assert now["health"]["healthy"] is True
        assert a["first_connected_at"] and a["last_connected_at"]
        stop = coder.build(ws["id"], "stop")
        assert coder.wait_job(f"/api/v2/workspacebuilds/{stop['id']}")["status"] == "stopped"
        assert agent.poll() is None
    finally:
        procs.stop(agent)
