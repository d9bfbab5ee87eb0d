#!/usr/bin/env bash
# The builds only a few tests need (Kubeflow Notebooks 2.0's Workspace controller and backend, kf-culler's own
# image, Coder, Terraform and its coder/coder and hashicorp/kubernetes providers, the kind backend and the images
# its tests run, Open Data Hub's controllers and kube-rbac-proxy), run by
# hack/test.sh in the background while the other tests run, in the order the tests that need them run
# (tests/conftest.py LATE). Each build script takes a lock on its cache, so a test harness that needs a binary before
# its build is done waits for it instead of building it twice.
#
#   bash hack/background-builds.sh        # logs to ${XDG_CACHE_HOME:-~/.cache}/kf-culler/logs/
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
logs=${XDG_CACHE_HOME:-$HOME/.cache}/kf-culler/logs
mkdir -p "$logs"
status=0
for entry in "hack/controlplane/build.sh workspaces" "hack/controlplane/build.sh workspaces-backend" \
    hack/image/build.sh hack/coder/build.sh hack/kind/build.sh hack/kind/images.sh hack/odh/build.sh; do
  read -r build arg <<<"$entry"
  [ -f "$build" ] || continue
  name=$(basename "$(dirname "$build")")
  [ "$(basename "$build")" = build.sh ] || name=$name-$(basename "$build" .sh)  # hack/kind/images.sh: kind-images
  [ -z "$arg" ] || name=$arg                                                     # the Workspaces' two binaries
  t0=$SECONDS
  # shellcheck disable=SC2086  # $arg is one word or none
  if nice -n 10 bash "$build" $arg >"$logs/$name.log" 2>&1; then
    printf '[background] %s: ready (%d s)\n' "$name" "$((SECONDS - t0))" >>"$logs/background.log"
  else
    printf '[background] %s: FAILED (%d s; %s)\n' "$name" "$((SECONDS - t0))" "$logs/$name.log" >>"$logs/background.log"
    status=1
  fi
done
exit "$status"
