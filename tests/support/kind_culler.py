"""kf-culler, Kubeflow's notebook-controller and Jupyter as pods on the kind cluster (tests/test_kind_*.py,
bench/kind_handoff.py).

The images come from hack/kind/images.sh (built here, nothing pulled) and are loaded onto the node. kf-culler is the
rendered `kustomize/overlays/kubeflow` as an admin installs it: an overlay of their own on top of it, with the
components it needs, a `config.yaml` of their own (`configMapGenerator` `behavior: merge`, docs/install.md
"Overlays") and the namespace the test chose. The notebook-controller is upstream's own standalone kustomization
(`config/overlays/standalone` of the vendored v1.11.0 source) with the image built here.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from support.kind import Kind
from support.kustomize import render

ROOT = Path(__file__).resolve().parents[2]
IMAGES = ROOT / "hack" / "kind" / "images.sh"
NBC_SOURCE = ROOT.parent / "shared" / "vendor" / "kubeflow-notebook-controller-v1.11.0"
NBC_NAMESPACE = "kubeflow"  # where Kubeflow installs it, and the namespace builtin-culling-off's patch names
NBC_DEPLOYMENT = "notebook-controller-deployment"
NBC_UPSTREAM_IMAGE = "ghcr.io/kubeflow/notebooks/notebook-controller"
GPU = "nvidia.com/gpu"
# What a kind cluster cannot take from the kubeflow overlay: the Istio component's objects. There is no Istio here,
# so their CustomResourceDefinitions are absent and the API server refuses them; the sidecar label and annotations
# the component puts on the pod template stay (nothing injects a sidecar, so they change nothing).
NO_ISTIO = ("security.istio.io/", "networking.istio.io/")
# Cluster-scoped kinds of the rendered objects (kustomize gives them the overlay's namespace too; the API server
# drops it).
CLUSTER_KINDS = ("ClusterRole", "ClusterRoleBinding", "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding",
                 "CustomResourceDefinition", "Namespace")


class ImagesUnavailable(RuntimeError):
    """hack/kind/images.sh could not build an image; the message has its log."""


@dataclass(frozen=True)
class Images:
    culler: str
    jupyterlab: str
    notebook_controller: str


def build_images(kind: Kind) -> Images:
    """Build (or find cached) the three images and put them on the cluster's node."""
    done = subprocess.run(["bash", str(IMAGES), "all"], capture_output=True, text=True, timeout=3600)
    if done.returncode != 0:
        raise ImagesUnavailable(done.stderr[-4000:])
    out = dict(line.split("=", 1) for line in done.stdout.splitlines() if "=" in line)
    for name in ("culler", "jupyterlab", "notebook_controller"):
        kind.load_archive_once(Path(out[f"{name}_archive"]))
    return Images(out["culler_image"], out["jupyterlab_image"], out["notebook_controller_image"])


def wait_for(what: str, check: Callable[[], Any], timeout: float = 180, every: float = 0.5) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(every)


def apply(kind: Kind, objs: list[dict[str, Any]]) -> None:
    kind.kubectl("apply", "-f", "-", stdin=yaml.safe_dump_all(objs))


def delete(kind: Kind, objs: list[dict[str, Any]], wait: bool = False) -> None:
    with contextlib.suppress(AssertionError):
        kind.kubectl("delete", "--ignore-not-found", f"--wait={str(wait).lower()}", "--timeout=180s", "-f", "-",
                     stdin=yaml.safe_dump_all(objs))


# --- kf-culler ---------------------------------------------------------------------------------------------------


def base_config() -> dict[str, Any]:
    """kustomize/base/config.yaml, the admin's file the overlays ship."""
    data: dict[str, Any] = yaml.safe_load((ROOT / "kustomize" / "base" / "config.yaml").read_text())
    return data


def render_culler(workdir: Path, namespace: str, config: dict[str, Any],
                  components: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    """The kubeflow overlay with `components`, in `namespace`, its config.yaml base/config.yaml with `config`'s keys
    changed, the image taken from the node (imagePullPolicy Never); the Istio objects left out (NO_ISTIO)."""
    workdir.mkdir(parents=True, exist_ok=True)
    rel = os.path.relpath(ROOT / "kustomize", workdir)
    (workdir / "config.yaml").write_text(yaml.safe_dump({**base_config(), **config}, sort_keys=False))
    (workdir / "kustomization.yaml").write_text(yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        "namespace": namespace,
        "resources": [f"{rel}/overlays/kubeflow"],
        "components": [f"{rel}/components/{c}" for c in components],
        "configMapGenerator": [{"name": "kf-culler-config", "behavior": "merge", "files": ["config.yaml"]}],
        "patches": [{"target": {"kind": "Deployment", "name": "kf-culler"}, "patch": yaml.safe_dump([
            {"op": "replace", "path": "/spec/template/spec/containers/0/imagePullPolicy", "value": "Never"}])}],
    }))
    return [o for o in render(workdir) if not o["apiVersion"].startswith(NO_ISTIO)]


@dataclass
class Culler:
    kind: Kind
    namespace: str
    objs: list[dict[str, Any]]

    @property
    def deployment(self) -> dict[str, Any]:
        (found,) = [o for o in self.objs if o["kind"] == "Deployment" and o["metadata"]["name"] == "kf-culler"]
        return found

    def pods(self) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = json.loads(self.kind.kubectl(
            "get", "pods", "-n", self.namespace, "-l", "app.kubernetes.io/name=kf-culler", "-o", "json"))["items"]
        return [p for p in items if not p["metadata"].get("deletionTimestamp")]

    def ready_pods(self) -> list[str]:
        return [p["metadata"]["name"] for p in self.pods()
                if any(c["type"] == "Ready" and c["status"] == "True" for c in p["status"].get("conditions") or [])]

    def leader(self) -> str | None:
        out = self.kind.kubectl("get", "lease", "-n", self.namespace, "kf-culler", "--ignore-not-found",
                                "-o", "jsonpath={.spec.holderIdentity}")
        return out.strip() or None

    def logs(self, pod: str) -> str:
        return self.kind.kubectl("logs", "-n", self.namespace, pod)

    def passes(self, pod: str) -> int:
        return self.logs(pod).count("pass done")

    def wait_ready(self, replicas: int, timeout: float = 300) -> list[str]:
        return list(wait_for(f"{replicas} kf-culler pods Ready",
                             lambda: r if len(r := self.ready_pods()) == replicas else None, timeout))


@contextlib.contextmanager
def deployed_culler(kind: Kind, workdir: Path, config: dict[str, Any], components: tuple[str, ...] = (),
                    namespace: str | None = None) -> Iterator[Culler]:
    """The rendered culler applied in a namespace of its own; everything it made deleted on leaving."""
    namespace = namespace or f"kf-culler-{uuid.uuid4().hex[:6]}"
    objs = render_culler(workdir, namespace, config, components)
    kind.kubectl("create", "namespace", namespace)
    try:
        apply(kind, objs)
        yield Culler(kind, namespace, objs)
    finally:
        delete(kind, [o for o in objs if o["kind"] in CLUSTER_KINDS])
        with contextlib.suppress(AssertionError):
            kind.kubectl("delete", "namespace", namespace, "--wait=true", "--timeout=120s")


# --- Kubeflow's notebook-controller ----------------------------------------------------------------------------


def render_notebook_controller(workdir: Path, image: str) -> list[dict[str, Any]]:
    """Upstream's standalone kustomization (its CRD, RBAC, ServiceAccount, ConfigMap and Deployment, USE_ISTIO=false)
    in Kubeflow's namespace, with the image built here, taken from the node."""
    workdir.mkdir(parents=True, exist_ok=True)
    name, tag = image.rsplit(":", 1)
    (workdir / "kustomization.yaml").write_text(yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization", "namespace": NBC_NAMESPACE,
        "resources": [os.path.relpath(NBC_SOURCE / "config" / "overlays" / "standalone", workdir)],
        "images": [{"name": NBC_UPSTREAM_IMAGE, "newName": name, "newTag": tag}],
        "patches": [{"target": {"kind": "Deployment"}, "patch": yaml.safe_dump([
            {"op": "replace", "path": "/spec/template/spec/containers/0/imagePullPolicy", "value": "Never"}])}],
    }))
    return render(workdir)


@contextlib.contextmanager
def notebook_controller(kind: Kind, workdir: Path, image: str) -> Iterator[None]:
    """The notebook-controller running (its Deployment rolled out, Ready); upstream's ConfigMap has
    ENABLE_CULLING=false, its default."""
    if not (NBC_SOURCE / "config").is_dir():
        raise ImagesUnavailable(f"no notebook-controller source at {NBC_SOURCE}")
    objs = render_notebook_controller(workdir, image)
    kind.kubectl("apply", "-f", "-", stdin=yaml.safe_dump_all([o for o in objs
                                                               if o["kind"] == "CustomResourceDefinition"]))
    kind.wait_condition("crd/notebooks.kubeflow.org", "Established", timeout=60)
    apply(kind, objs)
    try:
        kind.kubectl("rollout", "status", "-n", NBC_NAMESPACE, f"deployment/{NBC_DEPLOYMENT}", "--timeout=300s")
        yield
    finally:
        delete(kind, [o for o in objs if o["kind"] != "CustomResourceDefinition"], wait=True)


# --- Jupyter in a pod, used as a browser would ------------------------------------------------------------------

# Run with the pod's own Python (kubectl exec): start a kernel through the server's REST API and send it one message
# over its websocket channel, as JupyterLab does when a notebook is opened (kernel_info_request: the kernel is then
# idle) or a cell is run (execute_request: busy). The request carries the same _xsrf cookie and header a browser
# would; Kubeflow's command line allows any origin.
DRIVE_KERNEL = r"""
import json, sys, uuid, urllib.request
from tornado.httpclient import HTTPRequest
from tornado.ioloop import IOLoop
from tornado.websocket import websocket_connect

base, code = sys.argv[1], sys.argv[2]
headers = {"Content-Type": "application/json", "Cookie": "_xsrf=kfc", "X-XSRFToken": "kfc"}
request = urllib.request.Request(base + "api/kernels", data=b'{"name": "python3"}', headers=headers, method="POST")
kernel = json.load(urllib.request.urlopen(request, timeout=120))["id"]

async def send():
    url = base.replace("http://", "ws://", 1) + "api/kernels/" + kernel + "/channels?_xsrf=kfc"
    ws = await websocket_connect(HTTPRequest(url, headers={"Cookie": "_xsrf=kfc"}))
    msg_type, until = ("execute_request", "busy") if code else ("kernel_info_request", "idle")
    content = {"code": code, "silent": False, "store_history": False, "user_expressions": {}, "allow_stdin": False,
               "stop_on_error": True} if code else {}
    ws.write_message(json.dumps({"header": {"msg_id": uuid.uuid4().hex, "msg_type": msg_type, "username": "user",
                                            "session": uuid.uuid4().hex, "date": "", "version": "5.3"},
                                 "parent_header": {}, "metadata": {}, "channel": "shell", "content": content}))
    while True:
        message = await ws.read_message()
        if message is None:
            break
        data = json.loads(message)
        if data.get("msg_type") == "status" and data["content"].get("execution_state") == until:
            break
    ws.close()

IOLoop.current().run_sync(send, timeout=120)
print(kernel)
"""

# The server's kernels, read without moving its activity clock (as the culler reads them).
READ_KERNELS = r"""
import sys, urllib.request
print(urllib.request.urlopen(sys.argv[1] + "api/kernels?no_track_activity=1", timeout=30).read().decode())
"""


def jupyter_base(prefix: str) -> str:
    return f"http://127.0.0.1:8888{prefix.rstrip('/')}/"


def start_kernel(kind: Kind, namespace: str, pod: str, prefix: str, code: str = "") -> str:
    """A kernel in the Jupyter server of `pod`: opened (idle), or running `code` (busy while it runs)."""
    return kind.kubectl("exec", "-i", "-n", namespace, pod, "--", "python3", "-", jupyter_base(prefix), code,
                        stdin=DRIVE_KERNEL).strip().splitlines()[-1]


def kernels(kind: Kind, namespace: str, pod: str, prefix: str) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = json.loads(kind.kubectl("exec", "-i", "-n", namespace, pod, "--", "python3", "-",
                                                          jupyter_base(prefix), stdin=READ_KERNELS))
    return found


# --- objects -------------------------------------------------------------------------------------------------------


def get(kind: Kind, *args: str) -> dict[str, Any]:
    """`kubectl get ... -o json`; {} when it does not exist."""
    out = kind.kubectl("get", *args, "--ignore-not-found", "-o", "json")
    return json.loads(out) if out.strip() else {}


def events(kind: Kind, namespace: str, kind_name: str, name: str, reason: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = get(kind, "events", "-n", namespace, "--field-selector",
                                      f"involvedObject.name={name},involvedObject.kind={kind_name},reason={reason}"
                                      ).get("items", [])
    return items


def ready(pod: dict[str, Any]) -> bool:
    return any(c["type"] == "Ready" and c["status"] == "True" for c in (pod.get("status") or {}).get("conditions")
               or [])


def condition(pod: dict[str, Any], kind_name: str) -> dict[str, Any] | None:
    for c in (pod.get("status") or {}).get("conditions") or []:
        if c["type"] == kind_name:
            return dict(c)
    return None


@contextlib.contextmanager
def fake_gpu(kind: Kind, count: int = 1) -> Iterator[str]:
    """The node advertises `count` nvidia.com/gpu, as the write-up did: its status capacity and allocatable patched
    (no device plugin, no GPU: the scheduler counts it, nothing is attached to a container). Removed on leaving."""
    node = kind.node()
    path = GPU.replace("/", "~1")
    kind.kubectl("patch", "node", node, "--subresource=status", "--type=json", "-p", json.dumps([
        {"op": "add", "path": f"/status/capacity/{path}", "value": str(count)},
        {"op": "add", "path": f"/status/allocatable/{path}", "value": str(count)}]))
    try:
        wait_for("the node to advertise the GPU", lambda: get(kind, "node", node)["status"]["allocatable"].get(GPU)
                 == str(count), 60)
        yield node
    finally:
        with contextlib.suppress(AssertionError):
            kind.kubectl("patch", "node", node, "--subresource=status", "--type=json", "-p", json.dumps([
                {"op": "remove", "path": f"/status/capacity/{path}"},
                {"op": "remove", "path": f"/status/allocatable/{path}"}]))
