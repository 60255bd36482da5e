#!/usr/bin/env bash
# Builds runr-wrapper, runs it in exec mode on examples/hello.sh, sends it one request with
# curl, prints the answer and stops the wrapper (SIGTERM: it drains and exits 0).
set -euo pipefail
cd "$(dirname "$0")/.."

cargo build --quiet -p runr-wrapper
log=$(mktemp)
trap 'kill "$pid" 2>/dev/null || true; rm -f "$log"' EXIT

# PORT=0: the wrapper binds a free port and logs it ("listening addr=0.0.0.0:NNNNN").
PORT=0 RUNR_WRAPPER_MODE=exec RUNR_COMMAND='["bash", "examples/hello.sh"]' \
  target/debug/runr-wrapper 2>"$log" &
pid=$!
port=
for _ in $(seq 100); do
  port=$(sed -n 's/.*listening addr=[0-9.]*:\([0-9]*\).*/\1/p' "$log")
  [ -n "$port" ] && break
  kill -0 "$pid" 2>/dev/null || { cat "$log" >&2; exit 1; }
  sleep 0.05
done
[ -n "$port" ] || { echo "the wrapper did not start:" >&2; cat "$log" >&2; exit 1; }

echo "\$ curl -s 'http://127.0.0.1:$port/greet?name=RunR'"
curl -s --max-time 10 "http://127.0.0.1:$port/greet?name=RunR"

kill -TERM "$pid"
wait "$pid"
echo "--- wrapper log ---"
cat "$log"
