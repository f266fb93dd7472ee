#!/usr/bin/env bash
# Run a real Apache Kafka 4.x broker (KRaft, combined broker+controller, one node)
# on 127.0.0.1 for tests, CI and development. The broker comes from the Maven
# Central jars that deploy/kafka/pom.xml copies into deploy/kafka/libs.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
LIBS="$HERE/libs"
RUN_DIR="${GANGWATCH_KAFKA_DIR:-/tmp/gangwatch-kafka}"
PORT="${GANGWATCH_KAFKA_PORT:-9092}"
CONTROLLER_PORT="${GANGWATCH_KAFKA_CONTROLLER_PORT:-9093}"
READY_TIMEOUT="${GANGWATCH_KAFKA_TIMEOUT:-90}"
HEAP_OPTS="${GANGWATCH_KAFKA_HEAP_OPTS:--Xms256m -Xmx768m}"
# the probe's Python: $PYTHON, else the checkout's .venv (what ./gw makes), else python3 (check_prereqs says what to do)
VENV_PYTHON="$(cd "$HERE/../.." && pwd)/.venv/bin/python"
PYTHON_GIVEN="${PYTHON:-}"
PYTHON="${PYTHON:-$(if [[ -x "$VENV_PYTHON" ]]; then echo "$VENV_PYTHON"; else echo python3; fi)}"

PID_FILE="$RUN_DIR/broker.pid"
PROPS="$RUN_DIR/server.properties"
LOG4J="$RUN_DIR/log4j2.properties"
LOG_DIR="$RUN_DIR/logs"
DATA_DIR="$RUN_DIR/data"
LOG="$LOG_DIR/server.log"   # log4j output
OUT="$LOG_DIR/broker.out"   # JVM stdout/stderr (crashes before log4j is up)
STAMP="$RUN_DIR/formatted-for"

usage() {
  cat <<EOF
Usage: $(basename "$0") start|stop|status|logs [-h|--help]

Real Kafka 4.x broker (KRaft, broker+controller in one JVM) on 127.0.0.1.

  start   build libs if missing (mvn), format storage once, start the broker
          in the background and wait until a real probe passes (describe
          cluster, create topic, produce, consume via a throw-away group).
          If a healthy broker is already running, say so and exit 0.
  stop    TERM, wait up to 20 s, then KILL. Safe to repeat.
  status  exit 0 if the broker runs and the probe passes, 1 otherwise.
  logs    print the last 100 lines of the broker log (LINES=n to change).

Topic auto-creation is DISABLED (auto.create.topics.enable=false): create the
topics you need (tests do; Faust never creates source topics either).

Environment:
  GANGWATCH_KAFKA_DIR              run dir: config, data, logs, pid  [$RUN_DIR]
  GANGWATCH_KAFKA_PORT             PLAINTEXT listener port            [$PORT]
  GANGWATCH_KAFKA_CONTROLLER_PORT  KRaft controller port              [$CONTROLLER_PORT]
  GANGWATCH_KAFKA_TIMEOUT          seconds to wait for readiness      [$READY_TIMEOUT]
  GANGWATCH_KAFKA_HEAP_OPTS        JVM heap flags                     [$HEAP_OPTS]
  GANGWATCH_KAFKA_EXTRA_CONFIG     a file of server.properties lines appended to the generated ones
                                   (a later key wins: e.g. add a SASL_SSL listener to listeners=,
                                   advertised.listeners= and listener.security.protocol.map=; the
                                   PLAINTEXT listener must stay, the readiness probe uses it)
                                   [${GANGWATCH_KAFKA_EXTRA_CONFIG:-none}]
  JAVA_HOME                        java (>= 17)                       [${JAVA_HOME:-java on the PATH}]
  PYTHON                           a Python with kafka-python (probe) [$PYTHON]

Data survives stop/start; wipe it with: $(basename "$0") stop && rm -rf "$RUN_DIR"
EOF
}

die() { echo "kafka: error: $*" >&2; exit 1; }
say() { echo "kafka: $*"; }
# shellcheck source=../lib.sh
source "$HERE/../lib.sh"

java_bin() {
  if [[ -n "${JAVA_HOME:-}" ]]; then echo "$JAVA_HOME/bin/java"; else command -v java || true; fi
}

# --- process bookkeeping -----------------------------------------------------

# Prints the pid if the pid file names a live broker of THIS run dir.
running_pid() {
  [[ -f "$PID_FILE" ]] || return 1
  local pid; pid="$(cat "$PID_FILE" 2>/dev/null || true)"
  [[ "$pid" =~ ^[0-9]+$ ]] || return 1
  # guard against pid reuse: the command line must be our broker
  if tr "\\0" " " 2>/dev/null < "/proc/$pid/cmdline" | grep -qF "kafka.Kafka $PROPS"; then
    echo "$pid"
  else
    return 1
  fi
}

port_in_use() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

show_log_tail() {
  local f
  for f in "$OUT" "$LOG"; do
    [[ -s "$f" ]] || continue
    echo "----- last 40 lines of $f -----" >&2
    tail -n 40 "$f" >&2
  done
}

# Seconds (one decimal) since a `date +%s%N` timestamp.
since() { awk -v a="$1" -v b="$(date +%s%N)" 'BEGIN { printf "%.1f", (b - a) / 1e9 }'; }

# One probe attempt: probe <seconds> [probe.py flags]. `timeout` is a backstop
# in case a client call hangs past --timeout.
probe() {
  local t="$1"; shift
  local guard=(); command -v timeout > /dev/null && guard=(timeout $((t + 15)))
  "${guard[@]}" "$PYTHON" "$HERE/probe.py" --bootstrap "127.0.0.1:$PORT" --timeout "$t" "$@"
}

# --- setup -------------------------------------------------------------------

# Kafka version pinned in pom.xml (<kafka.version>).
pom_version() { sed -n 's|.*<kafka.version>\(.*\)</kafka.version>.*|\1|p' "$HERE/pom.xml" | head -n1; }

# (Re)build libs when missing or when pom.xml pins another Kafka version;
# copy-dependencies never deletes old jars, so a stale libs dir is wiped first.
ensure_libs() {
  local want; want="$(pom_version)"
  [[ -f "$LIBS/kafka_2.13-$want.jar" ]] && return 0
  command -v mvn > /dev/null || die "$LIBS lacks kafka_2.13-$want.jar and mvn is not installed (apt-get install maven)"
  [[ -d "$LIBS" ]] && { say "libs do not match pom.xml (Kafka $want); rebuilding"; rm -rf "$LIBS"; }
  say "building $LIBS with Maven (needs Maven Central; ~/.m2 caches it)..."
  # output goes to a file: quiet mvn still prints bare ANSI reset codes
  (cd "$HERE" && mvn -B -q package) > "$RUN_DIR/mvn.log" 2>&1 \
    || { tail -n 40 "$RUN_DIR/mvn.log" >&2; die "mvn package failed in $HERE (log $RUN_DIR/mvn.log)"; }
  [[ -f "$LIBS/kafka_2.13-$want.jar" ]] || die "mvn ran but $LIBS has no kafka_2.13-$want.jar"
}

check_prereqs() {
  say "readiness probe's Python: $PYTHON$([[ -n "${PYTHON_GIVEN:-}" ]] && echo " (\$PYTHON)" || { [[ "$PYTHON" == "$VENV_PYTHON" ]] && echo " (the checkout's .venv)" || echo " (no .venv in the checkout, no \$PYTHON: the one on the PATH)"; })"
  "$PYTHON" -c 'import kafka' 2>/dev/null || die "$PYTHON cannot import kafka-python (the readiness probe needs it): run ./gw up from the checkout (it makes .venv with it), or set PYTHON to a Python that has it (pip install kafka-python)"
  local java; java="$(java_bin)"
  [[ -x "$java" ]] || die "java not found (Kafka 4.x needs Java >= 17; set JAVA_HOME or apt-get install openjdk-17-jre-headless)"
  local major
  major="$("$java" -version 2>&1 | sed -n 's/.*version "\([0-9]*\).*/\1/p' | head -n1)"
  [[ -n "$major" && "$major" -ge 17 ]] || die "Kafka 4.x needs Java >= 17, $java is version ${major:-unknown}"
}

kafka_version() {
  local jar; jar="$(compgen -G "$LIBS/kafka_2.13-*.jar" | head -n1)"
  jar="${jar##*/kafka_2.13-}"; echo "${jar%.jar}"
}

write_config() {
  mkdir -p "$LOG_DIR" "$DATA_DIR"
  cat > "$PROPS" <<EOF
# Generated by deploy/kafka/broker.sh; rewritten on every start.
process.roles=broker,controller
node.id=1
controller.quorum.bootstrap.servers=127.0.0.1:$CONTROLLER_PORT
controller.listener.names=CONTROLLER
listeners=PLAINTEXT://127.0.0.1:$PORT,CONTROLLER://127.0.0.1:$CONTROLLER_PORT
advertised.listeners=PLAINTEXT://127.0.0.1:$PORT,CONTROLLER://127.0.0.1:$CONTROLLER_PORT
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT
log.dirs=$DATA_DIR
num.partitions=1
# one node: every internal topic has a single replica
offsets.topic.replication.factor=1
offsets.topic.num.partitions=1
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
transaction.state.log.num.partitions=1
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
share.coordinator.state.topic.num.partitions=1
# fast consumer-group joins and short test sessions
group.initial.rebalance.delay.ms=0
group.min.session.timeout.ms=1000
# tests create their topics explicitly
auto.create.topics.enable=false
EOF
  if [[ -n "${GANGWATCH_KAFKA_EXTRA_CONFIG:-}" ]]; then
    [[ -r "$GANGWATCH_KAFKA_EXTRA_CONFIG" ]] || die "GANGWATCH_KAFKA_EXTRA_CONFIG=$GANGWATCH_KAFKA_EXTRA_CONFIG is not a readable file"
    { echo "# from GANGWATCH_KAFKA_EXTRA_CONFIG=$GANGWATCH_KAFKA_EXTRA_CONFIG"; cat "$GANGWATCH_KAFKA_EXTRA_CONFIG"; } >> "$PROPS"
  fi
  cat > "$LOG4J" <<'EOF'
# Generated by deploy/kafka/broker.sh. ${sys:kafka.logs.dir} is set on the java command line.
status = warn
appender.file.type = RollingFile
appender.file.name = FILE
appender.file.fileName = ${sys:kafka.logs.dir}/server.log
appender.file.filePattern = ${sys:kafka.logs.dir}/server.log.%i
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
appender.file.policies.type = Policies
appender.file.policies.size.type = SizeBasedTriggeringPolicy
appender.file.policies.size.size = 50MB
appender.file.strategy.type = DefaultRolloverStrategy
appender.file.strategy.max = 3
rootLogger.level = INFO
rootLogger.appenderRef.file.ref = FILE
# per-request chatter is useless in tests
logger.request.name = kafka.request.logger
logger.request.level = WARN
logger.state.name = state.change.logger
logger.state.level = WARN
EOF
}

# KRaft storage is formatted once per run dir. --standalone records this node
# (and its controller endpoint) as the only voter, so a changed controller port
# needs a fresh run dir.
format_storage() {
  if [[ -f "$DATA_DIR/meta.properties" ]]; then
    local was; was="$(cat "$STAMP" 2>/dev/null || true)"
    [[ -z "$was" || "$was" == "$CONTROLLER_PORT" ]] || die "storage in $DATA_DIR was formatted for controller port $was, not $CONTROLLER_PORT; use another GANGWATCH_KAFKA_DIR or rm -rf $RUN_DIR"
    return 0
  fi
  local java cid; java="$(java_bin)"
  cid="$("$java" -cp "$LIBS/*" kafka.tools.StorageTool random-uuid 2>>"$OUT")" || die "StorageTool random-uuid failed (see $OUT)"
  "$java" -Dlog4j2.configurationFile="$LOG4J" -Dkafka.logs.dir="$LOG_DIR" -cp "$LIBS/*" \
    kafka.tools.StorageTool format --standalone -t "$cid" -c "$PROPS" >>"$OUT" 2>&1 \
    || { show_log_tail; die "StorageTool format failed"; }
  echo "$CONTROLLER_PORT" > "$STAMP"
  say "formatted $DATA_DIR (cluster id $cid)"
}

launch() {
  local java; java="$(java_bin)"
  # setsid: the broker outlives this shell and ignores the caller's Ctrl-C.
  # The inner shell writes its own pid and then execs java, so the pid is exact.
  # shellcheck disable=SC2086,SC2016  # HEAP_OPTS is a list of flags; $$ is for the inner shell
  setsid bash -c 'echo $$ > "$0"; exec "$@"' "$PID_FILE" \
    "$java" $HEAP_OPTS -XX:+UseG1GC -XX:MaxGCPauseMillis=20 \
    -XX:+ExitOnOutOfMemoryError -Djava.awt.headless=true \
    -Dlog4j2.configurationFile="$LOG4J" -Dkafka.logs.dir="$LOG_DIR" \
    -cp "$LIBS/*" kafka.Kafka "$PROPS" \
    >>"$OUT" 2>&1 < /dev/null 9>&- &   # 9>&-: the broker must not inherit the start lock
  for _ in $(seq 50); do [[ -s "$PID_FILE" ]] && return 0; sleep 0.1; done
  die "broker did not write $PID_FILE"
}

# Probe until it passes, the JVM dies, or the deadline passes.
wait_ready() {
  local deadline=$((SECONDS + READY_TIMEOUT)) rc
  while :; do
    rc=0; probe 20 --quiet 2>>"$LOG_DIR/probe.err" || rc=$?
    [[ $rc -eq 0 ]] && return 0
    [[ $rc -eq 2 ]] && die "probe cannot run (see $LOG_DIR/probe.err)"
    running_pid > /dev/null || { show_log_tail; die "broker process exited during startup"; }
    if (( SECONDS >= deadline )); then
      tail -n 5 "$LOG_DIR/probe.err" >&2 || true
      show_log_tail
      die "broker not ready after ${READY_TIMEOUT}s (still running; '$0 stop' to kill it)"
    fi
    sleep 0.5
  done
}

# --- commands ----------------------------------------------------------------

cmd_start() {
  mkdir -p "$RUN_DIR"
  local t0 pid launch_ns p
  t0=$(date +%s%N)
  if pid="$(running_pid)"; then
    wait_ready
    say "already running and healthy (pid $pid, 127.0.0.1:$PORT)"
    return 0
  fi
  rm -f "$PID_FILE"
  check_prereqs
  ensure_libs
  for p in "$PORT" "$CONTROLLER_PORT"; do
    port_in_use "$p" && die "port $p on 127.0.0.1 is taken by another process (not our broker; set GANGWATCH_KAFKA_PORT / GANGWATCH_KAFKA_CONTROLLER_PORT)"
  done
  write_config
  format_storage
  launch_ns=$(date +%s%N)
  launch
  wait_ready
  say "Kafka $(kafka_version) ready on 127.0.0.1:$PORT (pid $(cat "$PID_FILE")): $(since "$launch_ns")s from launch, $(since "$t0")s in total"
  say "log: $LOG"
}

cmd_status() {
  local pid
  pid="$(running_pid)" || { say "not running"; return 1; }
  if probe 15; then
    say "running (pid $pid, Kafka $(kafka_version), 127.0.0.1:$PORT, log $LOG)"
  else
    say "process $pid is up but the probe fails (log $LOG)"
    return 1
  fi
}

cmd_logs() { [[ -f "$LOG" ]] || die "no log at $LOG"; tail -n "${LINES:-100}" "$LOG"; }

# Serialise start/stop so parallel CI steps cannot start two brokers.
with_lock() {
  mkdir -p "$RUN_DIR"
  if command -v flock > /dev/null; then
    exec 9>"$RUN_DIR/.lock"
    flock -w 180 9 || die "another start/stop holds $RUN_DIR/.lock for over 180 s"
  fi
  "$@"
}

main() {
  case "${1:-}" in
    start)  with_lock cmd_start ;;
    stop)   with_lock cmd_stop ;;
    status) cmd_status ;;
    logs)   cmd_logs ;;
    -h|--help|help) usage ;;
    "") usage >&2; exit 2 ;;
    *) echo "kafka: unknown command '$1'" >&2; usage >&2; exit 2 ;;
  esac
}

main "$@"
