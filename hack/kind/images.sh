#!/usr/bin/env bash
# The images the tests on kind run (tests/test_kind_*.py), built here without pulling anything, as
# docker-archives for `kind load image-archive`:
#
#   bash hack/kind/images.sh [all|culler|jupyterlab|notebook-controller]
#
#   culler               kf-culler's own image: hack/image/build.sh (podman; its docker-archive, kf-culler:<version>)
#   jupyterlab           a Jupyter notebook image as Kubeflow's images run one: a Debian bookworm minbase (mmdebstrap)
#                        with python3, JupyterLab from PyPI in a virtualenv, the user jovyan (1000, group users 100)
#                        and HOME /home/jovyan, started with Kubeflow's `jupyter lab` command line: port 8888, no
#                        token, no password, any origin, remote access, the base URL from NB_PREFIX (the
#                        notebook-controller sets it to /notebook/<namespace>/<name>; `/` without it)
#   notebook-controller  Kubeflow's notebook-controller v1.11.0: the binary hack/controlplane/build.sh builds from the
#                        vendored source, alone on an empty image (upstream's Dockerfile puts it on distroless/static:
#                        nonroot, user 65532, entrypoint /manager; the same here, minus the base)
#   all                  the three (default)
#
# Idempotent and cached by key (the inputs' hash) under ~/.cache/kf-culler/kind-images/ (KF_CULLER_KIND_IMAGES_DIR),
# one build at a time (a lock there). podman, skopeo and mmdebstrap as hack/image/build.sh installs them.
#
# Environment:
#   KF_CULLER_JUPYTERLAB_VERSION  JupyterLab to install (default 4.6.6, as hack/jupyterlab/build.sh)
#   KF_CULLER_DEBIAN_MIRROR       the Debian mirror for the base (default http://deb.debian.org/debian)
#
# Prints, on stdout, `<name>_image=...` and `<name>_archive=...` lines (name: culler, jupyterlab,
# notebook_controller); the log goes to stderr.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
what=${1:-all}
CACHE_ROOT=${XDG_CACHE_HOME:-$HOME/.cache}/kf-culler
CACHE=${KF_CULLER_KIND_IMAGES_DIR:-$CACHE_ROOT/kind-images}
MIRROR=${KF_CULLER_DEBIAN_MIRROR:-http://deb.debian.org/debian}
SUITE=bookworm
LAB_VERSION=${KF_CULLER_JUPYTERLAB_VERSION:-4.6.6}
NBC_VERSION=v1.11.0

log() { printf '[kind-images] %s\n' "$*" >&2; }
die() { printf '[kind-images] error: %s\n' "$*" >&2; exit 1; }
timed() { local t0=$SECONDS; "$@" || return; log "  done in $((SECONDS - t0)) s"; }

case "$what" in all|culler|jupyterlab|notebook-controller) ;; *) die "unknown image '$what'" ;; esac

# --- kf-culler's image: its own script (which installs podman, skopeo and mmdebstrap when missing) ------------
culler() {
  local out; out=$(bash "$root/hack/image/build.sh") || die "hack/image/build.sh failed"
  # the name in the archive, the overlays' `image: kf-culler` with the version as its tag
  printf '%s\n' "$out" | sed -n 's/^image=localhost\//culler_image=/p; s/^archive=/culler_archive=/p'
}
if [ "$what" = all ] || [ "$what" = culler ]; then culler; fi
[ "$what" = culler ] && exit 0

for tool in podman skopeo mmdebstrap; do
  command -v "$tool" >/dev/null || bash "$root/hack/image/build.sh" >/dev/null
  command -v "$tool" >/dev/null || die "$tool is missing (hack/image/build.sh installs it)"
done
mkdir -p "$CACHE"
exec 9>"$CACHE/.build.lock"
flock 9

# runc (crun does not run on cgroup v1 hybrid hosts) and ulimits a root without CAP_SYS_RESOURCE may set
export CONTAINERS_CONF=$CACHE/containers.conf
printf '%s\n' '# Written by hack/kind/images.sh.' '[containers]' \
  'default_ulimits = ["nofile=20000:20000", "nproc=32768:32768"]' '' '[engine]' 'runtime = "runc"' \
  > "$CONTAINERS_CONF.tmp"
mv "$CONTAINERS_CONF.tmp" "$CONTAINERS_CONF"

# archive NAME TAG KEY CONTEXT [BUILD ARGS...]: builds CONTEXT/Containerfile as localhost/TAG unless the archive
# CACHE/NAME-KEY.tar exists, exports it as a docker-archive named TAG, prints the `<name>_image/archive` lines.
archive() {
  local name=$1 tag=$2 key=$3 ctx=$4; shift 4
  local out="$CACHE/$name-$key.tar" var=${name//-/_}
  if [ -s "$out" ]; then
    log "$tag: cached ($out)"
  else
    log "$tag: podman build"
    local mounts=() f
    for f in /etc/ssl/certs/ca-certificates.crt /etc/pip.conf; do [ -f "$f" ] && mounts+=(--volume "$f:$f:ro"); done
    timed nice -n 10 podman build --quiet --network=host --pull=never --layers=false "${mounts[@]}" "$@" \
      --tag "localhost/$tag" --file "$ctx/Containerfile" "$ctx" >/dev/null
    rm -f "$CACHE/$name"-*.tar "$out.part"
    skopeo copy --quiet "containers-storage:localhost/$tag" "docker-archive:$out.part:$tag" >&2
    mv "$out.part" "$out"
    podman rmi --force "localhost/$tag" >/dev/null 2>&1 || true
    log "$tag: $(du -m "$out" | cut -f1) MB"
  fi
  printf '%s_image=%s\n%s_archive=%s\n' "$var" "$tag" "$var" "$out"
}

# --- a Jupyter notebook image ---------------------------------------------------------------------------------
jupyterlab() {
  local debs=python3,python3-venv,ca-certificates
  local mirrors=("deb $MIRROR $SUITE main" "deb $MIRROR $SUITE-updates main" "deb ${MIRROR%/debian}/debian-security $SUITE-security main")
  local mm=(--variant=minbase "--include=$debs" --aptopt='Apt::Install-Recommends "false"'
            --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-include=/usr/share/doc/*/copyright'
            --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/locale/*')
  local base_key; base_key=$(printf '%s\n' "$SUITE" "${mm[@]}" "${mirrors[@]}" | sha256sum | cut -c1-12)
  local ctx="$CACHE/build/jupyterlab"
  rm -rf "$ctx" && mkdir -p "$ctx"
  cat > "$ctx/start-jupyterlab" <<'EOF'
#!/bin/sh
# Kubeflow's command line for JupyterLab images: no token or password (the cluster's gateway authenticates), any
# origin, remote access, the base URL the notebook-controller gives in NB_PREFIX.
cd "$HOME"
exec jupyter lab --notebook-dir="$HOME" --ip=0.0.0.0 --no-browser --allow-root --port=8888 \
  --ServerApp.token="" --ServerApp.password="" --ServerApp.allow_origin="*" \
  --ServerApp.allow_remote_access=True --ServerApp.authenticate_prometheus=False \
  --ServerApp.base_url="${NB_PREFIX:-/}" "$@"
EOF
  cat > "$ctx/Containerfile" <<EOF
ARG BASE
FROM \${BASE}
RUN python3 -m venv /opt/jupyter \\
 && PIP_DISABLE_PIP_VERSION_CHECK=1 /opt/jupyter/bin/pip install --no-cache-dir --quiet jupyterlab==$LAB_VERSION \\
 && echo 'jovyan:x:1000:100:jovyan:/home/jovyan:/bin/bash' >> /etc/passwd \\
 && mkdir -p /home/jovyan && chown 1000:100 /home/jovyan && chmod 0775 /home/jovyan
COPY --chmod=0755 start-jupyterlab /usr/local/bin/start-jupyterlab
ENV PATH=/opt/jupyter/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \\
    HOME=/home/jovyan NB_USER=jovyan NB_UID=1000 NB_PREFIX=/ SHELL=/bin/bash PYTHONUNBUFFERED=1
USER 1000:100
WORKDIR /home/jovyan
EXPOSE 8888
ENTRYPOINT ["/usr/local/bin/start-jupyterlab"]
EOF
  local key; key=$(cat "$ctx/Containerfile" "$ctx/start-jupyterlab" <(echo "$base_key") | sha256sum | cut -c1-12)
  local tag="kf-culler.local/jupyterlab:$LAB_VERSION-$key"
  if [ ! -s "$CACHE/jupyterlab-$key.tar" ]; then
    local base="localhost/kf-culler-notebook-base:$SUITE-$base_key" tarball="$CACHE/notebook-base-$SUITE-$base_key.tar"
    if ! podman image exists "$base"; then
      if [ ! -s "$tarball" ]; then
        log "notebook base: mmdebstrap $SUITE minbase with $debs"
        rm -f "$CACHE"/notebook-base-*.tar "$tarball.part.tar"
        timed nice -n 10 mmdebstrap --quiet "${mm[@]}" "$SUITE" "$tarball.part.tar" "${mirrors[@]}" >&2
        mv "$tarball.part.tar" "$tarball"
      fi
      podman import --quiet "$tarball" "$base" >/dev/null
    fi
    archive jupyterlab "$tag" "$key" "$ctx" --build-arg "BASE=$base"
  else
    archive jupyterlab "$tag" "$key" "$ctx"
  fi
}

# --- Kubeflow's notebook-controller -------------------------------------------------------------------------
notebook_controller() {
  local k8s; k8s=$(sed -n 's/^KF_CULLER_K8S_VERSION=//p' "$root/hack/controlplane/versions.env")
  local bin_dir=$CACHE_ROOT/bin/${KF_CULLER_K8S_VERSION:-$k8s}
  if [ ! -s "$bin_dir/notebook-controller.version" ]; then  # hack/setup.sh builds it; else built here
    bin_dir=$(bash "$root/hack/controlplane/build.sh" all | tail -n1) || die "hack/controlplane/build.sh all failed"
  fi
  [ -x "$bin_dir/notebook-controller" ] || die "no notebook-controller in $bin_dir"
  local ctx="$CACHE/build/notebook-controller"
  rm -rf "$ctx" && mkdir -p "$ctx"
  cp "$bin_dir/notebook-controller" "$ctx/manager"
  printf '%s\n' 'FROM scratch' 'COPY --chmod=0755 manager /manager' 'USER 65532:65532' 'ENTRYPOINT ["/manager"]' \
    > "$ctx/Containerfile"
  local key; key=$(cat "$ctx/Containerfile" "$ctx/manager" "$bin_dir/notebook-controller.version" | sha256sum | cut -c1-12)
  archive notebook-controller "kf-culler.local/notebook-controller:$NBC_VERSION-$key" "$key" "$ctx"
}

if [ "$what" = all ] || [ "$what" = jupyterlab ]; then jupyterlab; fi
if [ "$what" = all ] || [ "$what" = notebook-controller ]; then notebook_controller; fi
