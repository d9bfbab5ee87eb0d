#!/usr/bin/env bash
# Install Kubeflow's Jupyter web app backend (v1.11.0, Flask) into a virtualenv of its own, outside the
# repository, so that tests can run the unmodified upstream backend against a local API server.
#
#   hack/webapp/install.sh            # prints progress on stderr; the last line is the virtualenv's path
#
# Environment:
#   KF_CULLER_WEBAPP_SRC     the unmodified upstream tree, holding common-backend/ and jupyter-backend/
#                            (default: ../shared/vendor/kubeflow-jupyter-web-app-v1.11.0 beside the repo)
#   KF_CULLER_WEBAPP_PYTHON  the Python that makes the virtualenv (default: python3)
#   XDG_CACHE_HOME           the cache root (default ~/.cache); the virtualenv is
#                            $XDG_CACHE_HOME/kf-culler/webapp/v1.11.0/venv
#
# The virtualenv is separate from kf-culler's environment: the backend pins kubernetes==34.1.0. It gets
# the requirements of common-backend/setup.py and jupyter-backend/requirements.txt from PyPI (with
# gunicorn's gevent extra, for upstream's gevent workers), and
# common-backend itself (the `kubeflow` package; its setup.py says Python >= 3.12, it runs on 3.11, so it
# is installed with --ignore-requires-python). The source is read-only (CI): pip works on a copy.
# The web app itself (jupyter-backend/) is not installed: tests/support/webapp.py runs it from a copy.
# A finished install is marked by .installed next to venv/; running the script again is then a no-op.
set -euo pipefail

version=v1.11.0
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
src="${KF_CULLER_WEBAPP_SRC:-${root}/../shared/vendor/kubeflow-jupyter-web-app-${version}}"
dir="${XDG_CACHE_HOME:-${HOME}/.cache}/kf-culler/webapp/${version}"
venv="${dir}/venv"
marker="${dir}/.installed"
python="${KF_CULLER_WEBAPP_PYTHON:-python3}"
# Upstream runs the backend as `gunicorn --worker-class=gevent` (jupyter-backend/Makefile); gunicorn's
# gevent worker needs its "gevent" extra (gevent and packaging), which requirements.txt does not name.
extra=('gunicorn[gevent]')

say() { printf 'webapp-install: %s\n' "$*" >&2; }
die() { say "error: $*"; exit 1; }

[[ -d "${src}" ]] || die "the Jupyter web app source is missing: ${src} (set KF_CULLER_WEBAPP_SRC to the unmodified kubeflow-jupyter-web-app-${version} tree)"
src="$(cd "${src}" && pwd)"
for f in common-backend/setup.py jupyter-backend/requirements.txt jupyter-backend/entrypoint.py; do
  [[ -f "${src}/${f}" ]] || die "${src} is not the Jupyter web app source: ${f} is missing"
done

# What the install is made of: a different source or Python means a new install.
fingerprint() {
  {
    printf '%s\n' "${version}" "${extra[@]}"
    "${python}" -c 'import sys; print(sys.version.split()[0])' 2>/dev/null || printf 'no-python\n'
    cat "${src}/common-backend/setup.py" "${src}/jupyter-backend/requirements.txt"
  } | sha256sum | cut -d' ' -f1
}
command -v "${python}" >/dev/null 2>&1 || die "${python} is not on PATH (set KF_CULLER_WEBAPP_PYTHON)"
want="$(fingerprint)"

installed() { [[ -f "${marker}" && -x "${venv}/bin/python" && "$(cat "${marker}")" == "${want}" ]]; }

if installed; then
  say "already installed in ${venv}"
  printf '%s\n' "${venv}"
  exit 0
fi

mkdir -p "${dir}"
# One installer at a time per directory (set-up and tests may call this concurrently).
exec 9>"${dir}/.lock"
if command -v flock >/dev/null 2>&1; then
  flock 9
fi
if installed; then
  say "already installed in ${venv} (by a concurrent run)"
  printf '%s\n' "${venv}"
  exit 0
fi

start=${SECONDS}
rm -rf "${venv}" "${marker}"
say "creating the virtualenv ${venv} with $("${python}" --version 2>&1)"
"${python}" -m venv "${venv}" >&2 || die "${python} -m venv ${venv} failed (on Debian: apt-get install python3-venv)"
pip=("${venv}/bin/python" -m pip --disable-pip-version-check --no-input)

work="$(mktemp -d)"
trap 'rm -rf "${work}"' EXIT
# pip builds in the package's folder (egg-info): copy it, the source is read-only.
cp -r "${src}/common-backend" "${work}/common-backend"
chmod -R u+w "${work}"

say "installing jupyter-backend/requirements.txt and common-backend (the kubeflow package) with its requirements from PyPI"
"${pip[@]}" install --quiet --ignore-requires-python \
  -r "${src}/jupyter-backend/requirements.txt" "${extra[@]}" "${work}/common-backend" >&2 \
  || die "pip install failed (see pip's message above)"

# The backend runs as gunicorn entrypoint:app; check what it imports at start.
"${venv}/bin/python" - >&2 <<'PY' || die "the installed virtualenv is incomplete (see above)"
import importlib.metadata as md
import cachetools, flask, flask_cors, gevent, gunicorn, kubernetes, prometheus_flask_exporter  # noqa: F401
import gunicorn.workers.ggevent  # noqa: F401
import kubeflow.kubeflow  # noqa: F401
assert md.version("kubernetes") == "34.1.0", md.version("kubernetes")
print("webapp-install: kubeflow %s, kubernetes %s, Flask %s, gunicorn %s"
      % (md.version("kubeflow"), md.version("kubernetes"), md.version("flask"), md.version("gunicorn")))
PY

printf '%s\n' "${want}" >"${marker}"
say "installed in $((SECONDS - start))s"
printf '%s\n' "${venv}"
