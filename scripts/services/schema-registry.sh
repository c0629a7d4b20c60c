#!/usr/bin/env bash
# A Confluent-compatible schema registry for readfold's tests: Apicurio
# Registry (from Maven Central; runs on Java 17) with in-memory storage, whose
# Confluent API is at http://127.0.0.1:8081/apis/ccompat/v7. Confluent's own
# registry is not published on Maven Central, and Karapace not on PyPI.
#
#   scripts/services/schema-registry.sh up|down|status|env
#
# State: $STATE/schema-registry (unpacked distribution, log, pid file).
# Environment: READFOLD_REGISTRY_PORT (8081), READFOLD_REGISTRY_MGMT_PORT
#   (9001), READFOLD_REGISTRY_VERSION (2.6.13.Final), READFOLD_REGISTRY_WAIT
#   (120 s). Storage is in memory: a restart forgets every schema.
set -euo pipefail

export SVC_NAME=schema-registry
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/lib.sh"

HOST=127.0.0.1
PORT="${READFOLD_REGISTRY_PORT:-8081}"
MGMT_PORT="${READFOLD_REGISTRY_MGMT_PORT:-9001}"
VERSION="${READFOLD_REGISTRY_VERSION:-2.6.13.Final}"
WAIT="${READFOLD_REGISTRY_WAIT:-120}"
DIR="$STATE/schema-registry"
DIST="$DIR/apicurio-registry-$VERSION"
JAR="$DIST/apicurio-registry-app-$VERSION-runner.jar"
PIDFILE="$DIR/registry.pid"
LOG="$DIR/registry.log"
URL="http://$HOST:$PORT/apis/ccompat/v7"

answers() { curl -sf --max-time 5 "$URL/subjects" >/dev/null; }

install() {
  [[ -f "$JAR" ]] && return 0
  command -v mvn >/dev/null 2>&1 || die "mvn not found: the registry is fetched from Maven Central with Maven"
  log "fetching io.apicurio:apicurio-registry-app:$VERSION (tar.gz, ~140 MB) from Maven Central"
  mvn -q -B dependency:get -Dartifact="io.apicurio:apicurio-registry-app:$VERSION:tar.gz:all" -Dtransitive=false \
    || die "cannot fetch the Apicurio Registry distribution"
  local tarball="${HOME:-/root}/.m2/repository/io/apicurio/apicurio-registry-app/$VERSION/apicurio-registry-app-$VERSION-all.tar.gz"
  [[ -f "$tarball" ]] || die "no $tarball after the download"
  rm -rf "$DIST.tmp" && mkdir -p "$DIST.tmp"
  tar -xzf "$tarball" -C "$DIST.tmp"
  local jar
  jar="$(find "$DIST.tmp" -name "apicurio-registry-app-$VERSION-runner.jar" | head -1)"
  [[ -n "$jar" ]] || die "the distribution has no runner jar"
  rm -rf "$DIST" && mv "$(dirname "$jar")" "$DIST" && rm -rf "$DIST.tmp"
}

cmd_up() {
  mkdir -p "$DIR"
  if answers; then
    log "already up at $URL"
    return 0
  fi
  if port_open "$HOST" "$PORT"; then
    die "port $PORT is in use by something that is not a schema registry"
  fi
  install
  local t0=$SECONDS
  log "starting Apicurio Registry $VERSION on $HOST:$PORT (in-memory storage)"
  nohup java -Xmx512m \
    -Dquarkus.http.host=$HOST -Dquarkus.http.port="$PORT" \
    -Dquarkus.management.host=$HOST -Dquarkus.management.port="$MGMT_PORT" \
    -jar "$JAR" >"$LOG" 2>&1 &
  echo $! >"$PIDFILE"
  if ! wait_for "$WAIT" 0.5 answers; then
    show_log_tail "$LOG" 40
    pid_stop "$PIDFILE" "$JAR" 10 || true
    die "the registry did not answer within ${WAIT}s"
  fi
  log "up at $URL (pid $(pid_read "$PIDFILE"), $((SECONDS - t0))s)"
}

cmd_down() {
  if ! pid_alive "$PIDFILE" "$JAR"; then
    log "not running"
    return 0
  fi
  pid_stop "$PIDFILE" "$JAR" 20
  log "stopped"
}

cmd_status() {
  if answers; then
    echo "schema-registry: up ($URL, Apicurio $VERSION)"
  else
    echo "schema-registry: down"
    return 1
  fi
}

case "${1:-}" in
  up) cmd_up ;;
  down) cmd_down ;;
  status) cmd_status ;;
  env) echo "export READFOLD_TEST_SCHEMA_REGISTRY='$URL'" ;;
  *) service_usage "$0" "|env"; exit 2 ;;
esac
