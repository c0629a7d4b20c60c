#!/usr/bin/env bash
# Local services for readfold's development and tests.
#
#   scripts/services.sh up|down|status [SERVICE...]
#
# SERVICE is one of: kafka redis cassandra, or their second instances for the
# authenticated, encrypted connection tests: kafka-secure (SASL/SCRAM over
# TLS), redis-secure (ACL user over TLS), cassandra-secure
# (PasswordAuthenticator over TLS), with certificates made by
# services/secure-certs.sh; and schema-registry, a Confluent-compatible
# registry (Apicurio, in memory) (default: all of them). Each is
# handled by scripts/services/<name>.sh up|down|status; a service whose
# script does not exist is skipped with a message.
#   up      start each (idempotent: a service already answering is left alone);
#           exit non-zero if any failed
#   down    stop each (in reverse order)
#   status  one line per service; exit non-zero if any is not up
#
# State (jar cache, data, logs, pid files) lives in
# ${READFOLD_SERVICES_HOME:-~/.cache/readfold-services}.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
SVC_DIR="$ROOT/services"
ALL=(kafka redis cassandra kafka-secure redis-secure cassandra-secure schema-registry)

usage() {
  echo "usage: $0 up|down|status [${ALL[*]}]" >&2
  exit 2
}

[[ $# -ge 1 ]] || usage
action="$1"; shift
case "$action" in up | down | status) ;; *) usage ;; esac

names=("$@")
((${#names[@]})) || names=("${ALL[@]}")
for n in "${names[@]}"; do
  [[ " ${ALL[*]} " == *" $n "* ]] || { echo "unknown service: $n (known: ${ALL[*]})" >&2; exit 2; }
done

if [[ "$action" == down ]]; then
  # stop in reverse order
  rev=()
  for ((i = ${#names[@]} - 1; i >= 0; i--)); do rev+=("${names[$i]}"); done
  names=("${rev[@]}")
fi

failed=()
for n in "${names[@]}"; do
  script="$SVC_DIR/$n.sh"
  if [[ ! -f "$script" ]]; then
    if [[ "$action" == status ]]; then
      echo "$n: skipped (no scripts/services/$n.sh)"
    else
      echo "[$n] skipped: scripts/services/$n.sh does not exist" >&2
    fi
    continue
  fi
  if ! bash "$script" "$action"; then
    failed+=("$n")
    [[ "$action" == up ]] && echo "[$n] up FAILED" >&2
  fi
done

if ((${#failed[@]})); then
  case "$action" in
    up) echo "services failed to start: ${failed[*]}" >&2 ;;
    status) ;;
    down) echo "services failed to stop: ${failed[*]}" >&2 ;;
  esac
  exit 1
fi
