"""The Dockerfile, checked without a Docker engine.

The static tests parse the Dockerfile. The slow test does what its build stage does: it assembles the
build context the way `docker build` would (only what .dockerignore lets through, only what COPY
copies), creates a fresh virtual environment, runs the stage's install command in it, and runs the
installed `kf-culler --help`.
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

import pytest
from support.lock import locked, normalize

ROOT = Path(__file__).resolve().parent.parent
DOCKERFILE = ROOT / "Dockerfile"


@dataclass
class Stage:
    base: str
    name: str | None
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def all(self, keyword: str) -> list[str]:
        return [args for kw, args in self.instructions if kw == keyword]

    def last(self, keyword: str) -> str | None:
        found = self.all(keyword)
        return found[-1] if found else None


def parse(text: str) -> list[Stage]:
    """Stages of a Dockerfile: comments dropped, continuation lines joined."""
    logical: list[str] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if pending and line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        logical.append(pending + line)
        pending = ""
    assert not pending, "the Dockerfile ends in a line continuation"
    stages: list[Stage] = []
    global_args: dict[str, str] = {}  # ARGs before the first FROM: what a FROM line may name
    for line in logical:
        keyword, _, args = line.partition(" ")
        keyword, args = keyword.upper(), args.strip()
        if keyword == "ARG" and not stages:
            name, _, default = args.partition("=")
            global_args[name] = default
        elif keyword == "FROM":
            words = args.split()
            words = [w for w in words if not w.startswith("--")]
            name = words[2] if len(words) >= 3 and words[1].upper() == "AS" else None
            base = re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: global_args[m.group(1) or m.group(2)], words[0])
            stages.append(Stage(base, name))
        else:
            assert stages, f"{keyword} before FROM"
            stages[-1].instructions.append((keyword, args))
    return stages


def exec_form(args: str) -> list[str]:
    value = json.loads(args)
    assert isinstance(value, list) and all(isinstance(v, str) for v in value), f"not exec form: {args}"
    return value


def env_of(stage: Stage) -> dict[str, str]:
    env: dict[str, str] = {}
    for args in stage.all("ENV"):
        for word in shlex.split(args):
            key, sep, value = word.partition("=")
            assert sep, f"use ENV KEY=VALUE: {args}"
            env[key] = value
    return env


def user_is_root(user: str | None) -> bool:
    if user is None:
        return True  # python:*-slim images run as root unless told otherwise
    uid = user.split(":", 1)[0]
    return uid in ("0", "root")


@pytest.fixture(scope="module")
def stages() -> list[Stage]:
    return parse(DOCKERFILE.read_text(encoding="utf-8"))


def install_commands(stage: Stage) -> list[list[str]]:
    """The `&&`-separated commands of the stage's RUN instructions (shell form)."""
    commands = []
    for args in stage.all("RUN"):
        for part in args.split("&&"):
            if part.strip():
                commands.append(shlex.split(part))
    return commands


# --- static ---------------------------------------------------------------------------------------


def test_final_stage_runs_as_a_numeric_non_root_user(stages: list[Stage]) -> None:
    user = stages[-1].last("USER")
    assert not user_is_root(user), f"USER {user}"
    uid = str(user).split(":", 1)[0]
    assert uid.isdigit(), "a numeric uid lets the kubelet verify runAsNonRoot"
    # The Deployment runs as the same uid.
    assert int(uid) == 65532


def test_entrypoint_is_kf_culler(stages: list[Stage]) -> None:
    entrypoint = stages[-1].last("ENTRYPOINT")
    assert entrypoint is not None
    assert exec_form(entrypoint) == ["kf-culler"]


def test_every_stage_starts_from_slim_python_311(stages: list[Stage]) -> None:
    for stage in stages:
        image, _, tag = stage.base.partition(":")
        assert image in ("python", "docker.io/library/python")
        assert tag.startswith("3.11") and "slim" in tag


def test_installs_the_locked_dependencies_then_the_package_without_test_extras_and_without_a_cache(
        stages: list[Stage]) -> None:
    """First requirements.lock, every file checked against its hash, wheels only; then the project itself with no
    dependencies of its own choosing, no extras."""
    pip_installs = [c for s in stages for c in install_commands(s)
                    if "pip" in Path(c[0]).name and "install" in c]
    assert len(pip_installs) == 2, pip_installs
    lock, project = pip_installs
    assert {"--require-hashes", "--only-binary=:all:", "--no-cache-dir"} <= set(lock), lock
    assert lock[lock.index("-r") + 1] == "requirements.lock"
    assert [w for w in lock[lock.index("install") + 1:] if not w.startswith("-")] == ["requirements.lock"]
    targets = [w for w in project[project.index("install") + 1:] if not w.startswith("-")]
    assert targets == ["."], "install the project itself, no extras, nothing else"
    assert {"--no-deps", "--no-cache-dir"} <= set(project), project


def test_the_lock_pins_every_dependency_by_version_and_hash() -> None:
    """Every runtime dependency of pyproject.toml (and the build backend) is pinned to a version it accepts, each
    with the hash of at least one file; the lock holds the build backend and nothing of the test extras."""
    from packaging.requirements import Requirement

    lock = locked()
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    wanted = [*project["project"]["dependencies"], *project["build-system"]["requires"]]
    for spec in map(Requirement, wanted):
        name = normalize(spec.name)
        assert name in lock, f"{spec.name} is not in requirements.lock (bash hack/image/lock.sh)"
        assert spec.specifier.contains(lock[name][0]), f"requirements.lock's {name}=={lock[name][0]} is not {spec}"
    for name, (version, hashes) in lock.items():
        assert re.fullmatch(r"[0-9][0-9A-Za-z.+!-]*", version), name
        assert hashes and all(re.fullmatch(r"[0-9a-f]{64}", h) for h in hashes), name
    for test_only in ("pytest", "hypothesis", "mypy", "cryptography", "jupyter-server"):
        assert test_only not in lock


def test_final_stage_has_no_sources_and_no_build_tools(stages: list[Stage]) -> None:
    final = stages[-1]
    assert not final.all("RUN"), "the final stage only copies the built environment"
    for args in final.all("COPY"):
        assert args.startswith("--from="), f"COPY {args}"


# --- doing what the build stage does --------------------------------------------------------------


def dockerignore_patterns() -> list[tuple[bool, str]]:
    path = ROOT / ".dockerignore"
    out = []
    for line in path.read_text(encoding="utf-8").splitlines() if path.exists() else []:
        line = line.strip()
        if line and not line.startswith("#"):
            negate = line.startswith("!")
            out.append((negate, line.lstrip("!").strip("/")))
    return out


def ignored(rel: PurePosixPath, patterns: list[tuple[bool, str]]) -> bool:
    """.dockerignore semantics: the last matching pattern wins; a pattern matching a parent matches."""
    candidates = [str(rel), *(str(p) for p in rel.parents if str(p) != ".")]
    result = False
    for negate, pattern in patterns:
        if any(fnmatch.fnmatchcase(c, pattern) for c in candidates):
            result = not negate
    return result


def build_context(tmp: Path) -> Path:
    """The files `docker build .` would send, copied under tmp/context."""
    patterns = dockerignore_patterns()
    ctx = tmp / "context"
    for dirpath, dirnames, filenames in os.walk(ROOT):
        dirnames[:] = [d for d in dirnames if d != ".git"]
        for filename in filenames:
            path = Path(dirpath) / filename
            rel = PurePosixPath(path.relative_to(ROOT).as_posix())
            if ignored(rel, patterns):
                continue
            dest = ctx / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, dest)
    return ctx


def test_dockerignore_keeps_what_the_image_needs_and_drops_the_rest(tmp_path: Path) -> None:
    ctx = build_context(tmp_path)
    assert (ctx / "pyproject.toml").is_file()
    assert (ctx / "kf_culler" / "cli.py").is_file()
    assert (ctx / "requirements.lock").is_file()
    assert not (ctx / "tests").exists()
    # The image runs the culler, not the demo: no local components (control plane, Jupyter, Prometheus).
    assert not (ctx / "kf_culler" / "local").exists()
    assert not list((ctx / "kf_culler").glob("demo*.py"))
    assert not list(ctx.rglob("__pycache__"))


def stage_files(stage: Stage, ctx: Path, dest_root: Path) -> Path:
    """Run the stage's WORKDIR/COPY instructions from the context into dest_root; return the workdir."""
    workdir = PurePosixPath("/")
    for keyword, args in stage.instructions:
        if keyword == "WORKDIR":
            workdir = workdir / args
        elif keyword == "COPY":
            words = shlex.split(args)
            assert not any(w.startswith("--from") for w in words)
            *sources, dest = (w for w in words if not w.startswith("--"))
            target = dest_root / (workdir / dest).relative_to("/")
            for src in sources:
                origin = ctx / src
                assert origin.exists(), f"COPY {src}: not in the build context"
                if origin.is_dir():  # a directory's contents go into dest
                    shutil.copytree(origin, target, dirs_exist_ok=True)
                else:
                    to = target / origin.name if dest.endswith("/") else target
                    to.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(origin, to)
    return dest_root / workdir.relative_to("/")


@pytest.mark.slow
def test_build_stage_installs_a_working_kf_culler(stages: list[Stage], tmp_path: Path) -> None:
    build = next(s for s in stages if any("pip" in " ".join(c) for c in install_commands(s)))
    root = tmp_path / "fs"
    workdir = stage_files(build, build_context(tmp_path), root)
    env = {**os.environ, **env_of(build)}
    env.pop("PYTHONPATH", None)
    env.pop("VIRTUAL_ENV", None)
    venv_dir: Path | None = None
    for cmd in install_commands(build):
        if cmd[:3] == ["python3", "-m", "venv"]:
            venv_dir = root / cmd[3].lstrip("/")
            cmd = [sys.executable, "-m", "venv", str(venv_dir)]
        else:
            assert venv_dir is not None and cmd[0].startswith("/"), f"unexpected command: {cmd}"
            cmd = [str(root / cmd[0].lstrip("/")), *cmd[1:]]
        proc = subprocess.run(cmd, cwd=workdir, env=env, capture_output=True, text=True, timeout=900)
        assert proc.returncode == 0, f"{cmd} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    assert venv_dir is not None
    # Exactly the locked versions, and nothing else but the project.
    python = venv_dir / "bin" / "python"
    listed = subprocess.run([str(python), "-c", "import importlib.metadata as m, json; print(json.dumps("
                             "{d.metadata['Name']: d.version for d in m.distributions()}))"],
                            env=env, capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    installed_versions = {normalize(k): v for k, v in json.loads(listed.stdout).items()}
    assert installed_versions.pop("kf-culler") == tomllib.loads((ROOT / "pyproject.toml").read_text())[
        "project"]["version"]
    expected = {name: version for name, (version, _) in locked().items() if name not in ("pip", "setuptools")}
    assert installed_versions == expected
    # The final stage puts the environment's bin first on PATH and runs the ENTRYPOINT from there.
    final_env = env_of(stages[-1])
    assert final_env["PATH"].split(":")[0] == "/" + str(venv_dir.relative_to(root)) + "/bin"
    entry = exec_form(str(stages[-1].last("ENTRYPOINT")))
    exe = venv_dir / "bin" / entry[0]
    run = subprocess.run([str(exe), "--help"], env=env, capture_output=True, text=True, timeout=120,
                         cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert "usage: kf-culler" in run.stdout and "run" in run.stdout
    run = subprocess.run([str(exe), "run", "--help"], env=env, capture_output=True, text=True, timeout=120,
                         cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert "--metrics-address" in run.stdout
    # Only runtime dependencies: the test tools are not in the image.
    python = venv_dir / "bin" / "python"
    for test_only in ("pytest", "hypothesis", "mypy", "cryptography", "jupyter_server"):
        probe = subprocess.run([str(python), "-c", f"import {test_only}"], capture_output=True, timeout=60)
        assert probe.returncode != 0, f"{test_only} is installed in the image"
    # The installed package: no local components, no demo, no test code, no test support.
    site = subprocess.run([str(python), "-c", "import kf_culler, os; print(os.path.dirname(kf_culler.__file__))"],
                          env=env, capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert site.returncode == 0, site.stderr
    installed = Path(site.stdout.strip())
    assert installed.is_relative_to(venv_dir), installed
    assert (installed / "cli.py").is_file() and (installed / "kube").is_dir()
    for absent in ("local", "testing", "demo.py", "demo_gpu.py"):
        assert not (installed / absent).exists(), f"kf_culler/{absent} is in the image"
    packages = installed.parent
    assert not (packages / "tests").exists() and not (packages / "support").exists()
    test_code = [p for p in installed.rglob("*.py")
                 if p.name.startswith("test_") or p.name == "conftest.py"
                 or any(line.startswith(("import pytest", "from pytest"))
                        for line in p.read_text(encoding="utf-8").splitlines())]
    assert test_code == [], test_code
    # The demo says what it needs instead of a traceback.
    run = subprocess.run([str(exe), "demo"], env=env, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert run.returncode == 2, run.stdout + run.stderr
    assert "kf_culler.local" in run.stderr and "Traceback" not in run.stderr
