#!/usr/bin/env bash
# Build kf-culler's container image from the repository's Dockerfile with podman, where no image registry
# is reachable, and export it as a docker-archive (for `podman load`, `docker load`, `kind load image-archive`,
# or `skopeo copy` to a registry) and as an OCI image layout (for `skopeo copy oci:...`, crane, oras).
#
#   bash hack/image/build.sh
#
# What it does:
#   1. installs Debian's podman, buildah, runc, skopeo, mmdebstrap, uidmap, conmon and fuse-overlayfs when
#      podman, skopeo or mmdebstrap is missing (apt-get, as root);
#   2. writes a private containers.conf (runtime runc, ulimits the machine allows) and uses it through
#      CONTAINERS_CONF; nothing under /etc/containers is changed;
#   3. the base: a Debian bookworm minbase with python3 (3.11), python3-venv, ca-certificates and tzdata, made
#      with mmdebstrap from the Debian mirror and imported as localhost/kf-culler-base:bookworm-<key>, where
#      <key> is the hash of this recipe: made once, kept as a tarball in the cache;
#      KF_CULLER_BASE_IMAGE=python:3.11-slim-bookworm (or any image the Dockerfile accepts) uses that instead;
#   4. `podman build` of the Dockerfile with BASE_IMAGE set to that base, the machine's CA bundle and
#      /etc/pip.conf mounted read-only into the build's RUN steps (pip reaches PyPI through them; neither is
#      in the image), tagged localhost/kf-culler:<version> and labelled with the build key: the hash of the
#      base, the Dockerfile, .dockerignore and every file the build context sends (requirements.lock, the
#      locked dependencies, among them);
#   5. `skopeo copy` to a docker-archive named kf-culler:<version> and to an OCI layout (a directory) tagged
#      <version>, both in the cache; the image's size and the archive's are printed.
#
# Idempotent and cached by key: an image already built from the same files is not rebuilt (seconds); an
# archive whose image left podman's storage is loaded back. One build at a time (a lock in the cache): a test
# that needs the image while hack/background-builds.sh builds it waits, then finds it.
#
# Environment:
#   KF_CULLER_IMAGE_DIR       the cache (default ~/.cache/kf-culler/images)
#   KF_CULLER_BASE_IMAGE      a base image to use instead of the one made here
#   KF_CULLER_DEBIAN_MIRROR   the Debian mirror for the base (default http://deb.debian.org/debian)
#
# Prints, on stdout, `image=...`, `archive=...`, `oci=...`, `containers_conf=...`, `key=...` and `size_mb=...` (the
# image's size in podman's storage, uncompressed) lines; the log goes to stderr.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
CACHE=${KF_CULLER_IMAGE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/kf-culler/images}
MIRROR=${KF_CULLER_DEBIAN_MIRROR:-http://deb.debian.org/debian}
SUITE=bookworm
BASE_PACKAGES=python3,python3-venv,ca-certificates,tzdata
DEBS="podman buildah runc skopeo mmdebstrap uidmap conmon fuse-overlayfs"

log() { printf '[image] %s\n' "$*" >&2; }
die() { printf '[image] error: %s\n' "$*" >&2; exit 1; }
timed() { local t0=$SECONDS; "$@" || return; log "  done in $((SECONDS - t0)) s"; }

mkdir -p "$CACHE"
exec 9>"$CACHE/.build.lock"
flock 9

# --- 1. tools ---------------------------------------------------------------------------------------------
if ! command -v podman >/dev/null || ! command -v skopeo >/dev/null || ! command -v runc >/dev/null \
   || { [ -z "${KF_CULLER_BASE_IMAGE:-}" ] && ! command -v mmdebstrap >/dev/null; }; then
  command -v apt-get >/dev/null || die "install podman, runc and skopeo (and mmdebstrap), then run again"
  [ "$(id -u)" = 0 ] || die "run as root to install Debian's $DEBS, or install them and run again"
  log "installing Debian's $DEBS"
  export DEBIAN_FRONTEND=noninteractive
  timed sh -c "apt-get update -qq -o DPkg::Lock::Timeout=600 \
    && apt-get install -y -qq -o DPkg::Lock::Timeout=600 --no-install-recommends $DEBS >/dev/null"
fi

# --- 2. podman's settings for this machine ----------------------------------------------------------------
# runc (crun does not run on cgroup v1 hybrid hosts); ulimits at or below what a root without
# CAP_SYS_RESOURCE may set (podman's defaults ask for more and every container fails in setrlimit).
export CONTAINERS_CONF=$CACHE/containers.conf
cat > "$CONTAINERS_CONF.tmp" <<'EOF'
# Written by hack/image/build.sh.
[containers]
default_ulimits = ["nofile=20000:20000", "nproc=32768:32768"]

[engine]
runtime = "runc"
EOF
mv "$CONTAINERS_CONF.tmp" "$CONTAINERS_CONF"

version=$(python3 -c 'import sys, tomllib; print(tomllib.load(open(sys.argv[1], "rb"))["project"]["version"])' \
  "$root/pyproject.toml")

# --- 3. the base ------------------------------------------------------------------------------------------
if [ -n "${KF_CULLER_BASE_IMAGE:-}" ]; then
  base=$KF_CULLER_BASE_IMAGE
  base_key=$base
  log "base: $base (KF_CULLER_BASE_IMAGE)"
else
  mirrors=("deb $MIRROR $SUITE main" "deb $MIRROR $SUITE-updates main" "deb ${MIRROR%/debian}/debian-security $SUITE-security main")
  mm_args=(--variant=minbase "--include=$BASE_PACKAGES" --aptopt='Apt::Install-Recommends "false"'
           --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-include=/usr/share/doc/*/copyright'
           --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/locale/*')
  base_key=$(printf '%s\n' "$SUITE" "${mm_args[@]}" "${mirrors[@]}" | sha256sum | cut -c1-12)
  base=localhost/kf-culler-base:$SUITE-$base_key
  tarball=$CACHE/base-$SUITE-$base_key.tar
  if podman image exists "$base"; then
    log "base $base: cached"
  else
    if [ ! -s "$tarball" ]; then
      log "base: mmdebstrap $SUITE minbase with $BASE_PACKAGES (cold: 1.5 to 4 minutes on 2 cores)"
      rm -f "$CACHE"/base-*.tar "$tarball.part"
      timed nice -n 10 mmdebstrap --quiet "${mm_args[@]}" "$SUITE" "$tarball.part.tar" "${mirrors[@]}" >&2
      mv "$tarball.part.tar" "$tarball"
    fi
    log "base: importing $tarball as $base"
    podman import --quiet --change 'CMD ["/bin/bash"]' "$tarball" "$base" >/dev/null
  fi
fi

# --- 4. the image -----------------------------------------------------------------------------------------
# The build key: the base, and every file the build context sends (the Dockerfile and .dockerignore
# included), read with .dockerignore's rules: the last matching pattern wins, a pattern matching a parent
# directory matches what is under it.
key=$(cd "$root" && BASE_KEY="$base_key" python3 - <<'EOF'
import fnmatch, hashlib, os
from pathlib import Path, PurePosixPath

patterns = []
for line in Path(".dockerignore").read_text().splitlines():
    line = line.strip()
    if line and not line.startswith("#"):
        patterns.append((line.startswith("!"), line.lstrip("!").strip("/")))

def ignored(rel: PurePosixPath) -> bool:
    names = [str(rel), *(str(p) for p in rel.parents if str(p) != ".")]
    out = False
    for negate, pattern in patterns:
        if any(fnmatch.fnmatchcase(n, pattern) for n in names):
            out = not negate
    return out

h = hashlib.sha256(os.environ["BASE_KEY"].encode() + b"\0")
files = {"Dockerfile", ".dockerignore"}
for dirpath, dirnames, filenames in os.walk("."):
    dirnames[:] = sorted(d for d in dirnames if d != ".git")
    for name in filenames:
        rel = PurePosixPath(Path(dirpath, name).as_posix()).relative_to(".")
        if not ignored(rel):
            files.add(str(rel))
for rel in sorted(files):
    h.update(rel.encode() + b"\0" + Path(rel).read_bytes() + b"\0")
print(h.hexdigest()[:16])
EOF
)
image=localhost/kf-culler:$version
archive=$CACHE/kf-culler-$version-$key.tar
oci=$CACHE/kf-culler-$version-$key.oci
label=io.kf-culler.build-key
built_key() { podman image inspect --format "{{index .Labels \"$label\"}}" "$image" 2>/dev/null || true; }

if [ "$(built_key)" = "$key" ]; then
  log "image $image ($key): cached"
elif [ -s "$archive" ]; then
  log "image $image ($key): loading $archive"
  loaded=$(podman load --input "$archive" | sed -n 's/^Loaded image[(s)]*: //p' | head -n1)
  [ -n "$loaded" ] || die "podman load $archive named no image"
  [ "$loaded" = "$image" ] || podman tag "$loaded" "$image"
else
  log "image $image ($key): podman build (cold: 1 to 2.5 minutes on 2 cores)"
  mounts=()
  for f in /etc/ssl/certs/ca-certificates.crt /etc/pip.conf; do
    [ -f "$f" ] && mounts+=(--volume "$f:$f:ro")
  done
  pull=never
  [ -n "${KF_CULLER_BASE_IMAGE:-}" ] && pull=missing
  timed nice -n 10 podman build --quiet --network=host --pull="$pull" --layers=false \
    --build-arg "BASE_IMAGE=$base" --label "$label=$key" "${mounts[@]}" \
    --tag "$image" --file "$root/Dockerfile" "$root" >/dev/null
fi
[ "$(built_key)" = "$key" ] || die "$image does not carry the build key $key"

# --- 5. the archive ---------------------------------------------------------------------------------------
if [ ! -s "$archive" ]; then
  log "exporting $image to $archive (docker-archive, kf-culler:$version)"
  rm -f "$CACHE"/kf-culler-*.tar "$archive.part"
  skopeo copy --quiet "containers-storage:$image" "docker-archive:$archive.part:kf-culler:$version" >&2
  mv "$archive.part" "$archive"
fi
if [ ! -s "$oci/index.json" ]; then
  log "exporting $image to $oci (OCI layout, tag $version)"
  rm -rf "$CACHE"/kf-culler-*.oci "$oci.part"
  skopeo copy --quiet "containers-storage:$image" "oci:$oci.part:$version" >&2
  mv "$oci.part" "$oci"
fi
size_mb=$(podman image inspect --format '{{.Size}}' "$image" | awk '{printf "%.0f", $1/1e6}')
log "image $image: $size_mb MB; docker-archive $(du -m "$archive" | cut -f1) MB;"\
" OCI layout $(du -sm "$oci" | cut -f1) MB"
printf 'image=%s\narchive=%s\noci=%s\ncontainers_conf=%s\nkey=%s\nsize_mb=%s\n' \
  "$image" "$archive" "$oci" "$CONTAINERS_CONF" "$key" "$size_mb"
