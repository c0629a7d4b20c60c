#!/usr/bin/env bash
# Local single-node Apache Cassandra 5.0 (CQL on 127.0.0.1:9042) for readfold tests.
#
# --secure (what cassandra-secure.sh runs): a second, separate node for the
# secure-connection tests. CQL over TLS only (client_encryption_options) on
# localhost:19042, PasswordAuthenticator + CassandraAuthorizer, a login role
# `readfold` (not a superuser) with ALL PERMISSIONS ON ALL KEYSPACES. Own data
# dir and ports, same jar cache; the plain node is left alone. Its superuser
# is Cassandra's default cassandra/cassandra (test node, loopback only).
#
#   cassandra.sh [--secure] up        install (first time) + start, wait until healthy
#                                     (secure: certificates first; creates/refreshes role readfold;
#                                     healthy means readfold queries over TLS)
#   cassandra.sh [--secure] down      stop (SIGTERM, wait, SIGKILL)
#   cassandra.sh [--secure] status    one line; exit 0 iff CQL answers
#   cassandra.sh [--secure] reset     stop and wipe data/logs/config (keeps the jar cache and certificates)
#   cassandra.sh [--secure] cql [--admin] [--header] "STATEMENT" ...
#                                     run statements on one connection, print rows (TSV)
#                                     (secure: as readfold, or with --admin the superuser)
#   cassandra.sh [--secure] logs [N]  last N (default 60) lines of system.log
#   cassandra.sh --secure env         print `export` lines for clients
#
# Jars come from Maven Central (org.apache.cassandra:cassandra-all + runtime deps, via
# `mvn dependency:copy-dependencies` on scripts/services/cassandra/pom.xml); no tarball.
# Self-contained: needs bash, java 11/17, mvn (first run only), python3, flock, setsid.
# Health checks and `cql` use cassandra/cqlping.py (no cqlsh in a jar-only install).
#
# State: ${READFOLD_SERVICES_HOME:-$HOME/.cache/readfold-services}/cassandra/
#   (secure: .../secure/cassandra/; certificates from secure-certs.sh)
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
#   secure, instead: CASSANDRA_SECURE_PORT (19042)  CASSANDRA_SECURE_STORAGE_PORT (17000)
#     CASSANDRA_SECURE_JMX_PORT  CASSANDRA_SECURE_START_TIMEOUT (180 s)
#     CASSANDRA_SECURE_HEAP ("-Xms256M -Xmx768M -XX:MaxDirectMemorySize=256M")
#     CASSANDRA_SECURE_USER (readfold)  CASSANDRA_SECURE_PASSWORD (rf-cql-secret-5T); no CASSANDRA_NICE
set -euo pipefail

SECURE=
[[ "${1:-}" == --secure ]] && { SECURE=1; shift; }
SVC_NAME=cassandra${SECURE:+-secure}
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/lib.sh"
ME="$0${SECURE:+ --secure}"

SUPPORT="$SERVICES_DIR/cassandra"
PLAIN="$STATE/cassandra"   # the plain node's state; its jar cache and lock serve both
LIBS="$PLAIN/libs"
VERSION="${CASSANDRA_VERSION:-5.0.9}"
HOST=127.0.0.1
STOP_TIMEOUT="${CASSANDRA_STOP_TIMEOUT:-30}"
CERTS="$STATE/secure/certs"
if [[ $SECURE ]]; then
  CS="$STATE/secure/cassandra"
  TLS_HOST=localhost   # name in the server certificate
  PORT="${CASSANDRA_SECURE_PORT:-19042}"
  STORAGE_PORT="${CASSANDRA_SECURE_STORAGE_PORT:-17000}"
  JMX_PORT="${CASSANDRA_SECURE_JMX_PORT:-}"
  HEAP="${CASSANDRA_SECURE_HEAP:--Xms256M -Xmx768M -XX:MaxDirectMemorySize=256M}"
  START_TIMEOUT="${CASSANDRA_SECURE_START_TIMEOUT:-180}"
  NICE=0
  CQL_USER="${CASSANDRA_SECURE_USER:-readfold}"
  CQL_PASSWORD="${CASSANDRA_SECURE_PASSWORD:-rf-cql-secret-5T}"
  ADMIN_USER=cassandra
  ADMIN_PASSWORD=cassandra
  STORAGE_PORT_VAR=CASSANDRA_SECURE_STORAGE_PORT
  READY="let $CQL_USER query over TLS"
  MARKER="-Dreadfold.service=secure-cassandra"   # on the java command line; guards against pid reuse
else
  CS="$PLAIN"
  TLS_HOST=$HOST
  PORT="${CASSANDRA_PORT:-9042}"
  STORAGE_PORT="${CASSANDRA_STORAGE_PORT:-7000}"
  JMX_PORT="${CASSANDRA_JMX_PORT:-}"
  HEAP=   # jvm.options' own
  START_TIMEOUT="${CASSANDRA_START_TIMEOUT:-120}"
  NICE="${CASSANDRA_NICE:-0}"
  [[ "$NICE" =~ ^-?[0-9]+$ ]] || { printf '[cassandra] ERROR: CASSANDRA_NICE must be a whole number (got %s)\n' "$NICE" >&2; exit 2; }
  STORAGE_PORT_VAR=CASSANDRA_STORAGE_PORT
  READY="answer CQL"
  MARKER="-Dreadfold.service=cassandra"
fi
PIDFILE="$CS/cassandra.pid"
LOGDIR="$CS/logs"
ADDR="$TLS_HOST:$PORT"

usage() {
  service_usage "$ME" "|reset|cql ${SECURE:+[--admin] }[--header] STATEMENT...|logs [N]${SECURE:+|env}"
  exit 2
}

# ---------------------------------------------------------------- helpers
take_lock() {  # serialise up/down/reset across concurrent callers
  mkdir -p "$CS"
  exec 9>"$CS/.lock"
  flock -w 300 9 || die "could not lock $CS/.lock within 300s"
}

# cqlping [--admin] [OPTIONS] ping|cql ...: cassandra/cqlping.py against this node;
# secure: over TLS, as readfold or (--admin) the superuser.
cqlping() {
  local user="${CQL_USER:-}" password="${CQL_PASSWORD:-}" tls=()
  [[ "${1:-}" == --admin ]] && { user="$ADMIN_USER"; password="$ADMIN_PASSWORD"; shift; }
  [[ $SECURE ]] && tls=(--ca "$CERTS/ca.pem" --sni "$TLS_HOST" --user "$user")
  CQLPING_PASSWORD="$password" python3 "$SUPPORT/cqlping.py" --host "$HOST" --port "$PORT" "${tls[@]}" "$@"
}

healthy() {
  [[ -z $SECURE || -s "$CERTS/ca.pem" ]] || return 1   # secure-certs.sh has not run yet
  cqlping --timeout 3 ping >/dev/null 2>&1
}

cql_quote() { printf "'%s'" "${1//\'/\'\'}"; }

# Create (or refresh the password of) the readfold role, as the default superuser.
# Returns 1 while the superuser cannot log in yet (auth tables still being set up).
provision_role() {
  local pw
  pw="$(cql_quote "$CQL_PASSWORD")"
  cqlping --admin --timeout 10 ping >/dev/null 2>&1 || return 1
  cqlping --admin --timeout 30 --quorum cql \
    "CREATE ROLE IF NOT EXISTS \"$CQL_USER\" WITH PASSWORD = $pw AND LOGIN = true AND SUPERUSER = false" \
    "GRANT ALL PERMISSIONS ON ALL KEYSPACES TO \"$CQL_USER\"" \
    2> >(grep -v '^warning: Role .* was already granted' >&2) >/dev/null || return 1
  # An existing role with another password (CASSANDRA_SECURE_PASSWORD changed).
  # Cassandra 5 refuses a second password change within 5 s, hence not always ALTER.
  if ! healthy; then
    log "setting the password of role $CQL_USER"
    cqlping --admin --timeout 30 --quorum cql \
      "ALTER ROLE \"$CQL_USER\" WITH PASSWORD = $pw AND LOGIN = true" >/dev/null || return 1
  fi
  log "role $CQL_USER ready (LOGIN, ALL PERMISSIONS ON ALL KEYSPACES)"
}

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
libs_ok() {
  [[ -f "$LIBS/.complete" && "$(cat "$LIBS/.complete")" == "$VERSION" && -f "$LIBS/cassandra-all-$VERSION.jar" ]]
}

fetch_libs() {
  libs_ok && return 0
  command -v mvn >/dev/null || die "mvn not found (needed once to fetch Cassandra jars)"
  local tmp="$PLAIN/libs.tmp.$$" t0=$SECONDS
  rm -rf "$PLAIN"/libs.tmp.*   # leftovers of an interrupted fetch (we hold the lock)
  log "fetching org.apache.cassandra:cassandra-all:$VERSION and its runtime dependencies from Maven Central ..."
  if ! (cd "$PLAIN" && mvn -q -B -f "$SUPPORT/pom.xml" -Dcassandra.version="$VERSION" \
          dependency:copy-dependencies -DoutputDirectory="$tmp" >"$PLAIN/mvn.log" 2>&1); then
    tail -n 30 "$PLAIN/mvn.log" >&2
    rm -rf "$tmp"
    die "maven could not fetch cassandra-all:$VERSION (full log: $PLAIN/mvn.log)"
  fi
  [[ -f "$tmp/cassandra-all-$VERSION.jar" ]] || { rm -rf "$tmp"; die "cassandra-all-$VERSION.jar missing after mvn"; }
  echo "$VERSION" >"$tmp/.complete"
  rm -rf "$LIBS"
  mv "$tmp" "$LIBS"
  local jars=("$LIBS"/*.jar)
  log "fetched ${#jars[@]} jars ($(du -sh "$LIBS" | cut -f1)) in $((SECONDS - t0))s"
}

# The plain node fetches under its own lock (held); the secure one takes that
# lock too, on another fd, so that the two never fetch at once.
ensure_libs() {
  libs_ok && return 0
  if [[ $SECURE ]]; then
    mkdir -p "$PLAIN"
    (
      exec 7>"$PLAIN/.lock"
      flock -w 600 7 || die "could not lock $PLAIN/.lock"
      fetch_libs
    )
  else
    fetch_libs
  fi
}

sed_escape() { printf '%s' "$1" | sed -e 's/[\\|&]/\\&/g'; }

# cassandra/cassandra.yaml.in with our dir and ports; secure: password
# authentication + authorization and TLS-only client connections.
write_config() {
  mkdir -p "$CS/conf/triggers" "$CS/data" "$LOGDIR"
  local y="$CS/conf/cassandra.yaml" auth=()
  if [[ $SECURE ]]; then
    auth=(-e 's|^cluster_name:.*|cluster_name: readfold-secure-test|'
          -e 's|^authenticator:.*|authenticator: PasswordAuthenticator|'
          -e 's|^authorizer:.*|authorizer: CassandraAuthorizer|'
          -e 's|^role_manager:.*|role_manager: CassandraRoleManager|')
  fi
  (
    umask 077   # the secure one holds the keystore password
    sed -e "s|@DIR@|$(sed_escape "$CS")|g" \
        -e "s|@CQL_PORT@|$PORT|g" \
        -e "s|@STORAGE_PORT@|$STORAGE_PORT|g" \
        "${auth[@]}" "$SUPPORT/cassandra.yaml.in" >"$y.tmp"
    if [[ $SECURE ]]; then
      local n store_pass
      n="$(grep -cE '^(authenticator: PasswordAuthenticator|authorizer: CassandraAuthorizer|role_manager: CassandraRoleManager)$' "$y.tmp" || true)"
      [[ "$n" == 3 ]] || die "cassandra.yaml.in no longer has authenticator/authorizer/role_manager lines to replace"
      grep -q '^client_encryption_options:' "$y.tmp" && die "cassandra.yaml.in now sets client_encryption_options; update cassandra.sh"
      store_pass="$(cat "$CERTS/store.pass")"
      cat >>"$y.tmp" <<EOF

# ---- added by scripts/services/cassandra.sh --secure ----
# TLS-only native transport (optional: false); no client certificates.
client_encryption_options:
  enabled: true
  optional: false
  keystore: $CERTS/server.keystore.p12
  keystore_password: "$store_pass"
  store_type: PKCS12
  require_client_auth: false
  accepted_protocols: [TLSv1.2, TLSv1.3]
EOF
    fi
    mv -f "$y.tmp" "$y"
  )
  cp "$SUPPORT/logback.xml" "$CS/conf/logback.xml"
}

# JVM_ARGS: flags from cassandra/jvm.options (secure: with our heap instead of
# its own) + paths + extras; main class last.
build_jvm_args() {
  local line words jamm=("$LIBS"/jamm-*.jar)
  JVM_ARGS=()
  while IFS= read -r line || [[ -n "$line" ]]; do
    [[ "$line" == -* ]] || continue
    [[ -n "$HEAP" && ( "$line" == -Xms* || "$line" == -Xmx* || "$line" == -XX:MaxDirectMemorySize=* ) ]] && continue
    read -r -a words <<<"$line"
    JVM_ARGS+=("${words[@]}")
  done <"$SUPPORT/jvm.options"
  if [[ -n "$HEAP" ]]; then
    read -r -a words <<<"$HEAP"
    JVM_ARGS+=("${words[@]}")
  fi
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
  printf '\n===== %s starting Cassandra %s%s =====\n%s\n' "$(date -Is)" "$VERSION" "${SECURE:+ (secure)}" \
    "$JAVA ${JVM_ARGS[*]}" >>"$LOGDIR/stdout.log"
  rm -f "$PIDFILE" "$PIDFILE.tmp"
  # As root, Cassandra's startup mlockall(MCL_CURRENT) succeeds and pins the whole committed
  # heap in RAM (RSS ~930 MiB at idle). Dropping CAP_IPC_LOCK makes it fail harmlessly
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

# ready: CQL answers; secure: the role is provisioned and readfold can query.
ready() {
  if [[ $SECURE ]]; then provision_role && healthy; else healthy; fi
}

wait_ready() {  # wait_ready PID T0
  local pid="$1" t0="$2" deadline=$((SECONDS + START_TIMEOUT))
  while ! ready; do
    if ! kill -0 "$pid" 2>/dev/null; then
      rm -f "$PIDFILE"
      log_tail "$LOGDIR/system.log" 60
      die "Cassandra (pid $pid) exited during startup"
    fi
    if ((SECONDS >= deadline)); then
      log_tail "$LOGDIR/system.log" 60
      warn "not ready after ${START_TIMEOUT}s; stopping pid $pid"
      stop_pid "$pid"
      die "Cassandra did not $READY on $ADDR within ${START_TIMEOUT}s"
    fi
    sleep 1
  done
  log "up: $(describe "$pid"), $((SECONDS - t0))s"
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

# describe [PID]: "Cassandra 5.0.9 on ADDR[, TLS, user readfold][, pid N, rss M MiB]";
# fails if CQL does not answer.
describe() {
  local ver
  ver="$(cqlping --timeout 3 ping 2>/dev/null)" || return 1
  printf 'Cassandra %s on %s%s' "$ver" "$ADDR" "${SECURE:+, TLS, user $CQL_USER}"
  [[ -z "${1:-}" ]] || printf ', pid %s, rss %s MiB' "$1" "$(rss_mib "$1")"
  printf '\n'
}

# ---------------------------------------------------------------- commands
cmd_up() {
  local t0=$SECONDS pid
  command -v python3 >/dev/null || die "python3 is needed for the CQL health check"
  [[ $SECURE ]] && bash "$SERVICES_DIR/secure-certs.sh" up
  take_lock
  if healthy; then
    log "already up: $(describe "$(our_pid || true)")"
    [[ "$NICE" == 0 ]] || log "CASSANDRA_NICE applies when Cassandra starts: \`down\` first to start it at nice $NICE"
    return 0
  fi
  if pid="$(our_pid)"; then
    log "pid $pid is running but not ready yet; waiting"
    wait_ready "$pid" "$t0"
    return 0
  fi
  port_open "$HOST" "$PORT" && die "$HOST:$PORT is in use by something that does not $READY"
  port_open "$HOST" "$STORAGE_PORT" && die "$HOST:$STORAGE_PORT (storage_port) is in use; set $STORAGE_PORT_VAR"
  find_java
  ensure_libs
  write_config
  launch
  pid="$(our_pid)"
  log "started pid $pid (java $JAVA_MAJOR${HEAP:+, heap $HEAP}); waiting up to ${START_TIMEOUT}s for CQL${SECURE:+/TLS} on $ADDR"
  wait_ready "$pid" "$t0"
}

cmd_down() {
  local pid
  take_lock
  if pid="$(our_pid)"; then
    log "stopping pid $pid"
    stop_pid "$pid"
    log "down"
  elif port_open "$HOST" "$PORT"; then
    warn "something not started by this script listens on $HOST:$PORT; leaving it alone"
  else
    log "already down"
  fi
}

cmd_status() {
  local pid what
  pid="$(our_pid || true)"
  if what="$(describe "$pid")"; then
    echo "$SVC_NAME: up ($what)"
    return 0
  elif [[ -n "$pid" ]]; then
    echo "$SVC_NAME: starting or unhealthy (pid $pid, does not $READY on $ADDR)"
  else
    echo "$SVC_NAME: down"
  fi
  return 1
}

cmd_reset() {
  cmd_down
  log "wiping $CS/{data,logs,conf} (jar cache${SECURE:+ and certificates} kept)"
  rm -rf "$CS/data" "$CS/logs" "$CS/conf"
  [[ $SECURE ]] || rm -f "$CS/mvn.log"
}

cmd_cql() {
  local admin=() header=()
  [[ $SECURE && "${1:-}" == --admin ]] && { admin=(--admin); shift; }
  [[ "${1:-}" == --header ]] && { header=(--header); shift; }
  (($# > 0)) || die "usage: $ME cql ${SECURE:+[--admin] }[--header] \"STATEMENT\" ..."
  cqlping "${admin[@]}" --timeout 60 "${header[@]}" cql "$@"
}

cmd_env() {
  cat <<EOF
export READFOLD_TEST_CQL_SECURE='$ADDR'
export READFOLD_CQL_SECURE_USER='$CQL_USER'
export READFOLD_CQL_SECURE_PASSWORD='$CQL_PASSWORD'
export READFOLD_CQL_SECURE_CA='$CERTS/ca.pem'
# cqlsh (pip install cqlsh): SSL_CERTFILE=\$READFOLD_CQL_SECURE_CA cqlsh --ssl -u $CQL_USER -p '$CQL_PASSWORD' $TLS_HOST $PORT
EOF
}

cmd_logs() { tail -n "${1:-60}" "$LOGDIR/system.log"; }

case "${1:-}" in
  up)     cmd_up ;;
  down)   cmd_down ;;
  status) cmd_status ;;
  reset)  cmd_reset ;;
  cql)    shift; cmd_cql "$@" ;;
  logs)   shift; cmd_logs "$@" ;;
  env)    [[ $SECURE ]] || usage; cmd_env ;;
  *)      usage ;;
esac
