#!/usr/bin/env bash
# runr-wrapper soak: DURATION seconds of mixed load at CONCURRENCY clients against exec mode, then
# the same against persistent mode (WORKERS workers), on a release build. Every request is one of
# a mix whose right answer is known (wrapper/examples/soak_client.rs): outputs of random sizes up
# to 1 MiB compared byte for byte, crashes, timeouts, more than 10 MiB of output, orphans holding
# stdout, workers that exit after answering, and (from two clients) stalled bodies; clients also
# go away mid-request. Then it reports, per mode:
#   requests sent, wrong answers (status or bytes; must be 0),
#   zombies among the wrapper's descendants after the load (0),
#   leftover processes after the load (0 besides the persistent workers),
#   the wrapper's RSS, open fds and threads while idle after the first tenth of the run, after
#   its middle and at its end (the load pauses for each reading until every handler is gone):
#   flat, the end against the first reading within 10 % (RSS: or 512 KiB, whichever is more;
#   fds: exactly). The peak RSS and fds of the first, middle and last tenth are printed too, but
#   they measure the load (how many big outputs happened to be in flight at once), not a leak.
#
#   bash bench/soak.sh                 # DURATION=60 per mode (the lead's run: DURATION=600)
#   DURATION=600 CONCURRENCY=64 WORKERS=16 TIMEOUT=3 bash bench/soak.sh
set -euo pipefail
cd "$(dirname "$0")/.."

DURATION=${DURATION:-60}
CONCURRENCY=${CONCURRENCY:-64}
WORKERS=${WORKERS:-16}
TIMEOUT=${TIMEOUT:-3}
TARGET=x86_64-unknown-linux-musl
OUT=bench/out/soak
mkdir -p "$OUT"

for tool in cc curl python3; do
  command -v "$tool" >/dev/null || { echo "soak needs $tool" >&2; exit 1; }
done

echo "building (release) ..." >&2
cargo build --quiet --release --target "$TARGET" -p runr-wrapper --bin runr-wrapper
cargo build --quiet --release -p runr-wrapper --example soak_client
BIN=target/$TARGET/release/runr-wrapper
CLIENT=target/release/examples/soak_client
cc -O2 -o "$OUT/stress_handler" wrapper/tests/fixtures/stress_handler.c
cc -O2 -o "$OUT/stress_worker" wrapper/tests/fixtures/stress_worker.c

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# The descendants of $1 as "pid state" lines.
descendants() {
  python3 - "$1" <<'PY'
import os, sys
root = int(sys.argv[1])
parent, state = {}, {}
for d in os.listdir("/proc"):
    if not d.isdigit():
        continue
    try:
        s = open(f"/proc/{d}/stat").read()
    except OSError:
        continue
    rest = s[s.rindex(")") + 2:].split()
    parent[int(d)], state[int(d)] = int(rest[1]), rest[0]
for p in parent:
    q, n = parent[p], 0
    while q not in (root, 0, 1) and q in parent and n < 64:
        q, n = parent[q], n + 1
    if q == root:
        print(p, state[p])
PY
}

sample() { # pid -> "rss_kib fds threads"
  local pid=$1
  echo "$(awk '/^VmRSS/ { print $2 }' /proc/"$pid"/status) $(ls /proc/"$pid"/fd | wc -l) $(awk '/^Threads/ { print $2 }' /proc/"$pid"/status)"
}

wait_port() {
  for _ in $(seq 400); do
    curl -s -o /dev/null "http://127.0.0.1:$1/answer/0/1" && return 0
    sleep 0.025
  done
  echo "wrapper on port $1 did not come up" >&2
  return 1
}

declare -A ROW
# Waits until the wrapper's descendants are down to $2 (orphans sleep 2 s, a timed-out request's
# group is killed at once).
settle() {
  for _ in $(seq 40); do
    [ "$(descendants "$1" | wc -l)" -le "$2" ] && return 0
    sleep 0.25
  done
}

soak() { # mode command
  local mode=$1 command=$2 port pid client samples
  port=$(free_port)
  env PORT="$port" RUNR_LOG=warn RUNR_WRAPPER_MODE="$mode" RUNR_COMMAND="$command" \
    RUNR_WORKERS="$WORKERS" RUNR_TIMEOUT="$TIMEOUT" "$BIN" 2>>"$OUT/wrapper-$mode.log" &
  pid=$!
  wait_port "$port"
  local expected=0
  [ "$mode" = persistent ] && expected=$WORKERS
  samples="$OUT/samples-$mode"
  : >"$samples"
  : >"$OUT/result-$mode"
  : >"$OUT/wrong-$mode"
  # Three stretches of load: the first tenth, up to the middle, the rest; idle readings after each.
  local first=$(( DURATION / 10 > 5 ? DURATION / 10 : 5 ))
  local second=$(( DURATION / 2 - first > 5 ? DURATION / 2 - first : 5 ))
  local third=$(( DURATION - first - second > 5 ? DURATION - first - second : 5 ))
  local t=0 idle=() part
  for part in "$first" "$second" "$third"; do
    "$CLIENT" "127.0.0.1:$port" "$mode" "$part" "$CONCURRENCY" "$TIMEOUT" >>"$OUT/result-$mode" 2>>"$OUT/wrong-$mode" &
    client=$!
    while kill -0 "$client" 2>/dev/null; do
      echo "$t $(sample "$pid")" >>"$samples"
      sleep 1
      t=$((t + 1))
    done
    wait "$client"
    settle "$pid" "$expected"
    idle+=("$(sample "$pid")")
  done
  local zombies leftover
  zombies=$(descendants "$pid" | awk '$2 == "Z"' | wc -l)
  leftover=$(( $(descendants "$pid" | wc -l) - expected ))
  kill "$pid"
  wait "$pid" || true
  # first, middle and last tenth of the run: max RSS, fds and threads in each
  local windows
  windows=$(awk -v d="$t" '
    function win(t) { if (t >= 0.1 * d && t < 0.2 * d) return 1; if (t >= 0.45 * d && t < 0.55 * d) return 2; if (t >= 0.9 * d) return 3; return 0 }
    { w = win($1); if (w) { if ($2 > r[w]) r[w] = $2; if ($3 > f[w]) f[w] = $3; if ($4 > th[w]) th[w] = $4 } }
    END { printf "%d %d %d %d %d %d %d %d %d", r[1], r[2], r[3], f[1], f[2], f[3], th[1], th[2], th[3] }' "$samples")
  # The three RESULT lines summed, key by key, in the order they first appear.
  local result
  result=$(awk '{ for (i = 2; i <= NF; i++) { split($i, kv, "="); if (!(kv[1] in sum)) order[++n] = kv[1]; sum[kv[1]] += kv[2] } }
    END { printf "RESULT"; for (i = 1; i <= n; i++) printf " %s=%d", order[i], sum[order[i]]; print "" }' "$OUT/result-$mode")
  ROW[$mode]="$result zombies=$zombies leftover=$leftover windows=$windows idle=${idle[0]} ${idle[1]} ${idle[2]}"
}

echo "exec mode, ${DURATION}s ..." >&2
soak exec "$PWD/$OUT/stress_handler"
echo "persistent mode, ${DURATION}s ..." >&2
soak persistent "$PWD/$OUT/stress_worker"

echo
echo "runr-wrapper soak  $(date -u +%FT%TZ)  $(nproc) cores, load before: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "${DURATION}s per mode, $CONCURRENCY clients, RUNR_TIMEOUT=${TIMEOUT}s, persistent: $WORKERS workers"
fail=0
for mode in exec persistent; do
  row=${ROW[$mode]}
  read -r r1 r2 r3 f1 f2 f3 t1 t2 t3 <<<"$(sed 's/.*windows=//; s/ idle=.*//' <<<"$row")"
  read -r i1r i1f i1t i2r i2f i2t i3r i3f i3t <<<"$(sed 's/.*idle=//' <<<"$row")"
  requests=$(grep -o 'requests=[0-9]*' <<<"$row" | cut -d= -f2)
  wrong=$(grep -o 'wrong=[0-9]*' <<<"$row" | cut -d= -f2)
  zombies=$(grep -o 'zombies=[0-9]*' <<<"$row" | cut -d= -f2)
  leftover=$(grep -o 'leftover=-*[0-9]*' <<<"$row" | cut -d= -f2)
  kinds=$(sed 's/^RESULT requests=[0-9]* wrong=[0-9]* //; s/ zombies=.*//' <<<"$row")
  growth=$(awk -v a="$i1r" -v b="$i3r" 'BEGIN { if (a > 0) printf "%+.1f", (b - a) * 100 / a; else print "n/a" }')
  printf '\n%s: %s requests, %s wrong, %s zombies, %s leftover processes\n' "$mode" "$requests" "$wrong" "$zombies" "$leftover"
  printf '  mix: %s\n' "$kinds"
  printf '  %-24s %10s %10s %10s\n' "" first middle end
  printf '  %-24s %10s %10s %10s\n' "idle RSS KiB" "$i1r" "$i2r" "$i3r"
  printf '  %-24s %10s %10s %10s\n' "idle open fds" "$i1f" "$i2f" "$i3f"
  printf '  %-24s %10s %10s %10s\n' "idle threads" "$i1t" "$i2t" "$i3t"
  printf '  %-24s %10s %10s %10s\n' "peak RSS KiB (the load)" "$r1" "$r2" "$r3"
  printf '  %-24s %10s %10s %10s\n' "peak open fds" "$f1" "$f2" "$f3"
  printf '  %-24s %10s %10s %10s\n' "peak threads" "$t1" "$t2" "$t3"
  printf '  idle RSS at the end vs after the first tenth: %s %%\n' "$growth"
  if [ "$wrong" != 0 ] || [ "$zombies" != 0 ] || [ "$leftover" -gt 0 ]; then
    fail=1
    head -5 "$OUT/wrong-$mode" >&2
  fi
  awk -v a="$i1r" -v b="$i3r" 'BEGIN { m = a * 0.1; if (m < 512) m = 512; exit !(a > 0 && b > a + m) }' \
    && { echo "  $mode: idle RSS grew by more than 10 % (and 512 KiB)" >&2; fail=1; }
  [ "$i3f" -gt "$i1f" ] && { echo "  $mode: idle open fds grew" >&2; fail=1; }
  [ "$i3t" -gt "$i1t" ] && { echo "  $mode: idle threads grew" >&2; fail=1; }
done
exit $fail
