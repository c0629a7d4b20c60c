#!/usr/bin/env bash
# Local Redis on 127.0.0.1:6379 for development and tests (no systemd needed).
#
#   scripts/services/redis.sh up      install redis-server/redis-tools (apt) if missing, start, wait for PING
#   scripts/services/redis.sh down    shut down the Redis started by `up` (SHUTDOWN, else by pid)
#   scripts/services/redis.sh status  one line; exit 0 if PING answers PONG, 1 otherwise
#   scripts/services/redis.sh reset   down + wipe data dir (AOF/RDB) and log
#
# Data, pid file and log live in $STATE/redis (see lib.sh). appendonly yes +
# appendfsync everysec, so data survives a restart of Redis.
set -euo pipefail

export SVC_NAME=redis
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/lib.sh"

HOST=127.0.0.1
PORT=6379
RDIR="$STATE/redis"
PIDFILE="$RDIR/redis.pid"
LOG="$RDIR/redis.log"
REDIS_WAIT="${READFOLD_REDIS_WAIT:-30}"

ping_ok() {
  command -v redis-cli >/dev/null 2>&1 || return 1
  [[ "$(timeout 5 redis-cli -h "$HOST" -p "$PORT" ping 2>/dev/null)" == PONG ]]
}

ensure_installed() {
  if command -v redis-server >/dev/null 2>&1 && command -v redis-cli >/dev/null 2>&1; then
    return 0
  fi
  log "installing redis-server redis-tools (apt)"
  as_root apt-get update -qq
  DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq redis-server redis-tools >/dev/null
  # Where services may start on install (no policy-rc.d), the package starts its
  # own Redis with /etc/redis/redis.conf. Stop it: we run our own below.
  if ping_ok; then
    log "stopping the Redis started by the package install"
    as_root /etc/init.d/redis-server stop >/dev/null 2>&1 || timeout 10 redis-cli -h "$HOST" -p "$PORT" shutdown >/dev/null 2>&1 || true
    wait_for 10 0.2 bash -c "! (exec 3<>/dev/tcp/$HOST/$PORT)" || true
  fi
}

cmd_up() {
  if ping_ok; then
    log "already up on $HOST:$PORT"
    return 0
  fi
  ensure_installed
  if ping_ok; then
    log "already up on $HOST:$PORT"
    return 0
  fi
  if port_open "$HOST" "$PORT"; then
    die "port $PORT is in use but does not answer Redis PING"
  fi
  mkdir -p "$RDIR"
  log "starting redis-server (dir $RDIR)"
  # A group's cursor hash past 128 members becomes a real hash table: in the
  # default listpack (up to 512) each of a flush's fields is a linear scan.
  redis-server \
    --bind "$HOST" --port "$PORT" --protected-mode yes \
    --daemonize yes --pidfile "$PIDFILE" --logfile "$LOG" --dir "$RDIR" \
    --appendonly yes --appendfsync everysec --save "" \
    --hash-max-listpack-entries 128 \
    || { show_log_tail "$LOG" 20; die "redis-server failed to start"; }
  if ! wait_for "$REDIS_WAIT" 0.2 ping_ok; then
    show_log_tail "$LOG" 30
    die "redis did not answer PING within ${REDIS_WAIT}s"
  fi
  log "up on $HOST:$PORT (pid $(pid_read "$PIDFILE" || echo '?'))"
}

cmd_down() {
  if ! ping_ok && ! pid_alive "$PIDFILE" redis-server; then
    log "not running"
    return 0
  fi
  if ping_ok; then
    if ! pid_alive "$PIDFILE" redis-server; then
      warn "Redis on $HOST:$PORT was not started by this script (no pid file in $RDIR); leaving it alone"
      return 0
    fi
    log "shutting down (pid $(pid_read "$PIDFILE"))"
    # SHUTDOWN flushes the AOF before exiting.
    timeout 15 redis-cli -h "$HOST" -p "$PORT" shutdown >/dev/null 2>&1 || true
  fi
  if pid_alive "$PIDFILE" redis-server; then
    pid_stop "$PIDFILE" redis-server 20 || die "could not stop redis"
  fi
  rm -f "$PIDFILE"
  log "stopped"
}

cmd_status() {
  if ping_ok; then
    local pidinfo="not started by this script"
    pid_alive "$PIDFILE" redis-server && pidinfo="pid $(pid_read "$PIDFILE")"
    printf 'redis: up (%s, %s:%s)\n' "$pidinfo" "$HOST" "$PORT"
    return 0
  fi
  if pid_alive "$PIDFILE" redis-server; then
    printf 'redis: not healthy (pid %s, no PONG; log %s)\n' "$(pid_read "$PIDFILE")" "$LOG"
  else
    printf 'redis: down\n'
  fi
  return 1
}

cmd_reset() {
  cmd_down
  rm -rf "$RDIR"
  log "data wiped ($RDIR)"
}

case "${1:-}" in
  up) cmd_up ;;
  down) cmd_down ;;
  status) cmd_status ;;
  reset) cmd_reset ;;
  *) service_usage "$0" "|reset"; exit 2 ;;
esac
