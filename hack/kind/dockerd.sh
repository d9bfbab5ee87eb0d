#!/usr/bin/env bash
# A Docker daemon of the test run's own, for kind: its data, state and socket under a directory of ours,
# never the system's (/var/lib/docker, /var/run/docker.sock), so it collides with nothing.
#
#   hack/kind/dockerd.sh start   start it unless it already answers; prints DOCKER_HOST=unix://... last
#   hack/kind/dockerd.sh stop    stop it (its unused networks removed, SIGTERM to the pid it recorded, then wait)
#   hack/kind/dockerd.sh env     print DOCKER_HOST=unix://...
#
# How it runs (each one needed on this machine):
#   - default ulimits nofile 20000 and nproc 32768: root here may not raise its limits higher;
#   - runc through hack/kind/runc-wrapper (the default runtime), which removes CAP_SYS_RESOURCE from each
#     container, without which every `docker run --privileged` (a kind node) fails;
#   - no default bridge; the networks kind makes are bridges `br-*`, and nothing on them may be forwarded
#     anywhere but to another of them: a DROP rule heads DOCKER-USER (nothing is pulled, nothing needs out).
#     Traffic between the machine and the containers is not forwarded, so it is untouched.
#
# Environment: KF_CULLER_DOCKER_DIR  its directory (default ~/.cache/kf-culler/kind/docker)
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
DIR=${KF_CULLER_DOCKER_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/kf-culler/kind/docker}
SOCK=$DIR/docker.sock
RUNTIME=kfc-runc
export DOCKER_HOST=unix://$SOCK

log() { printf '[dockerd] %s\n' "$*" >&2; }
die() { printf '[dockerd] error: %s\n' "$*" >&2; exit 1; }

answers() { docker version --format '{{.Server.Version}}' >/dev/null 2>&1; }

isolate() {
  # iptables -C/-I: idempotent; the chain exists once dockerd has set up its rules
  iptables -n -L DOCKER-USER >/dev/null 2>&1 || iptables -N DOCKER-USER
  iptables -C FORWARD -j DOCKER-USER >/dev/null 2>&1 || iptables -I FORWARD -j DOCKER-USER
  iptables -C DOCKER-USER -i br-+ ! -o br-+ -j DROP >/dev/null 2>&1 \
    || iptables -I DOCKER-USER -i br-+ ! -o br-+ -j DROP
}

start() {
  command -v dockerd >/dev/null 2>&1 || die "dockerd is not installed (Debian: apt-get install docker.io)"
  mkdir -p "$DIR/data" "$DIR/exec"
  if answers; then isolate; log "running ($SOCK)"; echo "DOCKER_HOST=$DOCKER_HOST"; return; fi
  install -m 0755 "$here/runc-wrapper" "$DIR/runc-wrapper"
  log "starting dockerd (log: $DIR/dockerd.log)"
  # Without the caller's descriptors: a daemon that kept build.sh's lock (fd 9) open would hold it for its whole
  # life, and every later build.sh would wait for it forever.
  setsid dockerd \
    --host "$DOCKER_HOST" --data-root "$DIR/data" --exec-root "$DIR/exec" --pidfile "$DIR/dockerd.pid" \
    --bridge none --ip-forward=true --iptables=true \
    --default-ulimit nofile=20000:20000 --default-ulimit nproc=32768:32768 \
    --add-runtime "$RUNTIME=$DIR/runc-wrapper" --default-runtime "$RUNTIME" \
    >>"$DIR/dockerd.log" 2>&1 </dev/null 3>&- 4>&- 5>&- 6>&- 7>&- 8>&- 9>&- &
  local i
  for i in $(seq 1 120); do answers && break; sleep 0.5; done
  answers || die "dockerd did not answer on $SOCK within 60 s; see $DIR/dockerd.log"
  isolate
  log "running ($SOCK)"
  echo "DOCKER_HOST=$DOCKER_HOST"
}

stop() {
  local pid; pid=$(cat "$DIR/dockerd.pid" 2>/dev/null || true)
  [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null || { log "not running"; return; }
  # The networks no container uses any more (kind's, once its clusters are deleted): dockerd leaves their `br-*`
  # bridges on the machine when it exits, so they go first.
  answers && docker network prune --force >/dev/null 2>&1 || true
  kill -TERM "$pid"
  local i; for i in $(seq 1 60); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
  kill -0 "$pid" 2>/dev/null && die "dockerd ($pid) did not stop"
  log "stopped"
}

case "${1:-start}" in
  start) start ;;
  stop) stop ;;
  env) echo "DOCKER_HOST=$DOCKER_HOST" ;;
  *) die "unknown command '$1' (expected start, stop or env)" ;;
esac
