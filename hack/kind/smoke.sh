#!/usr/bin/env bash
# Prove the kind backend works: a cluster made with pytest-kind's own command line from the local node image;
# the node Ready, CoreDNS Running, a locally built image loaded with `kind load image-archive`, a pod of it
# serving through a Service, reached from another pod by ClusterIP and by <svc>.<ns>.svc.cluster.local.
# The cluster is deleted at the end (also on failure). Prints the times it measured.
#
#   hack/kind/smoke.sh          (builds with hack/kind/build.sh first: cached after the first time)
#
# Environment: KF_CULLER_KIND_CLUSTER  cluster name (default kf-culler-smoke)
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
NAME=${KF_CULLER_KIND_CLUSTER:-kf-culler-smoke}
log() { printf '[kind-smoke] %s\n' "$*" >&2; }
die() { printf '[kind-smoke] error: %s\n' "$*" >&2; exit 1; }

dir=$(bash "$here/build.sh" all | tail -n1)
set -a; . "$dir/env"; set +a
work=$(mktemp -d "${TMPDIR:-/tmp}/kf-culler-kind-smoke.XXXXXX")
KC=$work/kubeconfig
k() { "$KUBECTL_BIN" --kubeconfig "$KC" "$@"; }
cleanup() {
  local rc=$?
  if [ $rc -ne 0 ] && [ -s "$KC" ]; then
    k get pods -A -o wide >&2 || true
    k get events -A --sort-by=.lastTimestamp 2>/dev/null | tail -n 20 >&2 || true
  fi
  "$KIND_BIN" delete cluster --name "$NAME" >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT

"$KIND_BIN" delete cluster --name "$NAME" >/dev/null 2>&1 || true
t0=$SECONDS
log "kind create cluster --name=$NAME --image=$KIND_NODE_IMAGE"
"$KIND_BIN" create cluster "--name=$NAME" "--kubeconfig=$KC" "--image=$KIND_NODE_IMAGE" >&2
t_created=$((SECONDS - t0))
k wait --for=condition=Ready node --all --timeout=180s >&2
t_ready=$((SECONDS - t0))
# CoreDNS's pods exist only once the controller-manager has made them
for _ in $(seq 1 180); do [ -n "$(k -n kube-system get pods -l k8s-app=kube-dns -o name)" ] && break; sleep 1; done
k -n kube-system wait --for=condition=Ready pod -l k8s-app=kube-dns --timeout=180s >&2
t_dns=$((SECONDS - t0))

log "loading $KIND_TOOLS_IMAGE with kind load image-archive"
docker save -o "$work/tools.tar" "$KIND_TOOLS_IMAGE"
"$KIND_BIN" load image-archive --name "$NAME" "$work/tools.tar" >&2

k apply -f - >&2 <<EOF
apiVersion: v1
kind: Pod
metadata: {name: echo, namespace: default, labels: {app: echo}}
spec:
  containers:
  - name: echo
    image: $KIND_TOOLS_IMAGE
    imagePullPolicy: Never
    command: [socat, "TCP-LISTEN:8080,fork,reuseaddr", "SYSTEM:echo hello-from-kind"]
    ports: [{containerPort: 8080}]
    readinessProbe: {tcpSocket: {port: 8080}, periodSeconds: 1}
---
apiVersion: v1
kind: Service
metadata: {name: echo, namespace: default}
spec:
  selector: {app: echo}
  ports: [{port: 80, targetPort: 8080}]
EOF
k wait --for=condition=Ready pod/echo --timeout=120s >&2
ip=$(k get svc echo -o jsonpath='{.spec.clusterIP}')
k apply -f - >&2 <<EOF
apiVersion: v1
kind: Pod
metadata: {name: client, namespace: default}
spec:
  restartPolicy: Never
  containers:
  - name: client
    image: $KIND_TOOLS_IMAGE
    imagePullPolicy: Never
    command: [sh, -c, "getent hosts echo.default.svc.cluster.local && socat -T5 - TCP:$ip:80 </dev/null && socat -T5 - TCP:echo.default.svc.cluster.local:80 </dev/null"]
EOF
k wait --for=jsonpath='{.status.phase}'=Succeeded pod/client --timeout=120s >&2 \
  || { k logs client >&2 || true; die "the client pod did not reach the Service"; }
out=$(k logs client)
printf '%s\n' "$out" >&2
[ "$(printf '%s\n' "$out" | grep -c '^hello-from-kind$')" = 2 ] || die "expected two answers from the Service"
printf '%s\n' "$out" | grep -q "^$ip " || die "echo.default.svc.cluster.local did not resolve to $ip"
log "ok: cluster created in ${t_created} s, node Ready at ${t_ready} s, CoreDNS Ready at ${t_dns} s," \
  "a pod reached the Service by ClusterIP and by DNS ($((SECONDS - t0)) s in all)"
