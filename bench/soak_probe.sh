#!/usr/bin/env bash
# Persistent-mode idle-RSS probe for bench/soak.sh's persistent check: 4 stretches of SEG seconds
# of the soak's load (run bench/soak.sh once first: it builds the client and the worker), the
# wrapper's RSS read at once, 1 s and 10 s after each (past the lingering read's 5 s idle bound),
# and its in-flight gauges. BIN picks another build (e.g. an older commit's) to compare with.
#
#   SEG=15 bash bench/soak_probe.sh
#   BIN=/path/to/old/runr-wrapper bash bench/soak_probe.sh
set -euo pipefail
cd "$(dirname "$0")/.."

BIN=${BIN:-target/x86_64-unknown-linux-musl/release/runr-wrapper}; CLIENT=target/release/examples/soak_client
OUT=bench/out/soak
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
mport=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
env PORT=$port RUNR_METRICS_PORT=$mport RUNR_LOG=warn RUNR_WRAPPER_MODE=persistent RUNR_COMMAND=$PWD/$OUT/stress_worker RUNR_WORKERS=16 RUNR_TIMEOUT=3 "$BIN" 2>"$OUT/probe-wrapper.log" &
pid=$!
for _ in $(seq 200); do curl -s -o /dev/null http://127.0.0.1:$port/answer/0/1 && break; sleep 0.05; done
rss() { awk '/^VmRSS/ {print $2}' /proc/$pid/status; }
g() { curl -s http://127.0.0.1:$mport/metrics | grep -E '^runr_(inflight_bytes|in_?flight)' | tr '\n' ' '; }
echo "start rss=$(rss)"
for seg in 1 2 3 4; do
  "$CLIENT" 127.0.0.1:$port persistent ${SEG:-15} 64 3 >"$OUT/probe-r$seg" 2>/dev/null
  a=$(rss); sleep 1; b=$(rss); sleep 9; c=$(rss)
  echo "seg $seg: $(cat "$OUT/probe-r$seg" | cut -c1-60) rss now=$a +1s=$b +10s=$c $(g)"
done
kill "$pid"; wait "$pid" || true
