#!/usr/bin/env bash
# Everything kf-culler's demo and tests need on a fresh machine; idempotent (seconds when done before).
#
#   bash hack/setup.sh            # Python package + test deps, control plane, notebook-controller,
#                                 # Kubeflow's web app, Prometheus, code-server, Chromium, JupyterLab
#                                 # with kf-culler's extension, the code-server extension
#                                 # (the Workspace controller and backend, the image, Coder, kind and ODH are
#                                 # built by hack/background-builds.sh while the tests run, or on first use)
#   KF_CULLER_SETUP=minimal ...   # only the Python package and the API-server binaries (the demo's needs)
#
# Heavy builds go to ~/.cache/kf-culler (outside the repository), keyed by version.
# With CI=true every install that fails fails the set-up; elsewhere it is reported and the tests that
# need that component say so.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
say() { printf '[setup] %s\n' "$*" >&2; }
in_ci() { [ "${CI:-}" = true ] || [ "${CI:-}" = 1 ]; }
# step WHAT COMMAND...: run one install; a failure ends the set-up in CI and is reported elsewhere.
step() {
  local what=$1; shift
  say "$what"
  local t0=$SECONDS
  if "$@"; then
    say "  $what: ready ($((SECONDS - t0)) s)"
    return 0
  fi
  if in_ci; then
    say "FAILED: $what (command: $*)"
    exit 1
  fi
  say "  $what did not install; the tests that need it will say so"
}

py=${PYTHON:-python3}
step "Python package and test dependencies (pip)" \
  "$py" -m pip install --quiet --disable-pip-version-check -e '.[test]'

if [ "${KF_CULLER_SETUP:-full}" = minimal ]; then
  bash hack/controlplane/build.sh apiserver >/dev/null
  exit 0
fi

quiet() { "$@" >/dev/null; }
apt_prometheus() {
  command -v prometheus >/dev/null 2>&1 && return 0
  command -v apt-get >/dev/null 2>&1 || { say "no apt-get to install Debian's prometheus"; return 1; }
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus
}

step "control plane from upstream Go modules (cached after the first build)" \
  quiet bash hack/controlplane/build.sh cluster
step "Kubeflow's notebook-controller v1.11.0 (Go module proxy, else its source)" \
  quiet bash hack/controlplane/build.sh all
step "Kubeflow's Jupyter web app backend v1.11.0 (its own virtualenv)" quiet bash hack/webapp/install.sh
step "Prometheus (Debian package)" quiet apt_prometheus
apt_postgresql() {
  ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 && return 0
  command -v apt-get >/dev/null 2>&1 || { say "no apt-get to install Debian's postgresql"; return 1; }
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends postgresql
}
step "PostgreSQL (Debian package; the Coder server's database)" quiet apt_postgresql
step "code-server and Node 24 (npm registry)" quiet bash hack/codeserver/install.sh
apt_chromium() {
  command -v chromium >/dev/null 2>&1 && return 0
  command -v apt-get >/dev/null 2>&1 || { say "no apt-get to install Debian's chromium"; return 1; }
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium
}
step "Chromium, headless (Debian package; the JupyterLab banner test)" quiet apt_chromium
step "JupyterLab 4 and the kf-culler extension (PyPI, npm registry; its own virtualenv)" \
  quiet bash hack/jupyterlab/build.sh
step "kf-culler's code-server extension, a .vsix (npm registry)" quiet bash hack/codeserver/extension.sh
say "ready"
