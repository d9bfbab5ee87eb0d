#!/usr/bin/env bash
# Build the JupyterLab extension (extensions/jupyterlab) into a wheel and install it, with JupyterLab,
# into a virtualenv outside the repository. Idempotent: seconds when the extension's sources are unchanged.
#
#   bash hack/jupyterlab/build.sh     # progress on stderr; the last line on stdout is the venv's python
#
# Environment:
#   KF_CULLER_JUPYTERLAB_DIR      cache directory (default ~/.cache/kf-culler/jupyterlab)
#   KF_CULLER_JUPYTERLAB_VERSION  JupyterLab to install (default 4.6.6; the extension needs >=4,<5)
#
# The directory holds venv/ (JupyterLab, hatch-jupyter-builder, the extension), build/ (a copy of the
# extension's sources with node_modules/: jlpm, JupyterLab's bundled yarn, fetches the npm packages),
# yarn-cache/, and dist/kf_culler_jupyterlab-*.whl, the wheel to pip install into a notebook image.
# Nothing is written inside the repository.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
src="$PWD/extensions/jupyterlab"
dir="${KF_CULLER_JUPYTERLAB_DIR:-${HOME}/.cache/kf-culler/jupyterlab}"
lab_version="${KF_CULLER_JUPYTERLAB_VERSION:-4.6.6}"
py="${PYTHON:-python3}"
say() { printf 'jupyterlab-build: %s\n' "$*" >&2; }
die() { say "error: $*"; exit 1; }

# Node.js for the front-end build: @jupyter/builder (rspack 2) needs ^20.19 or >= 22.12. Without such a
# node on PATH, Node.js from the npm registry (the package node-linux-<arch>, the binary that the "node"
# package's install script would fetch; version KF_CULLER_JUPYTERLAB_NODE_SPEC, default 22) is installed
# into the cache directory.
node_ok() {
  command -v node >/dev/null 2>&1 && node -e 'const [a, b] = process.versions.node.split(".").map(Number);
    process.exit((a === 20 && b >= 19) || (a === 22 && b >= 12) || a > 22 ? 0 : 1)' >/dev/null 2>&1
}
if ! node_ok; then
  case "$(uname -m)" in x86_64) arch=x64 ;; aarch64 | arm64) arch=arm64 ;; *) arch="$(uname -m)" ;; esac
  node_pkg="node-linux-${arch}"
  export PATH="$dir/node/node_modules/${node_pkg}/bin:$PATH"
  if ! node_ok; then
    command -v npm >/dev/null 2>&1 || die "no Node.js >= 20.19 and no npm to install one (apt-get install npm)"
    say "installing ${node_pkg}@${KF_CULLER_JUPYTERLAB_NODE_SPEC:-22} from the npm registry into $dir/node"
    mkdir -p "$dir/node"
    npm install --prefix "$dir/node" --no-audit --no-fund --no-save --loglevel=warn \
      "${node_pkg}@${KF_CULLER_JUPYTERLAB_NODE_SPEC:-22}" >&2 || die "npm install ${node_pkg} failed"
    hash -r
    node_ok || die "the node from the npm registry does not run: $(node --version 2>&1)"
  fi
  say "node $(node --version) from $(command -v node)"
fi
# The extension's sources: everything tracked or trackable under extensions/jupyterlab, not build outputs.
files() {
  (cd "$src" && find . -type f \
    -not -path './node_modules/*' -not -path './lib/*' -not -path './kf_culler_jupyterlab/labextension/*' \
    -not -path './.yarn/*' -not -path './dist/*' -not -path '*/__pycache__/*' -not -name '_version.py' \
    -not -name 'tsconfig.tsbuildinfo' -not -name '*.egg-info' | LC_ALL=C sort)
}
want="$( (echo "jupyterlab==${lab_version} node=$(node --version)"; cd "$src" && files | xargs sha256sum) | sha256sum | cut -c1-16)"
marker="$dir/.built"
python="$dir/venv/bin/python"

mkdir -p "$dir"
exec 9>"$dir/.lock"
command -v flock >/dev/null 2>&1 && flock 9
if [[ -f "$marker" && "$(cat "$marker")" == "$want" && -x "$python" ]] \
   && "$python" -c 'import kf_culler_jupyterlab' 2>/dev/null; then
  say "up to date in $dir"
  printf '%s\n' "$python"
  exit 0
fi
t0=$SECONDS
rm -f "$marker"
if ! "$python" -c "import jupyterlab, hatch_jupyter_builder, hatch_nodejs_version, sys; sys.exit(jupyterlab.__version__ != '${lab_version}')" 2>/dev/null; then
  say "virtualenv with jupyterlab==${lab_version} (PyPI) in $dir/venv"
  [[ -x "$python" ]] || "$py" -m venv "$dir/venv" || die "python3 -m venv failed (Debian: apt-get install python3-venv)"
  "$python" -m pip install --quiet --disable-pip-version-check "jupyterlab==${lab_version}" \
    'hatchling>=1.5' 'hatch-jupyter-builder>=0.5' 'hatch-nodejs-version>=0.3.2' ipykernel \
    || die "pip install jupyterlab==${lab_version} failed"
fi

say "copying the extension's sources to $dir/build"
mkdir -p "$dir/build"
(cd "$dir/build" && find . -mindepth 1 -maxdepth 1 -not -name node_modules -exec rm -rf {} +)
(cd "$src" && files | while read -r f; do mkdir -p "$dir/build/$(dirname "$f")"; cp "$f" "$dir/build/$f"; done)

export PATH="$dir/venv/bin:$PATH" YARN_CACHE_FOLDER="$dir/yarn-cache" YARN_ENABLE_TELEMETRY=0
say "jlpm install (npm registry) and the production build, as pip would run them (hatch-jupyter-builder)"
rm -rf "$dir/dist"
(cd "$dir/build" && "$python" -m pip wheel --quiet --disable-pip-version-check --no-build-isolation --no-deps \
   -w "$dir/dist" .) >&2 || die "building the wheel failed (see jlpm's and pip's output above)"
wheel="$(ls "$dir"/dist/kf_culler_jupyterlab-*.whl)"
"$python" -m pip install --quiet --disable-pip-version-check --force-reinstall --no-deps "$wheel" \
  || die "pip install $wheel failed"
labext="$("$dir/venv/bin/jupyter" labextension list 2>&1)"
grep -q 'kf-culler-jupyterlab.*enabled.*OK' <<<"$labext" \
  || die "JupyterLab does not list kf-culler-jupyterlab as enabled: $labext"
serverext="$("$dir/venv/bin/jupyter" server extension list 2>&1)"
grep -q 'kf_culler_jupyterlab.*enabled' <<<"$serverext" \
  || die "jupyter_server does not list kf_culler_jupyterlab as enabled: $serverext"
[[ -f "$dir/build/yarn.lock" && ! -f "$src/yarn.lock" ]] && say "note: no yarn.lock in $src (one was made in $dir/build)"
printf '%s\n' "$want" >"$marker"
say "built $wheel and installed it in $dir/venv ($((SECONDS - t0)) s)"
printf '%s\n' "$python"
