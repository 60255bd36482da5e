#!/usr/bin/env bash
# Observed-proxy and tick benchmark, loopback only, about 1 minute. Prints one table, side by side:
#   the observed proxy (http mode, RUNR_TRACING=1: span, traceparent, access line) in front of a
#   bare hyper echo | the same echo hit directly
# at concurrency 1, 8 and 64 (wrk, 100-byte POSTs): req/s, p50/p99 latency, the wrapper's own CPU
# per request (the upstream's CPU is not counted); then the added p50, the tick binary's time from
# start to exit against a listening server (hyperfine), and both stripped static binary sizes.
#
#   bash bench/proxy.sh            # DURATION=5 (seconds per wrk run)
#   BEFORE=/path/to/older/runr-wrapper bash bench/proxy.sh   # that binary's observed proxy too,
#                                    # in the same run, and its size
set -euo pipefail
cd "$(dirname "$0")/.."

DURATION=${DURATION:-5}
BEFORE=${BEFORE:-}
TARGET=x86_64-unknown-linux-musl
OUT=bench/out
mkdir -p "$OUT"

for tool in wrk hyperfine curl; do
  command -v "$tool" >/dev/null || { echo "bench needs $tool (apt-get install wrk hyperfine curl)" >&2; exit 1; }
done

echo "building (release, $TARGET) ..." >&2
cargo build --quiet --release --target "$TARGET" -p runr-wrapper -p runr-tick \
  --bin runr-wrapper --bin runr-tick --example bare_echo
BIN=target/$TARGET/release/runr-wrapper
TICK=target/$TARGET/release/runr-tick
BARE=target/$TARGET/release/examples/bare_echo

cat >"$OUT/proxy_post.lua" <<'LUA'
wrk.method = "POST"
wrk.body = string.rep("x", 100)
wrk.headers["Content-Type"] = "text/plain"
done = function(summary, latency, requests)
  io.write(string.format("RESULT %d %d %d %d %d\n", summary.requests, summary.duration,
    latency:percentile(50), latency:percentile(99),
    summary.errors.status + summary.errors.connect + summary.errors.read + summary.errors.write + summary.errors.timeout))
end
LUA

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
clk=$(getconf CLK_TCK)
# utime + stime of one process (not its children: the upstream's CPU is the upstream's).
ticks() { awk '{ s = $0; sub(/.*\) /, "", s); split(s, f, " "); print f[12] + f[13] }' "/proc/$1/stat"; }

wait_port() {
  for _ in $(seq 400); do
    curl -s -o /dev/null -X POST -d x "http://127.0.0.1:$1/" && return 0
    sleep 0.025
  done
  echo "server on port $1 did not come up" >&2
  return 1
}

declare -A RPS P50 P99 CPU
run() { # name port pid-whose-cpu-counts
  local name=$1 port=$2 pid=$3 c
  wait_port "$port"
  wrk -t1 -c8 -d1s -s "$OUT/proxy_post.lua" "http://127.0.0.1:$port/" >/dev/null # warm-up
  for c in 1 8 64; do
    local before after line
    before=$(ticks "$pid")
    line=$(wrk -t1 -c"$c" -d"${DURATION}s" -s "$OUT/proxy_post.lua" "http://127.0.0.1:$port/" | grep '^RESULT')
    after=$(ticks "$pid")
    read -r _ reqs dur p50 p99 errs <<<"$line"
    [ "$errs" = 0 ] || echo "warning: $name c$c had $errs errors" >&2
    RPS[$name,$c]=$(awk -v r="$reqs" -v d="$dur" 'BEGIN { printf "%.0f", r / (d / 1e6) }')
    P50[$name,$c]=$p50
    P99[$name,$c]=$p99
    CPU[$name,$c]=$(awk -v t=$((after - before)) -v r="$reqs" -v k="$clk" 'BEGIN { printf "%.1f", t / k / r * 1e6 }')
  done
}

echo "upstream alone ..." >&2
p=$(free_port)
PORT=$p "$BARE" >/dev/null 2>&1 &
pid=$!
run direct "$p" "$pid"
TICK_PORT=$p
echo "tick start to exit ..." >&2
# -N: no shell in between; PORT reaches runr-tick through hyperfine's environment.
PORT=$TICK_PORT hyperfine -N --warmup 20 --runs 300 --export-json "$OUT/tick.json" "$PWD/$TICK" >/dev/null
TICK_MEDIAN=$(python3 -c "import json; r=json.load(open('$OUT/tick.json'))['results'][0]; print('%.2f %.2f' % (r['median']*1000, r['mean']*1000))")
kill "$pid"; wait "$pid" 2>/dev/null || true

observed() { # name binary
  local p u pid
  p=$(free_port)
  u=$(free_port)
  env PORT="$p" RUNR_LOG=warn RUNR_WRAPPER_MODE=http RUNR_TRACING=1 RUNR_UPSTREAM_PORT="$u" \
    RUNR_COMMAND="$PWD/$BARE" "$2" >/dev/null 2>"$OUT/$1_access.log" &
  pid=$!
  run "$1" "$p" "$pid"
  PEAK_RSS[$1]=$(awk '/VmHWM/ { print $2 }' /proc/"$pid"/status)
  kill "$pid"; wait "$pid" 2>/dev/null || true
  LINES[$1]=$(grep -c 'trace_id=' "$OUT/$1_access.log" || true)
}
declare -A PEAK_RSS LINES
echo "observed proxy ..." >&2
observed proxy "$BIN"
NAMES="direct proxy"
if [ -n "$BEFORE" ]; then
  echo "observed proxy, $BEFORE ..." >&2
  observed before "$BEFORE"
  NAMES="direct proxy before"
fi

size() { cp "$1" "$OUT/$(basename "$1").stripped" && strip "$OUT/$(basename "$1").stripped" && stat -c %s "$OUT/$(basename "$1").stripped"; }
WSIZE=$(size "$BIN")
TSIZE=$(size "$TICK")
static() { file -b "$1" | grep -oE 'static(-pie)? linked' || echo "NOT static"; }

ms() { awk -v u="$1" 'BEGIN { printf "%.3f", u / 1000 }'; }
echo
echo "observed proxy benchmark  $(date -u +%FT%TZ)  $(nproc) cores, load before: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "wrk -t1, ${DURATION}s per cell, 100-byte POSTs; upstream: bare hyper echo (current-thread tokio)"
printf '\n%-8s %4s %10s %9s %9s %16s\n' path conc req/s p50_ms p99_ms wrapper_cpu_us/req
for name in $NAMES; do
  for c in 1 8 64; do
    cpu=${CPU[$name,$c]}
    [ "$name" = direct ] && cpu="-"
    printf '%-8s %4s %10s %9s %9s %16s\n' "$name" "$c" "${RPS[$name,$c]}" "$(ms "${P50[$name,$c]}")" \
      "$(ms "${P99[$name,$c]}")" "$cpu"
  done
done
echo
for c in 1 8 64; do
  awk -v p="${P50[proxy,$c]}" -v d="${P50[direct,$c]}" -v q="${P99[proxy,$c]}" -v e="${P99[direct,$c]}" \
    -v pr="${RPS[proxy,$c]}" -v dr="${RPS[direct,$c]}" -v c="$c" \
    'BEGIN { printf "proxy c%-2s: %+d us p50, %+d us p99, %.2fx of direct req/s\n", c, p - d, q - e, pr / dr }'
done
if [ -n "$BEFORE" ]; then
  for c in 1 8 64; do
    awk -v a="${CPU[proxy,$c]}" -v b="${CPU[before,$c]}" -v c="$c" \
      'BEGIN { printf "proxy c%-2s: wrapper CPU per request %.1f us, before %.1f us (%.2fx)\n", c, a, b, a / b }'
  done
fi
printf 'access lines written: %s; proxy peak RSS: %s KiB\n' "${LINES[proxy]}" "${PEAK_RSS[proxy]}"
read -r tmed tmean <<<"$TICK_MEDIAN"
printf 'runr-tick start to exit against a listening server: median %s ms, mean %s ms (hyperfine -N, 300 runs)\n' "$tmed" "$tmean"
printf 'runr-wrapper: %s bytes stripped (%s MiB), %s\n' "$WSIZE" "$(awk -v s="$WSIZE" 'BEGIN { printf "%.2f", s / 1048576 }')" "$(static "$BIN")"
if [ -n "$BEFORE" ]; then
  BSIZE=$(size "$BEFORE")
  printf 'runr-wrapper before: %s bytes stripped (%+d)\n' "$BSIZE" "$((WSIZE - BSIZE))"
fi
printf 'runr-tick:    %s bytes stripped (%s MiB), %s\n' "$TSIZE" "$(awk -v s="$TSIZE" 'BEGIN { printf "%.2f", s / 1048576 }')" "$(static "$TICK")"
