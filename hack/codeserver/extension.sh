#!/usr/bin/env bash
# Build kf-culler's code-server extension (extensions/code-server) into a .vsix outside the repository.
# Idempotent: seconds when the extension's sources are unchanged.
#
#   bash hack/codeserver/extension.sh   # progress on stderr; the last line on stdout is the .vsix
#
# Environment:
#   KF_CULLER_CODE_SERVER_EXTENSION_DIR  cache directory (default ~/.cache/kf-culler/code-server-extension)
#
# The directory holds build/ (a copy of the extension's sources with node_modules/: TypeScript, VS Code's
# API types and @vscode/vsce from the npm registry, as pinned by package-lock.json) and
# dist/kf-culler-code-server-<version>.vsix, the file to install into code-server
# (`code-server --install-extension <file>`). It needs Node.js >= 20 and npm on PATH (else the Node that
# hack/codeserver/install.sh installed is used). Nothing is written inside the repository.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
src="$PWD/extensions/code-server"
dir="${KF_CULLER_CODE_SERVER_EXTENSION_DIR:-${HOME}/.cache/kf-culler/code-server-extension}"
say() { printf 'code-server-extension: %s\n' "$*" >&2; }
die() { say "error: $*"; exit 1; }

node_ok() {
  command -v node >/dev/null 2>&1 && command -v npm >/dev/null 2>&1 \
    && node -e 'process.exit(Number(process.versions.node.split(".")[0]) >= 20 ? 0 : 1)' 2>/dev/null
}
if ! node_ok; then
  cs_node="$(ls -d "${HOME}"/.cache/kf-culler/code-server/*/node/node_modules/.bin 2>/dev/null | tail -n 1 || true)"
  [[ -n "$cs_node" ]] && export PATH="$cs_node:$PATH"
  node_ok || die "no Node.js >= 20 with npm on PATH (and none from hack/codeserver/install.sh)"
fi

files() {
  (cd "$src" && find . -type f -not -path './node_modules/*' -not -path './out/*' -not -path './dist/*' \
    | LC_ALL=C sort)
}
want="$( (echo "node=$(node --version)"; cd "$src" && files | xargs sha256sum) | sha256sum | cut -c1-16)"
marker="$dir/.built"
mkdir -p "$dir"
exec 9>"$dir/.lock"
command -v flock >/dev/null 2>&1 && flock 9
vsix() { ls "$dir"/dist/kf-culler-code-server-*.vsix 2>/dev/null | head -n 1; }
if [[ -f "$marker" && "$(cat "$marker")" == "$want" && -n "$(vsix)" ]]; then
  say "up to date in $dir"
  vsix
  exit 0
fi
t0=$SECONDS
rm -f "$marker"
say "copying the extension's sources to $dir/build"
mkdir -p "$dir/build"
(cd "$dir/build" && find . -mindepth 1 -maxdepth 1 -not -name node_modules -exec rm -rf {} +)
(cd "$src" && files | while read -r f; do mkdir -p "$dir/build/$(dirname "$f")"; cp "$f" "$dir/build/$f"; done)
cd "$dir/build"
npm_flags=(--no-audit --no-fund --loglevel=warn)
if [[ -f package-lock.json ]] && cmp -s package-lock.json node_modules/.kf-culler-installed-lock; then
  say "node_modules as package-lock.json pins (installed before)"
elif [[ -f package-lock.json ]]; then
  say "npm ci (npm registry, as package-lock.json pins)"
  npm ci "${npm_flags[@]}" >&2 || die "npm ci failed"
  cp package-lock.json node_modules/.kf-culler-installed-lock
else
  say "npm install (npm registry; no package-lock.json in $src)"
  npm install "${npm_flags[@]}" >&2 || die "npm install failed"
fi
say "tsc and vsce package"
npm run --silent build >&2 || die "tsc failed"
rm -rf "$dir/dist"
mkdir -p "$dir/dist"
npx --no-install vsce package --skip-license --allow-missing-repository --out "$dir/dist/" >&2 \
  || die "vsce package failed"
out="$(vsix)"
[[ -n "$out" ]] || die "vsce made no .vsix in $dir/dist"
printf '%s\n' "$want" >"$marker"
say "built $out ($((SECONDS - t0)) s)"
printf '%s\n' "$out"
