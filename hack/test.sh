#!/usr/bin/env bash
# The whole test suite, set-up included: what CI runs (.ci/run calls exactly this).
#
#   bash hack/test.sh [pytest arguments]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash hack/setup.sh
set +e
python3 -m pytest -ra "$@"
status=$?
set -e
if [ "$status" -eq 5 ]; then
  echo "pytest collected no tests: that is a failure here" >&2
  exit 1
fi
exit "$status"
