#!/usr/bin/env bash
# runr-wrapper benchmark, loopback only, about 3 minutes. Prints one table, side by side:
#   exec mode with `cat` (RUNR_INPUT=raw) | persistent mode with a compiled echo worker |
#   lambda mode with a compiled lambda_runtime echo function (wrapper/tests/fixtures/lambda-rust)
#   | the same persistent mode with the metrics endpoint and JSON logs on (RUNR_METRICS_PORT,
#   RUNR_LOG_FORMAT=json), and with the per-invocation line too (RUNR_LOG_INVOCATIONS=1) |
#   the same echo served by bare hyper (no wrapper)
# at concurrency 1, 8 and 64 (wrk, 100-byte POSTs): req/s, p50/p99 latency, CPU per request
# (the server's process tree: wrapper + reaped children + live workers, and the wrapper
# process alone); lambda mode's req/s against persistent mode's (target: >= 0.8x); then exec mode's CPU
# per request against two floors in C (posix_spawn+pipe+wait of `cat`: bench/spawn_floor.c;
# fork+execve+waitpid of `cat`: bench/fork_exec_cat.c), the peak RSS of 64 concurrent 9 MiB
# requests in both input modes (and with RUNR_MAX_INFLIGHT=8), idle RSS, stripped static binary
# size and the time from exec to the first answered request.
#
#   bash bench/wrapper.sh            # DURATION=5 (seconds per wrk run), WORKERS=4
#   BEFORE=/path/to/older/runr-wrapper bash bench/wrapper.sh   # peak RSS of that binary too,
#                                    # exec and persistent mode with it (what always-on parts
#                                    # cost), and its system calls per exec request
set -euo pipefail
cd "$(dirname "$0")/.."

DURATION=${DURATION:-5}
WORKERS=${WORKERS:-4}
BEFORE=${BEFORE:-}
TARGET=x86_64-unknown-linux-musl
OUT=bench/out
mkdir -p "$OUT"

for tool in wrk cc curl; do
  command -v "$tool" >/dev/null || { echo "bench needs $tool (apt-get install wrk gcc curl)" >&2; exit 1; }
done

echo "building (release, $TARGET) ..." >&2
cargo build --quiet --release --target "$TARGET" -p runr-wrapper --bin runr-wrapper --example bare_echo
BIN=target/$TARGET/release/runr-wrapper
BARE=target/$TARGET/release/examples/bare_echo
# The Lambda function the tests use, built the same way (its own workspace and lock file).
cargo build --quiet --release --locked --manifest-path wrapper/tests/fixtures/lambda-rust/Cargo.toml \
  --target-dir target/tmp/lambda-rust
LAMBDA_FN=$PWD/target/tmp/lambda-rust/release/lambda-rust-fixture
cc -O2 -o "$OUT/echo_worker" examples/c/echo_worker.c
cc -O2 -o "$OUT/spawn_floor" bench/spawn_floor.c
cc -O2 -o "$OUT/fork_exec_cat" bench/fork_exec_cat.c
cc -O2 -o "$OUT/stress_handler" wrapper/tests/fixtures/stress_handler.c
cc -O2 -o "$OUT/first_answer" bench/first_answer.c

cat >"$OUT/post.lua" <<'EOF'
wrk.method = "POST"
wrk.body = string.rep("x", 100)
wrk.headers["Content-Type"] = "text/plain"
done = function(summary, latency, requests)
  io.write(string.format("RESULT %d %d %d %d %d\n", summary.requests, summary.duration,
    latency:percentile(50), latency:percentile(99),
    summary.errors.status + summary.errors.connect + summary.errors.read + summary.errors.write + summary.errors.timeout))
end
EOF

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
clk=$(getconf CLK_TCK)

# CPU ticks of a process tree: the process (+ its reaped children) and its live children.
tree_ticks() {
  local pid=$1 total=0 kid
  total=$(awk '{ s = $0; sub(/.*\) /, "", s); split(s, f, " "); print f[12] + f[13] + f[14] + f[15] }' "/proc/$pid/stat")
  for kid in $(cat /proc/"$pid"/task/*/children 2>/dev/null); do
    total=$((total + $(awk '{ s = $0; sub(/.*\) /, "", s); split(s, f, " "); print f[12] + f[13] }' "/proc/$kid/stat" 2>/dev/null || echo 0)))
  done
  echo "$total"
}

# CPU ticks of the process itself (utime + stime), children left out.
self_ticks() {
  awk '{ s = $0; sub(/.*\) /, "", s); split(s, f, " "); print f[12] + f[13] }' "/proc/$1/stat"
}

wait_port() {
  for _ in $(seq 400); do
    curl -s -o /dev/null -X POST -d x "http://127.0.0.1:$1/" && return 0
    sleep 0.025
  done
  echo "server on port $1 did not come up" >&2
  return 1
}

declare -A RPS P50 P99 CPU SELF
run() { # name port pid
  local name=$1 port=$2 pid=$3 c
  wait_port "$port"
  wrk -t1 -c8 -d1s -s "$OUT/post.lua" "http://127.0.0.1:$port/" >/dev/null # warm-up
  for c in 1 8 64; do
    local before after line self_before self_after
    before=$(tree_ticks "$pid")
    self_before=$(self_ticks "$pid")
    line=$(wrk -t1 -c"$c" -d"${DURATION}s" -s "$OUT/post.lua" "http://127.0.0.1:$port/" | grep '^RESULT')
    after=$(tree_ticks "$pid")
    self_after=$(self_ticks "$pid")
    read -r _ reqs dur p50 p99 errs <<<"$line"
    [ "$errs" = 0 ] || echo "warning: $name c$c had $errs errors" >&2
    RPS[$name,$c]=$(awk -v r="$reqs" -v d="$dur" 'BEGIN { printf "%.0f", r / (d / 1e6) }')
    P50[$name,$c]=$p50
    P99[$name,$c]=$p99
    CPU[$name,$c]=$(awk -v t=$((after - before)) -v r="$reqs" -v k="$clk" 'BEGIN { printf "%.1f", t / k / r * 1e6 }')
    SELF[$name,$c]=$(awk -v t=$((self_after - self_before)) -v r="$reqs" -v k="$clk" 'BEGIN { printf "%.1f", t / k / r * 1e6 }')
  done
}

start() { # port, then env assignments and the command; sets PID
  local port=$1
  shift
  env PORT="$port" "$@" >/dev/null 2>>"$OUT/wrapper.log" &
  PID=$!
}

: >"$OUT/wrapper.log"
echo "exec mode ..." >&2
p=$(free_port)
start "$p" RUNR_LOG=warn RUNR_WRAPPER_MODE=exec RUNR_INPUT=raw RUNR_COMMAND=cat "$BIN"
pid=$PID
sleep 0.2
IDLE_RSS=$(awk '/VmRSS/ { print $2 }' /proc/"$pid"/status)
run exec "$p" "$pid"
LOADED_RSS=$(awk '/VmHWM/ { print $2 }' /proc/"$pid"/status)
kill "$pid"; wait "$pid" || true

# System calls of the wrapper process per exec request (strace -c on it alone, not its
# children; 500 sequential keep-alive requests): a count that holds on a busy machine, where
# the CPU columns do not. Prints "total name=count ..." per request, the largest first.
syscalls_per_request() { # binary
  local p pid n=500
  command -v strace >/dev/null || { echo "no strace"; return; }
  p=$(free_port)
  env PORT="$p" RUNR_LOG=warn RUNR_WRAPPER_MODE=exec RUNR_INPUT=raw RUNR_COMMAND=cat \
    strace -c -U calls,name -o "$OUT/strace.txt" "$1" >/dev/null 2>>"$OUT/wrapper.log" &
  pid=$!
  wait_port "$p"
  python3 - "$p" "$n" <<'PY'
import http.client, sys
c = http.client.HTTPConnection("127.0.0.1", int(sys.argv[1]))
for _ in range(int(sys.argv[2])):
    c.request("POST", "/", body=b"x" * 100, headers={"Content-Type": "text/plain"})
    c.getresponse().read()
PY
  # The wrapper stops on SIGTERM, and strace then writes its counts.
  kill $(cat /proc/"$pid"/task/*/children); wait "$pid" || true
  # Start-up and the wait_port request are in the counts too: a few calls in all.
  awk -v n="$n" '$1 ~ /^[0-9]+$/ && NF == 2 && $1 / n >= 0.5 { printf "%.1f %s\n", $1 / n, $2 }' "$OUT/strace.txt" |
    sort -rn | awk '{ printf "%s%s=%s", (NR > 1 ? " " : ""), $2, $1 }'
}
echo "exec mode system calls ..." >&2
SYSCALLS=$(syscalls_per_request "$BIN")
[ -n "$BEFORE" ] && SYSCALLS_BEFORE=$(syscalls_per_request "$BEFORE")

echo "persistent mode ..." >&2
p=$(free_port)
start "$p" RUNR_LOG=warn RUNR_WRAPPER_MODE=persistent RUNR_WORKERS="$WORKERS" RUNR_COMMAND="$PWD/$OUT/echo_worker" "$BIN"
pid=$PID
run persistent "$p" "$pid"
kill "$pid"; wait "$pid" || true

echo "lambda mode ..." >&2
p=$(free_port)
start "$p" RUNR_LOG=warn RUNR_WRAPPER_MODE=lambda RUNR_WORKERS="$WORKERS" RUNR_HANDLER=echo RUNR_COMMAND="$LAMBDA_FN" "$BIN"
pid=$PID
run lambda "$p" "$pid"
kill "$pid"; wait "$pid" || true

NAMES="exec persistent"
if [ -n "${BEFORE:-}" ]; then
  echo "exec mode, $BEFORE ..." >&2
  p=$(free_port)
  start "$p" RUNR_LOG=warn RUNR_WRAPPER_MODE=exec RUNR_INPUT=raw RUNR_COMMAND=cat "$BEFORE"
  pid=$PID
  run exec_before "$p" "$pid"
  kill "$pid"; wait "$pid" || true
  NAMES="exec exec_before persistent"
  echo "persistent mode, $BEFORE ..." >&2
  p=$(free_port)
  start "$p" RUNR_LOG=warn RUNR_WRAPPER_MODE=persistent RUNR_WORKERS="$WORKERS" RUNR_COMMAND="$PWD/$OUT/echo_worker" "$BEFORE"
  pid=$PID
  run before "$p" "$pid"
  kill "$pid"; wait "$pid" || true
  NAMES="$NAMES before"
fi

echo "persistent mode, metrics + json logs ..." >&2
p=$(free_port)
mp=$(free_port)
start "$p" RUNR_LOG=warn RUNR_WRAPPER_MODE=persistent RUNR_WORKERS="$WORKERS" RUNR_COMMAND="$PWD/$OUT/echo_worker" \
  RUNR_METRICS_PORT="$mp" RUNR_LOG_FORMAT=json "$BIN"
pid=$PID
run telemetry "$p" "$pid"
# The endpoint answers and counted what wrk sent (a sanity check, not a timing).
SCRAPED=$(curl -s "http://127.0.0.1:$mp/metrics" | awk '/^faas_invocations_total\{.*code="2xx"/ { print $2 }')
kill "$pid"; wait "$pid" || true

echo "persistent mode, metrics + json logs + invocation lines ..." >&2
p=$(free_port)
mp=$(free_port)
: >"$OUT/invocations.log"
env PORT="$p" RUNR_WRAPPER_MODE=persistent RUNR_WORKERS="$WORKERS" RUNR_COMMAND="$PWD/$OUT/echo_worker" \
  RUNR_METRICS_PORT="$mp" RUNR_LOG_FORMAT=json RUNR_LOG_INVOCATIONS=1 "$BIN" >/dev/null 2>>"$OUT/invocations.log" &
pid=$!
run invlines "$p" "$pid"
kill "$pid"; wait "$pid" || true

echo "bare hyper echo ..." >&2
p=$(free_port)
start "$p" "$BARE"
pid=$PID
run bare "$p" "$pid"
kill "$pid"; wait "$pid" || true

echo "spawn floor, size, start-up ..." >&2
read -r FLOOR_CPU FLOOR_WALL FLOOR_OWN <<<"$("$OUT/spawn_floor" 3000)"
read -r FORK_CPU FORK_WALL <<<"$("$OUT/fork_exec_cat" 3000)"

# Peak RSS (VmHWM) of the wrapper while 64 requests of 9 MiB are in it at once: the handlers
# wait at a gate before reading stdin, so every admitted body is held at the same moment.
head -c $((9 * 1024 * 1024)) /dev/zero | tr '\0' 'a' >"$OUT/body-9mib"
children() { cat /proc/"$1"/task/*/children 2>/dev/null | wc -w; }
peak_rss() { # binary input running [VAR=value...] -> MiB
  local bin=$1 input=$2 running=$3 p pid curls=() i
  shift 3
  p=$(free_port)
  rm -f "$OUT/gate"
  env PORT="$p" RUNR_LOG=warn RUNR_WRAPPER_MODE=exec RUNR_INPUT="$input" RUNR_TIMEOUT=300 \
    GATE="$PWD/$OUT/gate" RUNR_COMMAND="$PWD/$OUT/stress_handler" "$@" "$bin" >/dev/null 2>>"$OUT/wrapper.log" &
  pid=$!
  for _ in $(seq 400); do curl -s -o /dev/null "http://127.0.0.1:$p/answer/0/1" && break; sleep 0.025; done
  for i in $(seq 64); do
    curl -s -o /dev/null -H 'Expect:' --data-binary @"$OUT/body-9mib" "http://127.0.0.1:$p/gate" &
    curls+=($!)
  done
  for _ in $(seq 2400); do [ "$(children "$pid")" -ge "$running" ] && break; sleep 0.05; done
  touch "$OUT/gate"
  wait "${curls[@]}" || true
  awk '/VmHWM/ { printf "%.0f", $2 / 1024 }' /proc/"$pid"/status
  kill "$pid"; wait "$pid" || true
}
echo "peak RSS of 64 concurrent 9 MiB requests ..." >&2
declare -A RSS
for bin in after ${BEFORE:+before}; do
  b=$BIN
  [ "$bin" = before ] && b=$BEFORE
  RSS[$bin,json]=$(peak_rss "$b" json 64)
  RSS[$bin,raw]=$(peak_rss "$b" raw 64)
  RSS[$bin,json8]=$(peak_rss "$b" json 8 RUNR_MAX_INFLIGHT=8)
done
cp "$BIN" "$OUT/runr-wrapper.stripped" && strip "$OUT/runr-wrapper.stripped"
SIZE=$(stat -c %s "$OUT/runr-wrapper.stripped")
STATIC=$(file -b "$BIN" | grep -oE 'static(-pie)? linked' || echo "NOT static")
first_answer() { # PROBE=0|1: median of 15 starts, microseconds
  local starts=() p
  for _ in $(seq 15); do
    p=$(free_port)
    starts+=("$(env PROBE="$1" PORT="$p" RUNR_LOG=warn RUNR_WRAPPER_MODE=exec RUNR_INPUT=raw RUNR_COMMAND=cat "$OUT/first_answer" "$p" "$BIN")")
  done
  printf '%s\n' "${starts[@]}" | sort -n | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }'
}
FIRST=$(first_answer 0)
FIRST_PROBE=$(first_answer 1)

ms() { awk -v u="$1" 'BEGIN { printf "%.2f", u / 1000 }'; }
echo
echo "runr-wrapper benchmark  $(date -u +%FT%TZ)  $(nproc) cores, load before: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "wrk ${DURATION}s per cell, 100-byte POSTs; persistent: $WORKERS workers (C echo); lambda: $WORKERS runtimes (lambda_runtime echo); exec: cat (RUNR_INPUT=raw)"
printf '\n%-12s %4s %10s %9s %9s %12s %15s\n' mode conc req/s p50_ms p99_ms cpu_us/req wrapper_us/req
for name in $NAMES lambda telemetry invlines bare; do
  for c in 1 8 64; do
    printf '%-12s %4s %10s %9s %9s %12s %15s\n' "$name" "$c" "${RPS[$name,$c]}" "$(ms "${P50[$name,$c]}")" \
      "$(ms "${P99[$name,$c]}")" "${CPU[$name,$c]}" "${SELF[$name,$c]}"
  done
done
echo
printf 'spawn floor (posix_spawn+pipe+wait of cat, sequential): %s us CPU, %s us wall per spawn, %s us of it the spawner'"'"'s own\n' "$FLOOR_CPU" "$FLOOR_WALL" "$FLOOR_OWN"
printf 'fork floor (fork+execve+waitpid of cat, sequential): %s us CPU, %s us wall per spawn\n' "$FORK_CPU" "$FORK_WALL"
for c in 1 8 64; do
  awk -v e="${CPU[exec,$c]}" -v f="$FLOOR_CPU" -v k="$FORK_CPU" -v c="$c" \
    'BEGIN { printf "exec c%-2s CPU per request: %s us, %.2fx the spawn floor (target <= 1.10), %.2fx the fork floor\n", c, e, e / f, e / k }'
done
if [ -n "$BEFORE" ]; then
  for c in 1 8 64; do
    awk -v e="${CPU[exec_before,$c]}" -v f="$FLOOR_CPU" -v s="${SELF[exec_before,$c]}" -v p="${SELF[persistent,$c]}" -v c="$c" \
      'BEGIN { printf "exec c%-2s with BEFORE: %.2fx the spawn floor, wrapper CPU %.2fx persistent mode'"'"'s\n", c, e / f, s / p }'
  done
fi
for c in 1 8 64; do
  awk -v e="${SELF[exec,$c]}" -v p="${SELF[persistent,$c]}" -v c="$c" \
    -v o="$FLOOR_OWN" \
    'BEGIN { printf "exec c%-2s wrapper CPU per request: %s us, %.2fx persistent mode'"'"'s %s us (target <= 2); the spawner'"'"'s own floor alone %.2fx\n", c, e, e / p, p, o / p }'
done
printf 'exec mode, system calls of the wrapper per request: %s\n' "$SYSCALLS"
[ -n "$BEFORE" ] && printf 'exec mode, system calls per request with BEFORE:    %s\n' "$SYSCALLS_BEFORE"
printf '\npeak RSS, 64 concurrent 9 MiB requests (targets: json <= 695 MiB, raw <= 608 MiB, json with RUNR_MAX_INFLIGHT=8 <= 115 MiB)\n'
printf '%-28s %10s %10s\n' input after "${BEFORE:+before}"
for k in json raw json8; do
  label=$k
  [ "$k" = json8 ] && label="json, RUNR_MAX_INFLIGHT=8"
  printf '%-28s %6s MiB %6s\n' "$label" "${RSS[after,$k]}" "${BEFORE:+${RSS[before,$k]} MiB}"
done
for c in 1 8 64; do
  awk -v p="${P50[persistent,$c]}" -v b="${P50[bare,$c]}" -v pr="${RPS[persistent,$c]}" -v br="${RPS[bare,$c]}" -v c="$c" \
    'BEGIN { printf "persistent c%-2s: +%d us p50 over bare, %.2fx of bare req/s\n", c, p - b, pr / br }'
done
for c in 1 8 64; do
  awk -v l="${RPS[lambda,$c]}" -v p="${RPS[persistent,$c]}" -v c="$c" \
    'BEGIN { printf "lambda c%-2s: %.2fx of persistent req/s (target >= 0.80)\n", c, l / p }'
done
for c in 1 8 64; do
  awk -v t="${SELF[telemetry,$c]}" -v p="${SELF[persistent,$c]}" -v i="${SELF[invlines,$c]}" \
    -v tt="${CPU[telemetry,$c]}" -v pt="${CPU[persistent,$c]}" -v c="$c" \
    'BEGIN { printf "persistent c%-2s with metrics + json logs: %+.1f us wrapper CPU per request (target < 5; %+.1f us the whole tree), with invocation lines: %+.1f us\n", c, t - p, tt - pt, i - p }'
done
if [ -n "${BEFORE:-}" ]; then
  for c in 1 8 64; do
    awk -v p="${SELF[persistent,$c]}" -v b="${SELF[before,$c]}" -v c="$c" \
      'BEGIN { printf "persistent c%-2s, nothing set, against BEFORE: %+.1f us wrapper CPU per request\n", c, p - b }'
  done
fi
printf 'metrics endpoint after the telemetry run: faas_invocations_total{code="2xx"} = %s\n' "${SCRAPED:-none}"
printf 'idle RSS: %s KiB (peak under load: %s KiB)\n' "$IDLE_RSS" "$LOADED_RSS"
printf 'binary: %s bytes stripped (%s MiB), %s\n' "$SIZE" "$(awk -v s="$SIZE" 'BEGIN { printf "%.2f", s / 1048576 }')" "$STATIC"
printf 'exec to first answer (median of 15): %s ms for an invocation (exec mode, one cat spawn), %s ms for a Knative probe\n' \
  "$(ms "$FIRST")" "$(ms "$FIRST_PROBE")"
