#!/usr/bin/env bash
# Single-node Apache Kafka 4.x (KRaft, combined broker+controller) for local
# development and tests. No tarball needed: the broker jars come from Maven
# Central via scripts/services/kafka/pom.xml.
#
# --secure (what kafka-secure.sh runs): a second, separate broker for the
# secure-connection tests. One client listener, SASL_SSL with SCRAM-SHA-512 on
# localhost:19093 (certificate from secure-certs.sh), controller on
# 127.0.0.1:19094 (plaintext, loopback only), state in $STATE/secure/kafka; it
# runs on the plain broker's jar cache and leaves that broker alone.
#
#   kafka.sh [--secure] up        install (if needed), format (if needed), start, wait healthy
#                                 (secure: certificates first; SCRAM users added at format;
#                                 healthy means `readfold` lists topics over SASL_SSL)
#   kafka.sh [--secure] down      stop the broker started by `up` (SIGTERM, then SIGKILL)
#   kafka.sh [--secure] status    one line; exit 0 if healthy, 1 otherwise
#   kafka.sh [--secure] reset     down + wipe data and log (secure: its whole state dir); keeps jars and certs
#   kafka.sh [--secure] tool MAIN_CLASS [ARGS...]
#       run a Kafka Java CLI tool against the cached jars, e.g.
#       kafka.sh tool TopicCommand --bootstrap-server 127.0.0.1:9092 --create --topic t --partitions 1
#       kafka.sh tool ConsumerGroupCommand --bootstrap-server 127.0.0.1:9092 --describe --group g
#       Short names are resolved (TopicCommand, ConsumerGroupCommand, ConsoleConsumer,
#       ConsoleProducer, GetOffsetShell, TransactionsCommand, StorageTool, ConfigCommand, ...);
#       a fully qualified class name is used as is. Against the secure broker pass
#       --command-config "$STATE/secure/kafka/client.properties" (readfold) or
#       admin.properties (the super user) yourself.
#   kafka.sh classpath            print the classpath (for ad-hoc java -cp use)
#   kafka.sh --secure env         print `export` lines for clients
#   kafka.sh --secure topics ARGS...   TopicCommand as `readfold`, e.g. `topics --list`
#
# Secure users (SCRAM-SHA-512, stored in the KRaft metadata):
#   readfold  READFOLD_KAFKA_SECURE_PASSWORD        (default rf-kafka-secret-7Q)   the client
#   rf-admin  READFOLD_KAFKA_SECURE_ADMIN_PASSWORD  (default rf-kafka-admin-4M)    inter-broker, super user
# Passwords may not contain , ] " or '. If readfold's password changes, `up`
# re-sets it through rf-admin; if rf-admin's changes, run reset.
# No authorizer is configured: every authenticated user may do everything.
#
# Environment:
#   READFOLD_SERVICES_HOME  state dir (default ~/.cache/readfold-services); Kafka uses $STATE/kafka
#   READFOLD_KAFKA_VERSION  Kafka version to fetch (default 4.1.1)
#   READFOLD_KAFKA_HEAP     broker heap flags (default "-Xms512m -Xmx1g")
#   READFOLD_KAFKA_WAIT     seconds to wait for health after start (default 90)
#   secure: READFOLD_KAFKA_SECURE_PORT (19093), READFOLD_KAFKA_SECURE_CONTROLLER_PORT (19094),
#           READFOLD_KAFKA_SECURE_HEAP ("-Xms256m -Xmx512m")
set -euo pipefail

SECURE=
[[ "${1:-}" == --secure ]] && { SECURE=1; shift; }
SVC_NAME=kafka${SECURE:+-secure}
export SVC_NAME
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/lib.sh"
ME="$0${SECURE:+ --secure}"

KAFKA_VERSION="${READFOLD_KAFKA_VERSION:-4.1.1}"
KAFKA_WAIT="${READFOLD_KAFKA_WAIT:-90}"
HOST=127.0.0.1
CACHE="$STATE/kafka"   # jar cache, shared by both brokers
LIBS="$CACHE/libs"
POM="$SERVICES_DIR/kafka/pom.xml"
MAIN_CLASS=kafka.Kafka
STORAGE_TOOL=kafka.tools.StorageTool
TOPIC_COMMAND=org.apache.kafka.tools.TopicCommand
CONFIG_COMMAND=kafka.admin.ConfigCommand

if [[ $SECURE ]]; then
  PORT="${READFOLD_KAFKA_SECURE_PORT:-19093}"
  CONTROLLER_PORT="${READFOLD_KAFKA_SECURE_CONTROLLER_PORT:-19094}"
  KAFKA_HEAP="${READFOLD_KAFKA_SECURE_HEAP:--Xms256m -Xmx512m}"
  LISTENER=SASL_SSL
  ADVERTISED_HOST=localhost   # in the certificate's SAN
  KDIR="$STATE/secure/kafka"
  CLIENT_PROPS="$KDIR/client.properties"
  ADMIN_PROPS="$KDIR/admin.properties"
  IO_THREADS=2
  TOOLS_LEVEL=ERROR
  CERTS="$STATE/secure/certs"
  MECHANISM=SCRAM-SHA-512
  CLIENT_USER=readfold
  CLIENT_PASSWORD="${READFOLD_KAFKA_SECURE_PASSWORD:-rf-kafka-secret-7Q}"
  ADMIN_USER=rf-admin
  ADMIN_PASSWORD="${READFOLD_KAFKA_SECURE_ADMIN_PASSWORD:-rf-kafka-admin-4M}"
else
  PORT=9092
  CONTROLLER_PORT=9093
  KAFKA_HEAP="${READFOLD_KAFKA_HEAP:--Xms512m -Xmx1g}"
  LISTENER=PLAINTEXT
  ADVERTISED_HOST=$HOST
  KDIR="$STATE/kafka"
  CLIENT_PROPS="$KDIR/admin-client.properties"   # the health check's
  ADMIN_PROPS="$CLIENT_PROPS"
  IO_THREADS=4
  TOOLS_LEVEL=WARN
fi
BOOTSTRAP="$ADVERTISED_HOST:$PORT"
DATA="$KDIR/data"
CONF="$KDIR/server.properties"
LOG="$KDIR/server.log"
PIDFILE="$KDIR/kafka.pid"
CLUSTER_ID_FILE="$KDIR/cluster.id"
BROKER_LOG4J="$KDIR/log4j2-broker.properties"
TOOLS_LOG4J="$KDIR/log4j2-tools.properties"
# Identifies our broker process in /proc/PID/cmdline (guards against pid reuse).
PID_PATTERN="$MAIN_CLASS $CONF"

java_bin() {
  if [[ -n "${JAVA_HOME:-}" && -x "$JAVA_HOME/bin/java" ]]; then
    printf '%s\n' "$JAVA_HOME/bin/java"
  else
    command -v java
  fi
}

ensure_tools() {
  local pkgs=()
  command -v java >/dev/null 2>&1 || [[ -x "${JAVA_HOME:-/nonexistent}/bin/java" ]] || pkgs+=(default-jre-headless)
  command -v mvn >/dev/null 2>&1 || pkgs+=(maven)
  if ((${#pkgs[@]})); then
    log "installing ${pkgs[*]} (apt)"
    as_root apt-get update -qq
    DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq "${pkgs[@]}" >/dev/null
  fi
}

libs_stamp() {
  printf '%s %s\n' "$KAFKA_VERSION" "$(sha256sum "$POM" | cut -c1-16)"
}

kafka_version() { cut -d' ' -f1 "$LIBS/.stamp" 2>/dev/null || echo '?'; }

# Download the broker + tools jars into $LIBS unless already there for this
# version (and this pom). The secure broker takes whatever version is cached:
# replacing the jars would pull them from under the running plain broker.
ensure_jars() {
  if [[ $SECURE && -f "$LIBS/.stamp" ]] && compgen -G "$LIBS/kafka_2.13-*.jar" >/dev/null; then
    return 0
  fi
  local stamp
  stamp="$(libs_stamp)"
  if [[ -f "$LIBS/.stamp" && "$(cat "$LIBS/.stamp")" == "$stamp" ]]; then
    return 0
  fi
  ensure_tools
  mkdir -p "$CACHE"
  local tmp="$CACHE/libs.tmp.$$"
  rm -rf "$tmp"
  log "fetching org.apache.kafka:kafka_2.13:$KAFKA_VERSION (+ kafka-tools, log4j2) from Maven Central"
  if ! mvn -q -B -f "$POM" dependency:copy-dependencies \
        -Dkafka.version="$KAFKA_VERSION" -DoutputDirectory="$tmp" >"$CACHE/mvn.log" 2>&1; then
    tail -n 30 "$CACHE/mvn.log" >&2
    rm -rf "$tmp"
    die "maven could not fetch Kafka $KAFKA_VERSION (full log: $CACHE/mvn.log)"
  fi
  [[ -f "$tmp/kafka_2.13-$KAFKA_VERSION.jar" ]] || { rm -rf "$tmp"; die "kafka_2.13-$KAFKA_VERSION.jar missing after download"; }
  printf '%s\n' "$stamp" >"$tmp/.stamp"
  rm -rf "$LIBS"
  mv "$tmp" "$LIBS"
  log "jars cached in $LIBS ($(find "$LIBS" -name '*.jar' | wc -l) jars)"
}

check_passwords() {
  local p
  for p in "$CLIENT_PASSWORD" "$ADMIN_PASSWORD"; do
    [[ -n "$p" && "$p" != *[\],\"\']* ]] || die "Kafka SCRAM passwords must be non-empty and free of , ] \" '"
  done
}

# client_props FILE [USER PASSWORD]: admin client settings; with a user, SASL_SSL as that user.
client_props() {
  local store_pass
  [[ $SECURE ]] && store_pass="$(cat "$CERTS/store.pass")"
  (
    umask 077
    {
      echo "# Generated by scripts/services/kafka.sh -- overwritten on 'up'."
      if [[ $SECURE ]]; then
        cat <<EOF
security.protocol=SASL_SSL
sasl.mechanism=$MECHANISM
sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required username="$2" password="$3";
ssl.truststore.location=$CERTS/truststore.p12
ssl.truststore.type=PKCS12
ssl.truststore.password=$store_pass
ssl.endpoint.identification.algorithm=https
EOF
      fi
      cat <<'EOF'
# fail fast (health checks)
request.timeout.ms=5000
default.api.timeout.ms=10000
socket.connection.setup.timeout.ms=2000
socket.connection.setup.timeout.max.ms=5000
EOF
    } >"$1"
  )
}

write_configs() {
  mkdir -p "$KDIR" "$DATA"
  (
    umask 077   # the secure one holds passwords
    {
      cat <<EOF
# Generated by scripts/services/kafka.sh -- edits are overwritten on 'up'.
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@$HOST:$CONTROLLER_PORT
listeners=$LISTENER://$HOST:$PORT,CONTROLLER://$HOST:$CONTROLLER_PORT
advertised.listeners=$LISTENER://$BOOTSTRAP
listener.security.protocol.map=$LISTENER:$LISTENER,CONTROLLER:PLAINTEXT
inter.broker.listener.name=$LISTENER
controller.listener.names=CONTROLLER
log.dirs=$DATA

EOF
      if [[ $SECURE ]]; then
        local store_pass
        store_pass="$(cat "$CERTS/store.pass")"
        cat <<EOF
# SASL/SCRAM (credentials live in the KRaft metadata; added at format time)
sasl.enabled.mechanisms=$MECHANISM
sasl.mechanism.inter.broker.protocol=$MECHANISM
listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required username="$ADMIN_USER" password="$ADMIN_PASSWORD";
super.users=User:$ADMIN_USER

# TLS (server certificate CN=localhost, SAN DNS:localhost,IP:127.0.0.1)
ssl.keystore.location=$CERTS/server.keystore.p12
ssl.keystore.type=PKCS12
ssl.keystore.password=$store_pass
ssl.key.password=$store_pass
ssl.truststore.location=$CERTS/truststore.p12
ssl.truststore.type=PKCS12
ssl.truststore.password=$store_pass
ssl.client.auth=none
ssl.endpoint.identification.algorithm=https
ssl.enabled.protocols=TLSv1.2,TLSv1.3

EOF
      fi
      cat <<EOF
num.partitions=1
default.replication.factor=1
auto.create.topics.enable=false
offsets.topic.replication.factor=1
offsets.topic.num.partitions=1
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
transaction.state.log.num.partitions=1
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
group.initial.rebalance.delay.ms=0
# KIP-848 groups take their session timeout and heartbeat from the broker:
# a SIGKILLed member's partitions move after 6 s, as in the tests' classic
# groups (session.timeout.ms 6000), and moves are seen within a second.
group.consumer.min.session.timeout.ms=2000
group.consumer.session.timeout.ms=6000
group.consumer.min.heartbeat.interval.ms=500
group.consumer.heartbeat.interval.ms=1000
# A dead producer's open transaction holds back read_committed readers of
# its partitions, and a restore there, until the broker aborts it: after its
# transaction timeout, at the next of these scans (10 s by default).
transaction.abort.timed.out.transaction.cleanup.interval.ms=1000
log.cleaner.enable=true
log.cleaner.backoff.ms=1000
log.retention.check.interval.ms=30000
num.network.threads=2
num.io.threads=$IO_THREADS
EOF
    } >"$CONF"
  )

  cat >"$BROKER_LOG4J" <<'EOF'
# Broker logging: stdout, which kafka.sh redirects to server.log.
status = warn
appender.out.type = Console
appender.out.name = STDOUT
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.out.ref = STDOUT
logger.kafkaclients.name = org.apache.kafka.clients
logger.kafkaclients.level = WARN
logger.request.name = kafka.request.logger
logger.request.level = WARN
EOF

  cat >"$TOOLS_LOG4J" <<EOF
# CLI tools: only $TOOLS_LEVEL and worse, to stderr, so tool output stays clean.
status = warn
appender.err.type = Console
appender.err.name = STDERR
appender.err.target = SYSTEM_ERR
appender.err.layout.type = PatternLayout
appender.err.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = $TOOLS_LEVEL
rootLogger.appenderRef.err.ref = STDERR
EOF

  if [[ $SECURE ]]; then
    client_props "$CLIENT_PROPS" "$CLIENT_USER" "$CLIENT_PASSWORD"
    client_props "$ADMIN_PROPS" "$ADMIN_USER" "$ADMIN_PASSWORD"
  else
    client_props "$CLIENT_PROPS"
  fi
}

write_configs_if_missing() {
  [[ -f "$ADMIN_PROPS" && -f "$TOOLS_LOG4J" ]] || write_configs
}

# run_java HEAP MAIN_CLASS ARGS...: a CLI class as the user asked for it (no time limit).
run_java() {
  local heap="$1"; shift
  # shellcheck disable=SC2086
  "$(java_bin)" $heap -XX:+UseG1GC -Djava.awt.headless=true \
    -Dlog4j2.configurationFile="$TOOLS_LOG4J" -cp "$LIBS/*" "$@"
}

# run_tool MAIN_CLASS ARGS...: a CLI class of this script's, small heap, quick JIT.
run_tool() {
  timeout 60 "$(java_bin)" -Xmx256m -XX:TieredStopAtLevel=1 -Djava.awt.headless=true \
    -Dlog4j2.configurationFile="$TOOLS_LOG4J" -cp "$LIBS/*" "$@"
}

resolve_class() {
  case "$1" in
    *.*) printf '%s\n' "$1" ;;
    StorageTool | DumpLogSegments) printf 'kafka.tools.%s\n' "$1" ;;
    ConfigCommand) printf 'kafka.admin.%s\n' "$1" ;;
    ConsumerGroupCommand | ShareGroupCommand) printf 'org.apache.kafka.tools.consumer.group.%s\n' "$1" ;;
    ConsoleConsumer | ConsoleShareConsumer) printf 'org.apache.kafka.tools.consumer.%s\n' "$1" ;;
    ReassignPartitionsCommand) printf 'org.apache.kafka.tools.reassign.%s\n' "$1" ;;
    StreamsGroupCommand) printf 'org.apache.kafka.tools.streams.%s\n' "$1" ;;
    *) printf 'org.apache.kafka.tools.%s\n' "$1" ;;
  esac
}

# can_list PROPS: the client of PROPS lists topics (secure: TLS verified against our CA).
can_list() {
  port_open "$HOST" "$PORT" || return 1
  run_tool "$TOPIC_COMMAND" --bootstrap-server "$BOOTSTRAP" --command-config "$1" --list >/dev/null 2>&1
}

healthy() {
  port_open "$HOST" "$PORT" || return 1
  [[ -f "$LIBS/.stamp" ]] || return 1
  if [[ $SECURE ]]; then
    [[ -f "$CLIENT_PROPS" && -s "$CERTS/truststore.p12" ]] || return 1
  else
    write_configs_if_missing
  fi
  can_list "$CLIENT_PROPS"
}

format_storage() {
  [[ -f "$DATA/meta.properties" ]] && return 0
  local cid scram=()
  if [[ -s "$CLUSTER_ID_FILE" ]]; then
    cid="$(cat "$CLUSTER_ID_FILE")"
  else
    cid="$(run_tool "$STORAGE_TOOL" random-uuid | tail -n 1 | tr -d '[:space:]')"
    [[ -n "$cid" ]] || die "StorageTool random-uuid printed nothing"
    printf '%s\n' "$cid" >"$CLUSTER_ID_FILE"
  fi
  if [[ $SECURE ]]; then
    scram=(--add-scram "$MECHANISM=[name=$ADMIN_USER,password=$ADMIN_PASSWORD]"
           --add-scram "$MECHANISM=[name=$CLIENT_USER,password=$CLIENT_PASSWORD]")
  fi
  log "formatting KRaft storage in $DATA (cluster id $cid${SECURE:+, SCRAM users $ADMIN_USER, $CLIENT_USER})"
  run_tool "$STORAGE_TOOL" format -t "$cid" -c "$CONF" --ignore-formatted "${scram[@]}" \
    >"$KDIR/format.log" 2>&1 || { cat "$KDIR/format.log" >&2; die "storage format failed"; }
}

# readfold cannot log in but the broker answers rf-admin: (re)set readfold's credential.
sync_client_user() {
  can_list "$ADMIN_PROPS" || return 1
  log "setting $MECHANISM credential of user $CLIENT_USER (via $ADMIN_USER)"
  run_tool "$CONFIG_COMMAND" --bootstrap-server "$BOOTSTRAP" --command-config "$ADMIN_PROPS" \
    --alter --entity-type users --entity-name "$CLIENT_USER" \
    --add-config "$MECHANISM=[password=$CLIENT_PASSWORD]" >/dev/null
}

# wait_healthy TIMEOUT [ours|foreign]
# Wait until healthy; for our own broker, fail early (with the log tail) if
# the process dies.
wait_healthy() {
  local timeout="$1" whose="${2:-ours}" synced=0
  local deadline=$((SECONDS + timeout))
  while ((SECONDS < deadline)); do
    if [[ "$whose" == ours ]] && ! pid_alive "$PIDFILE" "$PID_PATTERN"; then
      show_log_tail "$LOG" 40
      die "broker process exited during startup"
    fi
    healthy && return 0
    # Up for rf-admin but not for readfold: its password changed since format.
    if [[ $SECURE ]] && ((!synced)) && port_open "$HOST" "$PORT" && sync_client_user; then
      synced=1
      continue
    fi
    sleep 1
  done
  if [[ "$whose" == ours ]]; then
    show_log_tail "$LOG" 40
    [[ $SECURE ]] && die "broker on $BOOTSTRAP does not let $CLIENT_USER list topics after ${timeout}s (log: $LOG; if passwords changed since the data dir was formatted: $ME reset)"
    die "broker not healthy on $BOOTSTRAP after ${timeout}s (log: $LOG)"
  fi
  die "ports $PORT/$CONTROLLER_PORT are held by a process not started by this script and it does not answer as a Kafka broker; stop it (see: ss -ltnp)"
}

pid_info() {
  if pid_alive "$PIDFILE" "$PID_PATTERN"; then printf 'pid %s' "$(pid_read "$PIDFILE")"
  else printf 'not started by this script'
  fi
}

cmd_up() {
  if [[ $SECURE ]]; then
    check_passwords
    bash "$SERVICES_DIR/secure-certs.sh" up
    ensure_jars
    write_configs   # refreshes client.properties (passwords, store password)
  fi
  if healthy; then
    log "already up on $BOOTSTRAP (${SECURE:+$LISTENER/$MECHANISM, }$(pid_info))"
    return 0
  fi
  ensure_jars
  if pid_alive "$PIDFILE" "$PID_PATTERN"; then
    log "broker process $(pid_read "$PIDFILE") exists but is not answering${SECURE:+ $CLIENT_USER} yet; waiting"
    write_configs_if_missing
    wait_healthy "$KAFKA_WAIT" ours
    log "up on $BOOTSTRAP"
    return 0
  fi
  if port_open "$HOST" "$PORT" || port_open "$HOST" "$CONTROLLER_PORT"; then
    # A foreign plain broker (e.g. docker-compose's) will do; a secure one lacks our users and certificate.
    [[ $SECURE ]] && die "port $PORT/$CONTROLLER_PORT is in use by a process not started by this script (see: ss -ltnp)"
    log "port $PORT/$CONTROLLER_PORT is in use by a process not started by this script; waiting for it to become healthy"
    write_configs_if_missing
    wait_healthy 30 foreign
    log "up on $BOOTSTRAP (not started by this script)"
    return 0
  fi

  write_configs
  format_storage
  local t0=$SECONDS pid
  [[ -f "$LOG" ]] && mv -f "$LOG" "$LOG.1"
  log "starting broker (Kafka $(kafka_version), KRaft, $LISTENER $BOOTSTRAP, controller $HOST:$CONTROLLER_PORT, log $LOG)"
  # setsid: own session, so the broker outlives this shell / its process group.
  # shellcheck disable=SC2086
  setsid nohup "$(java_bin)" $KAFKA_HEAP -XX:+UseG1GC -XX:MaxGCPauseMillis=20 \
    -XX:+ExitOnOutOfMemoryError -Djava.awt.headless=true \
    -Dlog4j2.configurationFile="$BROKER_LOG4J" -Dkafka.logs.dir="$KDIR" \
    -cp "$LIBS/*" "$MAIN_CLASS" "$CONF" >"$LOG" 2>&1 </dev/null &
  pid=$!
  printf '%s\n' "$pid" >"$PIDFILE"
  sleep 0.5
  pid_alive "$PIDFILE" "$PID_PATTERN" || { show_log_tail "$LOG" 40; die "broker failed to start"; }
  wait_healthy "$KAFKA_WAIT" ours
  log "up on $BOOTSTRAP (${SECURE:+$LISTENER/$MECHANISM, user $CLIENT_USER, }pid $pid, healthy after $((SECONDS - t0))s)"
}

cmd_down() {
  if pid_alive "$PIDFILE" "$PID_PATTERN"; then
    local pid
    pid="$(pid_read "$PIDFILE")"
    log "stopping broker (pid $pid)"
    pid_stop "$PIDFILE" "$PID_PATTERN" 60 || die "could not stop pid $pid"
    log "stopped"
  else
    rm -f "$PIDFILE"
    if port_open "$HOST" "$PORT"; then
      warn "something listens on $HOST:$PORT but was not started by this script (no pid file); leaving it alone"
    else
      log "not running"
    fi
  fi
}

cmd_status() {
  local pidinfo="" what="$BOOTSTRAP" why="starting or hung"
  if [[ $SECURE ]]; then
    what="$LISTENER $BOOTSTRAP, $MECHANISM user $CLIENT_USER"
    why="starting, hung or rejecting $CLIENT_USER"
  fi
  pid_alive "$PIDFILE" "$PID_PATTERN" && pidinfo="pid $(pid_read "$PIDFILE"), "
  if healthy; then
    printf '%s: up (%s%s, Kafka %s)\n' "$SVC_NAME" "$pidinfo" "$what" "$(kafka_version)"
    return 0
  elif [[ -n "$pidinfo" ]]; then
    printf '%s: not healthy (%s%s; log %s)\n' "$SVC_NAME" "$pidinfo" "$why" "$LOG"
  elif port_open "$HOST" "$PORT"; then
    printf '%s: not healthy (port %s open, no pid file)\n' "$SVC_NAME" "$PORT"
  else
    printf '%s: down\n' "$SVC_NAME"
  fi
  return 1
}

cmd_reset() {
  cmd_down
  local wiped=("$KDIR")
  # The plain broker's dir holds the jar cache too.
  [[ $SECURE ]] || wiped=("$DATA" "$CLUSTER_ID_FILE" "$LOG" "$LOG.1" "$KDIR/format.log")
  rm -rf "${wiped[@]}"
  log "wiped ${wiped[0]}; jars in $LIBS${SECURE:+ and certificates} kept"
}

cmd_tool() {
  [[ $# -ge 1 ]] || die "usage: $ME tool MAIN_CLASS [ARGS...]"
  local cls
  cls="$(resolve_class "$1")"; shift
  ensure_jars
  write_configs_if_missing
  run_java "${READFOLD_KAFKA_TOOL_HEAP:--Xmx256m}" "$cls" "$@"
}

cmd_env() {
  cat <<EOF
export READFOLD_TEST_KAFKA_SECURE='$BOOTSTRAP'
export READFOLD_KAFKA_SECURE_SECURITY_PROTOCOL='SASL_SSL'
export READFOLD_KAFKA_SECURE_SASL_MECHANISM='$MECHANISM'
export READFOLD_KAFKA_SECURE_USER='$CLIENT_USER'
export READFOLD_KAFKA_SECURE_PASSWORD='$CLIENT_PASSWORD'
export READFOLD_KAFKA_SECURE_CA='$CERTS/ca.pem'
export READFOLD_KAFKA_SECURE_ADMIN_USER='$ADMIN_USER'
export READFOLD_KAFKA_SECURE_ADMIN_PASSWORD='$ADMIN_PASSWORD'
export READFOLD_KAFKA_SECURE_CLIENT_PROPERTIES='$CLIENT_PROPS'
EOF
}

cmd_topics() {
  ensure_jars
  [[ -f "$CLIENT_PROPS" ]] || die "no $CLIENT_PROPS yet; run: $ME up"
  run_tool "$TOPIC_COMMAND" --bootstrap-server "$BOOTSTRAP" --command-config "$CLIENT_PROPS" "$@"
}

usage() {
  service_usage "$ME" "|reset|tool MAIN_CLASS [ARGS...]|classpath${SECURE:+|env|topics ARGS...}"
  exit 2
}

main() {
  local cmd="${1:-}"
  [[ $# -gt 0 ]] && shift
  case "$cmd" in
    up) cmd_up ;;
    down) cmd_down ;;
    status) cmd_status ;;
    reset) cmd_reset ;;
    tool) cmd_tool "$@" ;;
    classpath) ensure_jars >&2; printf '%s\n' "$LIBS/*" ;;
    env) [[ $SECURE ]] || usage; cmd_env ;;
    topics) [[ $SECURE ]] || usage; cmd_topics "$@" ;;
    *) usage ;;
  esac
}

main "$@"
