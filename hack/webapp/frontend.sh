#!/usr/bin/env bash
# Build Kubeflow's Jupyter web app front end (Angular, v1.11.0) from an upstream source tree, outside the
# repository, into a cache that the backend (hack/webapp/install.sh) can serve as its static folder.
#
#   KF_CULLER_WEBAPP_FRONTEND_SRC=/path/to/notebooks hack/webapp/frontend.sh
#       # progress on stderr; the last line on stdout is the built front end's directory
#
# Environment:
#   KF_CULLER_WEBAPP_FRONTEND_SRC  (required) a tree of github.com/kubeflow/notebooks at tag v1.11.0, holding
#                                  components/crud-web-apps/jupyter/frontend and
#                                  components/crud-web-apps/common/frontend/kubeflow-common-lib, e.g.
#                                    git clone --depth 1 -b v1.11.0 https://github.com/kubeflow/notebooks
#                                  It is only read: the build works on a copy.
#   KF_CULLER_WEBAPP_NODE_BIN      a directory holding the node and npm to use (default: those on PATH;
#                                  upstream's Dockerfile uses Node 24, Node 20 builds it too)
#   XDG_CACHE_HOME                 the cache root (default ~/.cache); the result is
#                                  $XDG_CACHE_HOME/kf-culler/webapp/v1.11.0/frontend (index.html and the
#                                  bundles), the build tree beside it in frontend-build/
#
# The steps are upstream's (components/crud-web-apps/jupyter/Dockerfile): `npm ci` and `npm run build` in
# kubeflow-common-lib, `npm ci` in jupyter/frontend, the library's dist/kubeflow copied into its
# node_modules/kubeflow, then `npm run build -- --output-path=... --configuration=production`
# (base href /jupyter/, which the backend rewrites to its APP_PREFIX; the bundles under static/).
# Both npm installs take minutes and a few hundred MB each. The build is not part of the test suite: the
# backend-level tests (tests/test_webapp.py) do not need it. A finished build is marked by .built next to
# frontend/; running the script again with the same source is then a no-op.
set -euo pipefail

version=v1.11.0
dir="${XDG_CACHE_HOME:-${HOME}/.cache}/kf-culler/webapp/${version}"
out="${dir}/frontend"
work="${dir}/frontend-build"
marker="${dir}/.frontend-built"
lib_rel=components/crud-web-apps/common/frontend/kubeflow-common-lib
app_rel=components/crud-web-apps/jupyter/frontend

say() { printf 'webapp-frontend: %s\n' "$*" >&2; }
die() { say "error: $*"; exit 1; }

src="${KF_CULLER_WEBAPP_FRONTEND_SRC:-}"
[[ -n "${src}" ]] || die "set KF_CULLER_WEBAPP_FRONTEND_SRC to a kubeflow/notebooks ${version} tree"
[[ -d "${src}" ]] || die "KF_CULLER_WEBAPP_FRONTEND_SRC=${src} is not a directory"
src="$(cd "${src}" && pwd)"
for f in "${lib_rel}/package-lock.json" "${lib_rel}/angular.json" "${app_rel}/package-lock.json" \
         "${app_rel}/angular.json" "${app_rel}/src/main.ts"; do
  [[ -f "${src}/${f}" ]] || die "${src} is not a kubeflow/notebooks tree: ${f} is missing"
done

if [[ -n "${KF_CULLER_WEBAPP_NODE_BIN:-}" ]]; then
  PATH="${KF_CULLER_WEBAPP_NODE_BIN}:${PATH}"
fi
command -v node >/dev/null 2>&1 || die "node is not on PATH (install Node.js, or set KF_CULLER_WEBAPP_NODE_BIN)"
command -v npm >/dev/null 2>&1 || die "npm is not on PATH (install npm, or set KF_CULLER_WEBAPP_NODE_BIN)"

# What the build is made of: the sources (not node_modules) and the Node version.
fingerprint() {
  {
    printf '%s\n' "${version}" "$(node --version)"
    (cd "${src}" && find "${lib_rel}" "${app_rel}" -type f -not -path '*/node_modules/*' -not -path '*/dist/*' \
       -print0 | LC_ALL=C sort -z | xargs -0 sha256sum)
  } | sha256sum | cut -d' ' -f1
}
want="$(fingerprint)"
built() { [[ -f "${marker}" && -f "${out}/index.html" && "$(cat "${marker}")" == "${want}" ]]; }

if built; then
  say "already built in ${out}"
  printf '%s\n' "${out}"
  exit 0
fi

mkdir -p "${dir}"
exec 9>"${dir}/.frontend-lock"
if command -v flock >/dev/null 2>&1; then
  flock 9
fi
if built; then
  say "already built in ${out} (by a concurrent run)"
  printf '%s\n' "${out}"
  exit 0
fi

start=${SECONDS}
export NG_CLI_ANALYTICS=ci NPM_CONFIG_FUND=false NPM_CONFIG_AUDIT=false NPM_CONFIG_UPDATE_NOTIFIER=false
# Angular 14's webpack runs in one process; its default heap is enough on Node >= 20, but say so plainly.
export NODE_OPTIONS="${NODE_OPTIONS:---max-old-space-size=4096}"
say "node $(node --version), npm $(npm --version); source ${src}"

# A fresh copy of the two projects (the source is read-only); node_modules are reused only if the
# package-lock.json they were installed from is the same (npm ci would wipe them anyway).
copy() {  # copy <rel>: the project without node_modules/dist into ${work}/<basename>
  local rel="$1" to="${work}/$(basename "$1")"
  mkdir -p "${to}"
  find "${to}" -mindepth 1 -maxdepth 1 -not -name node_modules -exec rm -rf {} +
  (cd "${src}/${rel}" && tar --exclude=./node_modules --exclude=./dist -cf - .) | tar -xf - -C "${to}"
  chmod -R u+w "${to}"
}
npm_ci() {  # npm_ci <dir>: npm ci unless node_modules were installed from this very lock file
  local d="$1" lock
  lock="$(sha256sum "${d}/package-lock.json" | cut -d' ' -f1)"
  if [[ -f "${d}/node_modules/.kf-culler-lock" && "$(cat "${d}/node_modules/.kf-culler-lock")" == "${lock}" ]]; then
    say "$(basename "${d}"): node_modules already installed from this package-lock.json"
    return 0
  fi
  say "$(basename "${d}"): npm ci (minutes)"
  (cd "${d}" && npm ci --no-audit --no-fund >&2) || die "npm ci in $(basename "${d}") failed (see npm's message above)"
  printf '%s\n' "${lock}" >"${d}/node_modules/.kf-culler-lock"
}

copy "${lib_rel}"
copy "${app_rel}"
lib="${work}/kubeflow-common-lib"
app="${work}/frontend"

npm_ci "${lib}"
say "kubeflow-common-lib: npm run build"
(cd "${lib}" && npm run build >&2) || die "npm run build in kubeflow-common-lib failed (see above)"
[[ -f "${lib}/dist/kubeflow/package.json" ]] || die "kubeflow-common-lib built no dist/kubeflow/package.json"

npm_ci "${app}"
rm -rf "${app}/node_modules/kubeflow"
cp -r "${lib}/dist/kubeflow" "${app}/node_modules/kubeflow"

say "frontend: npm run build -- --configuration=production (minutes)"
rm -rf "${app}/dist"
(cd "${app}" && npm run build -- --output-path=./dist/default --configuration=production >&2) \
  || die "npm run build in jupyter/frontend failed (see above)"
[[ -f "${app}/dist/default/index.html" ]] || die "the build wrote no dist/default/index.html"

rm -rf "${out}.new"
cp -r "${app}/dist/default" "${out}.new"
rm -rf "${out}"
mv "${out}.new" "${out}"
printf '%s\n' "${want}" >"${marker}"
say "built in $((SECONDS - start))s: ${out}"
printf '%s\n' "${out}"
