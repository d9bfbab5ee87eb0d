"""What only a real kubelet shows, on a kind cluster built here (hack/kind/build.sh, docs/kind.md).

A session stopped the way the culler stops one (its StatefulSet scaled to 0) and started again: the old pod's
container ends and its Service stops routing to it; the new pod's home volume (a PersistentVolumeClaim bound
to a hostPath PersistentVolume) still holds the file written before the stop, while its /tmp starts empty.
The cluster is made with pytest-kind's own command line from the local node image; nothing is pulled.
"""

from __future__ import annotations

import json
from pathlib import Path

from support.kind import Kind
from support.kind_culler import wait_for

ROOT = Path(__file__).resolve().parents[1]

NS = "default"


def manifests(image: str) -> str:
    return f"""
apiVersion: v1
kind: PersistentVolume
metadata: {{name: kf-home-session}}
spec:
  capacity: {{storage: 1Gi}}
  accessModes: [ReadWriteOnce]
  storageClassName: standard
  persistentVolumeReclaimPolicy: Delete
  hostPath: {{path: /var/local/kf-home-session, type: DirectoryOrCreate}}
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {{name: home, namespace: {NS}}}
spec:
  accessModes: [ReadWriteOnce]
  storageClassName: standard
  volumeName: kf-home-session
  resources: {{requests: {{storage: 1Gi}}}}
---
apiVersion: v1
kind: Service
metadata: {{name: session, namespace: {NS}}}
spec:
  selector: {{app: session}}
  ports: [{{port: 80, targetPort: 8080}}]
---
apiVersion: apps/v1
kind: StatefulSet
metadata: {{name: session, namespace: {NS}}}
spec:
  replicas: 1
  serviceName: session
  selector: {{matchLabels: {{app: session}}}}
  template:
    metadata: {{labels: {{app: session}}}}
    spec:
      terminationGracePeriodSeconds: 5
      containers:
      - name: session
        image: {image}
        imagePullPolicy: Never
        command: [socat, "TCP-LISTEN:8080,fork,reuseaddr", "SYSTEM:echo session"]
        ports: [{{containerPort: 8080}}]
        readinessProbe: {{tcpSocket: {{port: 8080}}, periodSeconds: 1}}
        volumeMounts: [{{name: home, mountPath: /home/session}}]
      volumes:
      - name: home
        persistentVolumeClaim: {{claimName: home}}
"""


def ready_endpoints(kind: Kind) -> list[str]:
    """The addresses the Service routes to: its EndpointSlices' ready endpoints."""
    slices = json.loads(kind.kubectl("get", "endpointslices", "-n", NS, "-l",
                                     "kubernetes.io/service-name=session", "-o", "json"))["items"]
    return [address for piece in slices for endpoint in piece.get("endpoints") or []
            if (endpoint.get("conditions") or {}).get("ready") for address in endpoint["addresses"]]


def pod_uid(kind: Kind) -> str:
    return kind.kubectl("get", "pod", "-n", NS, "session-0", "--ignore-not-found", "-o", "jsonpath={.metadata.uid}")


def test_a_stopped_session_keeps_its_home_loses_its_tmp_and_leaves_its_service(kind: Kind) -> None:
    kind.kubectl("apply", "-f", "-", stdin=manifests(kind.backend.tools_image))
    kind.wait_condition("pod/session-0", "Ready", namespace=NS)
    first = pod_uid(kind)
    ip = kind.kubectl("get", "pod", "-n", NS, "session-0", "-o", "jsonpath={.status.podIP}")
    assert wait_for("the Service to route to the pod", lambda: ready_endpoints(kind) == [ip])
    kind.kubectl("exec", "-n", NS, "session-0", "--", "sh", "-c",
                 "echo kept > /home/session/notes && echo scratch > /tmp/scratch")

    kind.kubectl("scale", "-n", NS, "statefulset/session", "--replicas=0")
    wait_for("the stopped pod to be gone", lambda: pod_uid(kind) == "")
    assert wait_for("the Service to stop routing to it", lambda: ready_endpoints(kind) == [])

    kind.kubectl("scale", "-n", NS, "statefulset/session", "--replicas=1")
    wait_for("a new pod", lambda: pod_uid(kind) not in ("", first))
    kind.wait_condition("pod/session-0", "Ready", namespace=NS)
    home = kind.kubectl("exec", "-n", NS, "session-0", "--", "cat", "/home/session/notes")
    tmp = kind.kubectl("exec", "-n", NS, "session-0", "--", "ls", "-A", "/tmp")
    assert home.strip() == "kept"
    assert "scratch" not in tmp.split()
    new_ip = kind.kubectl("get", "pod", "-n", NS, "session-0", "-o", "jsonpath={.status.podIP}")
    assert wait_for("the Service to route to the new pod", lambda: ready_endpoints(kind) == [new_ip])
