#!/usr/bin/env bash
# Build a kind backend from reachable parts into a cache outside the repository: kind, a node image made
# without pulls, and the images it preloads. Nothing here is pulled from an image registry.
#
#   hack/kind/build.sh [all|binaries|node]
#
#   binaries  kind (Go module proxy); kubelet, kubeadm, kubectl, kube-proxy from the k8s.io/kubernetes module
#             through a wrapper module, as hack/controlplane/build.sh builds kube-apiserver; CoreDNS (Go module
#             proxy); pause, compiled from kubernetes' build/pause/linux/pause.c in the module cache
#   node      also the images: a tools image (Debian minbase + iptables, nftables, socat, ...), the images
#             kubeadm asks for (kube-apiserver, kube-controller-manager, kube-scheduler, etcd from
#             hack/controlplane/build.sh's cache; kube-proxy on the tools image; CoreDNS; pause), and the node
#             image: Debian bookworm minbase with systemd, containerd, runc and the CNI plugins, kind's own base
#             files read from the kind module, the Kubernetes binaries, a static bridge CNI config and a unit
#             that imports the images into containerd before kubelet starts
#   all       the same as node (default)
#
# Docker: Debian's docker.io, run by hack/kind/dockerd.sh with its state under the cache (never the system's).
# Installs docker.io, containernetworking-plugins, mmdebstrap and jq with apt-get when missing (as root).
#
# Environment:
#   KF_CULLER_KIND_VERSION     kind release          (default v0.33.0)
#   KF_CULLER_K8S_VERSION      Kubernetes release    (default: hack/controlplane/versions.env)
#   KF_CULLER_COREDNS_VERSION  CoreDNS release       (default v1.14.6)
#   KF_CULLER_KIND_DIR         the cache (default ~/.cache/kf-culler/kind/kind-<kind>-k8s-<k8s>)
#   KF_CULLER_DEBIAN_MIRROR    Debian mirror for mmdebstrap (default http://deb.debian.org/debian)
#
# Idempotent: what exists with a matching stamp is not rebuilt. Writes <cache>/env (KIND_BIN, KUBECTL_BIN,
# KIND_NODE_IMAGE, KIND_TOOLS_IMAGE, DOCKER_HOST, as shell assignments) and prints the cache directory last.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
set_name=${1:-all}
while IFS='=' read -r key value; do
  case "$key" in KF_CULLER_*) [ -n "${!key:-}" ] || export "$key=$value" ;; esac
done < "$root/hack/controlplane/versions.env"
K8S_VERSION=$KF_CULLER_K8S_VERSION
KIND_VERSION=${KF_CULLER_KIND_VERSION:-v0.33.0}
COREDNS_VERSION=${KF_CULLER_COREDNS_VERSION:-v1.14.6}
CACHE_ROOT=${XDG_CACHE_HOME:-$HOME/.cache}/kf-culler
DIR=${KF_CULLER_KIND_DIR:-$CACHE_ROOT/kind/kind-$KIND_VERSION-k8s-$K8S_VERSION}
BIN=$DIR/bin
CP_BIN=$CACHE_ROOT/bin/$K8S_VERSION
MIRROR=${KF_CULLER_DEBIAN_MIRROR:-http://deb.debian.org/debian}
SUITE=bookworm

log() { printf '[kind] %s\n' "$*" >&2; }
die() { printf '[kind] error: %s\n' "$*" >&2; exit 1; }
timed() { local t0=$SECONDS; "$@" || return; log "  done in $((SECONDS - t0)) s"; }

case "$set_name" in all|binaries|node) ;; *) die "unknown set '$set_name' (expected all, binaries or node)" ;; esac
command -v go >/dev/null 2>&1 || die "Go is not installed or not on PATH; install Go >= 1.26 and run again"
mkdir -p "$BIN" "$DIR/build" "$DIR/images"
# One build at a time per cache: a test that needs the backend while hack/background-builds.sh builds it
# waits here, then finds it cached.
exec 9>"$DIR/.build.lock"
flock 9
export GOFLAGS="${GOFLAGS:-} -mod=mod"
export CGO_ENABLED=0
# Builds share the machine with other work.
gobuild() { nice -n 10 go build "$@"; }

have() { [ -x "$BIN/$1" ] && [ "$(cat "$BIN/$1.version" 2>/dev/null)" = "$2" ]; }
stamp() { printf '%s\n' "$2" > "$BIN/$1.version"; }

# --- Debian packages ----------------------------------------------------------------------------------------
DEBS="docker.io containernetworking-plugins mmdebstrap jq"
packages() {
  local missing=()
  command -v dockerd >/dev/null 2>&1 || missing+=(docker.io)
  [ -x /usr/lib/cni/bridge ] || missing+=(containernetworking-plugins)
  command -v mmdebstrap >/dev/null 2>&1 || missing+=(mmdebstrap)
  command -v jq >/dev/null 2>&1 || missing+=(jq)
  command -v gcc >/dev/null 2>&1 || missing+=(gcc libc6-dev)
  [ ${#missing[@]} -eq 0 ] && return
  command -v apt-get >/dev/null 2>&1 || die "install ${missing[*]} (Debian: $DEBS), then run again"
  log "installing ${missing[*]} (apt-get)"
  apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
}

# --- binaries -------------------------------------------------------------------------------------------------
build_kind() {
  have kind "$KIND_VERSION" && { log "kind $KIND_VERSION: cached"; return; }
  log "kind $KIND_VERSION: go install from the Go module proxy"
  GOBIN=$BIN timed nice -n 10 go install -trimpath -ldflags "-s -w" "sigs.k8s.io/kind@$KIND_VERSION"
  stamp kind "$KIND_VERSION"
}

# The node's Kubernetes binaries: a wrapper module of our own (a copy of hack/controlplane's pins, so the
# shared one is never touched), whose tools.go imports what they need.
K8S_NODE_BINS="kubelet kubeadm kubectl kube-proxy"
k8s_wrapper() {
  local dir="$DIR/build/kubernetes"
  if [ -f "$dir/.ready" ]; then echo "$dir"; return; fi
  local base="$CACHE_ROOT/build/kubernetes-$K8S_VERSION"
  if [ ! -f "$base/.ready" ]; then
    log "kubernetes $K8S_VERSION: preparing the wrapper module (hack/controlplane/build.sh apiserver)"
    bash "$root/hack/controlplane/build.sh" apiserver >/dev/null
  fi
  rm -rf "$dir" && mkdir -p "$dir"
  cp "$base/go.mod" "$base/go.sum" "$dir/"
  (cd "$dir" && go mod edit -module kfculler.local/kubernetes-kind)
  printf '//go:build tools\n\npackage tools\n\n' > "$dir/tools.go"
  printf 'import _ "%s"\n' k8s.io/kubernetes/cmd/kubelet/app k8s.io/kubernetes/cmd/kubeadm/app \
    k8s.io/kubernetes/cmd/kube-proxy/app k8s.io/kubectl/pkg/cmd >> "$dir/tools.go"
  log "kubernetes $K8S_VERSION: adding the modules the node's binaries need"
  (cd "$dir" && go mod tidy >&2)
  touch "$dir/.ready"
  echo "$dir"
}

build_k8s() { # build_k8s NAME
  local name=$1
  have "$name" "$K8S_VERSION" && { log "$name $K8S_VERSION: cached"; return; }
  local dir; dir=$(k8s_wrapper)
  local minor=${K8S_VERSION#v1.}; minor=${minor%%.*}
  local pkg=k8s.io/component-base/version
  log "$name $K8S_VERSION: compiling"
  (cd "$dir" && timed gobuild -trimpath -o "$BIN/$name" \
     -ldflags "-s -w -X $pkg.gitVersion=$K8S_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor -X $pkg.gitTreeState=clean" \
     "k8s.io/kubernetes/cmd/$name")
  stamp "$name" "$K8S_VERSION"
}

build_coredns() {
  have coredns "$COREDNS_VERSION" && { log "coredns $COREDNS_VERSION: cached"; return; }
  log "coredns $COREDNS_VERSION: go install from the Go module proxy"
  GOBIN=$BIN timed nice -n 10 go install -trimpath -ldflags "-s -w" "github.com/coredns/coredns@$COREDNS_VERSION"
  stamp coredns "$COREDNS_VERSION"
}

build_pause() {
  have pause "$K8S_VERSION" && { log "pause ($K8S_VERSION): cached"; return; }
  local src
  src=$(go mod download -json "k8s.io/kubernetes@$K8S_VERSION" | jq -r '.Dir // empty')/build/pause/linux/pause.c
  [ -f "$src" ] || die "no pause.c at $src"
  log "pause: compiling $src (static)"
  gcc -Os -Wall -static -DVERSION="$K8S_VERSION" -o "$BIN/pause" "$src"
  stamp pause "$K8S_VERSION"
}

build_binaries() {
  build_kind
  local n; for n in $K8S_NODE_BINS; do build_k8s "$n"; done
  build_coredns
  build_pause
}

# --- images -------------------------------------------------------------------------------------------------
MM_ARGS=(--variant=minbase --aptopt='Apt::Install-Recommends "false"'
         --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-include=/usr/share/doc/*/copyright'
         --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/locale/*')
MIRRORS=("deb $MIRROR $SUITE main" "deb $MIRROR $SUITE-updates main" "deb ${MIRROR%/debian}/debian-security $SUITE-security main")
NODE_DEBS=systemd,dbus,containerd,runc,iptables,nftables,iproute2,conntrack,ethtool,util-linux,mount,kmod,libseccomp2,ca-certificates,procps,e2fsprogs,jq,socat,containernetworking-plugins
TOOLS_DEBS=iptables,nftables,conntrack,socat,iproute2,kmod,procps

rootfs() { # rootfs NAME PACKAGES: a bookworm minbase tarball, cached by its inputs; prints its path
  local name=$1 debs=$2 key
  key=$(printf '%s\n' "$SUITE" "$debs" "${MM_ARGS[@]}" "${MIRRORS[@]}" | sha256sum | cut -c1-12)
  local tarball="$DIR/rootfs/$name-$key.tar"
  if [ ! -s "$tarball" ]; then
    mkdir -p "$DIR/rootfs"
    log "rootfs $name: mmdebstrap $SUITE minbase with $debs"
    rm -f "$DIR/rootfs/$name"-*.tar*
    timed nice -n 10 mmdebstrap --quiet "${MM_ARGS[@]}" "--include=$debs" "$SUITE" "$tarball.part.tar" "${MIRRORS[@]}" >&2
    mv "$tarball.part.tar" "$tarball"
  fi
  echo "$tarball"
}

image_exists() { docker image inspect "$1" >/dev/null 2>&1; }

# docker_build TAG CONTEXT: a build of COPY steps only (no RUN: the daemon has no network to give one)
docker_build() {
  local out; out=$(DOCKER_BUILDKIT=0 docker build --quiet -t "$1" "$2" 2>&1) || { printf '%s\n' "$out" >&2; return 1; }
}

# The key of everything the images are made from: the versions, the rootfs keys, this script and node/.
images_key() {
  { printf '%s\n' "$K8S_VERSION" "$KIND_VERSION" "$COREDNS_VERSION" "$1" "$2"
    cat "$here/build.sh" "$here"/node/*
    cat "$BIN"/*.version "$CP_BIN"/{kube-apiserver,kube-controller-manager,kube-scheduler,etcd}.version
  } | sha256sum | cut -c1-12
}

build_tools_image() { # build_tools_image TARBALL TAG
  image_exists "$2" && { log "image $2: cached"; return; }
  log "image $2: importing $1"
  docker import --change 'CMD ["/bin/bash"]' "$1" "$2" >/dev/null
}

# kubeadm's image list, and an image for each from the binaries built here and by hack/controlplane.
build_component_images() { # build_component_images TOOLS_TAG KEY: writes $DIR/images/components-KEY.tar
  local tools=$1 key=$2 out="$DIR/images/components-$2.tar"
  [ -s "$out" ] && { log "component images: cached ($out)"; return; }
  local n; for n in kube-apiserver kube-controller-manager kube-scheduler etcd; do
    [ -x "$CP_BIN/$n" ] || die "$CP_BIN/$n is missing: run hack/controlplane/build.sh cluster first"
  done
  local list; list=$("$BIN/kubeadm" config images list --kubernetes-version "$K8S_VERSION" 2>/dev/null) \
    || die "kubeadm config images list failed"
  log "component images: $(echo $list)"
  local kind_src; kind_src=$(go mod download -json "sigs.k8s.io/kind@$KIND_VERSION" | jq -r '.Dir // empty')
  local SANDBOX_IMAGE
  SANDBOX_IMAGE=$(sed -n 's/^ *sandbox_image = "\(.*\)"/\1/p' "$kind_src/images/base/files/etc/containerd/config.toml")
  [ -n "$SANDBOX_IMAGE" ] || die "no sandbox_image in kind's containerd config"
  local ctx="$DIR/build/images" tags=() ref name bin entry from
  for ref in $list; do
    name=${ref%:*}; name=${name##*/}
    from=scratch
    case "$name" in
      kube-apiserver|kube-controller-manager|kube-scheduler) bin=$CP_BIN/$name; entry=/usr/local/bin/$name ;;
      etcd) bin=$CP_BIN/etcd; entry=/usr/local/bin/etcd ;;
      kube-proxy) bin=$BIN/kube-proxy; entry=/usr/local/bin/kube-proxy; from=$tools ;;
      coredns) bin=$BIN/coredns; entry=/coredns ;;
      pause) bin=$BIN/pause; entry=/pause ;;
      *) die "kubeadm asks for an image this build does not make: $ref" ;;
    esac
    rm -rf "$ctx" && mkdir -p "$ctx"
    cp "$bin" "$ctx/bin"
    printf 'FROM %s\nCOPY bin %s\nENTRYPOINT ["%s"]\n' "$from" "$entry" "$entry" > "$ctx/Dockerfile"
    docker_build "$ref" "$ctx"
    tags+=("$ref")
    # containerd's sandbox image (kind's config.toml) may be another pause tag than kubeadm's
    if [ "$name" = pause ] && [ "$ref" != "$SANDBOX_IMAGE" ]; then
      docker tag "$ref" "$SANDBOX_IMAGE"; tags+=("$SANDBOX_IMAGE")
    fi
  done
  rm -rf "$ctx"
  docker save -o "$out.part" "${tags[@]}"
  mv "$out.part" "$out"
  rm -f $(ls "$DIR"/images/components-*.tar | grep -v "components-$key.tar") 2>/dev/null || true
}

# The node image: kind's base image's steps (images/base/Dockerfile), on a Debian rootfs with Debian's
# containerd, runc and CNI plugins instead of binaries built from git.
build_node_image() { # build_node_image NODE_TARBALL COMPONENTS_TAR TAG
  local tarball=$1 components=$2 tag=$3
  image_exists "$tag" && { log "node image $tag: cached"; return; }
  local kind_src; kind_src=$(go mod download -json "sigs.k8s.io/kind@$KIND_VERSION" | jq -r '.Dir // empty')
  local files="$kind_src/images/base/files"
  [ -d "$files" ] || die "no images/base/files in sigs.k8s.io/kind@$KIND_VERSION ($kind_src)"
  local fs="$DIR/build/node-rootfs"
  log "node image $tag: assembling in $fs"
  rm -rf "$fs" && mkdir -p "$fs"
  tar -C "$fs" -xf "$tarball"
  # kind's base files, with the Dockerfile's modes
  install -m 0755 "$files"/usr/local/bin/* "$fs/usr/local/bin/"
  mkdir -p "$fs/kind/bin" "$fs/kind/manifests" "$fs/kind/images" "$fs/LICENSES" "$fs/etc/systemd/system/kubelet.service.d"
  install -m 0644 "$files"/kind/README.txt "$fs/kind/"
  install -m 0755 "$files"/kind/bin/* "$fs/kind/bin/"
  install -m 0644 "$files"/LICENSES/* "$fs/LICENSES/"
  install -m 0644 "$files"/etc/crictl.yaml "$fs/etc/"
  install -m 0644 "$files"/etc/containerd/* "$fs/etc/containerd/"
  install -m 0644 "$files"/etc/default/* "$fs/etc/default/"
  install -m 0644 "$files"/etc/sysctl.d/* "$fs/etc/sysctl.d/"
  find "$files/etc/systemd/system" -maxdepth 1 -type f -exec install -m 0644 {} "$fs/etc/systemd/system/" \;
  install -m 0644 "$files"/etc/systemd/system/kubelet.service.d/* "$fs/etc/systemd/system/kubelet.service.d/"
  # the Dockerfile's unit clean-up
  find "$fs/lib/systemd/system/sysinit.target.wants/" -name systemd-tmpfiles-setup.service -delete
  rm -f "$fs"/lib/systemd/system/multi-user.target.wants/* "$fs"/etc/systemd/system/*.wants/* \
    "$fs"/lib/systemd/system/local-fs.target.wants/* "$fs"/lib/systemd/system/sockets.target.wants/*udev* \
    "$fs"/lib/systemd/system/sockets.target.wants/*initctl* "$fs"/lib/systemd/system/basic.target.wants/*
  echo "ReadKMsg=no" >> "$fs/etc/systemd/journald.conf"
  ln -sf /usr/lib/systemd/systemd "$fs/sbin/init"
  # Debian's containerd where kind's unit looks for it; its CRI base spec as the Dockerfile makes it
  ln -sf /usr/bin/containerd "$fs/usr/local/bin/containerd"
  chroot "$fs" ctr oci spec \
    | jq '.hooks.createContainer[.hooks.createContainer| length] |= . + {"path": "/kind/bin/mount-product-files.sh"}' \
    | jq 'del(.process.rlimits)' > "$fs/etc/containerd/cri-base.json"
  # pod sandboxes fail ("can't get final child's PID from pipe: EOF") unless containerd restricts oom_score_adj
  sed -i 's/restrict_oom_score_adj = false/restrict_oom_score_adj = true/' "$fs/etc/containerd/config.toml"
  grep -q 'restrict_oom_score_adj = true' "$fs/etc/containerd/config.toml" || die "kind's containerd config changed"
  # the Kubernetes binaries
  install -m 0755 "$BIN/kubelet" "$BIN/kubeadm" "$BIN/kubectl" "$fs/usr/bin/"
  # kind's `kubeadm` (first on PATH) waits for the node's boot to end, then runs /usr/bin/kubeadm
  install -m 0755 "$here/node/kubeadm-wait" "$fs/usr/local/bin/kubeadm"
  printf '%s\n' "$K8S_VERSION" > "$fs/kind/version"
  # pod network: Debian's CNI plugins where containerd looks (/opt/cni/bin), a static bridge config
  mkdir -p "$fs/opt/cni" "$fs/etc/cni/net.d"
  ln -sfn /usr/lib/cni "$fs/opt/cni/bin"
  install -m 0644 "$here/node/10-kf-bridge.conflist" "$fs/etc/cni/net.d/"
  install -m 0644 "$here/node/default-cni.yaml" "$here/node/default-storage.yaml" "$fs/kind/manifests/"
  # kubelet 1.37 refuses cgroup v1 without --fail-cgroupv1=false (kind's create passes no config to patch)
  install -m 0644 "$here/node/kubelet.default" "$fs/etc/default/kubelet"
  # the preloaded images, imported before kubelet starts
  install -m 0644 "$components" "$fs/kind/images/components.tar"
  install -m 0644 "$here/node/kf-preload-images.service" "$fs/etc/systemd/system/"
  install -m 0644 "$here/node/12-kf-preload.conf" "$fs/etc/systemd/system/kubelet.service.d/"
  mkdir -p "$fs/etc/systemd/system/multi-user.target.wants" "$fs/etc/kubernetes/manifests"
  local u; for u in kubelet containerd undo-mount-hacks kf-preload-images; do
    ln -sf "/etc/systemd/system/$u.service" "$fs/etc/systemd/system/multi-user.target.wants/$u.service"
  done
  ln -sf /dev/null "$fs/etc/systemd/system/systemd-binfmt.service"
  log "node image $tag: importing"
  tar -C "$fs" -c . | docker import \
    --change 'ENV container=docker' --change 'ENTRYPOINT ["/usr/local/bin/entrypoint", "/sbin/init"]' \
    - "$tag.part" >/dev/null
  # STOPSIGNAL is not one of docker import's changes
  local ctx="$DIR/build/node-ctx"; rm -rf "$ctx" && mkdir -p "$ctx"
  printf 'FROM %s\nSTOPSIGNAL SIGRTMIN+3\n' "$tag.part" > "$ctx/Dockerfile"
  docker_build "$tag" "$ctx"
  docker rmi "$tag.part" >/dev/null
  rm -rf "$fs" "$ctx"
  # node images of earlier builds (1.2 GB each) that no container uses
  local old; for old in $(docker images --format '{{.Repository}}:{{.Tag}}' "${tag%:*}"); do
    [ "$old" = "$tag" ] || docker rmi "$old" >/dev/null 2>&1 || true
  done
}

build_images() {
  eval "$("$here/dockerd.sh" start | tail -n1 | sed 's/^/export /')"
  local node_tar tools_tar key
  node_tar=$(rootfs node "$NODE_DEBS")
  tools_tar=$(rootfs tools "$TOOLS_DEBS")
  key=$(images_key "$(basename "$node_tar")" "$(basename "$tools_tar")")
  local tools="kf-culler.local/kind-tools:${tools_tar##*-}"; tools=${tools%.tar}
  local node="kf-culler.local/kind-node:$K8S_VERSION-$key"
  build_tools_image "$tools_tar" "$tools"
  build_component_images "$tools" "$key"
  build_node_image "$node_tar" "$DIR/images/components-$key.tar" "$node"
  cat > "$DIR/env" <<EOF
KIND_BIN=$BIN/kind
KUBECTL_BIN=$BIN/kubectl
KIND_NODE_IMAGE=$node
KIND_TOOLS_IMAGE=$tools
DOCKER_HOST=$DOCKER_HOST
EOF
  log "node image $node"
}

t0=$SECONDS
packages
build_binaries
[ "$set_name" = binaries ] || build_images
log "ready in $DIR ($((SECONDS - t0)) s)"
echo "$DIR"
