#!/usr/bin/env bash
# A second, separate single-node Apache Cassandra 5.0 for readfold's
# secure-connection tests: CQL over TLS only (client_encryption_options) on
# localhost:19042, PasswordAuthenticator + CassandraAuthorizer, a login role
# `readfold` (not a superuser) with ALL PERMISSIONS ON ALL KEYSPACES. Own
# data dir and ports; it runs on the jars cassandra.sh caches
# ($STATE/cassandra/libs) and leaves the plain node (9042) alone.
#
#   scripts/services/cassandra-secure.sh up       certs + start, create/refresh role readfold,
#                                                 wait until readfold queries over TLS
#   scripts/services/cassandra-secure.sh down     stop (SIGTERM, wait, SIGKILL)
#   scripts/services/cassandra-secure.sh status   one line; exit 0 iff readfold can query over TLS
#   scripts/services/cassandra-secure.sh reset    stop and wipe data/logs/config (keeps jars and certs)
#   scripts/services/cassandra-secure.sh env      print `export` lines for clients
#   scripts/services/cassandra-secure.sh cql [--admin] [--header] "STATEMENT" ...
#                                                 run statements over TLS as readfold (or the superuser)
#   scripts/services/cassandra-secure.sh logs [N] last N (default 60) lines of system.log
#
# Health checks use a tiny TLS + SASL PLAIN wrapper around cassandra/cqlping.py
# (no cqlsh in a jar-only install); `pip install cqlsh` works too, see `env`.
#
# State: $STATE/secure/cassandra/{conf,data,logs,cassandra.pid}; certificates from secure-certs.sh.
# Environment (all optional):
#   CASSANDRA_SECURE_PORT (19042)  CASSANDRA_SECURE_STORAGE_PORT (17000)
#   CASSANDRA_SECURE_JMX_PORT (unset = no JMX listener, like cassandra.sh)
#   CASSANDRA_SECURE_HEAP ("-Xms256M -Xmx768M -XX:MaxDirectMemorySize=256M")
#   CASSANDRA_SECURE_USER (readfold)  CASSANDRA_SECURE_PASSWORD (rf-cql-secret-5T)
#   CASSANDRA_SECURE_START_TIMEOUT (180 s)  CASSANDRA_STOP_TIMEOUT (30 s)
#   CASSANDRA_VERSION, CASSANDRA_JAVA, CASSANDRA_MLOCK: as cassandra.sh
# The superuser is Cassandra's default cassandra/cassandra (test node, loopback only).
set -euo pipefail

export SVC_NAME=cassandra-secure
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/lib.sh"

SUPPORT="$SERVICES_DIR/cassandra"
PLAIN="$STATE/cassandra"          # cassandra.sh's state: jar cache + its lock
LIBS="$PLAIN/libs"
CERTS="$STATE/secure/certs"
CS="$STATE/secure/cassandra"
PIDFILE="$CS/cassandra.pid"
LOGDIR="$CS/logs"

VERSION="${CASSANDRA_VERSION:-5.0.9}"
HOST=127.0.0.1
TLS_HOST=localhost   # name in the server certificate
PORT="${CASSANDRA_SECURE_PORT:-19042}"
STORAGE_PORT="${CASSANDRA_SECURE_STORAGE_PORT:-17000}"
JMX_PORT="${CASSANDRA_SECURE_JMX_PORT:-}"
HEAP="${CASSANDRA_SECURE_HEAP:--Xms256M -Xmx768M -XX:MaxDirectMemorySize=256M}"
START_TIMEOUT="${CASSANDRA_SECURE_START_TIMEOUT:-180}"
STOP_TIMEOUT="${CASSANDRA_STOP_TIMEOUT:-30}"
CQL_USER="${CASSANDRA_SECURE_USER:-readfold}"
CQL_PASSWORD="${CASSANDRA_SECURE_PASSWORD:-rf-cql-secret-5T}"
ADMIN_USER=cassandra
ADMIN_PASSWORD=cassandra
MARKER="-Dreadfold.service=secure-cassandra"   # on the java command line; guards against pid reuse

# ---------------------------------------------------------------- CQL over TLS
# cqlping.py's frame/row code, on a TLS socket that answers AUTHENTICATE with
# SASL PLAIN. Exit: 0 ok, 1 server/protocol error, 2 cannot connect (TCP/TLS), 3 bad credentials.
# shellcheck disable=SC2016
CQLTLS_PY='
import os, socket, ssl, struct, sys
sys.path.insert(0, os.environ["RF_SUPPORT"])
import cqlping as c

class TlsConn(c.Conn):
    def __init__(self, host, port, timeout, ca, sni, user, password):
        try:
            raw = socket.create_connection((host, port), timeout=timeout)
            self.s = ssl.create_default_context(cafile=ca).wrap_socket(raw, server_hostname=sni)
        except (OSError, ssl.SSLError) as e:
            raise ConnectionError(f"cannot open TLS to {host}:{port}: {e}") from e
        self.stream = 0
        op, b = self.request(c.OP_STARTUP, struct.pack(">H", 1) + c._str("CQL_VERSION") + c._str("3.0.0"))
        if op == c.OP_AUTHENTICATE:
            tok = b"\0" + user.encode() + b"\0" + password.encode()
            try:
                op, b = self.request(0x0F, struct.pack(">i", len(tok)) + tok)  # AUTH_RESPONSE
            except c.CqlError as e:
                raise PermissionError(str(e)) from e
            if op != 0x10:  # AUTH_SUCCESS
                raise c.CqlError(f"unexpected opcode {op:#x} after AUTH_RESPONSE")
        elif op != c.OP_READY:
            raise c.CqlError(f"unexpected opcode {op:#x} after STARTUP")

def main():
    a = sys.argv[1:]
    header = a[:1] == ["--header"]
    if header:
        a = a[1:]
    e = os.environ
    try:
        conn = TlsConn(e["RF_HOST"], int(e["RF_PORT"]), float(e.get("RF_TIMEOUT", "10")), e["RF_CA"],
                       e["RF_SNI"], e["RF_USER"], e["RF_PASSWORD"])
        if not a:  # ping
            _, rows = conn.query("SELECT release_version FROM system.local")
            print(rows[0][0])
            return 0
        for stmt in a:
            cols, rows = conn.query(stmt, consistency=0x0004 if e.get("RF_QUORUM") else 0x0001)
            if cols is None:
                continue
            if header:
                print("\t".join(cols))
            for r in rows:
                print("\t".join(c._fmt(v) for v in r))
        return 0
    except ConnectionError as ex:
        print(f"cqltls: {ex}", file=sys.stderr); return 2
    except PermissionError as ex:
        print(f"cqltls: {ex}", file=sys.stderr); return 3
    except (c.CqlError, OSError, struct.error, IndexError) as ex:
        print(f"cqltls: {ex}", file=sys.stderr); return 1

sys.exit(main())
'

# cqltls USER PASSWORD TIMEOUT [--header] [STATEMENT...]   (no statement: print release_version)
cqltls() {
  local user="$1" password="$2" timeout="$3"; shift 3
  RF_SUPPORT="$SUPPORT" RF_HOST="$HOST" RF_PORT="$PORT" RF_SNI="$TLS_HOST" RF_CA="$CERTS/ca.pem" \
    RF_USER="$user" RF_PASSWORD="$password" RF_TIMEOUT="$timeout" \
    python3 -c "$CQLTLS_PY" "$@"
}

healthy() { [[ -s "$CERTS/ca.pem" ]] && cqltls "$CQL_USER" "$CQL_PASSWORD" 3 >/dev/null 2>&1; }

cql_quote() { printf "'%s'" "${1//\'/\'\'}"; }

# Create (or refresh the password of) the readfold role, as the default superuser.
# Returns 1 while the superuser cannot log in yet (auth tables still being set up).
provision_role() {
  local pw
  pw="$(cql_quote "$CQL_PASSWORD")"
  cqltls "$ADMIN_USER" "$ADMIN_PASSWORD" 10 >/dev/null 2>&1 || return 1
  RF_QUORUM=1 cqltls "$ADMIN_USER" "$ADMIN_PASSWORD" 30 \
    "CREATE ROLE IF NOT EXISTS \"$CQL_USER\" WITH PASSWORD = $pw AND LOGIN = true AND SUPERUSER = false" \
    "GRANT ALL PERMISSIONS ON ALL KEYSPACES TO \"$CQL_USER\"" \
    2> >(grep -v '^warning: Role .* was already granted' >&2) >/dev/null || return 1
  # An existing role with another password (CASSANDRA_SECURE_PASSWORD changed).
  # Cassandra 5 refuses a second password change within 5 s, hence not always ALTER.
  if ! healthy; then
    log "setting the password of role $CQL_USER"
    RF_QUORUM=1 cqltls "$ADMIN_USER" "$ADMIN_PASSWORD" 30 \
      "ALTER ROLE \"$CQL_USER\" WITH PASSWORD = $pw AND LOGIN = true" >/dev/null || return 1
  fi
  log "role $CQL_USER ready (LOGIN, ALL PERMISSIONS ON ALL KEYSPACES)"
}

# ---------------------------------------------------------------- helpers
take_lock() {  # serialise up/down/reset across concurrent callers
  mkdir -p "$CS"
  exec 9>"$CS/.lock"
  flock -w 300 9 || die "could not lock $CS/.lock within 300s"
}

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

libs_ok() {
  [[ -f "$LIBS/.complete" && "$(cat "$LIBS/.complete")" == "$VERSION" && -f "$LIBS/cassandra-all-$VERSION.jar" ]]
}

# The jar cache of cassandra.sh; fetched the way cassandra.sh does (under its lock) if missing.
ensure_libs() {
  libs_ok && return 0
  command -v mvn >/dev/null || die "mvn not found (needed once to fetch Cassandra jars)"
  mkdir -p "$PLAIN"
  (
    exec 7>"$PLAIN/.lock"
    flock -w 600 7 || die "could not lock $PLAIN/.lock"
    libs_ok && exit 0
    local tmp="$PLAIN/libs.tmp.$$"
    rm -rf "$PLAIN"/libs.tmp.*
    log "fetching org.apache.cassandra:cassandra-all:$VERSION (jar cache shared with cassandra.sh) ..."
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
  )
}

sed_escape() { printf '%s' "$1" | sed -e 's/[\\|&]/\\&/g'; }

# cassandra/cassandra.yaml.in (shared with cassandra.sh) with our dir and ports,
# password authentication + authorization and TLS-only client connections.
write_config() {
  mkdir -p "$CS/conf/triggers" "$CS/data" "$LOGDIR"
  local y="$CS/conf/cassandra.yaml" store_pass n
  store_pass="$(cat "$CERTS/store.pass")"
  (
    umask 077
    sed -e "s|@DIR@|$(sed_escape "$CS")|g" \
        -e "s|@CQL_PORT@|$PORT|g" \
        -e "s|@STORAGE_PORT@|$STORAGE_PORT|g" \
        -e 's|^cluster_name:.*|cluster_name: readfold-secure-test|' \
        -e 's|^authenticator:.*|authenticator: PasswordAuthenticator|' \
        -e 's|^authorizer:.*|authorizer: CassandraAuthorizer|' \
        -e 's|^role_manager:.*|role_manager: CassandraRoleManager|' \
        "$SUPPORT/cassandra.yaml.in" >"$y.tmp"
    n="$(grep -cE '^(authenticator: PasswordAuthenticator|authorizer: CassandraAuthorizer|role_manager: CassandraRoleManager)$' "$y.tmp" || true)"
    [[ "$n" == 3 ]] || die "cassandra.yaml.in no longer has authenticator/authorizer/role_manager lines to replace"
    grep -q '^client_encryption_options:' "$y.tmp" && die "cassandra.yaml.in now sets client_encryption_options; update cassandra-secure.sh"
    cat >>"$y.tmp" <<EOF

# ---- added by scripts/services/cassandra-secure.sh ----
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
    mv -f "$y.tmp" "$y"
  )
  cp "$SUPPORT/logback.xml" "$CS/conf/logback.xml"
}

# JVM_ARGS: cassandra/jvm.options without its heap lines, our heap, paths; main class last.
build_jvm_args() {
  local line words jamm=("$LIBS"/jamm-*.jar)
  JVM_ARGS=()
  while IFS= read -r line || [[ -n "$line" ]]; do
    [[ "$line" == -* ]] || continue
    [[ "$line" == -Xms* || "$line" == -Xmx* || "$line" == -XX:MaxDirectMemorySize=* ]] && continue
    read -r -a words <<<"$line"
    JVM_ARGS+=("${words[@]}")
  done <"$SUPPORT/jvm.options"
  read -r -a words <<<"$HEAP"
  JVM_ARGS+=("${words[@]}")
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
  printf '\n===== %s starting Cassandra %s (secure) =====\n%s\n' "$(date -Is)" "$VERSION" \
    "$JAVA ${JVM_ARGS[*]}" >>"$LOGDIR/stdout.log"
  rm -f "$PIDFILE" "$PIDFILE.tmp"
  local wrap=()
  if [[ "${CASSANDRA_MLOCK:-0}" != 1 && "$(id -u)" == 0 ]] && command -v setpriv >/dev/null; then
    wrap=(setpriv --bounding-set -ipc_lock)   # see cassandra.sh: keeps RSS from pinning the heap
  fi
  # shellcheck disable=SC2016  # $$ and $@ are for the inner bash
  (cd "$CS" && MALLOC_ARENA_MAX=4 setsid -f bash -c 'echo $$ >"$0.tmp" && mv "$0.tmp" "$0" && exec "$@"' \
      "$PIDFILE" "${wrap[@]}" "$JAVA" "${JVM_ARGS[@]}" </dev/null >>"$LOGDIR/stdout.log" 2>&1 9>&-)
  local i
  for ((i = 0; i < 100; i++)); do [[ -s "$PIDFILE" ]] && break; sleep 0.05; done
  our_pid >/dev/null || { log_tail "$LOGDIR/system.log"; die "java did not start"; }
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

# wait_ready PID T0: CQL/TLS answers the superuser, role provisioned, readfold can query.
wait_ready() {
  local pid="$1" t0="$2" deadline=$((SECONDS + START_TIMEOUT))
  while ! { provision_role && healthy; }; do
    if ! kill -0 "$pid" 2>/dev/null; then
      rm -f "$PIDFILE"
      log_tail "$LOGDIR/system.log" 60
      die "Cassandra (pid $pid) exited during startup"
    fi
    if ((SECONDS >= deadline)); then
      log_tail "$LOGDIR/system.log" 60
      warn "not ready after ${START_TIMEOUT}s; stopping pid $pid"
      stop_pid "$pid"
      die "Cassandra did not let $CQL_USER query over TLS on $TLS_HOST:$PORT within ${START_TIMEOUT}s"
    fi
    sleep 1
  done
  log "up: Cassandra $(cqltls "$CQL_USER" "$CQL_PASSWORD" 3) on $TLS_HOST:$PORT (TLS, user $CQL_USER, pid $pid, $((SECONDS - t0))s, rss $(rss_mib "$pid") MiB)"
}

# ---------------------------------------------------------------- commands
cmd_up() {
  local t0=$SECONDS pid
  command -v python3 >/dev/null || die "python3 is needed for the CQL health check"
  bash "$SERVICES_DIR/secure-certs.sh" up
  take_lock
  if healthy; then
    pid="$(our_pid || true)"
    log "already up: Cassandra $(cqltls "$CQL_USER" "$CQL_PASSWORD" 3) on $TLS_HOST:$PORT (TLS, user $CQL_USER${pid:+, pid $pid})"
    return 0
  fi
  if pid="$(our_pid)"; then
    log "pid $pid is running but $CQL_USER cannot query yet; waiting (and creating/refreshing the role)"
    wait_ready "$pid" "$t0"
    return 0
  fi
  port_open "$HOST" "$PORT" && die "$HOST:$PORT is in use by something that does not let $CQL_USER in over TLS"
  port_open "$HOST" "$STORAGE_PORT" && die "$HOST:$STORAGE_PORT (storage_port) is in use; set CASSANDRA_SECURE_STORAGE_PORT"
  [[ -n "$JMX_PORT" ]] && port_open "$HOST" "$JMX_PORT" && die "$HOST:$JMX_PORT (JMX) is in use; set CASSANDRA_SECURE_JMX_PORT"
  find_java
  ensure_libs
  write_config
  launch
  pid="$(our_pid)"
  log "started pid $pid (java $JAVA_MAJOR, heap $HEAP); waiting up to ${START_TIMEOUT}s for CQL/TLS on $TLS_HOST:$PORT"
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
  local pid ver
  pid="$(our_pid || true)"
  if ver="$(cqltls "$CQL_USER" "$CQL_PASSWORD" 3 2>/dev/null)"; then
    echo "cassandra-secure: up (Cassandra $ver on $TLS_HOST:$PORT, TLS, user $CQL_USER${pid:+, pid $pid, rss $(rss_mib "$pid") MiB})"
    return 0
  elif [[ -n "$pid" ]]; then
    echo "cassandra-secure: starting or unhealthy (pid $pid, $CQL_USER cannot query over TLS on $TLS_HOST:$PORT)"
  else
    echo "cassandra-secure: down"
  fi
  return 1
}

cmd_reset() {
  cmd_down
  log "wiping $CS/{data,logs,conf} (jar cache and certificates kept)"
  rm -rf "$CS/data" "$CS/logs" "$CS/conf"
}

cmd_cql() {
  local user="$CQL_USER" password="$CQL_PASSWORD"
  [[ "${1:-}" == --admin ]] && { user="$ADMIN_USER"; password="$ADMIN_PASSWORD"; shift; }
  local header=()
  [[ "${1:-}" == --header ]] && { header=(--header); shift; }
  (($# > 0)) || die "usage: $0 cql [--admin] [--header] \"STATEMENT\" ..."
  cqltls "$user" "$password" 60 "${header[@]}" "$@"
}

cmd_env() {
  cat <<EOF
export READFOLD_TEST_CQL_SECURE='$TLS_HOST:$PORT'
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
  env)    cmd_env ;;
  cql)    shift; cmd_cql "$@" ;;
  logs)   shift; cmd_logs "$@" ;;
  *)      service_usage "$0" "|reset|env|cql [--admin] [--header] STATEMENT...|logs [N]"; exit 2 ;;
esac
