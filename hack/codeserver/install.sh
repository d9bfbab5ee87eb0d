#!/usr/bin/env bash
# Install code-server, and the Node.js it needs, from the npm registry into a cache outside the repo.
#
#   hack/codeserver/install.sh            # prints progress; the last line is the code-server executable
#
# Environment:
#   KF_CULLER_CODE_SERVER_VERSION  code-server version (default 4.139.1)
#   KF_CULLER_NODE_SPEC            npm spec of the "node" package (default 24: code-server 4.139 needs Node 24)
#   KF_CULLER_CODE_SERVER_DIR      install directory
#                                  (default ~/.cache/kf-culler/code-server/<version>)
#
# The directory holds node/ (the Node.js binary, from the "node" npm package), code-server/ (the
# code-server npm package and its dependencies) and bin/code-server, a wrapper that runs code-server
# with that Node. A finished install is marked by .installed; running the script again is then a no-op.
set -euo pipefail

version="${KF_CULLER_CODE_SERVER_VERSION:-4.139.1}"
node_spec="${KF_CULLER_NODE_SPEC:-24}"
dir="${KF_CULLER_CODE_SERVER_DIR:-${HOME}/.cache/kf-culler/code-server/${version}}"
exe="${dir}/bin/code-server"
marker="${dir}/.installed"
want="code-server@${version} node@${node_spec}"

say() { printf 'codeserver-install: %s\n' "$*" >&2; }
die() { say "error: $*"; exit 1; }
NO_NPM=3  # exit status when npm is missing (tests skip on it; any other failure is an error)

if [[ -f "${marker}" && -x "${exe}" && "$(cat "${marker}")" == "${want}" ]]; then
  say "already installed in ${dir}"
  printf '%s\n' "${exe}"
  exit 0
fi

if ! command -v npm >/dev/null 2>&1; then
  say "error: npm is not on PATH; install Node.js and npm (e.g. apt-get install npm) first"
  exit "${NO_NPM}"
fi

# code-server's postinstall builds VS Code's native modules from source (their prebuilt binaries are
# downloaded from outside the npm registry): it needs a C/C++ toolchain, Python and the Kerberos GSSAPI
# headers (the "kerberos" module). As root on Debian/Ubuntu the missing packages are installed with
# apt-get, unless KF_CULLER_NO_APT=1.
missing=()
command -v make >/dev/null 2>&1 || missing+=(make)
command -v g++ >/dev/null 2>&1 || missing+=(g++)
command -v python3 >/dev/null 2>&1 || missing+=(python3)
command -v pkg-config >/dev/null 2>&1 || missing+=(pkg-config)
[[ -f /usr/include/gssapi/gssapi.h ]] || missing+=(libkrb5-dev)
if ((${#missing[@]})); then
  if [[ "$(id -u)" == 0 && "${KF_CULLER_NO_APT:-0}" != 1 ]] && command -v apt-get >/dev/null 2>&1; then
    say "installing build prerequisites with apt-get: ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y --no-install-recommends "${missing[@]}" >&2 \
      || { apt-get update >&2 && apt-get install -y --no-install-recommends "${missing[@]}" >&2; } \
      || die "apt-get install ${missing[*]} failed"
  else
    die "missing build prerequisites for code-server's native modules: ${missing[*]} (Debian package names; on other systems: a C/C++ toolchain, python3, pkg-config and the Kerberos GSSAPI development headers)"
  fi
fi

mkdir -p "${dir}"
# One installer at a time per directory (tests and the demo may call this concurrently).
exec 9>"${dir}/.lock"
if command -v flock >/dev/null 2>&1; then
  flock 9
fi
if [[ -f "${marker}" && -x "${exe}" && "$(cat "${marker}")" == "${want}" ]]; then
  say "already installed in ${dir} (by a concurrent run)"
  printf '%s\n' "${exe}"
  exit 0
fi

rm -rf "${dir}/node" "${dir}/code-server" "${dir}/bin" "${marker}"
mkdir -p "${dir}/node" "${dir}/code-server" "${dir}/bin"
npm_flags=(--no-audit --no-fund --no-save --loglevel=warn)
start=${SECONDS}

say "installing node@${node_spec} from the npm registry into ${dir}/node"
npm install --prefix "${dir}/node" "${npm_flags[@]}" "node@${node_spec}" >&2 \
  || die "npm install node@${node_spec} failed (see npm's message above)"
node_bin="${dir}/node/node_modules/.bin"
[[ -x "${node_bin}/node" ]] || die "node@${node_spec} installed but ${node_bin}/node is missing"
node_version="$("${node_bin}/node" --version)" || die "${node_bin}/node does not run"
say "node ${node_version} ready ($((SECONDS - start))s)"

say "installing code-server@${version} with node ${node_version} (this builds native modules; minutes)"
PATH="${node_bin}:${PATH}" npm install --prefix "${dir}/code-server" "${npm_flags[@]}" \
  "code-server@${version}" >&2 \
  || die "npm install code-server@${version} failed (see npm's message above)"
entry="${dir}/code-server/node_modules/code-server/out/node/entry.js"
[[ -f "${entry}" ]] || die "code-server@${version} installed but ${entry} is missing"

# code-server's own bin is "#!/usr/bin/env node": pin it to the Node installed above.
cat >"${exe}" <<WRAPPER
#!/bin/sh
PATH='${node_bin}':"\${PATH}"
export PATH
exec '${node_bin}/node' '${entry}' "\$@"
WRAPPER
chmod +x "${exe}"
# code-server writes a default config file on every start: keep this check's files out of $HOME.
scratch="$(mktemp -d)"
got="$(XDG_CONFIG_HOME="${scratch}" XDG_DATA_HOME="${scratch}" "${exe}" --version 2>/dev/null | tail -n 1)" \
  || { rm -rf "${scratch}"; die "${exe} --version failed"; }
rm -rf "${scratch}"
case "${got}" in
  "${version} "*) ;;
  *) die "${exe} --version printed '${got}', expected ${version}" ;;
esac
printf '%s\n' "${want}" >"${marker}"
say "code-server ${got} installed in $((SECONDS - start))s"
printf '%s\n' "${exe}"
