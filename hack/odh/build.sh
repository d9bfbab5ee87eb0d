#!/usr/bin/env bash
# Build Open Data Hub / OpenShift AI's notebook controllers and kube-rbac-proxy into a cache outside the
# repository, for the tests that run them against the local control plane (kf_culler/local/odh.py).
#
#   hack/odh/build.sh [all|fork|odh|proxy|crds]
#
#   fork   ODH's fork of Kubeflow's notebook-controller (components/notebook-controller)
#   odh    odh-notebook-controller (components/odh-notebook-controller; replaces the fork through
#          ../notebook-controller and needs the vendored data-science-pipelines-operator through a replace)
#   proxy  kube-rbac-proxy from the Go module proxy (the sidecar odh-notebook-controller injects)
#   crds   the CRDs the controllers need at start-up (Notebook of the fork's version, ImageStream, Gateway API
#          HTTPRoute/ReferenceGrant/Gateway, DSPA, and Route/OAuthClient from github.com/openshift/api)
#   all    all of the above (default)
#
# Environment:
#   KF_CULLER_ODH_SRC       the ODH kubeflow tree (default: ../shared/vendor/odh-kubeflow-b85f66a)
#   KF_CULLER_DSPO_SRC      the data-science-pipelines-operator tree
#                           (default: ../shared/vendor/odh-data-science-pipelines-operator-560cbc1)
#   KF_CULLER_KRP_VERSION   kube-rbac-proxy version (default v0.20.0, the one ODH's own tests inject,
#                           controllers/suite_test.go); when the Go module proxy refuses it,
#                           KF_CULLER_KRP_FALLBACK (default v0.19.1) is built instead and the log says so
#   KF_CULLER_ODH_BIN_DIR   where binaries go (default ~/.cache/kf-culler/bin/odh)
#
# Sources in ../shared/vendor are read-only: every build runs in a copy. Idempotent: a binary already present
# with a matching .version stamp is not rebuilt. Go builds run under `nice -n 19`; the default Go module and
# build caches are shared. Prints the directory holding the binaries as its last line.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
set_name=${1:-all}
ODH_SRC=${KF_CULLER_ODH_SRC:-$repo/../shared/vendor/odh-kubeflow-b85f66a}
DSPO_SRC=${KF_CULLER_DSPO_SRC:-$repo/../shared/vendor/odh-data-science-pipelines-operator-560cbc1}
ODH_VERSION=b85f66ae8d18de4f402c07b2b53338ab92a44a1a
DSPO_VERSION=560cbc1d827afe24a06fd17b432f2db357fa9b9d
KRP_VERSION=${KF_CULLER_KRP_VERSION:-v0.20.0}
KRP_FALLBACK=${KF_CULLER_KRP_FALLBACK:-v0.19.1}
BIN_DIR=${KF_CULLER_ODH_BIN_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/kf-culler/bin/odh}
BUILD_ROOT=$(dirname "$BIN_DIR")/../build

log() { printf '[odh] %s\n' "$*" >&2; }
die() { printf '[odh] error: %s\n' "$*" >&2; exit 1; }

command -v go >/dev/null 2>&1 || die "Go is not installed or not on PATH; install Go >= 1.26.5 and run again"
command -v python3 >/dev/null 2>&1 || die "python3 is needed to read go mod download's answer"
mkdir -p "$BIN_DIR" "$BUILD_ROOT"
BUILD_ROOT=$(cd "$BUILD_ROOT" && pwd)
# One build at a time per cache: a test that needs the binaries while hack/background-builds.sh builds them
# waits here, then finds them cached.
exec 9>"$BIN_DIR/.build.lock"
flock 9
export GOFLAGS="${GOFLAGS:-} -mod=mod"
export CGO_ENABLED=0

have() { [ -x "$BIN_DIR/$1" ] && [ "$(cat "$BIN_DIR/$1.version" 2>/dev/null)" = "$2" ]; }
stamp() { printf '%s\n' "$2" > "$BIN_DIR/$1.version"; }
timed() { local t0=$SECONDS; "$@" || return; log "  done in $((SECONDS - t0)) s"; }
gobuild() { nice -n 19 go build -trimpath "$@"; }
# moddir MODULE@VERSION: download it and print its directory; prints the proxy's error and fails otherwise
moddir() {
  go mod download -json "$1" 2>/dev/null | python3 -c '
import json, sys
d = json.load(sys.stdin)
if d.get("Error"):
    print(d["Error"], file=sys.stderr); sys.exit(1)
print(d["Dir"])'
}

# copy_odh DIR: both components side by side (odh-notebook-controller replaces the fork via ../notebook-controller)
copy_odh() {
  local dir=$1
  [ -f "$ODH_SRC/components/notebook-controller/go.mod" ] && [ -f "$ODH_SRC/components/odh-notebook-controller/go.mod" ] \
    || die "no ODH kubeflow tree at $ODH_SRC (set KF_CULLER_ODH_SRC)"
  rm -rf "$dir" && mkdir -p "$dir/components"
  cp -r "$ODH_SRC/components/notebook-controller" "$ODH_SRC/components/odh-notebook-controller" "$dir/components/"
  chmod -R u+w "$dir"
}

build_fork() {
  have kf-notebook-controller "$ODH_VERSION" && { log "fork notebook-controller ${ODH_VERSION:0:7}: cached"; return; }
  local dir="$BUILD_ROOT/odh-${ODH_VERSION:0:7}-fork"
  copy_odh "$dir"
  log "fork notebook-controller ${ODH_VERSION:0:7}: building in $dir/components/notebook-controller"
  (cd "$dir/components/notebook-controller" && timed gobuild -ldflags "-s -w" -o "$BIN_DIR/kf-notebook-controller" .)
  stamp kf-notebook-controller "$ODH_VERSION"
}

build_odh() {
  local ver="$ODH_VERSION+dspo-$DSPO_VERSION"
  have odh-notebook-controller "$ver" && { log "odh-notebook-controller ${ODH_VERSION:0:7}: cached"; return; }
  [ -f "$DSPO_SRC/go.mod" ] || die "no data-science-pipelines-operator tree at $DSPO_SRC (set KF_CULLER_DSPO_SRC)"
  local dir="$BUILD_ROOT/odh-${ODH_VERSION:0:7}-odh"
  copy_odh "$dir"
  rm -rf "$dir/dspo" && cp -r "$DSPO_SRC" "$dir/dspo" && chmod -R u+w "$dir/dspo"
  log "odh-notebook-controller ${ODH_VERSION:0:7}: building in $dir/components/odh-notebook-controller"
  (cd "$dir/components/odh-notebook-controller" \
     && go mod edit -replace "github.com/opendatahub-io/data-science-pipelines-operator=$dir/dspo" \
     && timed gobuild -ldflags "-s -w" -o "$BIN_DIR/odh-notebook-controller" .)
  stamp odh-notebook-controller "$ver"
}

# kube-rbac-proxy's go.mod has a replace directive, so `go install ...@version` refuses it: build from a copy
# of the module the proxy serves.
build_proxy() {
  local ver=$KRP_VERSION src
  if have kube-rbac-proxy "$ver" || have kube-rbac-proxy "$KRP_FALLBACK"; then
    log "kube-rbac-proxy $(cat "$BIN_DIR/kube-rbac-proxy.version"): cached"; return
  fi
  if ! src=$(moddir "github.com/brancz/kube-rbac-proxy@$ver"); then
    log "the Go module proxy refuses kube-rbac-proxy $ver; building $KRP_FALLBACK instead"
    ver=$KRP_FALLBACK
    src=$(moddir "github.com/brancz/kube-rbac-proxy@$ver") || die "the Go module proxy refuses kube-rbac-proxy $ver too"
  fi
  local dir="$BUILD_ROOT/kube-rbac-proxy-$ver"
  rm -rf "$dir" && cp -r "$src" "$dir" && chmod -R u+w "$dir"
  log "kube-rbac-proxy $ver: building"
  (cd "$dir" && timed gobuild -ldflags "-s -w -X k8s.io/component-base/version.gitVersion=$ver" \
     -o "$BIN_DIR/kube-rbac-proxy" ./cmd/kube-rbac-proxy)
  stamp kube-rbac-proxy "$ver"
}

# The OpenShift CRDs come from the github.com/openshift/api version odh-notebook-controller's go.mod names;
# the others are the copies ODH keeps in config/crd/external (its envtest loads them).
build_crds() {
  local gomod="$ODH_SRC/components/odh-notebook-controller/go.mod"
  local osapi; osapi=$(awk '$1 == "github.com/openshift/api" {print $2}' "$gomod")
  [ -n "$osapi" ] || die "$gomod names no github.com/openshift/api version"
  local ver="$ODH_VERSION+openshift-api-$osapi"
  [ "$(cat "$BIN_DIR/crds.version" 2>/dev/null)" = "$ver" ] && [ -d "$BIN_DIR/crds" ] && { log "CRDs: cached"; return; }
  local api; api=$(moddir "github.com/openshift/api@$osapi") || die "the Go module proxy does not serve github.com/openshift/api@$osapi"
  local out="$BIN_DIR/crds.tmp"
  rm -rf "$out" && mkdir -p "$out"
  cp "$ODH_SRC/components/notebook-controller/config/crd/bases/kubeflow.org_notebooks.yaml" "$out/"
  local f
  for f in image.openshift.io_imagestream.yaml gateway.networking.k8s.io_httproutes.yaml \
           gateway.networking.k8s.io_referencegrants.yaml gateway.networking.k8s.io_gateways.yaml opendatahub.io_dspa.yaml; do
    cp "$ODH_SRC/components/odh-notebook-controller/config/crd/external/$f" "$out/"
  done
  local route oauth
  route=$(ls "$api"/route/v1/zz_generated.crd-manifests/*routes*.crd.yaml 2>/dev/null | head -1)
  oauth=$(ls "$api"/oauth/v1/zz_generated.crd-manifests/*oauthclients*.crd.yaml 2>/dev/null | head -1 || true)
  [ -n "$route" ] || die "github.com/openshift/api@$osapi ships no Route CRD under route/v1/zz_generated.crd-manifests"
  cp "$route" "$out/route.openshift.io_routes.yaml"
  if [ -n "$oauth" ]; then cp "$oauth" "$out/oauth.openshift.io_oauthclients.yaml"; else log "no OAuthClient CRD in openshift/api@$osapi"; fi
  chmod 0644 "$out"/*.yaml
  rm -rf "$BIN_DIR/crds" && mv "$out" "$BIN_DIR/crds"
  printf '%s\n' "$ver" > "$BIN_DIR/crds.version"
  log "CRDs written to $BIN_DIR/crds"
}

t0=$SECONDS
case "$set_name" in
  fork)  build_fork ;;
  odh)   build_odh ;;
  proxy) build_proxy ;;
  crds)  build_crds ;;
  all)   build_crds; build_proxy; build_odh; build_fork ;;
  *) die "unknown set '$set_name' (expected all, fork, odh, proxy or crds)" ;;
esac
log "ready in $BIN_DIR ($((SECONDS - t0)) s)"
echo "$BIN_DIR"
