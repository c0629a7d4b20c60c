# shellcheck shell=bash
# Shared helpers for scripts/services/*.sh. Source it; do not run it.
#
# State (downloads, data, logs, pid files) lives OUTSIDE the repo in
#   ${READFOLD_SERVICES_HOME:-$HOME/.cache/readfold-services}
# It may survive between runs (jar cache, data) but is never required:
# every script recreates what it needs from scratch.

SERVICES_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
STATE="${READFOLD_SERVICES_HOME:-${HOME:-/root}/.cache/readfold-services}"
export SERVICES_DIR STATE

# --- logging ---------------------------------------------------------------
# log prefix is the calling service's name, e.g. "[kafka]".
: "${SVC_NAME:=services}"
log()  { printf '[%s] %s\n' "$SVC_NAME" "$*" >&2; }
warn() { printf '[%s] WARNING: %s\n' "$SVC_NAME" "$*" >&2; }
die()  { printf '[%s] ERROR: %s\n' "$SVC_NAME" "$*" >&2; exit 1; }

# state_dir SUBDIR... -> creates and prints $STATE/SUBDIR
state_dir() {
  local d="$STATE/$1"
  mkdir -p "$d"
  printf '%s\n' "$d"
}

# --- ports -----------------------------------------------------------------
# port_open HOST PORT: true if something accepts TCP connections there.
port_open() {
  (exec 3<>"/dev/tcp/$1/$2") 2>/dev/null
}

# wait_for TIMEOUT_SECONDS INTERVAL_SECONDS COMMAND...
# Runs COMMAND until it succeeds or the deadline passes. Returns 0/1.
wait_for() {
  local timeout="$1" interval="$2"; shift 2
  local deadline=$((SECONDS + timeout))
  while true; do
    if "$@" >/dev/null 2>&1; then return 0; fi
    ((SECONDS >= deadline)) && return 1
    sleep "$interval"
  done
}

# wait_for_port HOST PORT TIMEOUT_SECONDS
wait_for_port() { wait_for "$3" 0.5 port_open "$1" "$2"; }

# --- pid files -------------------------------------------------------------
# pid_read PIDFILE -> prints the pid if the file holds a number.
pid_read() {
  local pid
  [[ -f "$1" ]] || return 1
  pid="$(tr -dc '0-9' <"$1")"
  [[ -n "$pid" ]] || return 1
  printf '%s\n' "$pid"
}

# pid_alive PIDFILE [CMDLINE_PATTERN]
# True if the pid in PIDFILE is running (and, if given, its command line
# contains CMDLINE_PATTERN, to guard against pid reuse). Removes stale files.
pid_alive() {
  local pidfile="$1" pattern="${2:-}" pid
  pid="$(pid_read "$pidfile")" || return 1
  if kill -0 "$pid" 2>/dev/null; then
    if [[ -z "$pattern" ]] || tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -F -- "$pattern" >/dev/null; then
      return 0
    fi
  fi
  rm -f "$pidfile"
  return 1
}

# pid_stop PIDFILE [CMDLINE_PATTERN] [GRACE_SECONDS]
# SIGTERM, wait up to GRACE_SECONDS (default 30), then SIGKILL. Removes the file.
pid_stop() {
  local pidfile="$1" pattern="${2:-}" grace="${3:-30}" pid
  if ! pid_alive "$pidfile" "$pattern"; then
    rm -f "$pidfile"
    return 0
  fi
  pid="$(pid_read "$pidfile")"
  kill -TERM "$pid" 2>/dev/null || true
  if ! wait_for "$grace" 0.5 bash -c "! kill -0 $pid" ; then
    warn "pid $pid did not stop after ${grace}s; sending SIGKILL"
    kill -KILL "$pid" 2>/dev/null || true
    wait_for 10 0.2 bash -c "! kill -0 $pid" || { warn "pid $pid still alive"; return 1; }
  fi
  rm -f "$pidfile"
}

# show_log_tail FILE [LINES]
show_log_tail() {
  local f="$1" n="${2:-40}"
  if [[ -f "$f" ]]; then
    printf -- '----- last %s lines of %s -----\n' "$n" "$f" >&2
    tail -n "$n" "$f" >&2
    printf -- '-----\n' >&2
  else
    printf -- '(no log at %s)\n' "$f" >&2
  fi
}

# as_root CMD...: run as root (directly, or with sudo when available).
as_root() {
  if [[ "$(id -u)" -eq 0 ]]; then "$@"
  elif command -v sudo >/dev/null 2>&1; then sudo "$@"
  else die "need root to run: $*"
  fi
}

# usage_for NAME: standard usage line for a service script.
service_usage() {
  printf 'usage: %s up|down|status%s\n' "$1" "${2:-}" >&2
}
