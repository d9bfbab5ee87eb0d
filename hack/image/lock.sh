#!/usr/bin/env bash
# Write requirements.lock: the image's Python dependencies, pinned with their hashes, for a reproducible build.
#
#   bash hack/image/lock.sh          # after changing pyproject.toml's dependencies; commit the result
#
# A clean virtual environment (Python 3.11, as in the image) installs the project from pyproject.toml; `pip
# freeze` of it, plus the build backend (setuptools), are the pins. The hashes are those of the wheels pip picks
# for CPython 3.11 on manylinux x86_64 and aarch64 (Debian bookworm's glibc 2.36), so the Dockerfile's
# `pip install --require-hashes --only-binary=:all:` installs exactly these files on either architecture.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
python=${PYTHON:-python3.11}
"$python" -c 'import sys; assert sys.version_info[:2] == (3, 11), sys.version' \
  || { echo "lock.sh: needs Python 3.11 (PYTHON=...), as in the image" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

"$python" -m venv "$tmp/venv"
pip=("$tmp/venv/bin/pip" --disable-pip-version-check --no-input)
"${pip[@]}" install --quiet --no-cache-dir "$root"
{
  "${pip[@]}" freeze --exclude kf-culler
  # The build backend of `pip install --no-build-isolation .`: the newest setuptools pyproject.toml accepts.
  backend=$(python3 -c 'import sys, tomllib
print(*tomllib.load(open(sys.argv[1], "rb"))["build-system"]["requires"])' "$root/pyproject.toml")
  "${pip[@]}" install --quiet --dry-run --ignore-installed --no-deps --report "$tmp/backend.json" $backend
  python3 -c 'import json, sys
for i in json.load(open(sys.argv[1]))["install"]:
    print("%s==%s" % (i["metadata"]["name"], i["metadata"]["version"]))' "$tmp/backend.json"
} | sort -f > "$tmp/pins"

for arch in x86_64 aarch64; do
  # Every manylinux tag glibc 2.36 runs, given one by one (pip does not widen a --platform).
  platforms=()
  for minor in $(seq 36 -1 5); do platforms+=(--platform "manylinux_2_${minor}_$arch"); done
  platforms+=(--platform "manylinux2014_$arch" --platform "manylinux2010_$arch" --platform "manylinux1_$arch")
  "${pip[@]}" install --quiet --dry-run --ignore-installed --no-deps --only-binary=:all: \
    "${platforms[@]}" --python-version 3.11 --implementation cp --abi cp311 \
    --target "$tmp/target-$arch" --report "$tmp/$arch.json" -r "$tmp/pins"
done

python3 - "$tmp/pins" "$tmp/x86_64.json" "$tmp/aarch64.json" > "$root/requirements.lock.tmp" <<'PY'
import json, re, sys

def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()

hashes: dict[str, set[str]] = {}
for report in sys.argv[2:]:
    for item in json.load(open(report))["install"]:
        info = item["download_info"]["archive_info"]
        digest = info.get("hashes", {}).get("sha256") or info["hash"].split("=", 1)[1]
        hashes.setdefault(norm(item["metadata"]["name"]), set()).add(digest)
print("# kf-culler's image: its Python dependencies, pinned with their hashes (CPython 3.11, manylinux x86_64 and")
print("# aarch64). Written by hack/image/lock.sh from pyproject.toml; do not edit by hand. The Dockerfile installs")
print("# these with --require-hashes, then the project itself without dependencies.")
for line in open(sys.argv[1]).read().split():
    name = norm(line.split("==")[0])
    print(line + "".join(f" \\\n    --hash=sha256:{h}" for h in sorted(hashes[name])))
PY
mv "$root/requirements.lock.tmp" "$root/requirements.lock"
echo "lock.sh: wrote $root/requirements.lock ($(grep -c '==' "$root/requirements.lock") packages)" >&2
