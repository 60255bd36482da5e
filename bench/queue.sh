#!/usr/bin/env bash
# runr-queue benchmark, loopback only. Prints one table, side by side:
#   runr-queue delivering ENTRIES stream entries into runr-wrapper (persistent mode, a compiled C
#   echo worker) | the floor: the same XREADGROUP/XACK work without HTTP (queue/examples/bench_floor.rs)
# Per run: entries per second end to end (consumer start until every entry is acknowledged),
# the consumer's CPU per entry (user + system, from /proc), its peak RSS (VmHWM); for the queue
# run also the wrapper's CPU per entry. The entries are loaded before the consumer starts (the
# group is created at 0), so the figure is the drain rate of a backlog.
# The cost of observation, in the same run: ROUNDS rounds, each running the consumer plain, with
# RUNR_QUEUE_METRICS_PORT, and with the metrics and the OTLP export of every delivery span to a
# collector stand-in (python3, answers 200), interleaved so a busy machine slows all three alike;
# reported as each variant's median and the median of its per-round ratio to the plain run.
#
#   bash bench/queue.sh          # ENTRIES=20000 CONCURRENCY=64 WORKERS=4 BODY=100 (bytes per entry) ROUNDS=3
set -euo pipefail
cd "$(dirname "$0")/.."

ENTRIES=${ENTRIES:-20000}
CONCURRENCY=${CONCURRENCY:-64}
WORKERS=${WORKERS:-4}
BODY=${BODY:-100}
ROUNDS=${ROUNDS:-3}
TARGET=x86_64-unknown-linux-musl
OUT=$PWD/bench/out/queue
mkdir -p "$OUT"
LOAD_BEFORE=$(cut -d' ' -f1-3 /proc/loadavg)

for tool in redis-server redis-cli cc python3 /usr/bin/time; do
  command -v "$tool" >/dev/null || { echo "bench needs $tool (apt-get install redis-server gcc python3 time)" >&2; exit 1; }
done

echo "building (release, $TARGET) ..." >&2
export CC_x86_64_unknown_linux_musl=${CC_x86_64_unknown_linux_musl:-musl-gcc}
cargo build --quiet --release --target "$TARGET" -p runr-queue --bin runr-queue --example bench_floor
cargo build --quiet --release --target "$TARGET" -p runr-wrapper --bin runr-wrapper
QUEUE=target/$TARGET/release/runr-queue
FLOOR=target/$TARGET/release/examples/bench_floor
WRAPPER=target/$TARGET/release/runr-wrapper
cc -O2 -o "$OUT/echo_worker" examples/c/echo_worker.c

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
clk=$(getconf CLK_TCK)
ticks() { awk '{ s = $0; sub(/.*\) /, "", s); split(s, f, " "); print f[12] + f[13] }' "/proc/$1/stat"; }
# A process tree's ticks: the wrapper and its live workers.
tree_ticks() {
  local pid=$1 total kid
  total=$(ticks "$pid")
  for kid in $(cat /proc/"$pid"/task/*/children 2>/dev/null); do
    total=$((total + $(ticks "$kid" 2>/dev/null || echo 0)))
  done
  echo "$total"
}

PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
}
trap cleanup EXIT

RPORT=$(free_port)
redis-server --port "$RPORT" --bind 127.0.0.1 --save '' --appendonly no --protected-mode no \
  --dir "$OUT" --logfile "$OUT/redis.log" --daemonize no &
PIDS+=($!)
R() { redis-cli -p "$RPORT" "$@"; }
for _ in $(seq 100); do R ping >/dev/null 2>&1 && break; sleep 0.05; done
R ping >/dev/null || { echo "redis-server did not start:" >&2; cat "$OUT/redis.log" >&2; exit 1; }

WPORT=$(free_port)
PORT=$WPORT RUNR_LOG=warn RUNR_WRAPPER_MODE=persistent RUNR_WORKERS="$WORKERS" RUNR_TRIGGER=queue \
  RUNR_COMMAND="$OUT/echo_worker" "$WRAPPER" 2>"$OUT/wrapper.log" &
WPID=$!
PIDS+=("$WPID")
for _ in $(seq 200); do
  python3 -c "import socket,sys; socket.create_connection(('127.0.0.1', $WPORT), 0.2)" 2>/dev/null && break
  sleep 0.025
done

# ENTRIES entries of BODY bytes, through redis-cli --pipe (the Redis protocol, generated once).
load() { # stream
  R DEL "$1" >/dev/null
  python3 - "$1" "$ENTRIES" "$BODY" >"$OUT/load.resp" <<'EOF'
import sys
stream, n, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
out = sys.stdout.buffer
def cmd(*args):
    out.write(b"*%d\r\n" % len(args))
    for a in args:
        a = a.encode() if isinstance(a, str) else a
        out.write(b"$%d\r\n%s\r\n" % (len(a), a))
payload = b"x" * size
for i in range(n):
    cmd("XADD", stream, "*", "n", str(i), "msg", payload)
EOF
  R --pipe <"$OUT/load.resp" >/dev/null
  R XGROUP CREATE "$1" bench 0 >/dev/null
}

# Waits until the group has read and acknowledged every entry.
drained() { # stream
  local info read pending
  info=$(R XINFO GROUPS "$1")
  read=$(awk 'prev == "entries-read" { print; exit } { prev = $0 }' <<<"$info")
  pending=$(awk 'prev == "pending" { print; exit } { prev = $0 }' <<<"$info")
  [ "${read:-0}" = "$ENTRIES" ] && [ "${pending:-1}" = 0 ]
}

declare -A RATE CPU RSS
measure() { # name stream command...
  local name=$1 stream=$2 pid t0 t1 c0 c1 w0 w1
  shift 2
  load "$stream"
  w0=$(tree_ticks "$WPID")
  t0=$(date +%s%N)
  env RUNR_QUEUE_REDIS_URL="redis://127.0.0.1:$RPORT" RUNR_QUEUE_STREAM="$stream" RUNR_QUEUE_GROUP=bench \
    RUNR_QUEUE_CONSUMER=bench RUNR_QUEUE_TARGET="http://127.0.0.1:$WPORT/" \
    RUNR_QUEUE_CONCURRENCY="$CONCURRENCY" RUNR_QUEUE_LOG=warn "$@" 2>"$OUT/$name.log" &
  pid=$!
  PIDS+=("$pid")
  c0=$(ticks "$pid")
  until drained "$stream"; do
    kill -0 "$pid" 2>/dev/null || { echo "$name exited:" >&2; cat "$OUT/$name.log" >&2; exit 1; }
    sleep 0.02
  done
  t1=$(date +%s%N)
  c1=$(ticks "$pid")
  RSS[$name]=$(awk '/VmHWM/ { printf "%.1f", $2 / 1024 }' /proc/"$pid"/status)
  kill -TERM "$pid"
  wait "$pid" 2>/dev/null || true
  w1=$(tree_ticks "$WPID")
  RATE[$name]=$(awk -v n="$ENTRIES" -v ns=$((t1 - t0)) 'BEGIN { printf "%.0f", n / (ns / 1e9) }')
  CPU[$name]=$(awk -v t=$((c1 - c0)) -v n="$ENTRIES" -v k="$clk" 'BEGIN { printf "%.1f", t / k / n * 1e6 }')
  CPU[$name.wrapper]=$(awk -v t=$((w1 - w0)) -v n="$ENTRIES" -v k="$clk" 'BEGIN { printf "%.1f", t / k / n * 1e6 }')
}

# The collector stand-in: reads each export and answers 200 (what the exporter waits for).
CPORT=$(free_port)
python3 - "$CPORT" <<'EOF' 2>"$OUT/collector.log" &
import http.server, sys
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def log_message(self, *a):
        pass
    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")
http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
EOF
PIDS+=($!)

VARIANTS=(plain metrics otlp)
declare -A RATES CPUS
for round in $(seq "$ROUNDS"); do
  for v in "${VARIANTS[@]}"; do
    echo "round $round: runr-queue ($v) -> runr-wrapper (persistent, $WORKERS echo workers) ..." >&2
    case $v in
      plain) measure "$v" "bench-$v" "$QUEUE" ;;
      metrics) measure "$v" "bench-$v" RUNR_QUEUE_METRICS_PORT=0 "$QUEUE" ;;
      otlp) measure "$v" "bench-$v" RUNR_QUEUE_METRICS_PORT=0 \
        OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:$CPORT" "$QUEUE" ;;
    esac
    RATES[$v]="${RATES[$v]:-} ${RATE[$v]}"
    CPUS[$v]="${CPUS[$v]:-} ${CPU[$v]}"
    if [ "$round" = 1 ] && [ "$v" = plain ]; then
      RATE[queue]=${RATE[plain]} CPU[queue]=${CPU[plain]} RSS[queue]=${RSS[plain]}
      CPU[queue.wrapper]=${CPU[plain.wrapper]}
    fi
  done
done
median() { tr ' ' '\n' | grep -v '^$' | sort -g | awk '{ a[NR] = $1 } END { print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2 }'; }
ratios() { # variant: its rate over the plain run's, per round
  paste -d' ' <(tr ' ' '\n' <<<"${RATES[$1]}" | grep -v '^$') <(tr ' ' '\n' <<<"${RATES[plain]}" | grep -v '^$') |
    awk '{ printf "%.3f ", $1 / $2 }'
}

echo "floor: XREADGROUP/XACK without HTTP ..." >&2
# The floor exits once it acknowledged every entry; GNU time reports its CPU and peak RSS.
load bench-floor
t0=$(date +%s%N)
env RUNR_QUEUE_REDIS_URL="redis://127.0.0.1:$RPORT" RUNR_QUEUE_STREAM=bench-floor RUNR_QUEUE_GROUP=bench \
  RUNR_QUEUE_CONSUMER=bench RUNR_QUEUE_TARGET="http://127.0.0.1:$WPORT/" RUNR_QUEUE_CONCURRENCY="$CONCURRENCY" \
  /usr/bin/time -f '%U %S %M' -o "$OUT/floor.time" "$FLOOR" "$ENTRIES" 2>"$OUT/floor.log"
t1=$(date +%s%N)
read -r fu fs fm <"$OUT/floor.time"
RATE[floor]=$(awk -v n="$ENTRIES" -v ns=$((t1 - t0)) 'BEGIN { printf "%.0f", n / (ns / 1e9) }')
CPU[floor]=$(awk -v u="$fu" -v s="$fs" -v n="$ENTRIES" 'BEGIN { printf "%.1f", (u + s) / n * 1e6 }')
RSS[floor]=$(awk -v m="$fm" 'BEGIN { printf "%.1f", m / 1024 }')

echo
echo "runr-queue benchmark  $(date -u +%FT%TZ)  $(nproc) cores, load before: $LOAD_BEFORE"
echo "$ENTRIES entries of $BODY bytes, RUNR_QUEUE_CONCURRENCY=$CONCURRENCY; wrapper: persistent, $WORKERS C echo workers"
printf '\n%-34s %10s %16s %14s %18s\n' run entries/s consumer_us/entry peak_rss_MiB wrapper_us/entry
printf '%-34s %10s %16s %14s %18s\n' "runr-queue -> wrapper (HTTP)" "${RATE[queue]}" "${CPU[queue]}" "${RSS[queue]}" "${CPU[queue.wrapper]}"
printf '%-34s %10s %16s %14s %18s\n' "floor: XREADGROUP/XACK, no HTTP" "${RATE[floor]}" "${CPU[floor]}" "${RSS[floor]}" "-"
echo
echo "observation cost, $ROUNDS interleaved rounds (entries/s per round; ratio to plain per round, median;"
echo "consumer CPU µs/entry per round, median):"
for v in "${VARIANTS[@]}"; do
  printf '  %-8s %-24s median %8s   ratio %s(median %s)   cpu %s(median %s)\n' "$v" "${RATES[$v]}" \
    "$(median <<<"${RATES[$v]}")" "$(ratios "$v")" "$(ratios "$v" | median)" "${CPUS[$v]# }" "$(median <<<"${CPUS[$v]}")"
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
echo
echo "targets: >= 5000 entries/s end to end, consumer peak RSS <= 16 MiB"
echo "binary: $(stat -c %s "$QUEUE" | awk '{ printf "%.2f MiB", $1 / 1048576 }') ($(file -b "$QUEUE" | grep -oE 'static(-pie)? linked' || echo 'NOT static'))"
