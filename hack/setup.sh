#!/usr/bin/env bash
# Everything kf-culler's demo and tests need on a fresh machine; idempotent (seconds when done before).
#
#   bash hack/setup.sh            # Python package + test deps, control plane, Prometheus, code-server
#   KF_CULLER_SETUP=minimal ...   # only the Python package and the API-server binaries (the demo's needs)
#
# Heavy builds go to ~/.cache/kf-culler (outside the repository), keyed by version.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
say() { printf '[setup] %s\n' "$*" >&2; }

py=${PYTHON:-python3}
say "Python package and test dependencies (pip)"
"$py" -m pip install --quiet --disable-pip-version-check -e '.[test]'

if [ "${KF_CULLER_SETUP:-full}" = minimal ]; then
  bash hack/controlplane/build.sh apiserver >/dev/null
  exit 0
fi

say "control plane from upstream Go modules (cached after the first build)"
if ! bash hack/controlplane/build.sh cluster >/dev/null; then
  say "the full cluster (controller-manager, scheduler, kwok) did not build; etcd + kube-apiserver only"
  bash hack/controlplane/build.sh apiserver >/dev/null
fi
# Kubeflow's notebook-controller, where the Go module proxy serves it (tests that need it say so).
bash hack/controlplane/build.sh all >/dev/null 2>&1 || say "Kubeflow's notebook-controller is not available here"

if ! command -v prometheus >/dev/null 2>&1; then
  say "Prometheus (Debian package)"
  if command -v apt-get >/dev/null 2>&1; then
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus) \
      >/dev/null || say "apt-get could not install prometheus; its tests will say so"
  fi
fi

if command -v npm >/dev/null 2>&1; then
  say "code-server and Node 24 (npm registry)"
  bash hack/codeserver/install.sh >/dev/null || say "code-server did not install; its tests will say so"
fi
say "ready"
