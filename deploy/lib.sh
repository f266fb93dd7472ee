# Shared by the service scripts under deploy/: sourced, not run. Expects `say`, `running_pid` and PID_FILE.

# stop_pid PID: TERM, wait up to 20 s (a controlled shutdown takes a few seconds), then KILL.
stop_pid() {
  local pid="$1"
  kill -TERM "$pid" 2>/dev/null || true
  for _ in $(seq 200); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  if kill -0 "$pid" 2>/dev/null; then
    say "still alive after 20 s, sending KILL"
    kill -KILL "$pid" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  fi
}

# cmd_stop: stop the service of this script if it runs; safe to repeat.
cmd_stop() {
  local pid
  if ! pid="$(running_pid)"; then
    rm -f "$PID_FILE"
    say "not running"
    return 0
  fi
  stop_pid "$pid"
  rm -f "$PID_FILE"
  say "stopped (pid $pid)"
}
