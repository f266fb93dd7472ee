#!/usr/bin/env bash
# Developer convenience: start/stop/check the real Kafka broker and ClickHouse
# server together. Each service script can also be used on its own.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
KAFKA="$HERE/kafka/broker.sh"
CLICKHOUSE="$HERE/clickhouse/server.sh"

usage() {
  cat <<EOF
Usage: $(basename "$0") up|down|status [-h|--help]

  up      start ClickHouse, then Kafka; each waits until it is really usable
  down    stop both (Kafka first); safe to repeat
  status  report both; exit 0 only if both are healthy

Ports, run dirs and timeouts come from the environment; see
  $KAFKA --help
  $CLICKHOUSE --help
EOF
}

up() {
  "$CLICKHOUSE" start   # sub-second; fail fast before the slower JVM start
  "$KAFKA" start
}

# Stop both even if one of them fails to stop; report the failure at the end.
down() {
  local rc=0
  "$KAFKA" stop || rc=1
  "$CLICKHOUSE" stop || rc=1
  return $rc
}

status() {
  local rc=0
  "$KAFKA" status || rc=1
  "$CLICKHOUSE" status || rc=1
  return $rc
}

case "${1:-}" in
  up) up ;;
  down) down ;;
  status) status ;;
  -h|--help|help) usage ;;
  "") usage >&2; exit 2 ;;
  *) echo "dev.sh: unknown command '$1'" >&2; usage >&2; exit 2 ;;
esac
