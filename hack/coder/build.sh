#!/usr/bin/env bash
# Build what a real Coder server needs for the tests, into a cache outside the repository.
#
#   hack/coder/build.sh [all|terraform|coder|provider|kubernetes]
#
#   terraform  Terraform, from a copy of the unmodified tree in ../shared/vendor (the module the Go module
#              proxy serves leaves out the nested backend modules, so it cannot be built from there)
#   coder      the Coder server and CLI (AGPL build, cmd/coder), from the Go module proxy; without the
#              `embed` build tag its web UI is left out (site/site_slim.go), and without `slim` the server
#              is in (cli/server_slim.go would stub it out)
#   provider   the coder/coder Terraform provider, from the Go module proxy, laid out as a Terraform
#              filesystem mirror (providers/registry.terraform.io/coder/coder/<v>/linux_amd64/...) with a
#              CLI config (terraformrc) that points Terraform at it, so no template reaches a registry
#   kubernetes Terraform's Kubernetes provider (hashicorp/kubernetes), from a copy of the unmodified tree in
#              ../shared/vendor (the Go module proxy refuses its module), into the same filesystem mirror
#              (providers/registry.terraform.io/hashicorp/kubernetes/<v>/linux_amd64/...), for templates in the
#              shape of Coder's upstream Kubernetes template (tests/test_coder_kind.py)
#   all        the four (default; what hack/background-builds.sh builds)
#
# Environment:
#   KF_CULLER_CODER_VERSION           Coder release             (default v2.36.0)
#   KF_CULLER_TERRAFORM_VERSION       Terraform release         (default v1.14.5)
#   KF_CULLER_CODER_PROVIDER_VERSION  coder/coder provider      (default v2.20.0)
#   KF_CULLER_TERRAFORM_SRC           Terraform source tree     (default ../shared/vendor/terraform-<version>)
#   KF_CULLER_KUBERNETES_PROVIDER_VERSION  hashicorp/kubernetes provider  (default v2.38.0)
#   KF_CULLER_KUBERNETES_PROVIDER_SRC  its source tree (default ../shared/vendor/terraform-provider-kubernetes-<version>)
#   KF_CULLER_CODER_BIN_DIR           where it goes (default ~/.cache/kf-culler/bin/coder-<coder-version>)
#
# Idempotent: a binary already present with a matching .version stamp is not rebuilt.
# Prints the directory holding the binaries as its last line.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
set_name=${1:-all}
CODER_VERSION=${KF_CULLER_CODER_VERSION:-v2.36.0}
TF_VERSION=${KF_CULLER_TERRAFORM_VERSION:-v1.14.5}
PROVIDER_VERSION=${KF_CULLER_CODER_PROVIDER_VERSION:-v2.20.0}
TF_SRC=${KF_CULLER_TERRAFORM_SRC:-$(cd "$here/../.." && pwd)/../shared/vendor/terraform-$TF_VERSION}
K8S_PROVIDER_VERSION=${KF_CULLER_KUBERNETES_PROVIDER_VERSION:-v2.38.0}
K8S_PROVIDER_SRC=${KF_CULLER_KUBERNETES_PROVIDER_SRC:-$(cd "$here/../.." && pwd)/../shared/vendor/terraform-provider-kubernetes-$K8S_PROVIDER_VERSION}
BIN_DIR=${KF_CULLER_CODER_BIN_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/kf-culler/bin/coder-$CODER_VERSION}
BUILD_ROOT=$(dirname "$BIN_DIR")/../build

log() { printf '[coder] %s\n' "$*" >&2; }
die() { printf '[coder] error: %s\n' "$*" >&2; exit 1; }

command -v go >/dev/null 2>&1 || die "Go is not installed or not on PATH; install Go >= 1.26.5 and run again"
mkdir -p "$BIN_DIR" "$BUILD_ROOT"
# One build at a time per cache: a test that needs the binaries while hack/background-builds.sh builds them
# waits here, then finds them cached.
exec 9>"$BIN_DIR/.build.lock"
flock 9
BUILD_ROOT=$(cd "$BUILD_ROOT" && pwd)
export GOFLAGS="${GOFLAGS:-} -mod=mod"
export CGO_ENABLED=0
# Builds share the machine with other work: keep them at the lowest priority.
gobuild() { nice -n 19 go build "$@"; }

have() { [ -x "$BIN_DIR/$1" ] && [ "$(cat "$BIN_DIR/$1.version" 2>/dev/null)" = "$2" ]; }
stamp() { printf '%s\n' "$2" > "$BIN_DIR/$1.version"; }
timed() { local t0=$SECONDS; "$@" || return; log "  done in $((SECONDS - t0)) s"; }
# moddir MODULE@VERSION: download it from the Go module proxy and print its (read-only) directory
moddir() {
  go mod download -json "$1" | python3 -c '
import json, sys
d = json.load(sys.stdin)
print(d.get("Dir") or sys.exit(d.get("Error", "no Dir")))'
}

build_terraform() {
  # the stamp, and the binary's own word: a build without version.dev=no calls itself "<version>-dev"
  if have terraform "$TF_VERSION" && [ "$(CHECKPOINT_DISABLE=1 TF_CLI_CONFIG_FILE=/dev/null "$BIN_DIR/terraform" version 2>/dev/null | head -n1)" = "Terraform $TF_VERSION" ]; then
    log "terraform $TF_VERSION: cached"; return
  fi
  [ -f "$TF_SRC/go.mod" ] || die "no Terraform source at $TF_SRC (set KF_CULLER_TERRAFORM_SRC)"
  grep -q '^module github.com/hashicorp/terraform$' "$TF_SRC/go.mod" || die "$TF_SRC/go.mod is not Terraform's"
  local dir="$BUILD_ROOT/terraform-$TF_VERSION"
  rm -rf "$dir" && mkdir -p "$dir" && cp -r "$TF_SRC/." "$dir/" && chmod -R u+w "$dir"
  log "terraform $TF_VERSION: compiling from a copy of $TF_SRC (cold: about 4 minutes, 2 GB)"
  (cd "$dir" && timed gobuild -trimpath -ldflags "-s -w -X github.com/hashicorp/terraform/version.dev=no" \
     -o "$BIN_DIR/terraform" .)
  rm -rf "$dir"
  stamp terraform "$TF_VERSION"
}

build_coder() {
  have coder "$CODER_VERSION" && { log "coder $CODER_VERSION: cached"; return; }
  local src; src=$(moddir "github.com/coder/coder/v2@$CODER_VERSION") \
    || die "the Go module proxy did not serve github.com/coder/coder/v2@$CODER_VERSION"
  # `go install` refuses a module with replace directives: build it as the main module, in a copy.
  local dir="$BUILD_ROOT/coder-$CODER_VERSION"
  rm -rf "$dir" && mkdir -p "$dir" && cp -r "$src/." "$dir/" && chmod -R u+w "$dir"
  log "coder $CODER_VERSION: compiling ./cmd/coder (cold: about 8 minutes, 3.4 GB)"
  local bi=github.com/coder/coder/v2/buildinfo
  (cd "$dir" && timed gobuild -trimpath -tags "ts_omit_aws,ts_omit_bird,ts_omit_tap,ts_omit_kube" \
     -ldflags "-s -w -X $bi.tag=${CODER_VERSION#v} -X $bi.agpl=true" -o "$BIN_DIR/coder" ./cmd/coder)
  rm -rf "$dir"
  stamp coder "$CODER_VERSION"
}

build_provider() {
  local v=${PROVIDER_VERSION#v}
  local plat; plat="$(go env GOOS)_$(go env GOARCH)"
  local pdir="$BIN_DIR/providers/registry.terraform.io/coder/coder/$v/$plat"
  local name="terraform-provider-coder_v$v"
  if [ -x "$pdir/$name" ] \
     && [ "$(cat "$BIN_DIR/terraform-provider-coder.version" 2>/dev/null)" = "$PROVIDER_VERSION" ]; then
    write_terraformrc
    log "terraform-provider-coder $PROVIDER_VERSION: cached"; return
  fi
  local src; src=$(moddir "github.com/coder/terraform-provider-coder/v2@$PROVIDER_VERSION") \
    || die "the Go module proxy did not serve github.com/coder/terraform-provider-coder/v2@$PROVIDER_VERSION"
  local dir="$BUILD_ROOT/terraform-provider-coder-$PROVIDER_VERSION"
  rm -rf "$dir" && mkdir -p "$dir" && cp -r "$src/." "$dir/" && chmod -R u+w "$dir"
  mkdir -p "$pdir"
  log "terraform-provider-coder $PROVIDER_VERSION: compiling into the filesystem mirror $BIN_DIR/providers"
  (cd "$dir" && timed gobuild -trimpath -ldflags "-s -w" -o "$pdir/$name" .)
  rm -rf "$dir"
  stamp terraform-provider-coder "$PROVIDER_VERSION"
  write_terraformrc
}

build_kubernetes() {
  local v=${K8S_PROVIDER_VERSION#v}
  local plat; plat="$(go env GOOS)_$(go env GOARCH)"
  local pdir="$BIN_DIR/providers/registry.terraform.io/hashicorp/kubernetes/$v/$plat"
  local name="terraform-provider-kubernetes_v$v"
  if [ -x "$pdir/$name" ] \
     && [ "$(cat "$BIN_DIR/terraform-provider-kubernetes.version" 2>/dev/null)" = "$K8S_PROVIDER_VERSION" ]; then
    write_terraformrc
    log "terraform-provider-kubernetes $K8S_PROVIDER_VERSION: cached"; return
  fi
  [ -f "$K8S_PROVIDER_SRC/go.mod" ] \
    || die "no terraform-provider-kubernetes source at $K8S_PROVIDER_SRC (set KF_CULLER_KUBERNETES_PROVIDER_SRC)"
  grep -q '^module github.com/hashicorp/terraform-provider-kubernetes$' "$K8S_PROVIDER_SRC/go.mod" \
    || die "$K8S_PROVIDER_SRC/go.mod is not the Kubernetes provider's"
  local dir="$BUILD_ROOT/terraform-provider-kubernetes-$K8S_PROVIDER_VERSION"
  rm -rf "$dir" && mkdir -p "$dir" && cp -r "$K8S_PROVIDER_SRC/." "$dir/" && chmod -R u+w "$dir"
  mkdir -p "$pdir"
  log "terraform-provider-kubernetes $K8S_PROVIDER_VERSION: compiling from a copy of $K8S_PROVIDER_SRC into the filesystem mirror"
  (cd "$dir" && timed gobuild -trimpath -ldflags "-s -w" -o "$pdir/$name" .)
  rm -rf "$dir"
  stamp terraform-provider-kubernetes "$K8S_PROVIDER_VERSION"
  write_terraformrc
}

# The CLI config: Terraform takes the providers built into the mirror so far from it and asks no registry for
# anything (a template that needs another provider fails its `terraform init`).
write_terraformrc() {
  local include=() name
  for name in coder/coder hashicorp/kubernetes; do
    [ -d "$BIN_DIR/providers/registry.terraform.io/$name" ] && include+=("\"registry.terraform.io/$name\"")
  done
  local list; list=$(printf '%s, ' "${include[@]}"); list=${list%, }
  cat > "$BIN_DIR/terraformrc" <<EOF
provider_installation {
  filesystem_mirror {
    path    = "$BIN_DIR/providers"
    include = [$list]
  }
  direct {
    exclude = ["registry.terraform.io/*/*"]
  }
}
disable_checkpoint = true
EOF
}

t0=$SECONDS
case "$set_name" in
  all)       build_terraform; build_provider; build_coder; build_kubernetes ;;
  terraform) build_terraform ;;
  coder)     build_coder ;;
  provider)  build_provider ;;
  kubernetes) build_kubernetes ;;
  *) die "unknown set '$set_name' (expected all, terraform, coder, provider or kubernetes)" ;;
esac
log "binaries ready in $BIN_DIR ($((SECONDS - t0)) s)"
echo "$BIN_DIR"
