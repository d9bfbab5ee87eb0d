#!/usr/bin/env bash
# The whole test suite, set-up included: what CI runs (.ci/run calls exactly this).
#
#   bash hack/test.sh [pytest arguments]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash hack/setup.sh
# The long builds few tests need go on in the background; those tests run last and wait for them
# (tests/conftest.py LATE); a failed build is reported by the tests that need it. Once pytest is done nothing
# needs them: what is still building is stopped (a later run starts it again from the Go caches).
setsid bash hack/background-builds.sh </dev/null &
builds=$!
set +e
python3 -m pytest -ra --durations=40 "$@"
status=$?
kill -TERM -- "-$builds" 2>/dev/null
wait "$builds" 2>/dev/null
set -e
if [ "$status" -eq 5 ]; then
  echo "pytest collected no tests: that is a failure here" >&2
  exit 1
fi
exit "$status"
