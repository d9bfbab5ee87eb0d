"""kf-culler's container image, built by hack/image/build.sh from the repository's Dockerfile and run with
podman as the rendered Deployment runs it.

The image is the one the script builds (podman, a Debian bookworm base made with mmdebstrap; no registry is
reachable here). Its checks run it the way the Deployment does: a read-only root, no capabilities, no
privilege escalation, no network where none is needed. The next to last test starts it with a rendered overlay's
ConfigMap mounted where the Deployment mounts it, the Deployment's command, arguments and environment, and
the credentials a pod of the rendered ServiceAccount gets (a token from the TokenRequest API at the in-cluster
path, KUBERNETES_SERVICE_HOST/PORT), against the real API server of the `kube` fixture; the one after it runs
`kf-culler check` in the image the same way and asserts its verdicts on a busy and an idle real Jupyter.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import tomllib
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from need import missing
from support.kustomize import rbac_in, render
from support.lock import locked, normalize
from support.target import KubeTarget

from kf_culler.local import procs

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]
UID = 65532


@dataclass(frozen=True)
class Image:
    ref: str
    archive: Path
    containers_conf: Path

    def podman(self, *args: str, timeout: float = 300, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "CONTAINERS_CONF": str(self.containers_conf)}
        return subprocess.run(["podman", *args], env=env, input=stdin, capture_output=True, text=True,
                              timeout=timeout)

    def run(self, *args: str, flags: tuple[str, ...] = (), timeout: float = 300) -> subprocess.CompletedProcess[str]:
        """Run the image in a container of its own: no network, read-only root, no capabilities, the image's
        own user (none given)."""
        return self.podman("run", "--rm", "--network=none", "--read-only", "--read-only-tmpfs=false",
                           "--cap-drop=ALL", "--security-opt=no-new-privileges", *flags, self.ref, *args,
                           timeout=timeout)


@pytest.fixture(scope="module")
def image() -> Image:
    """The image, from hack/image/build.sh (seconds when built already; it waits for a build in progress)."""
    try:
        done = subprocess.run(["bash", str(ROOT / "hack" / "image" / "build.sh")], capture_output=True, text=True,
                              timeout=1800)
    except subprocess.TimeoutExpired as err:
        missing("the kf-culler image (hack/image/build.sh)", f"no image after {err.timeout} s")
    if done.returncode != 0:
        missing("the kf-culler image (hack/image/build.sh)", done.stderr.strip()[-2000:])
    out = dict(line.split("=", 1) for line in done.stdout.splitlines() if "=" in line)
    return Image(out["image"], Path(out["archive"]), Path(out["containers_conf"]))


def test_the_script_exports_a_docker_archive_of_the_image(image: Image) -> None:
    assert image.archive.is_file()
    manifest = json.loads(subprocess.run(["tar", "-xOf", str(image.archive), "manifest.json"], capture_output=True,
                                         check=True, timeout=120).stdout)
    (entry,) = manifest
    # The name the manifests use (kustomize/base: `image: kf-culler`), tagged with the package's version.
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert entry["RepoTags"] == [f"docker.io/library/kf-culler:{version}"]
    for overlay in ("kubeflow", "dry-run", "gpu-only"):
        (container,) = _one(render(ROOT / "kustomize" / "overlays" / overlay), "Deployment",
                            "kf-culler")["spec"]["template"]["spec"]["containers"]
        assert container["image"] == f"kf-culler:{version}", overlay
    config = json.loads(subprocess.run(["tar", "-xOf", str(image.archive), entry["Config"]], capture_output=True,
                                       check=True, timeout=120).stdout)
    assert config["config"].get("User") == f"{UID}:{UID}"
    print(f"image {image.ref}: docker-archive {image.archive.stat().st_size / 1e6:.0f} MB")


def test_the_image_runs_as_65532_and_cannot_change_its_own_files(image: Image) -> None:
    inspect = image.podman("image", "inspect", "--format", "{{.Size}}|{{.Config.User}}", image.ref)
    assert inspect.returncode == 0, inspect.stderr
    size, user = inspect.stdout.strip().split("|")
    assert user == f"{UID}:{UID}"
    print(f"image {image.ref}: {int(size) / 1e6:.0f} MB")
    # No --user given: the image's own user. Even without the read-only root, the culler cannot rewrite its code.
    probe = ("import os; print(os.getuid(), os.getgid(), sorted(os.getgroups()),"
             " os.access('/opt/kf-culler/bin', os.W_OK), os.access('/opt/kf-culler/bin/kf-culler', os.W_OK))")
    done = image.podman("run", "--rm", "--network=none", "--entrypoint", "python3", image.ref, "-c", probe)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [str(UID), str(UID), f"[{UID}]", "False", "False"]


def test_help_and_version_with_a_read_only_root_and_no_capabilities(image: Image) -> None:
    done = image.run("--help")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: kf-culler") and " run " in done.stdout
    done = image.run()  # the image's CMD
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: kf-culler")
    version = image.run("--version")
    host = subprocess.run([sys.executable, "-m", "kf_culler", "--version"], capture_output=True, text=True,
                          timeout=120)
    assert version.returncode == 0 and host.returncode == 0, version.stderr + host.stderr
    assert version.stdout == host.stdout


def test_decide_gives_the_same_verdicts_as_the_host(image: Image) -> None:
    """Every scenario of tests/scenarios, through the image's `kf-culler decide`: byte for byte the host's."""
    scenarios = ROOT / "tests" / "scenarios"
    names = sorted(p.name for p in scenarios.glob("*.json"))
    assert names
    script = 'for f in "$@"; do kf-culler decide --input "/scenarios/$f"; echo "exit $?"; done'
    done = image.run("-c", script, "sh", *names, timeout=900,
                     flags=("--volume", f"{scenarios}:/scenarios:ro", "--entrypoint", "sh"))
    assert done.returncode == 0, done.stderr
    expected = []
    for name in names:
        host = subprocess.run([sys.executable, "-m", "kf_culler", "decide", "--input", str(scenarios / name)],
                              capture_output=True, text=True, timeout=120)
        expected.append(f"{host.stdout}exit {host.returncode}\n")
    assert done.stdout == "".join(expected)


def test_only_the_culler_is_in_the_image(image: Image) -> None:
    """No pip, no setuptools, no sources, no demo or local components, no test tools."""
    probe = """
import importlib.util, os, kf_culler
absent = ["pip", "setuptools", "pytest", "jupyter_server", "cryptography", "kf_culler.local", "kf_culler.demo"]
print(json.dumps({
    "present": [m for m in absent if importlib.util.find_spec(m) is not None],
    "src": os.path.exists("/src"),
    "package": os.path.dirname(kf_culler.__file__),
}))
"""
    done = image.run("-c", "import json\n" + probe, flags=("--entrypoint", "python3"))
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    assert found["present"] == [] and found["src"] is False
    assert found["package"].startswith("/opt/kf-culler/lib/")


def test_the_image_holds_exactly_the_locked_dependencies(image: Image) -> None:
    """Every distribution in the image's environment is requirements.lock's at its pinned version (pip and
    setuptools, locked for the build, are gone), and the project at its own version."""
    probe = ("import importlib.metadata as m, json;"
             " print(json.dumps({d.metadata['Name']: d.version for d in m.distributions()}))")
    done = image.run("-c", probe, flags=("--entrypoint", "python3"))
    assert done.returncode == 0, done.stderr
    installed = {normalize(k): v for k, v in json.loads(done.stdout).items()}
    assert installed.pop("kf-culler") == tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert installed == {n: v for n, (v, _) in locked().items() if n not in ("pip", "setuptools")}


def test_the_script_exports_an_oci_layout_of_the_image(image: Image) -> None:
    """Beside the docker-archive, an OCI image layout tagged with the version: its manifest's config is the image's
    (user 65532) and every blob it names is there."""
    oci = image.archive.with_suffix(".oci")
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert json.loads((oci / "oci-layout").read_text())["imageLayoutVersion"] == "1.0.0"

    def blob(digest: str) -> Path:
        algorithm, hexdigest = digest.split(":")
        return oci / "blobs" / algorithm / hexdigest

    (entry,) = json.loads((oci / "index.json").read_text())["manifests"]
    assert entry["annotations"]["org.opencontainers.image.ref.name"] == version
    manifest = json.loads(blob(entry["digest"]).read_text())
    config = json.loads(blob(manifest["config"]["digest"]).read_text())
    assert config["config"]["User"] == f"{UID}:{UID}"
    layers = [blob(layer["digest"]) for layer in manifest["layers"]]
    assert all(p.is_file() for p in layers)
    print(f"image {image.ref}: OCI layout {sum(p.stat().st_size for p in layers) / 1e6:.0f} MB of layers")


# --- the shipped configuration starts the image ------------------------------------------------------------


def _one(objs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    (found,) = [o for o in objs if o["kind"] == kind and o["metadata"]["name"] == name]
    return found


@pytest.fixture()
def culler_namespace(kube: KubeTarget) -> Iterator[str]:
    from kubernetes import client

    name = f"kf-culler-image-{uuid.uuid4().hex[:8]}"
    api = kube.api_client()
    client.CoreV1Api(api).create_namespace({"metadata": {"name": name}})
    yield name
    rbac = client.RbacAuthorizationV1Api(api)
    for delete in (rbac.delete_cluster_role_binding, rbac.delete_cluster_role):
        for item in (rbac.list_cluster_role_binding() if delete == rbac.delete_cluster_role_binding
                     else rbac.list_cluster_role()).items:
            if item.metadata.name.endswith(f"-{name}"):
                delete(item.metadata.name)
    client.CoreV1Api(api).delete_namespace(name)


def _podman_flags(deployment: dict[str, Any], config_maps: dict[str, dict[str, str]], tmp: Path,
                  culler_ns: str, pod_name: str) -> tuple[list[str], list[str], list[str]]:
    """podman flags that give the container what the Deployment's pod gets; the command and the arguments."""
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    pod_sc, sc = pod.get("securityContext", {}), container["securityContext"]
    flags = [f"--user={pod_sc['runAsUser']}:{pod_sc['runAsGroup']}"]
    assert sc["readOnlyRootFilesystem"] is True
    flags += ["--read-only", "--read-only-tmpfs=false"]
    assert sc["capabilities"]["drop"] == ["ALL"] and not sc["capabilities"].get("add")
    flags.append("--cap-drop=ALL")
    assert sc["allowPrivilegeEscalation"] is False
    flags.append("--security-opt=no-new-privileges")
    assert pod_sc["seccompProfile"]["type"] == "RuntimeDefault"  # podman's default seccomp profile
    volumes = {v["name"]: v for v in pod["volumes"]}
    for mount in container["volumeMounts"]:
        volume = volumes[mount["name"]]
        if "configMap" in volume:
            data = config_maps[volume["configMap"]["name"]]
            where = tmp / mount["name"]
            where.mkdir()
            for key, value in data.items():
                (where / key).write_text(value)
                (where / key).chmod(0o644)
            where.chmod(0o755)
            flags.append(f"--volume={where}:{mount['mountPath']}:ro" if mount.get("readOnly") else
                         f"--volume={where}:{mount['mountPath']}")
        elif "emptyDir" in volume:
            flags.append(f"--tmpfs={mount['mountPath']}:rw,mode=1777")
        else:
            pytest.fail(f"volume {mount['name']}: a kind this test does not know how to give the container")
    env = []
    for var in container.get("env", []):
        if "value" in var:
            env.append(f"{var['name']}={var['value']}")
        else:
            field = var["valueFrom"]["fieldRef"]["fieldPath"]
            env.append(f"{var['name']}=" + {"metadata.name": pod_name, "metadata.namespace": culler_ns}[field])
    flags += [f"--env={e}" for e in env]
    return flags, list(container["command"]), list(container["args"])


def _loopback(args: list[str]) -> tuple[list[str], dict[str, int]]:
    """The arguments with the listeners' addresses moved to free loopback ports (the container shares the
    machine's network to reach the API server, and nothing may listen beyond loopback here); nothing else
    changes."""
    out, ports = list(args), {}
    for flag in ("--metrics-address", "--api-address"):
        i = out.index(flag)
        assert out[i + 1].startswith("0.0.0.0:"), out[i + 1]
        ports[flag] = procs.free_port()
        out[i + 1] = f"127.0.0.1:{ports[flag]}"
    return out, ports


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()
    except OSError as err:
        return 0, str(err)


@pytest.mark.cluster
@pytest.mark.parametrize("overlay", ["kubeflow", "dry-run"])
def test_the_rendered_overlay_starts_the_culler_from_the_image(image: Image, kube: KubeTarget, culler_namespace: str,
                                                                overlay: str, tmp_path: Path) -> None:
    from kubernetes import client, utils

    objs = render(ROOT / "kustomize" / "overlays" / overlay)
    deployment = _one(objs, "Deployment", "kf-culler")
    config_maps = {o["metadata"]["name"]: o.get("data", {}) for o in objs if o["kind"] == "ConfigMap"}
    api = kube.api_client()
    for o in rbac_in(objs, culler_namespace):
        utils.create_from_dict(api, o)
    pod_name = f"kf-culler-{uuid.uuid4().hex[:5]}"
    flags, command, args = _podman_flags(deployment, config_maps, tmp_path, culler_namespace, pod_name)
    args, ports = _loopback(args)

    flags += _in_cluster_identity(api, kube, deployment, culler_namespace, tmp_path)

    name = f"kf-culler-test-{uuid.uuid4().hex[:8]}"
    started = image.podman("run", "--detach", f"--name={name}", "--network=host", *flags,
                           f"--entrypoint={command[0]}", image.ref, *command[1:], *args)
    assert started.returncode == 0, started.stderr
    try:
        deadline = time.monotonic() + 180
        ready: tuple[int, str] = (0, "")
        while time.monotonic() < deadline:
            ready = _get(f"http://127.0.0.1:{ports['--metrics-address']}/readyz")
            state = image.podman("inspect", "--format", "{{.State.Status}}", name).stdout.strip()
            if ready[0] == 200 or state != "running":
                break
            time.sleep(1)
        logs = image.podman("logs", name)
        assert ready[0] == 200, f"/readyz: {ready}\n{logs.stdout[-4000:]}{logs.stderr[-4000:]}"
        # Ready once the caches are synced: the first pass may still be under way.
        while "pass done" not in logs.stdout + logs.stderr and time.monotonic() < deadline:
            time.sleep(1)
            logs = image.podman("logs", name)
        assert "pass done" in logs.stdout + logs.stderr, logs.stderr[-4000:]
        # The leader: this pod, through the Lease the rendered Role lets it hold in its own namespace.
        lease = client.CoordinationV1Api(api).read_namespaced_lease("kf-culler", culler_namespace)
        assert lease.spec.holder_identity == pod_name
        # The process the container runs is the culler, as the Deployment's user.
        top = image.podman("top", name, "user", "args")
        assert top.returncode == 0, top.stderr
        assert str(UID) in top.stdout and "kf-culler run" in top.stdout, top.stdout
        # SIGTERM, as the kubelet sends it, within the Deployment's grace period: a clean exit.
        grace = deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
        image.podman("stop", f"--time={grace}", name, timeout=grace + 60)
        code = image.podman("inspect", "--format", "{{.State.ExitCode}}", name).stdout.strip()
        assert code == "0", image.podman("logs", name).stderr[-4000:]
    finally:
        image.podman("rm", "--force", name)


# --- the shipped configuration judges real notebooks from the image ----------------------------------------


def _notebook_behind_its_service(api: Any, namespace: str, name: str) -> None:
    """A Notebook as Kubeflow leaves it: its pod running for an hour (past startupGraceMinutes) through the
    ownership chain, and the Service `<name>` as the notebook-controller makes it (controlled by the Notebook,
    selecting its pod), which the culler checks before its default probe URL goes through it. Headless here
    (`clusterIP: None`): nothing on this machine routes a ClusterIP to a pod, so the culler, which connects to a
    Service's ClusterIP when it has one (`probe.serviceClusterIP`), looks the name up instead, as cluster DNS
    answers a headless Service's name with its pods' addresses (the kind tests probe through real ClusterIPs)."""
    from datetime import UTC, datetime, timedelta

    from kubernetes import client

    from kf_culler.local import objects as obj

    obj.create_notebook(api, namespace, obj.notebook(name))
    obj.running_pod(api, namespace, name, datetime.now(UTC) - timedelta(hours=1))
    nb = obj.get_notebook(api, namespace, name)
    client.CoreV1Api(api).create_namespaced_service(namespace, {
        "metadata": {"name": name, "ownerReferences": [{
            "apiVersion": "kubeflow.org/v1", "kind": "Notebook", "name": name, "uid": nb["metadata"]["uid"],
            "controller": True, "blockOwnerDeletion": True}]},
        "spec": {"clusterIP": "None", "selector": {"statefulset": name},
                 "ports": [{"name": "http-notebook", "port": 80, "targetPort": 8888}]}})


@pytest.mark.cluster
@pytest.mark.parametrize("overlay", ["kubeflow", "dry-run"])
def test_check_in_the_image_judges_an_idle_and_a_busy_jupyter(image: Image, kube: KubeTarget, culler_namespace: str,
                                                               namespace: str, overlay: str, tmp_path: Path) -> None:
    """`kf-culler check -o json` inside the image, as the rendered Deployment runs it (its user, read-only root,
    no capabilities, the rendered ConfigMap at its mount path, `--config` as its arguments give it, POD_NAMESPACE),
    with a TokenRequest token of the rendered ServiceAccount at the in-cluster path, so that the rendered RBAC is
    all it has. Two real Jupyter servers: one whose kernel runs code (busy), one whose kernel has done nothing
    since it started (idle).

    The shipped configuration is used as rendered: no key and no flag of the culler is added. Its idleMinutes
    is 60 and jupyter_server's last_activity cannot be backdated, so the idle notebook is judged idle (state
    `idle`, rule 10, its stop due idleMinutes after the kernel's last activity) and kept until then; the test
    does not wait an hour to see the stop.

    What stands in for the cluster: the Service's DNS name. The default probe URL is
    http://<name>.<namespace>.svc.cluster.local/notebook/<namespace>/<name>/ (port 80); each Jupyter listens on
    port 80 of a loopback address of its own, and the container's /etc/hosts (podman --add-host) maps the
    Service's name to it, as the cluster's DNS does a headless Service's (`_notebook_behind_its_service`). The
    container shares the machine's network to reach the API server on loopback."""
    from kubernetes import utils

    from kf_culler.local.jupyter import JupyterServer

    objs = render(ROOT / "kustomize" / "overlays" / overlay)
    deployment = _one(objs, "Deployment", "kf-culler")
    config_maps = {o["metadata"]["name"]: o.get("data", {}) for o in objs if o["kind"] == "ConfigMap"}
    api = kube.api_client()
    for o in rbac_in(objs, culler_namespace):
        utils.create_from_dict(api, o)
    flags, command, run_args = _podman_flags(deployment, config_maps, tmp_path, culler_namespace, "kf-culler-check")
    config = run_args[run_args.index("--config"):run_args.index("--config") + 2]

    flags += _in_cluster_identity(api, kube, deployment, culler_namespace, tmp_path)

    # The configuration the container reads: the ConfigMap of the volume mounted where `--config` points.
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    (mount,) = [m for m in container["volumeMounts"] if config[1].startswith(m["mountPath"].rstrip("/") + "/")]
    (volume,) = [v for v in deployment["spec"]["template"]["spec"]["volumes"] if v["name"] == mount["name"]]
    rendered_config = yaml.safe_load(config_maps[volume["configMap"]["name"]][Path(config[1]).name])
    domain = rendered_config.get("clusterDomain", "cluster.local")
    servers: dict[str, JupyterServer] = {}
    try:
        for name in ("nb-busy", "nb-idle"):
            address = f"127.{uuid.uuid4().int % 250 + 2}.{uuid.uuid4().int % 250 + 1}.{uuid.uuid4().int % 250 + 1}"
            servers[name] = JupyterServer(namespace, name, ip=address, port=80, remote=True)
            servers[name].start()
            flags.append(f"--add-host={name}.{namespace}.svc.{domain}:{address}")
            _notebook_behind_its_service(api, namespace, name)
        busy = servers["nb-busy"].start_kernel()
        servers["nb-busy"].execute(busy, "import time; time.sleep(600)")
        servers["nb-idle"].start_kernel()
        idle_kernel = servers["nb-idle"].get("api/kernels")[0]

        done = image.podman("run", "--rm", "--network=host", *flags, f"--entrypoint={command[0]}", image.ref,
                            *command[1:], "check", *config, "-o", "json", timeout=300)
        assert done.returncode == 0, done.stderr[-4000:]
    finally:
        for s in servers.values():
            s.stop()
    report = json.loads(done.stdout)
    rows = {r["name"]: r for r in report["notebooks"] if r["namespace"] == namespace}
    assert set(rows) == {"nb-busy", "nb-idle"}, report
    busy_row = rows["nb-busy"]
    assert (busy_row["state"], busy_row["action"], busy_row["rule"]) == ("active", "keep", "5-positive-evidence"), \
        busy_row
    idle = rows["nb-idle"]
    assert (idle["state"], idle["action"], idle["rule"]) == ("idle", "keep", "10-idle"), idle
    # The idle clock runs from the kernel's own last activity, and the stop falls idleMinutes after it.
    from kf_culler.timeutil import parse_time

    since, stop_at = parse_time(idle["idleSince"]), parse_time(idle["stopAt"])
    assert since is not None and stop_at is not None, idle
    assert abs((since - parse_time(idle_kernel["last_activity"])).total_seconds()) < 2, (idle, idle_kernel)
    assert (stop_at - since).total_seconds() == rendered_config["idleMinutes"] * 60, idle


def _in_cluster_identity(api: Any, kube: Any, deployment: dict[str, Any], culler_namespace: str,
                         tmp_path: Path) -> list[str]:
    """What a pod of the rendered ServiceAccount gets: a TokenRequest token, the cluster's CA and its namespace at
    the in-cluster path, and the API server's address in the environment (podman flags)."""
    from kubernetes import client

    sa = deployment["spec"]["template"]["spec"]["serviceAccountName"]
    token = client.CoreV1Api(api).create_namespaced_service_account_token(
        sa, culler_namespace, {"spec": {"expirationSeconds": 3600}}).status.token
    server, ca = kube._server_and_ca()
    host, port = server.removeprefix("https://").rsplit(":", 1)
    assert host in ("127.0.0.1", "localhost"), server
    secrets = tmp_path / "serviceaccount"
    secrets.mkdir()
    (secrets / "token").write_text(token)
    (secrets / "ca.crt").write_bytes(ca.read_bytes())
    (secrets / "namespace").write_text(culler_namespace)
    for f in secrets.iterdir():
        f.chmod(0o644)
    secrets.chmod(0o755)
    return [f"--volume={secrets}:/var/run/secrets/kubernetes.io/serviceaccount:ro",
            f"--env=KUBERNETES_SERVICE_HOST={host}", f"--env=KUBERNETES_SERVICE_PORT={port}"]
