#!/usr/bin/env bash
# Build the local control plane from upstream Go modules into a cache outside the repository.
#
#   hack/controlplane/build.sh [apiserver|cluster|all]
#
#   apiserver  etcd + kube-apiserver (default; what the tests need)
#   cluster    also kube-controller-manager, kube-scheduler and kwok
#   all        also Kubeflow's notebook-controller
#   workspaces Kubeflow Notebooks 2.0's Workspace controller v2.0.0-beta.0 (and its CRDs), alone
#   workspaces-backend  Kubeflow Notebooks 2.0's v2 backend (REST API) v2.0.0-beta.0, alone
#
# Environment:
#   KF_CULLER_K8S_VERSION  Kubernetes release to build       (default: versions.env)
#   KF_CULLER_ETCD_VERSION etcd release to build             (default: versions.env)
#   KF_CULLER_KWOK_VERSION kwok release to build             (default: versions.env)
#   KF_CULLER_NBC_VERSION  notebook-controller pseudo-version (default: the v1.11.0 commit)
#   KF_CULLER_BIN_DIR      where binaries go (default ~/.cache/kf-culler/bin/<k8s-version>)
#   KF_CULLER_NOTEBOOK_CONTROLLER_SRC  notebook-controller source tree, used when the Go module proxy does
#                          not serve the module (default: ../shared/vendor/kubeflow-notebook-controller-v1.11.0)
#   KF_CULLER_WORKSPACE_CONTROLLER_SRC  the Workspace controller's source tree
#                          (default: ../shared/vendor/kubeflow-workspaces-v2.0.0-beta.0/workspaces/controller)
#   KF_CULLER_WORKSPACES_SRC  the workspaces/ folder holding both backend/ and controller/, for the backend
#                          (default: ../shared/vendor/kubeflow-workspaces-v2.0.0-beta.0/workspaces)
#
# Idempotent: a binary that is already present with a matching .version stamp is not rebuilt.
# Prints the directory holding the binaries as its last line.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
set_name=${1:-apiserver}
# Defaults from versions.env; variables already in the environment win.
while IFS='=' read -r key value; do
  case "$key" in KF_CULLER_*) [ -n "${!key:-}" ] || export "$key=$value" ;; esac
done < "$here/versions.env"
K8S_VERSION=$KF_CULLER_K8S_VERSION
ETCD_VERSION=$KF_CULLER_ETCD_VERSION
KWOK_VERSION=$KF_CULLER_KWOK_VERSION
NBC_VERSION=${KF_CULLER_NBC_VERSION:-}
BIN_DIR=${KF_CULLER_BIN_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/kf-culler/bin/$K8S_VERSION}
BUILD_ROOT=$(dirname "$BIN_DIR")/../build

log() { printf '[controlplane] %s\n' "$*" >&2; }
die() { printf '[controlplane] error: %s\n' "$*" >&2; exit 1; }

command -v go >/dev/null 2>&1 || die "Go is not installed or not on PATH; install Go >= 1.26 (https://go.dev/doc/install) and run again"
command -v python3 >/dev/null 2>&1 || die "python3 is needed to read the upstream go.mod"
mkdir -p "$BIN_DIR" "$BUILD_ROOT"
BUILD_ROOT=$(cd "$BUILD_ROOT" && pwd)
# One build at a time per set of binaries: a test that needs the Workspace controller while
# hack/background-builds.sh builds it waits here, then finds it cached. The Workspaces' two binaries have
# locks of their own, so a test asking for kube-apiserver never waits behind them.
case "$set_name" in
  workspaces|workspaces-backend) lock=$set_name ;;
  *) lock=core ;;
esac
exec 9>"$BIN_DIR/.build-$lock.lock"
flock 9
export GOFLAGS="${GOFLAGS:-} -mod=mod"
export CGO_ENABLED=0

# have NAME VERSION: true when BIN_DIR/NAME exists and was built from VERSION
have() { [ -x "$BIN_DIR/$1" ] && [ "$(cat "$BIN_DIR/$1.version" 2>/dev/null)" = "$2" ]; }
stamp() { printf '%s\n' "$2" > "$BIN_DIR/$1.version"; }
timed() { local t0=$SECONDS; "$@" || return; log "  done in $((SECONDS - t0)) s"; }
# served MODULE@VERSION: true when the Go module proxy serves it; prints its error otherwise
served() {
  go mod download -json "$1" 2>/dev/null | python3 -c 'import json,sys; e=json.load(sys.stdin).get("Error"); e and print(e, file=sys.stderr); sys.exit(1 if e else 0)'
}

build_etcd() {
  have etcd "$ETCD_VERSION" && { log "etcd $ETCD_VERSION: cached"; return; }
  local dir="$BUILD_ROOT/etcd-$ETCD_VERSION"
  log "etcd $ETCD_VERSION: preparing wrapper module in $dir"
  rm -rf "$dir" && mkdir -p "$dir"
  cp "$here/etcd/main.go" "$dir/main.go"
  (cd "$dir" && go mod init kfculler.local/etcd >/dev/null 2>&1 \
     && go mod edit -require="go.etcd.io/etcd/server/v3@$ETCD_VERSION" \
     && log "etcd: downloading modules" && go mod tidy \
     && log "etcd: compiling" \
     && go build -trimpath -o "$BIN_DIR/etcd" .)
  stamp etcd "$ETCD_VERSION"
}

# The k8s.io/kubernetes go.mod points its staging modules at ./staging; a consumer must pin each to
# the matching published v0.<minor>.<patch>. The list is read from the upstream go.mod itself.
k8s_wrapper() {
  local dir="$BUILD_ROOT/kubernetes-$K8S_VERSION"
  if [ -f "$dir/.ready" ]; then echo "$dir"; return; fi
  log "kubernetes $K8S_VERSION: preparing wrapper module in $dir"
  rm -rf "$dir" && mkdir -p "$dir"
  local gomod
  gomod=$(go mod download -json "k8s.io/kubernetes@$K8S_VERSION" | python3 -c 'import json,sys; d=json.load(sys.stdin); print(d.get("GoMod") or sys.exit(d.get("Error","no GoMod")))') \
    || die "the Go module proxy did not serve k8s.io/kubernetes@$K8S_VERSION"
  local staging_version="v0.${K8S_VERSION#v1.}"
  (cd "$dir" && go mod init kfculler.local/kubernetes >/dev/null 2>&1)
  local args=("-require=k8s.io/kubernetes@$K8S_VERSION")
  while read -r mod; do
    args+=("-replace=$mod=$mod@$staging_version")
  done < <(go mod edit -json "$gomod" | python3 -c '
import json, sys
for r in json.load(sys.stdin).get("Replace") or []:
    if r["New"]["Path"].startswith("./staging/"):
        print(r["Old"]["Path"])')
  log "kubernetes: pinning $(( ${#args[@]} - 1 )) staging modules to $staging_version"
  (cd "$dir" && go mod edit "${args[@]}")
  printf '//go:build tools\n\npackage tools\n\nimport _ "k8s.io/kubernetes/cmd/kube-apiserver/app"\n' > "$dir/tools.go"
  log "kubernetes: downloading modules (the first time this takes several minutes)"
  (cd "$dir" && go mod tidy >&2)
  touch "$dir/.ready"
  echo "$dir"
}

# k8s_need DIR NAME: make the wrapper's go.mod/go.sum cover cmd/NAME (a pinned import, never `go get`,
# which would move k8s.io/kubernetes off K8S_VERSION).
k8s_need() {
  local dir=$1 pkg="k8s.io/kubernetes/cmd/$2/app"
  grep -q "\"$pkg\"" "$dir/tools.go" && return
  log "kubernetes: adding the modules $2 needs"
  printf 'import _ "%s"\n' "$pkg" >> "$dir/tools.go"
  (cd "$dir" && go mod tidy >&2)
}

build_k8s() { # build_k8s NAME
  local name=$1
  have "$name" "$K8S_VERSION" && { log "$name $K8S_VERSION: cached"; return; }
  local dir; dir=$(k8s_wrapper)
  local minor=${K8S_VERSION#v1.}; minor=${minor%%.*}
  local pkg=k8s.io/component-base/version
  log "$name $K8S_VERSION: compiling (cold: several minutes on 2 cores)"
  k8s_need "$dir" "$name"
  (cd "$dir" && timed go build -trimpath -o "$BIN_DIR/$name" \
     -ldflags "-s -w -X $pkg.gitVersion=$K8S_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor -X $pkg.gitTreeState=clean" \
     "k8s.io/kubernetes/cmd/$name")
  stamp "$name" "$K8S_VERSION"
}

# kwok needs Stage objects to play nodes and pods; the upstream "fast" stages (node initialise,
# heartbeat with lease, pod ready/complete/delete) are taken from the same module version.
KWOK_STAGES="node/fast/node-initialize.yaml node/heartbeat-with-lease/node-heartbeat-with-lease.yaml
pod/fast/pod-ready.yaml pod/fast/pod-complete.yaml pod/fast/pod-delete.yaml"

build_kwok() {
  have kwok "$KWOK_VERSION" && [ -s "$BIN_DIR/kwok-stages.yaml" ] && { log "kwok $KWOK_VERSION: cached"; return; }
  local dir="$BUILD_ROOT/kwok-$KWOK_VERSION"
  log "kwok $KWOK_VERSION: building"
  rm -rf "$dir" && mkdir -p "$dir"
  (cd "$dir" && go mod init kfculler.local/kwok >/dev/null 2>&1 \
     && go mod edit -require="sigs.k8s.io/kwok@$KWOK_VERSION" \
     && printf '//go:build tools\n\npackage tools\n\nimport _ "sigs.k8s.io/kwok/cmd/kwok"\n' > tools.go \
     && go mod tidy >&2 \
     && timed go build -trimpath -o "$BIN_DIR/kwok" sigs.k8s.io/kwok/cmd/kwok)
  local src; src=$(cd "$dir" && go list -m -f '{{.Dir}}' sigs.k8s.io/kwok)
  local f out="$BIN_DIR/kwok-stages.yaml.tmp"
  : > "$out"
  for f in $KWOK_STAGES; do
    [ -f "$src/kustomize/stage/$f" ] || die "kwok $KWOK_VERSION has no stage kustomize/stage/$f"
    printf -- '---\n' >> "$out" && cat "$src/kustomize/stage/$f" >> "$out"
  done
  mv "$out" "$BIN_DIR/kwok-stages.yaml"
  log "kwok: stages written to $BIN_DIR/kwok-stages.yaml"
  stamp kwok "$KWOK_VERSION"
}

# Kubeflow's notebook-controller: from the Go module proxy where it is served; else from a source tree,
# KF_CULLER_NOTEBOOK_CONTROLLER_SRC or the unmodified upstream copy in ../shared/vendor (read-only, so the
# build runs in a copy). Its dependencies come from the proxy either way.
NBC_VENDORED=$(cd "$here/../.." && pwd)/../shared/vendor/kubeflow-notebook-controller-v1.11.0

build_nbc() {
  local mod=github.com/kubeflow/notebooks/components/notebook-controller
  local ver=${NBC_VERSION:-$(cat "$here/notebook-controller.version")}
  have notebook-controller "$ver" && { log "notebook-controller $ver: cached"; return; }
  local dir="$BUILD_ROOT/notebook-controller-$ver"
  rm -rf "$dir" && mkdir -p "$dir"
  if served "$mod@$ver" 2>/dev/null; then
    log "notebook-controller $ver: building from the Go module proxy"
    (cd "$dir" && go mod init kfculler.local/nbc >/dev/null 2>&1 \
       && go mod edit -require="$mod@$ver" \
       && printf '//go:build tools\n\npackage tools\n\nimport _ "%s"\n' "$mod" > tools.go \
       && go mod tidy >&2 \
       && timed go build -trimpath -o "$BIN_DIR/notebook-controller" "$mod")
  else
    local src=${KF_CULLER_NOTEBOOK_CONTROLLER_SRC:-$NBC_VENDORED}
    [ -f "$src/go.mod" ] || die "the Go module proxy does not serve $mod@$ver and there is no source tree at $src
  (set KF_CULLER_NOTEBOOK_CONTROLLER_SRC to a checkout of kubeflow/notebooks components/notebook-controller
  at v1.11.0, or give a built binary with KF_CULLER_NOTEBOOK_CONTROLLER)"
    grep -q "^module $mod\$" "$src/go.mod" || die "$src/go.mod is not the module $mod"
    log "notebook-controller $ver: the Go module proxy does not serve it; building from the source in $src"
    cp -r "$src/." "$dir/" && chmod -R u+w "$dir"
    (cd "$dir" && timed go build -trimpath -o "$BIN_DIR/notebook-controller" .)
  fi
  stamp notebook-controller "$ver"
}

# Kubeflow Notebooks 2.0's Workspace controller (v2.0.0-beta.0): the Go module proxy does not serve it, so
# from the unmodified upstream copy in ../shared/vendor (read-only: the build runs in a copy).
WSC_VERSION=v2.0.0-beta.0
WSC_VENDORED=$(cd "$here/../.." && pwd)/../shared/vendor/kubeflow-workspaces-v2.0.0-beta.0/workspaces/controller

build_wsc() {
  have workspace-controller "$WSC_VERSION" && { log "workspace-controller $WSC_VERSION: cached"; return; }
  local src=${KF_CULLER_WORKSPACE_CONTROLLER_SRC:-$WSC_VENDORED}
  [ -f "$src/go.mod" ] || die "no Workspace controller source at $src (set KF_CULLER_WORKSPACE_CONTROLLER_SRC)"
  local dir="$BUILD_ROOT/workspace-controller-$WSC_VERSION"
  rm -rf "$dir" && mkdir -p "$dir" && cp -r "$src/." "$dir/" && chmod -R u+w "$dir"
  log "workspace-controller $WSC_VERSION: building from the source in $src"
  (cd "$dir" && timed go build -trimpath -o "$BIN_DIR/workspace-controller" ./cmd/)
  mkdir -p "$BIN_DIR/workspace-crds" && cp -f "$src"/manifests/kustomize/base/crd/kubeflow.org_*.yaml "$BIN_DIR/workspace-crds/" \
    && chmod 0644 "$BIN_DIR"/workspace-crds/*.yaml
  stamp workspace-controller "$WSC_VERSION"
}

# The v2 backend (same release): its go.mod replaces the controller module with ../controller, so the copy
# is of the whole workspaces/ folder (backend/ and controller/ side by side); built in backend/.
WSB_VENDORED=$(dirname "$WSC_VENDORED")

build_wsb() {
  have workspace-backend "$WSC_VERSION" && { log "workspace-backend $WSC_VERSION: cached"; return; }
  local src=${KF_CULLER_WORKSPACES_SRC:-$WSB_VENDORED}
  [ -f "$src/backend/go.mod" ] && [ -f "$src/controller/go.mod" ] \
    || die "no workspaces/ source (backend/ and controller/) at $src (set KF_CULLER_WORKSPACES_SRC)"
  local dir="$BUILD_ROOT/workspace-backend-$WSC_VERSION"
  rm -rf "$dir" && mkdir -p "$dir" && cp -r "$src/." "$dir/" && chmod -R u+w "$dir"
  log "workspace-backend $WSC_VERSION: building from the source in $src/backend"
  (cd "$dir/backend" && timed go build -trimpath -o "$BIN_DIR/workspace-backend" ./cmd/)
  stamp workspace-backend "$WSC_VERSION"
}

t0=$SECONDS
case "$set_name" in
  apiserver) build_etcd; build_k8s kube-apiserver ;;
  cluster)   build_etcd; build_k8s kube-apiserver; build_k8s kube-controller-manager; build_k8s kube-scheduler; build_kwok ;;
  all)       build_etcd; build_k8s kube-apiserver; build_k8s kube-controller-manager; build_k8s kube-scheduler; build_kwok; build_nbc ;;
  workspaces) build_wsc ;;
  workspaces-backend) build_wsb ;;
  *) die "unknown set '$set_name' (expected apiserver, cluster, all, workspaces or workspaces-backend)" ;;
esac
log "binaries ready in $BIN_DIR ($((SECONDS - t0)) s)"
echo "$BIN_DIR"
