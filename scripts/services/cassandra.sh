#!/usr/bin/env bash
# Local single-node Apache Cassandra 5.0 (CQL on 127.0.0.1:9042) for readfold tests.
#
#   scripts/services/cassandra.sh up        install (first time) + start, wait until healthy
#   scripts/services/cassandra.sh down      stop (SIGTERM, wait, SIGKILL)
#   scripts/services/cassandra.sh status    print state; exit 0 iff CQL answers
#   scripts/services/cassandra.sh reset     stop and wipe data/logs/config (keeps the jar cache)
#   scripts/services/cassandra.sh cql [--header] "STATEMENT" ...
#                                           run statements on one connection, print rows (TSV)
#   scripts/services/cassandra.sh logs [N]  last N (default 60) lines of system.log
#
# Jars come from Maven Central (org.apache.cassandra:cassandra-all + runtime deps, via
# `mvn dependency:copy-dependencies` on scripts/services/cassandra/pom.xml); no tarball.
# Self-contained: needs bash, java 11/17, mvn (first run only), python3, flock, setsid.
#
# State: ${READFOLD_SERVICES_HOME:-$HOME/.cache/readfold-services}/cassandra/
#   libs/   jar cache (libs/.complete holds the version)   conf/  generated yaml/logback
#   data/   data, commitlog, hints, caches                 logs/  system.log, stdout.log, gc.log
#   cassandra.pid
#
# Environment (all optional):
#   CASSANDRA_VERSION (5.0.9)  CASSANDRA_PORT (9042)  CASSANDRA_STORAGE_PORT (7000)
#   CASSANDRA_START_TIMEOUT (120 s)  CASSANDRA_STOP_TIMEOUT (30 s)
#   CASSANDRA_JMX_PORT (unset = no JMX listener)  CASSANDRA_JVM_EXTRA_OPTS (appended last)
#   CASSANDRA_JAVA (java binary; else $JAVA_HOME/bin/java, java on PATH, /usr/lib/jvm/*17*)
#   CASSANDRA_MLOCK=1 (let Cassandra mlockall its memory as root; default: prevented, saves RSS)
#   CASSANDRA_NICE (0; e.g. 10: run at a lower CPU priority, its threads and, where the kernel
#     groups each session's processes (sched_autogroup), its session too, so that on a small
#     machine it yields the cores to the broker, as a cluster on machines of its own would)
set -euo pipefail

SVC_NAME=cassandra
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
SUPPORT="$HERE/cassandra"
STATE="${READFOLD_SERVICES_HOME:-${HOME:-/root}/.cache/readfold-services}"
CS="$STATE/cassandra"
LIBS="$CS/libs"
PIDFILE="$CS/cassandra.pid"
LOGDIR="$CS/logs"

VERSION="${CASSANDRA_VERSION:-5.0.9}"
HOST=127.0.0.1
PORT="${CASSANDRA_PORT:-9042}"
STORAGE_PORT="${CASSANDRA_STORAGE_PORT:-7000}"
START_TIMEOUT="${CASSANDRA_START_TIMEOUT:-120}"
STOP_TIMEOUT="${CASSANDRA_STOP_TIMEOUT:-30}"
JMX_PORT="${CASSANDRA_JMX_PORT:-}"
NICE="${CASSANDRA_NICE:-0}"
[[ "$NICE" =~ ^-?[0-9]+$ ]] || { printf '[cassandra] ERROR: CASSANDRA_NICE must be a whole number (got %s)\n' "$NICE" >&2; exit 2; }
MARKER="-Dreadfold.service=cassandra"   # on the java command line; guards against pid reuse

log()  { printf '[%s] %s\n' "$SVC_NAME" "$*" >&2; }
warn() { printf '[%s] WARNING: %s\n' "$SVC_NAME" "$*" >&2; }
die()  { printf '[%s] ERROR: %s\n' "$SVC_NAME" "$*" >&2; exit 1; }

usage() {
  sed -n '2,11p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2
  exit 2
}

# ---------------------------------------------------------------- helpers
take_lock() {  # serialise up/down/reset across concurrent callers
  mkdir -p "$CS"
  exec 9>"$CS/.lock"
  flock -w 300 9 || die "could not lock $CS/.lock within 300s"
}

cqlping() { python3 "$SUPPORT/cqlping.py" --host "$HOST" --port "$PORT" "$@"; }

healthy() { cqlping --timeout 3 ping >/dev/null 2>&1; }

port_open() { (exec 3<>"/dev/tcp/$1/$2") 2>/dev/null; }

# our_pid: prints the pid from the pid file if that process is alive and is our Cassandra.
our_pid() {
  local pid cmdline
  [[ -f "$PIDFILE" ]] || return 1
  pid="$(tr -dc '0-9' <"$PIDFILE")"
  if [[ -n "$pid" ]] && kill -0 "$pid" 2>/dev/null; then
    cmdline="$(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null || true)"
    if [[ "$cmdline" == *"$MARKER"* ]]; then printf '%s\n' "$pid"; return 0; fi
  fi
  rm -f "$PIDFILE"   # stale
  return 1
}

rss_mib() { awk '/^VmRSS:/ {printf "%d", $2/1024}' "/proc/$1/status" 2>/dev/null || echo '?'; }

log_tail() {
  local f n="${2:-40}"
  for f in "$LOGDIR/stdout.log" "$1"; do
    [[ -s "$f" ]] || continue
    printf -- '----- last %s lines of %s -----\n' "$n" "$f" >&2
    tail -n "$n" "$f" >&2
  done
  printf -- '-----\n' >&2
}

find_java() {
  local c v
  for c in "${CASSANDRA_JAVA:-}" "${JAVA_HOME:+$JAVA_HOME/bin/java}" "$(command -v java || true)" \
           /usr/lib/jvm/java-17-openjdk-*/bin/java /usr/lib/jvm/*17*/bin/java; do
    [[ -n "$c" && -x "$c" ]] || continue
    v="$("$c" -XshowSettings:properties -version 2>&1 | awk -F'= ' '/java.specification.version/ {print $2}')"
    if [[ "$v" == 17 || "$v" == 11 ]]; then JAVA="$c"; JAVA_MAJOR="$v"; return 0; fi
  done
  die "Cassandra 5.0 needs Java 11 or 17 (set CASSANDRA_JAVA or JAVA_HOME)"
}

# ---------------------------------------------------------------- install
ensure_libs() {
  if [[ -f "$LIBS/.complete" && "$(cat "$LIBS/.complete")" == "$VERSION" \
        && -f "$LIBS/cassandra-all-$VERSION.jar" ]]; then
    return 0
  fi
  command -v mvn >/dev/null || die "mvn not found (needed once to fetch Cassandra jars)"
  local tmp="$CS/libs.tmp.$$" t0=$SECONDS
  rm -rf "$CS"/libs.tmp.*   # leftovers of an interrupted fetch (we hold the lock)
  log "fetching org.apache.cassandra:cassandra-all:$VERSION and its runtime dependencies from Maven Central ..."
  if ! (cd "$CS" && mvn -q -B -f "$SUPPORT/pom.xml" -Dcassandra.version="$VERSION" \
          dependency:copy-dependencies -DoutputDirectory="$tmp" >"$CS/mvn.log" 2>&1); then
    tail -n 30 "$CS/mvn.log" >&2
    rm -rf "$tmp"
    die "maven could not fetch cassandra-all:$VERSION (full log: $CS/mvn.log)"
  fi
  [[ -f "$tmp/cassandra-all-$VERSION.jar" ]] || { rm -rf "$tmp"; die "cassandra-all-$VERSION.jar missing after mvn"; }
  echo "$VERSION" >"$tmp/.complete"
  rm -rf "$LIBS"
  mv "$tmp" "$LIBS"
  local jars=("$LIBS"/*.jar)
  log "fetched ${#jars[@]} jars ($(du -sh "$LIBS" | cut -f1)) in $((SECONDS - t0))s"
}

sed_escape() { printf '%s' "$1" | sed -e 's/[\\|&]/\\&/g'; }

write_config() {
  mkdir -p "$CS/conf/triggers" "$CS/data" "$LOGDIR"
  sed -e "s|@DIR@|$(sed_escape "$CS")|g" \
      -e "s|@CQL_PORT@|$PORT|g" \
      -e "s|@STORAGE_PORT@|$STORAGE_PORT|g" \
      "$SUPPORT/cassandra.yaml.in" >"$CS/conf/cassandra.yaml"
  cp "$SUPPORT/logback.xml" "$CS/conf/logback.xml"
}

# JVM_ARGS: flags from cassandra/jvm.options + paths + extras; main class last.
build_jvm_args() {
  local line words jamm=("$LIBS"/jamm-*.jar)
  JVM_ARGS=()
  while IFS= read -r line || [[ -n "$line" ]]; do
    [[ "$line" == -* ]] || continue
    read -r -a words <<<"$line"
    JVM_ARGS+=("${words[@]}")
  done <"$SUPPORT/jvm.options"
  # Cassandra's cassandra-env.sh always adds the jamm agent (object size measurement)
  [[ -f "${jamm[0]}" ]] && JVM_ARGS+=("-javaagent:${jamm[0]}")
  JVM_ARGS+=(
    "$MARKER"
    "-Dcassandra-foreground=yes"
    "-Dcassandra.config=file://$CS/conf/cassandra.yaml"
    "-Dcassandra.storagedir=$CS/data"
    "-Dcassandra.triggers_dir=$CS/conf/triggers"
    "-Dcassandra.logdir=$LOGDIR"
    "-Dlogback.configurationFile=$CS/conf/logback.xml"
    "-Xlog:gc=info:file=$LOGDIR/gc.log:time,uptime:filecount=3,filesize=5M"
  )
  if [[ -n "$JMX_PORT" ]]; then
    JVM_ARGS+=("-Dcassandra.jmx.local.port=$JMX_PORT" "-Dcom.sun.management.jmxremote.authenticate=false")
  fi
  if [[ -n "${CASSANDRA_JVM_EXTRA_OPTS:-}" ]]; then
    read -r -a words <<<"$CASSANDRA_JVM_EXTRA_OPTS"
    JVM_ARGS+=("${words[@]}")
  fi
  JVM_ARGS+=(-cp "$LIBS/*" org.apache.cassandra.service.CassandraDaemon)
}

# ---------------------------------------------------------------- start/stop
launch() {
  build_jvm_args
  printf '\n===== %s starting Cassandra %s =====\n%s\n' "$(date -Is)" "$VERSION" \
    "$JAVA ${JVM_ARGS[*]}" >>"$LOGDIR/stdout.log"
  rm -f "$PIDFILE" "$PIDFILE.tmp"
  # As root, Cassandra's startup mlockall(MCL_CURRENT) succeeds and pins the whole committed
  # heap in RAM, even at idle. Dropping CAP_IPC_LOCK makes it fail harmlessly
  # (one WARN) so RSS only grows as memory is used. CASSANDRA_MLOCK=1 keeps the stock behaviour.
  local wrap=()
  if [[ "${CASSANDRA_MLOCK:-0}" != 1 && "$(id -u)" == 0 ]] && command -v setpriv >/dev/null; then
    wrap=(setpriv --bounding-set -ipc_lock)
  fi
  # A thread's nice value counts only within its autogroup (one per session, and setsid
  # makes a new one), so the session's group gets the value too, once java runs.
  if [[ "$NICE" != 0 ]]; then
    wrap=(nice -n "$NICE" "${wrap[@]}")
  fi
  # New session (immune to the caller's Ctrl-C / hangup), stdio detached, lock fd closed.
  # The inner bash writes its own pid, then execs java, so the pid file holds java's pid.
  # shellcheck disable=SC2016  # $$ and $@ are for the inner bash
  (cd "$CS" && MALLOC_ARENA_MAX=4 setsid -f bash -c 'echo $$ >"$0.tmp" && mv "$0.tmp" "$0" && exec "$@"' \
      "$PIDFILE" "${wrap[@]}" "$JAVA" "${JVM_ARGS[@]}" </dev/null >>"$LOGDIR/stdout.log" 2>&1 9>&-)
  local i
  for ((i = 0; i < 100; i++)); do [[ -s "$PIDFILE" ]] && break; sleep 0.05; done
  our_pid >/dev/null || { log_tail "$LOGDIR/system.log"; die "java did not start"; }
  if [[ "$NICE" != 0 && -w "/proc/$(our_pid)/autogroup" ]]; then
    echo "$NICE" >"/proc/$(our_pid)/autogroup" 2>/dev/null || warn "could not set the session's CPU priority"
  fi
}

wait_healthy() {  # wait_healthy PID T0
  local pid="$1" t0="$2" deadline=$((SECONDS + START_TIMEOUT))
  while ! healthy; do
    if ! kill -0 "$pid" 2>/dev/null; then
      rm -f "$PIDFILE"
      log_tail "$LOGDIR/system.log" 60
      die "Cassandra (pid $pid) exited during startup"
    fi
    if ((SECONDS >= deadline)); then
      log_tail "$LOGDIR/system.log" 60
      warn "not healthy after ${START_TIMEOUT}s; stopping pid $pid"
      stop_pid "$pid"
      die "Cassandra did not answer CQL on $HOST:$PORT within ${START_TIMEOUT}s"
    fi
    sleep 1
  done
  log "up: Cassandra $(cqlping --timeout 3 ping) on $HOST:$PORT (pid $pid, $((SECONDS - t0))s, rss $(rss_mib "$pid") MiB)"
}

stop_pid() {
  local pid="$1" deadline=$((SECONDS + STOP_TIMEOUT))
  kill -TERM "$pid" 2>/dev/null || true
  while kill -0 "$pid" 2>/dev/null; do
    if ((SECONDS >= deadline)); then
      warn "pid $pid still running after ${STOP_TIMEOUT}s; SIGKILL"
      kill -KILL "$pid" 2>/dev/null || true
      sleep 0.5
      break
    fi
    sleep 0.2
  done
  rm -f "$PIDFILE"
}

# ---------------------------------------------------------------- commands
cmd_up() {
  local t0=$SECONDS pid
  command -v python3 >/dev/null || die "python3 is needed for the CQL health check"
  take_lock
  if healthy; then
    pid="$(our_pid || true)"
    log "already up: Cassandra $(cqlping --timeout 3 ping) on $HOST:$PORT${pid:+ (pid $pid)}"
    [[ "$NICE" == 0 ]] || log "CASSANDRA_NICE applies when Cassandra starts: \`down\` first to start it at nice $NICE"
    return 0
  fi
  if pid="$(our_pid)"; then
    log "pid $pid is running but not answering yet; waiting"
    wait_healthy "$pid" "$t0"
    return 0
  fi
  port_open "$HOST" "$PORT" && die "$HOST:$PORT is in use by something that does not answer CQL"
  port_open "$HOST" "$STORAGE_PORT" && die "$HOST:$STORAGE_PORT (storage_port) is in use; set CASSANDRA_STORAGE_PORT"
  find_java
  ensure_libs
  write_config
  launch
  pid="$(our_pid)"
  log "started pid $pid (java $JAVA_MAJOR); waiting up to ${START_TIMEOUT}s for CQL on $HOST:$PORT"
  wait_healthy "$pid" "$t0"
}

cmd_down() {
  local pid
  take_lock
  if pid="$(our_pid)"; then
    log "stopping pid $pid"
    stop_pid "$pid"
    log "down"
  elif healthy; then
    warn "something not started by this script answers CQL on $HOST:$PORT; leaving it alone"
  else
    log "already down"
  fi
}

cmd_status() {
  local pid ver
  pid="$(our_pid || true)"
  if ver="$(cqlping --timeout 3 ping 2>/dev/null)"; then
    echo "cassandra: up (Cassandra $ver on $HOST:$PORT${pid:+, pid $pid, rss $(rss_mib "$pid") MiB})"
    return 0
  elif [[ -n "$pid" ]]; then
    echo "cassandra: starting or unhealthy (pid $pid, CQL not answering on $HOST:$PORT)"
  else
    echo "cassandra: down"
  fi
  return 1
}

cmd_reset() {
  cmd_down
  log "wiping $CS/{data,logs,conf} (jar cache kept)"
  rm -rf "$CS/data" "$CS/logs" "$CS/conf" "$CS/mvn.log"
}

cmd_cql() {
  local header=()
  [[ "${1:-}" == --header ]] && { header=(--header); shift; }
  (($# > 0)) || die "usage: $0 cql [--header] \"STATEMENT\" ..."
  cqlping --timeout 60 "${header[@]}" cql "$@"
}

cmd_logs() { tail -n "${1:-60}" "$LOGDIR/system.log"; }

case "${1:-}" in
  up)     cmd_up ;;
  down)   cmd_down ;;
  status) cmd_status ;;
  reset)  cmd_reset ;;
  cql)    shift; cmd_cql "$@" ;;
  logs)   shift; cmd_logs "$@" ;;
  *)      usage ;;
esac
