#!/usr/bin/env bash
# Run a real ClickHouse server on 127.0.0.1 for tests, CI and development, as a
# plain background process (not the system service) with all state in a run dir.
# On Debian 12 the packaged server is ClickHouse 18.16 (see "Running the real
# services" in docs/design.md for what that version lacks).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

RUN_DIR="${GANGWATCH_CH_DIR:-/tmp/gangwatch-clickhouse}"
TCP_PORT="${GANGWATCH_CH_PORT:-9000}"
HTTP_PORT="${GANGWATCH_CH_HTTP_PORT:-8123}"
INTERSERVER_PORT="${GANGWATCH_CH_INTERSERVER_PORT:-9009}"
CONFIG="${GANGWATCH_CH_CONFIG:-/etc/clickhouse-server/config.xml}"
READY_TIMEOUT="${GANGWATCH_CH_TIMEOUT:-30}"
# only without curl / clickhouse-client: $PYTHON, else the checkout's .venv (what ./gw makes), else python3
VENV_PYTHON="$(cd "$HERE/../.." && pwd)/.venv/bin/python"
PYTHON="${PYTHON:-$(if [[ -x "$VENV_PYTHON" ]]; then echo "$VENV_PYTHON"; else echo python3; fi)}"

PID_FILE="$RUN_DIR/server.pid"
DATA_DIR="$RUN_DIR/data"
LOG_DIR="$RUN_DIR/log"
LOG="$LOG_DIR/clickhouse-server.log"
ERR_LOG="$LOG_DIR/clickhouse-server.err.log"
OUT="$LOG_DIR/stdout.log"   # config-preprocessing noise and early crashes

usage() {
  cat <<EOF
Usage: $(basename "$0") start|stop|status [-h|--help]

Real ClickHouse server on 127.0.0.1, data and logs under a run dir.

  start   install clickhouse-server via apt-get if missing, start it in the
          background and wait until HTTP /ping says "Ok." and a native-protocol
          "SELECT 1" works. If a healthy server is already running, say so, exit 0.
  stop    TERM, wait up to 20 s, then KILL. Safe to repeat.
  status  exit 0 if the server runs and both checks pass, 1 otherwise.

Environment:
  GANGWATCH_CH_DIR               run dir: data, logs, pid          [$RUN_DIR]
  GANGWATCH_CH_PORT              native TCP port                   [$TCP_PORT]
  GANGWATCH_CH_HTTP_PORT         HTTP port                         [$HTTP_PORT]
  GANGWATCH_CH_INTERSERVER_PORT  interserver port (must be free)   [$INTERSERVER_PORT]
  GANGWATCH_CH_CONFIG            base config (users.xml beside it) [$CONFIG]
  GANGWATCH_CH_TIMEOUT           seconds to wait for readiness     [$READY_TIMEOUT]
  PYTHON                         health checks without curl and clickhouse-client (clickhouse-driver)  [$PYTHON]

Data survives stop/start; wipe it with: $(basename "$0") stop && rm -rf "$RUN_DIR"
EOF
}

die() { echo "clickhouse: error: $*" >&2; exit 1; }
say() { echo "clickhouse: $*"; }
# shellcheck source=../lib.sh
source "$HERE/../lib.sh"

# --- binaries ----------------------------------------------------------------

# Debian ships clickhouse-server/clickhouse-client; upstream packages ship one
# `clickhouse` binary with subcommands. Each function prints a command prefix.
server_cmd() {
  if command -v clickhouse-server > /dev/null; then echo clickhouse-server
  elif command -v clickhouse > /dev/null; then echo "clickhouse server"
  else return 1; fi
}

client_cmd() {
  if command -v clickhouse-client > /dev/null; then echo clickhouse-client
  elif command -v clickhouse > /dev/null; then echo "clickhouse client"
  else return 1; fi
}

ensure_installed() {
  server_cmd > /dev/null && return 0
  command -v apt-get > /dev/null || die "clickhouse-server is not installed and apt-get is unavailable"
  local sudo=(); [[ $(id -u) -eq 0 ]] || sudo=(sudo)
  say "clickhouse-server missing; installing it with apt-get..."
  "${sudo[@]}" apt-get update -q || die "apt-get update failed"
  # the package's postinst tries to start the system service; in containers
  # policy-rc.d refuses, which is harmless: we never use the service.
  DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -q clickhouse-server clickhouse-client \
    || die "apt-get install clickhouse-server clickhouse-client failed"
  server_cmd > /dev/null || die "installed, but neither clickhouse-server nor clickhouse is on PATH"
}

# --- process bookkeeping -----------------------------------------------------

# Prints the pid if the pid file names a live server of THIS run dir.
running_pid() {
  [[ -f "$PID_FILE" ]] || return 1
  local pid; pid="$(cat "$PID_FILE" 2>/dev/null || true)"
  [[ "$pid" =~ ^[0-9]+$ ]] || return 1
  # guard against pid reuse: the command line must name our data dir
  if tr "\\0" " " 2>/dev/null < "/proc/$pid/cmdline" | grep -qF -- "--path=$DATA_DIR/"; then
    echo "$pid"
  else
    return 1
  fi
}

port_in_use() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

show_log_tail() {
  local f
  for f in "$OUT" "$ERR_LOG" "$LOG"; do
    [[ -s "$f" ]] || continue
    echo "----- last 30 lines of $f -----" >&2
    tail -n 30 "$f" >&2
  done
}

# --- health ------------------------------------------------------------------

http_ping() {
  local url="http://127.0.0.1:$HTTP_PORT/ping" body
  if command -v curl > /dev/null; then
    body="$(curl -sf --max-time 2 "$url" 2>/dev/null)" || return 1
  else
    body="$("$PYTHON" -c 'import sys,urllib.request as u; print(u.urlopen(sys.argv[1], timeout=2).read().decode(), end="")' "$url" 2>/dev/null)" || return 1
  fi
  [[ "$body" == "Ok." ]]
}

# Runs a query over the native protocol (clickhouse-client, else clickhouse-driver).
native_query() {
  local client
  if client="$(client_cmd)"; then
    # shellcheck disable=SC2086  # client may be "clickhouse client"
    $client --host 127.0.0.1 --port "$TCP_PORT" --connect_timeout 2 --query "$1"
  else
    "$PYTHON" -c 'import sys; from clickhouse_driver import Client
print(Client("127.0.0.1", port=int(sys.argv[1]), connect_timeout=2).execute(sys.argv[2])[0][0])' "$TCP_PORT" "$1"
  fi
}

healthy() { http_ping && [[ "$(native_query 'SELECT 1' 2>/dev/null)" == "1" ]]; }

wait_ready() {
  local deadline=$((SECONDS + READY_TIMEOUT))
  until healthy; do
    running_pid > /dev/null || { show_log_tail; die "server process exited during startup"; }
    if (( SECONDS >= deadline )); then
      show_log_tail
      die "server not ready after ${READY_TIMEOUT}s (still running; '$0 stop' to kill it)"
    fi
    sleep 0.1
  done
}

# --- start -------------------------------------------------------------------

check_run_dir() {
  mkdir -p "$DATA_DIR/tmp" "$DATA_DIR/user_files" "$DATA_DIR/format_schemas" "$LOG_DIR"
  # newer servers refuse to run when the data dir belongs to another user
  [[ -O "$DATA_DIR" ]] || die "$DATA_DIR belongs to another user; use another GANGWATCH_CH_DIR"
  [[ -r "$CONFIG" ]] || die "config $CONFIG not found (is clickhouse-server installed?)"
}

launch() {
  local server; server="$(server_cmd)"
  # Everything after `--` overrides config.xml keys. The packaged config points
  # path, logs and ports at system locations; all are redirected here. users.xml
  # is found next to config.xml; preprocessed configs land in the data dir.
  # setsid: survive this shell; the inner shell writes its own pid then execs.
  # shellcheck disable=SC2086,SC2016  # server may be "clickhouse server"; $$ is for the inner shell
  setsid bash -c 'echo $$ > "$0"; exec "$@"' "$PID_FILE" \
    $server --config-file="$CONFIG" -- \
    --path="$DATA_DIR/" --tmp_path="$DATA_DIR/tmp/" \
    --user_files_path="$DATA_DIR/user_files/" --format_schema_path="$DATA_DIR/format_schemas/" \
    --listen_host=127.0.0.1 --tcp_port="$TCP_PORT" --http_port="$HTTP_PORT" \
    --interserver_http_port="$INTERSERVER_PORT" \
    --logger.log="$LOG" --logger.errorlog="$ERR_LOG" --logger.level=information \
    >>"$OUT" 2>&1 < /dev/null 9>&- &
  for _ in $(seq 50); do [[ -s "$PID_FILE" ]] && return 0; sleep 0.1; done
  die "server did not write $PID_FILE"
}

cmd_start() {
  local pid start_ns p
  if pid="$(running_pid)"; then
    wait_ready
    say "already running and healthy (pid $pid, tcp 127.0.0.1:$TCP_PORT, http :$HTTP_PORT)"
    return 0
  fi
  rm -f "$PID_FILE"
  ensure_installed
  check_run_dir
  for p in "$TCP_PORT" "$HTTP_PORT" "$INTERSERVER_PORT"; do
    port_in_use "$p" && die "port $p on 127.0.0.1 is taken by another process (set GANGWATCH_CH_PORT / _HTTP_PORT / _INTERSERVER_PORT)"
  done
  start_ns=$(date +%s%N)
  launch
  wait_ready
  local secs; secs=$(awk -v a="$start_ns" -v b="$(date +%s%N)" 'BEGIN{printf "%.2f", (b-a)/1e9}')
  say "ClickHouse $(native_query 'SELECT version()') ready on 127.0.0.1 tcp $TCP_PORT / http $HTTP_PORT (pid $(cat "$PID_FILE")) in ${secs}s"
  say "log: $LOG (errors: $ERR_LOG)"
}

# --- stop / status -----------------------------------------------------------

cmd_status() {
  local pid
  pid="$(running_pid)" || { say "not running"; return 1; }
  if healthy; then
    say "running (pid $pid, ClickHouse $(native_query 'SELECT version()'), tcp 127.0.0.1:$TCP_PORT, http :$HTTP_PORT, log $LOG)"
  else
    say "process $pid is up but /ping or SELECT 1 fails (log $LOG)"
    return 1
  fi
}

# Serialise start/stop so parallel CI steps cannot start two servers.
with_lock() {
  mkdir -p "$RUN_DIR"
  if command -v flock > /dev/null; then
    exec 9>"$RUN_DIR/.lock"
    flock -w 60 9 || die "another start/stop holds $RUN_DIR/.lock for over 60 s"
  fi
  "$@"
}

main() {
  case "${1:-}" in
    start)  with_lock cmd_start ;;
    stop)   with_lock cmd_stop ;;
    status) cmd_status ;;
    -h|--help|help) usage ;;
    "") usage >&2; exit 2 ;;
    *) echo "clickhouse: unknown command '$1'" >&2; usage >&2; exit 2 ;;
  esac
}

main "$@"
