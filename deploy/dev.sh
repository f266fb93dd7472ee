#!/usr/bin/env bash
# Developer convenience: start/stop/check the real Kafka broker and ClickHouse
# server together. Each service script can also be used on its own.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
KAFKA="$HERE/kafka/broker.sh"
CLICKHOUSE="$HERE/clickhouse/server.sh"

SHOWN_PYTHON="the checkout's .venv/bin/python, else python3"

usage() {
  cat <<EOF
Usage: $(basename "$0") up|down|status [-h|--help]     (from the checkout: ./gw up|down|status)

  up      start ClickHouse, then Kafka; each waits until it is really usable
  down    stop both (Kafka first); safe to repeat
  status  report both; exit 0 only if both are healthy

Ports and folders come from the environment (the current value, else the default, in brackets).
A second stack on this machine needs its own of each: set them for up, down and status alike.
  GANGWATCH_KAFKA_PORT             Kafka's listener (--bootstrap 127.0.0.1:PORT)  [${GANGWATCH_KAFKA_PORT:-9092}]
  GANGWATCH_KAFKA_CONTROLLER_PORT  Kafka's KRaft controller                       [${GANGWATCH_KAFKA_CONTROLLER_PORT:-9093}]
  GANGWATCH_KAFKA_DIR              Kafka's config, data, logs and pid             [${GANGWATCH_KAFKA_DIR:-/tmp/gangwatch-kafka}]
  GANGWATCH_CH_PORT                ClickHouse's native port (--store clickhouse://127.0.0.1:PORT/DB)  [${GANGWATCH_CH_PORT:-9000}]
  GANGWATCH_CH_HTTP_PORT           ClickHouse's HTTP port                         [${GANGWATCH_CH_HTTP_PORT:-8123}]
  GANGWATCH_CH_INTERSERVER_PORT    ClickHouse's interserver port (must be free)   [${GANGWATCH_CH_INTERSERVER_PORT:-9009}]
  GANGWATCH_CH_DIR                 ClickHouse's data, logs and pid                [${GANGWATCH_CH_DIR:-/tmp/gangwatch-clickhouse}]
  PYTHON                           a Python with kafka-python (readiness probes)  [${PYTHON:-$SHOWN_PYTHON}]
e.g. GANGWATCH_KAFKA_PORT=9192 GANGWATCH_KAFKA_CONTROLLER_PORT=9193 GANGWATCH_KAFKA_DIR=/tmp/gw2-kafka \\
     GANGWATCH_CH_PORT=9001 GANGWATCH_CH_HTTP_PORT=8124 GANGWATCH_CH_INTERSERVER_PORT=9010 GANGWATCH_CH_DIR=/tmp/gw2-ch ./gw up

Timeouts, heap and the ClickHouse base config: $KAFKA --help, $CLICKHOUSE --help
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

# --help anywhere (`./gw up --help`) shows the help and starts nothing
for arg in "$@"; do
  case "$arg" in -h|--help) usage; exit 0 ;; esac
done

case "${1:-}" in
  up) up ;;
  down) down ;;
  status) status ;;
  -h|--help|help) usage ;;
  "") usage >&2; exit 2 ;;
  *) echo "dev.sh: unknown command '$1'" >&2; usage >&2; exit 2 ;;
esac
