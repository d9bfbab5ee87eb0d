"""A real Coder server on loopback, for the tests: its own PostgreSQL, Terraform and the coder/coder provider.

    with CoderServer() as coder:
        coder.owner                           # the first user (site owner), logged in: its token is the default
        template = coder.push_template("gpu", CODER_ONLY_TEMPLATE)
        alice = coder.create_member("alice")
        ws = coder.create_workspace(alice, template["id"], "ws-a")
        agent = coder.start_agent(coder.agent_token(ws["latest_build"]["id"]), log_path)
        coder.build(ws["id"], "stop")         # a stop build, with the owner's token

Binaries come from the build cache (hack/coder/build.sh: Coder v2.36.0 from the Go module proxy without
its web UI, Terraform v1.14.5 from the vendored tree, the coder/coder provider in a Terraform filesystem
mirror); they are built on first use. PostgreSQL is Debian's (`initdb`/`postgres` of the newest
/usr/lib/postgresql/<major>/bin); it refuses to run as root, so as root it runs as the `postgres` user.

Nothing listens but on loopback. Coder's server-side tailnet (tailscale's magicsock, tailnet/conn.go) binds
a UDP socket on 0.0.0.0 and [::] at start, with no option to bind it elsewhere, so `coder server` runs in a
network namespace of its own that has only `lo` (`unshare --net`): there it listens on 127.0.0.1 and its
UDP sockets reach nothing. Its HTTP API comes out through two relays, a Unix socket in its directory (which
both namespaces see) and a TCP listener on this namespace's 127.0.0.1:`port`, which is `url`. PostgreSQL
has no TCP listener at all: Coder reaches it through its Unix socket. The DERP relay is inside Coder's
HTTP server (STUN off); no Prometheus or pprof endpoint. Nothing calls out: telemetry, the update check,
the AI gateway, the default GitHub OAuth and external-auth providers are off, and Terraform takes the
coder/coder provider from the mirror and is forbidden every registry (a template that needs another
provider fails its `terraform init`).
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import os
import pwd
import shutil
import signal
import subprocess
import sys
import tarfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kf_culler.local import procs

BUILD_SCRIPT = Path("hack") / "coder" / "build.sh"
CODER_VERSION = "v2.36.0"
TERRAFORM_VERSION = "v1.14.5"
PROVIDER_VERSION = "v2.20.0"
KUBERNETES_PROVIDER_VERSION = "v2.38.0"  # hashicorp/kubernetes, for templates that make Kubernetes objects
BIN_DIR_ENV = "KF_CULLER_CODER_BIN_DIR"
OWNER_EMAIL = "admin@kf-culler.test"
OWNER_USERNAME = "admin"
# Coder checks password strength (coderd/userpassword: go-password-validator, 52 bits of entropy)
PASSWORD = "Kf-Culler-Local-Coder-2026!"

# A template in the shape of the write-up's (a session resource with `count = start_count`), with only
# what Terraform can have here: the coder/coder provider (from the mirror) and Terraform's built-in
# terraform_data, which stands for the Deployment; the agent's token is its input, so Coder attaches the
# agent to it. A real session's pod is made by the caller (e.g. a local-exec provisioner).
CODER_ONLY_TEMPLATE = """
terraform {
  required_providers {
    coder = {
      source  = "coder/coder"
      version = ">= 2.0.0"
    }
  }
}

data "coder_provisioner" "me" {}
data "coder_workspace" "me" {}
data "coder_workspace_owner" "me" {}

resource "coder_agent" "main" {
  os   = "linux"
  arch = data.coder_provisioner.me.arch
}

resource "terraform_data" "session" {
  count = data.coder_workspace.me.start_count
  input = {
    agent_token = coder_agent.main.token
    name        = "coder-${lower(data.coder_workspace_owner.me.name)}-${lower(data.coder_workspace.me.name)}"
  }
}
"""


class CoderUnavailable(RuntimeError):
    """A Coder server cannot be had here: a binary cannot be built, PostgreSQL or Coder does not start, or
    its first user cannot be made. The message says which, with the build's error or the log tail."""


class CoderAPIError(RuntimeError):
    """The Coder API answered with an HTTP error: `status` and Coder's message."""

    def __init__(self, method: str, path: str, status: int, body: str) -> None:
        super().__init__(f"{method} {path}: HTTP {status}: {body[:2000]}")
        self.status = status
        self.body = body


# -- binaries ---------------------------------------------------------------------------------------------

def source_root() -> Path | None:
    env = os.environ.get("KF_CULLER_SOURCE")
    candidates = [Path(env)] if env else []
    candidates += list(Path(__file__).resolve().parents)
    for c in candidates:
        if (c / BUILD_SCRIPT).is_file():
            return c
    return None


def bin_dir() -> Path:
    if os.environ.get(BIN_DIR_ENV):
        return Path(os.environ[BIN_DIR_ENV])
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    return cache / "kf-culler" / "bin" / f"coder-{CODER_VERSION}"


@dataclass(frozen=True)
class Binaries:
    coder: Path
    terraform: Path
    terraformrc: Path  # the Terraform CLI config pointing at the provider mirror


def _built(directory: Path) -> Binaries | None:
    b = Binaries(directory / "coder", directory / "terraform", directory / "terraformrc")
    stamps = {"coder": CODER_VERSION, "terraform": TERRAFORM_VERSION, "terraform-provider-coder": PROVIDER_VERSION}
    for name, version in stamps.items():
        try:
            if (directory / f"{name}.version").read_text().strip() != version:
                return None
        except OSError:
            return None
    return b if b.coder.is_file() and b.terraform.is_file() and b.terraformrc.is_file() else None


def ensure_binaries(build: bool = True, quiet: bool = True) -> Binaries:
    """The built binaries; built now by hack/coder/build.sh when missing (cold: about 13 minutes)."""
    directory = bin_dir()
    found = _built(directory)
    if found is not None:
        return found
    if not build:
        raise CoderUnavailable(f"Coder binaries are missing from {directory}; run hack/coder/build.sh")
    root = source_root()
    if root is None:
        raise CoderUnavailable(f"Coder binaries are missing from {directory} and no kf-culler checkout "
                               f"({BUILD_SCRIPT}) was found; set KF_CULLER_SOURCE or {BIN_DIR_ENV}")
    if shutil.which("go") is None:
        raise CoderUnavailable("Coder binaries are missing and Go is not installed (Go >= 1.26.5 builds them)")
    if not quiet:
        print(f"Building Coder, Terraform and the coder provider into {directory} (first use only) ...",
              file=sys.stderr)
    result = subprocess.run(["bash", str(root / BUILD_SCRIPT), "all"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE if quiet else None, text=True,
                            env={**os.environ, BIN_DIR_ENV: str(directory)})
    if result.returncode != 0:
        raise CoderUnavailable(f"{BUILD_SCRIPT} all failed (exit {result.returncode})"
                               + (f":\n{result.stderr[-3000:]}" if quiet and result.stderr else ""))
    found = _built(directory)
    if found is None:
        raise CoderUnavailable(f"{BUILD_SCRIPT} succeeded but {directory} lacks a binary or its stamp")
    return found


def ensure_kubernetes_provider(binaries: Binaries) -> Path:
    """Terraform's Kubernetes provider in the binaries' filesystem mirror (its terraformrc names it), built now
    by `hack/coder/build.sh kubernetes` when missing; its directory in the mirror."""
    directory = binaries.terraformrc.parent
    v = KUBERNETES_PROVIDER_VERSION
    mirror = directory / "providers" / "registry.terraform.io" / "hashicorp" / "kubernetes" / v.lstrip("v")

    def built() -> bool:
        try:
            stamped = (directory / "terraform-provider-kubernetes.version").read_text().strip() == v
            return stamped and "hashicorp/kubernetes" in binaries.terraformrc.read_text() and mirror.is_dir()
        except OSError:
            return False

    if built():
        return mirror
    root = source_root()
    if root is None or shutil.which("go") is None:
        raise CoderUnavailable(f"Terraform's Kubernetes provider {v} is missing from {directory}, and "
                               + ("no kf-culler checkout was found" if root is None else "Go is not installed")
                               + f" to build it ({BUILD_SCRIPT} kubernetes)")
    result = subprocess.run(["bash", str(root / BUILD_SCRIPT), "kubernetes"], capture_output=True, text=True,
                            env={**os.environ, BIN_DIR_ENV: str(directory)})
    if result.returncode != 0:
        raise CoderUnavailable(f"{BUILD_SCRIPT} kubernetes failed (exit {result.returncode}):\n"
                               f"{result.stderr[-3000:]}")
    if not built():
        raise CoderUnavailable(f"{BUILD_SCRIPT} kubernetes succeeded but {mirror} or its stamp is missing")
    return mirror


def postgres_bindir() -> Path:
    """Debian's newest PostgreSQL server binaries (package postgresql), else initdb on PATH."""
    base = Path("/usr/lib/postgresql")
    versions = sorted((p for p in base.glob("*/bin") if (p / "postgres").is_file()),
                      key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else 0)
    if versions:
        return versions[-1]
    initdb = shutil.which("initdb")
    if initdb:
        return Path(os.path.realpath(initdb)).parent
    raise CoderUnavailable("PostgreSQL is not installed: no /usr/lib/postgresql/*/bin/postgres and no initdb "
                           "on PATH (apt-get install postgresql)")


# -- PostgreSQL -------------------------------------------------------------------------------------------

class Postgres(procs.LocalServer):
    """A throwaway PostgreSQL cluster in a temp directory: no TCP listener at all, only a Unix socket in
    that directory (`port` names the socket file), trust auth, fsync off."""

    what = "PostgreSQL"
    user = "coder"

    def __init__(self) -> None:
        super().__init__("kf-culler-pg-", "postgres.log")
        self.bindir = postgres_bindir()
        self.data = self.dir / "data"
        self.run_as: str | None = None
        if os.geteuid() == 0:  # initdb: "cannot be run as root"
            try:
                pw = pwd.getpwnam("postgres")
            except KeyError:
                raise CoderUnavailable("running as root, and PostgreSQL refuses root, but there is no "
                                       "'postgres' user to run it as") from None
            self.run_as = "postgres"
            os.chown(self.dir, pw.pw_uid, pw.pw_gid)

    @property
    def url(self) -> str:
        """Through the Unix socket in its directory: it reaches into Coder's network namespace too."""
        return f"postgres://{self.user}@/postgres?host={self.dir}&port={self.port}&sslmode=disable"

    def _run(self, cmd: list[str]) -> None:
        result = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                user=self.run_as, cwd=self.dir, env=self._env())
        if result.returncode != 0:
            raise CoderUnavailable(f"{' '.join(cmd)} failed (exit {result.returncode}):\n{result.stdout[-2000:]}")

    def _env(self) -> dict[str, str]:
        return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8",
                "HOME": str(self.dir)}

    def start(self, timeout: float = 60) -> None:
        self._run([str(self.bindir / "initdb"), "-D", str(self.data), "-U", self.user, "-A", "trust",
                   "-E", "UTF8", "--locale=C.UTF-8", "--no-sync", "--no-instructions"])
        cmd = [str(self.bindir / "postgres"), "-D", str(self.data), "-p", str(self.port),
               "-c", "listen_addresses=", "-c", f"unix_socket_directories={self.dir}",
               "-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off",
               "-c", "max_connections=200"]
        self.proc = subprocess.Popen(cmd, stdout=open(self.log, "ab"), stderr=subprocess.STDOUT,  # noqa: SIM115
                                     stdin=subprocess.DEVNULL, env=self._env(), cwd=self.dir,
                                     user=self.run_as, start_new_session=True)
        proc = self.proc

        def up() -> bool:
            if proc.poll() is not None:
                raise CoderUnavailable(f"postgres exited with {proc.returncode}:\n{procs.tail(self.log)}")
            return self.ready()

        try:
            procs.wait_until(up, timeout, 0.2, "PostgreSQL")
        except TimeoutError as err:
            raise CoderUnavailable(f"{err}:\n{procs.tail(self.log)}") from None

    def stop(self) -> None:
        """Fast shutdown (SIGINT: PostgreSQL's SIGTERM waits for every client to leave), then the usual."""
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGINT)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(10)
        super().stop()

    def ready(self) -> bool:
        r = subprocess.run([str(self.bindir / "pg_isready"), "-q", "-h", str(self.dir), "-p", str(self.port),
                            "-U", self.user, "-d", "postgres"], check=False)
        return r.returncode == 0


# -- a network namespace with only loopback, and the relays out of it ----------------------------------------

async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
    except (ConnectionError, OSError):
        pass
    finally:
        with contextlib.suppress(Exception):
            writer.close()


async def _relay_connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                            target: tuple[str, int] | str) -> None:
    try:
        if isinstance(target, str):
            up_r, up_w = await asyncio.open_unix_connection(target)
        else:
            up_r, up_w = await asyncio.open_connection(*target)
    except OSError:
        writer.close()
        return
    await asyncio.gather(_pipe(reader, up_w), _pipe(up_r, writer))


async def _serve_relay(listen: tuple[str, int] | str, target: tuple[str, int] | str,
                       ready: Callable[[], object] | None = None) -> None:
    async def handle(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await _relay_connection(r, w, target)

    if isinstance(listen, str):
        server = await asyncio.start_unix_server(handle, listen)
    else:
        server = await asyncio.start_server(handle, *listen, reuse_address=True)
    if ready is not None:
        ready()
    async with server:
        await server.serve_forever()


class Relay:
    """`listen` → `target` (each a (host, port) or a Unix socket's path), in a thread of this process."""

    def __init__(self, listen: tuple[str, int] | str, target: tuple[str, int] | str) -> None:
        self.loop = asyncio.new_event_loop()
        ready = threading.Event()
        self.task: asyncio.Task[None] | None = None

        def run() -> None:
            asyncio.set_event_loop(self.loop)
            self.task = self.loop.create_task(_serve_relay(listen, target, ready.set))
            with contextlib.suppress(asyncio.CancelledError):
                self.loop.run_until_complete(self.task)

        self.thread = threading.Thread(target=run, name=f"coder-relay-{listen}", daemon=True)
        self.thread.start()
        if not ready.wait(10):
            raise CoderUnavailable(f"the relay on {listen} did not start")

    def close(self) -> None:
        if self.task is not None:
            self.loop.call_soon_threadsafe(self.task.cancel)
        self.thread.join(5)


class HostRelay(Relay):
    """127.0.0.1:port here → a Unix socket, in a thread of this process."""

    def __init__(self, port: int, socket_path: Path) -> None:
        super().__init__(("127.0.0.1", port), str(socket_path))


def _inside_main(argv: list[str]) -> int:
    """`python -m kf_culler.local.coder inside SOCKET PORT -- CMD...`, run inside the new namespace:
    relay SOCKET → 127.0.0.1:PORT there, run CMD, and exit with its exit code."""
    socket_path, port, sep, cmd = argv[0], int(argv[1]), argv[2], argv[3:]
    assert sep == "--" and cmd
    child = subprocess.Popen(cmd)
    loop = asyncio.new_event_loop()
    threading.Thread(target=lambda: os._exit(child.wait()), daemon=True).start()
    loop.run_until_complete(_serve_relay(socket_path, ("127.0.0.1", port)))
    return 0


def _relay_main(argv: list[str]) -> int:
    """`python -m kf_culler.local.coder relay PORT SOCKET READY`, run inside Coder's network namespace: relay
    127.0.0.1:PORT there → SOCKET, and create the file READY once it listens."""
    port, socket_path, ready = int(argv[0]), argv[1], Path(argv[2])
    asyncio.new_event_loop().run_until_complete(_serve_relay(("127.0.0.1", port), socket_path, ready.touch))
    return 0


def _python_path() -> str:
    """PYTHONPATH with this kf_culler's checkout first, for `python -m kf_culler.local.coder ...`."""
    package_root = str(Path(__file__).resolve().parents[2])
    return os.pathsep.join(p for p in (package_root, os.environ.get("PYTHONPATH")) if p)


# -- the API ----------------------------------------------------------------------------------------------

@dataclass
class Session:
    """A logged-in Coder user: its id, name and session token (Coder-Session-Token header)."""

    id: str
    username: str
    email: str
    token: str


class CoderServer(procs.LocalServer):
    """`coder server` against its own PostgreSQL, its terraform provisioner in-process, in a network namespace
    with only `lo`; `url` (http://127.0.0.1:`port`, here) is relayed to it. `owner` is the first user."""

    what = "the Coder server"
    log_lines = 60

    def __init__(self, binaries: Binaries | None = None, provisioner_daemons: int = 1,
                 extra_env: dict[str, str] | None = None) -> None:
        self.binaries = binaries or ensure_binaries()
        super().__init__("kf-culler-coder-", "coder.log")
        self.url = f"http://127.0.0.1:{self.port}"
        self.provisioner_daemons = provisioner_daemons
        self.extra_env = extra_env or {}
        self.pg: Postgres | None = None
        self.owner: Session | None = None
        self.relay: HostRelay | None = None

    def __enter__(self) -> CoderServer:
        super().__enter__()
        return self

    def environment(self) -> dict[str, str]:
        path = f"{self.binaries.terraform.parent}:{os.environ.get('PATH', '/usr/bin:/bin')}"
        env = {k: v for k, v in os.environ.items() if not k.startswith(("CODER_", "TF_"))}
        assert self.pg is not None
        env.update({
            "PATH": path,  # the provisioner takes `terraform` from PATH (provisioner/terraform/serve.go)
            "HOME": str(self.dir),
            "TF_CLI_CONFIG_FILE": str(self.binaries.terraformrc),  # the provider mirror; no registry
            "CHECKPOINT_DISABLE": "1",
            "CODER_HTTP_ADDRESS": f"127.0.0.1:{self.port}",
            "CODER_ACCESS_URL": self.url,
            "CODER_PG_CONNECTION_URL": self.pg.url,
            "CODER_CONFIG_DIR": str(self.dir / "config"),
            "CODER_CACHE_DIRECTORY": str(self.dir / "cache"),
            "CODER_TELEMETRY_ENABLE": "false",
            "CODER_UPDATE_CHECK": "false",
            "CODER_DERP_SERVER_STUN_ADDRESSES": "disable",
            "CODER_BLOCK_DIRECT": "false",
            "CODER_AI_GATEWAY_ENABLED": "false",
            "CODER_OAUTH2_GITHUB_DEFAULT_PROVIDER_ENABLE": "false",
            "CODER_PROMETHEUS_ENABLE": "false",
            "CODER_PPROF_ENABLE": "false",
            "CODER_SWAGGER_ENABLE": "false",
            "CODER_PROVISIONER_DAEMONS": str(self.provisioner_daemons),
        })
        env["PYTHONPATH"] = _python_path()  # for `python -m kf_culler.local.coder inside`
        env.update(self.extra_env)
        return env

    def start(self, timeout: float = 180) -> None:
        self.pg = Postgres()
        try:
            self.pg.start()
        except RuntimeError as err:
            raise CoderUnavailable(f"PostgreSQL did not start: {err}") from None
        try:
            # As a flag: its variable CODER_EXTERNAL_AUTH_GITHUB_DEFAULT_PROVIDER_ENABLE is also read as an
            # external-auth provider list (CODER_EXTERNAL_AUTH_<n>_...) and fails the start with
            # "parse number: GITHUB_DEFAULT_PROVIDER_ENABLE" (cli/server.go parseExternalAuthProvidersFromEnv).
            cmd = [str(self.binaries.coder), "server", "--external-auth-github-default-provider-enable=false"]
            self.launch(self.isolated(cmd), self.environment(), timeout, interval=0.5)
        except RuntimeError as err:
            raise CoderUnavailable(str(err)) from None
        try:
            self.owner = self.create_first_user()
        except (CoderAPIError, OSError) as err:
            raise CoderUnavailable(f"the first user could not be made: {err}") from None

    def isolated(self, cmd: list[str]) -> list[str]:
        """cmd in a new network namespace with only `lo` (up), its 127.0.0.1:port relayed to `socket`."""
        for tool in ("unshare", "ip"):
            if shutil.which(tool) is None:
                raise CoderUnavailable(f"{tool} is not installed (util-linux / iproute2): Coder runs in a network "
                                       "namespace of its own, its tailnet binds UDP on every interface")
        probe = subprocess.run(["unshare", "--net", "--", "ip", "link", "set", "lo", "up"],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if probe.returncode != 0:
            raise CoderUnavailable(f"cannot make a network namespace (unshare --net): {probe.stdout.strip()}")
        inside = [sys.executable, "-m", "kf_culler.local.coder", "inside", str(self.socket), str(self.port), "--"]
        return ["unshare", "--net", "--", "sh", "-c", 'ip link set lo up && exec "$@"', "sh", *inside, *cmd]

    @property
    def socket(self) -> Path:
        return self.dir / "http.sock"

    def ready(self) -> bool:
        if self.relay is None and self.socket.exists():
            self.relay = HostRelay(self.port, self.socket)
        if self.relay is None:
            return False
        try:
            return bool(self.get("/api/v2/buildinfo").get("version"))
        except (OSError, CoderAPIError, ValueError):
            return False

    def stop(self) -> None:
        procs.stop(self.proc)
        self.proc = None
        if self.relay is not None:
            self.relay.close()
            self.relay = None
        if self.pg is not None:
            self.pg.stop()
        shutil.rmtree(self.dir, ignore_errors=True)

    # -- HTTP --------------------------------------------------------------------------------------
    def request(self, method: str, path: str, body: Any = None, token: str | None = None,
                data: bytes | None = None, content_type: str = "application/json", timeout: float = 30) -> Any:
        """One API call; the decoded JSON answer (None when empty); CoderAPIError on an HTTP error."""
        headers = {"Accept": "application/json"}
        if token is None and self.owner is not None:
            token = self.owner.token
        if token:
            headers["Coder-Session-Token"] = token
        if body is not None:
            data = json.dumps(body).encode()
        if data is not None:
            headers["Content-Type"] = content_type
        req = urllib.request.Request(self.url + path, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                raw = resp.read()
        except urllib.error.HTTPError as err:
            raise CoderAPIError(method, path, err.code, err.read().decode(errors="replace")) from None
        return json.loads(raw) if raw else None

    def get(self, path: str, token: str | None = None) -> Any:
        return self.request("GET", path, token=token)

    def post(self, path: str, body: Any, token: str | None = None) -> Any:
        return self.request("POST", path, body, token=token)

    # -- users ---------------------------------------------------------------------------------------
    def login(self, email: str, password: str = PASSWORD) -> str:
        answer = self.request("POST", "/api/v2/users/login", {"email": email, "password": password}, token="")
        return str(answer["session_token"])

    def create_first_user(self) -> Session:
        """The first user, who becomes the site owner (POST /api/v2/users/first), logged in."""
        user = self.request("POST", "/api/v2/users/first",
                            {"email": OWNER_EMAIL, "username": OWNER_USERNAME, "name": "kf-culler admin",
                             "password": PASSWORD, "trial": False}, token="")
        token = self.login(OWNER_EMAIL)
        return Session(str(user["user_id"]), OWNER_USERNAME, OWNER_EMAIL, token)

    def default_organization(self) -> dict[str, Any]:
        orgs: list[dict[str, Any]] = self.get("/api/v2/organizations")
        return next(o for o in orgs if o.get("is_default")) if orgs else {}

    def create_member(self, username: str) -> Session:
        """A plain member of the default organization, with a password, logged in."""
        email = f"{username}@kf-culler.test"
        user = self.post("/api/v2/users", {"email": email, "username": username, "password": PASSWORD,
                                           "login_type": "password",
                                           "organization_ids": [self.default_organization()["id"]]})
        return Session(str(user["id"]), username, email, self.login(email))

    # -- templates and workspaces --------------------------------------------------------------------
    def wait_job(self, path: str, timeout: float = 180) -> dict[str, Any]:
        """Poll a template version or workspace build until its provisioner job ends; raise on failure."""
        deadline = time.monotonic() + timeout
        while True:
            obj: dict[str, Any] = self.get(path)
            status = obj["job"]["status"]
            if status == "succeeded":
                return obj
            if status in ("failed", "canceled"):
                raise CoderAPIError("GET", path, 200, f"provisioner job {status}: {obj['job'].get('error')}\n"
                                    + self.job_logs(path, obj))
            if time.monotonic() > deadline:
                raise TimeoutError(f"provisioner job of {path} still {status} after {timeout:g}s")
            time.sleep(0.5)

    def job_logs(self, path: str, obj: dict[str, Any]) -> str:
        logs_path = f"{path}/logs" if "/templateversions/" in path else f"/api/v2/workspacebuilds/{obj['id']}/logs"
        with contextlib.suppress(CoderAPIError, OSError, ValueError):
            lines = self.get(logs_path)
            return "\n".join(f"{ln.get('stage')}: {ln.get('output')}" for ln in lines[-60:])
        return "(no logs)"

    def upload(self, files: dict[str, str]) -> str:
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            for name, text in files.items():
                raw = text.encode()
                info = tarfile.TarInfo(name)
                info.size, info.mode, info.mtime = len(raw), 0o644, int(time.time())
                tar.addfile(info, io.BytesIO(raw))
        answer = self.request("POST", "/api/v2/files", data=buf.getvalue(), content_type="application/x-tar")
        return str(answer["hash"])

    def push_template(self, name: str, main_tf: str = CODER_ONLY_TEMPLATE, timeout: float = 180,
                      variables: dict[str, str] | None = None) -> dict[str, Any]:
        """Upload main.tf, build a template version (terraform init + plan here) and make a template; `variables`
        are the values of its Terraform variables (the template admin's, as `coder templates push --variable`)."""
        org = self.default_organization()["id"]
        values = [{"name": k, "value": v} for k, v in (variables or {}).items()]
        version = self.post(f"/api/v2/organizations/{org}/templateversions",
                            {"storage_method": "file", "file_id": self.upload({"main.tf": main_tf}),
                             "provisioner": "terraform", "tags": {}, "user_variable_values": values})
        self.wait_job(f"/api/v2/templateversions/{version['id']}", timeout)
        template: dict[str, Any] = self.post(f"/api/v2/organizations/{org}/templates",
                                             {"name": name, "template_version_id": version["id"]})
        return template

    def create_workspace(self, owner: Session, template_id: str, name: str, timeout: float = 180) -> dict[str, Any]:
        """A workspace of `owner` (its start build made with the owner's own token), once the build ends."""
        ws = self.post(f"/api/v2/users/{owner.username}/workspaces", {"template_id": template_id, "name": name},
                       token=owner.token)
        self.wait_job(f"/api/v2/workspacebuilds/{ws['latest_build']['id']}", timeout)
        workspace: dict[str, Any] = self.get(f"/api/v2/workspaces/{ws['id']}")
        return workspace

    def build(self, workspace_id: str, transition: str, token: str | None = None) -> dict[str, Any]:
        """POST /api/v2/workspaces/{id}/builds {"transition": ...}: the stop (or start) a culler makes."""
        build: dict[str, Any] = self.post(f"/api/v2/workspaces/{workspace_id}/builds", {"transition": transition},
                                          token=token)
        return build


    # -- the workspace agent ---------------------------------------------------------------------------
    def agent_token(self, build_id: str, agent: str = "main") -> str:
        """The agent's token, from the build's Terraform state (GET /api/v2/workspacebuilds/{id}/state: the
        owner may read it), as the template hands it to the session's process in a real pod."""
        state = self.get(f"/api/v2/workspacebuilds/{build_id}/state")
        for res in state.get("resources") or []:
            if res.get("type") == "coder_agent" and res.get("name") == agent:
                for inst in res.get("instances") or []:
                    return str(inst["attributes"]["token"])
        raise CoderAPIError("GET", f"/api/v2/workspacebuilds/{build_id}/state", 200, f"no coder_agent.{agent}")

    def start_agent(self, token: str, log: Path) -> subprocess.Popen[bytes]:
        """`coder agent` as a session's process, in Coder's network namespace (its tailnet binds UDP on every
        interface too), talking to Coder at 127.0.0.1 there. Stop it with procs.stop."""
        assert self.proc is not None
        env = {k: v for k, v in os.environ.items() if not k.startswith("CODER_")}
        agent_dir = log.parent / f"agent-{token[:8]}"
        agent_dir.mkdir(parents=True, exist_ok=True)
        env.update({"HOME": str(agent_dir), "CODER_AGENT_TOKEN": token, "CODER_AGENT_AUTH": "token",
                    "CODER_AGENT_URL": self.url, "CODER_AGENT_LOG_DIR": str(agent_dir)})
        cmd = ["nsenter", f"--net=/proc/{self.proc.pid}/ns/net", "--", str(self.binaries.coder), "agent"]
        return procs.start(cmd, log, env=env, cwd=agent_dir)

    # -- what Terraform reaches -------------------------------------------------------------------------
    @contextlib.contextmanager
    def reaching(self, port: int, timeout: float = 10) -> Iterator[None]:
        """This machine's 127.0.0.1:`port` (e.g. a kind cluster's API server), reachable at the same address
        inside Coder's network namespace, where its provisioner runs Terraform: a relay thread here from a Unix
        socket in Coder's directory to it, and a relay process in the namespace from its 127.0.0.1:`port` to that
        socket. Nothing listens anywhere else; the relays end on leaving."""
        assert self.proc is not None
        sock, ready = self.dir / f"reach-{port}.sock", self.dir / f"reach-{port}.ready"
        out = Relay(str(sock), ("127.0.0.1", port))
        env = {**os.environ, "PYTHONPATH": _python_path()}
        cmd = ["nsenter", f"--net=/proc/{self.proc.pid}/ns/net", "--", sys.executable, "-m", "kf_culler.local.coder",
               "relay", str(port), str(sock), str(ready)]
        log = self.dir / f"reach-{port}.log"
        proc = procs.start(cmd, log, env=env)
        try:
            def up() -> bool:
                if proc.poll() is not None:
                    raise CoderUnavailable(f"the relay into Coder's namespace exited ({proc.returncode}):\n"
                                           f"{procs.tail(log)}")
                return ready.exists()

            procs.wait_until(up, timeout, 0.1, f"the relay to 127.0.0.1:{port} in Coder's namespace")
            yield
        finally:
            procs.stop(proc)
            out.close()


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "inside":
        sys.exit(_inside_main(sys.argv[2:]))
    if len(sys.argv) == 5 and sys.argv[1] == "relay":
        sys.exit(_relay_main(sys.argv[2:]))
    sys.exit("usage: python -m kf_culler.local.coder inside SOCKET PORT -- CMD...\n"
             "       python -m kf_culler.local.coder relay PORT SOCKET READY")
