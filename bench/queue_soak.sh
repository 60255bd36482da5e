#!/usr/bin/env bash
# runr-queue soak: minutes of traffic with mixed faults, then an account of every entry.
#
#   producer   XADDs RATE entries per second for DURATION seconds
#   function   runr-wrapper (exec mode) running a Bash handler that fails 20% of its invocations
#              (exit 1: 500), takes 2 s for 5% of them, and records every success
#   consumers  "steady" (never touched; its RSS and open fds are sampled at start, middle, end)
#              and "victim", killed with SIGKILL every KILL_EVERY seconds and started again under a
#              new name (its entries must be claimed by the others after RUNR_QUEUE_CLAIM_IDLE)
#   redis      stopped (SIGTERM) and started again every RESTART_EVERY seconds (append-only file,
#              fsync always: what it acknowledged survives)
# Afterwards it waits until the group has read and acknowledged everything, then reports every
# entry of the stream that was neither processed nor dead-lettered (lost: must be 0), duplicates,
# dead letters, and the steady consumer's RSS and fds. Exits 1 when anything was lost.
#
#   bash bench/queue_soak.sh     # DURATION=180 RATE=40 KILL_EVERY=25 RESTART_EVERY=45
set -euo pipefail
cd "$(dirname "$0")/.."

DURATION=${DURATION:-180}
RATE=${RATE:-40}
KILL_EVERY=${KILL_EVERY:-25}
RESTART_EVERY=${RESTART_EVERY:-45}
TARGET=x86_64-unknown-linux-musl
OUT=$PWD/bench/out/queue-soak
rm -rf "$OUT"
mkdir -p "$OUT/redis"

for tool in redis-server redis-cli python3 bash; do
  command -v "$tool" >/dev/null || { echo "soak needs $tool" >&2; exit 1; }
done

echo "building (release, $TARGET) ..." >&2
export CC_x86_64_unknown_linux_musl=${CC_x86_64_unknown_linux_musl:-musl-gcc}
cargo build --quiet --release --target "$TARGET" -p runr-queue --bin runr-queue
cargo build --quiet --release --target "$TARGET" -p runr-wrapper --bin runr-wrapper
QUEUE=$PWD/target/$TARGET/release/runr-queue
WRAPPER=$PWD/target/$TARGET/release/runr-wrapper

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  [ -n "${REDIS_PID:-}" ] && kill -9 "$REDIS_PID" 2>/dev/null || true
  wait 2>/dev/null || true
}
trap cleanup EXIT

RPORT=$(free_port)
R() { redis-cli -p "$RPORT" "$@"; }
REDIS_PID=""
redis_start() {
  redis-server --port "$RPORT" --bind 127.0.0.1 --protected-mode no --dir "$OUT/redis" \
    --appendonly yes --appendfsync always --save '' --logfile "$OUT/redis/redis.log" &
  REDIS_PID=$!
  for _ in $(seq 200); do R ping >/dev/null 2>&1 && return 0; sleep 0.05; done
  echo "redis-server did not start" >&2
  exit 1
}
redis_stop() { kill -TERM "$REDIS_PID"; wait "$REDIS_PID" 2>/dev/null || true; REDIS_PID=""; }
redis_start
R XGROUP CREATE soak soak-fn 0 MKSTREAM >/dev/null

cat >"$OUT/handler.sh" <<EOF
#!/usr/bin/env bash
set -euo pipefail
body=\$(cat)
r=\$((RANDOM % 100))
if [ \$r -lt 20 ]; then echo "failing on purpose" >&2; exit 1; fi
if [ \$r -ge 95 ]; then sleep 2; fi
printf '%s %s\n' "\$RUNR_EVENT_ID" "\$RUNR_HEADER_X_RUNR_DELIVERY_ATTEMPT" >>"$OUT/processed.log"
printf 'processed %s' "\$body"
EOF
: >"$OUT/processed.log"
WPORT=$(free_port)
PORT=$WPORT RUNR_LOG=warn RUNR_WRAPPER_MODE=exec RUNR_INPUT=raw RUNR_TRIGGER=queue RUNR_TIMEOUT=5 \
  RUNR_COMMAND="[\"bash\", \"$OUT/handler.sh\"]" "$WRAPPER" 2>"$OUT/wrapper.log" &
PIDS+=($!)

consumer() { # name
  env RUNR_QUEUE_REDIS_URL="redis://127.0.0.1:$RPORT" RUNR_QUEUE_STREAM=soak RUNR_QUEUE_GROUP=soak-fn \
    RUNR_QUEUE_CONSUMER="$1" RUNR_QUEUE_TARGET="http://127.0.0.1:$WPORT/" RUNR_QUEUE_CONCURRENCY=8 \
    RUNR_QUEUE_MAX_ATTEMPTS=5 RUNR_QUEUE_BACKOFF=100ms RUNR_QUEUE_BACKOFF_MAX=1s \
    RUNR_QUEUE_CLAIM_IDLE=2s RUNR_QUEUE_TIMEOUT=10s "$QUEUE" 2>>"$OUT/$1.log" &
  LAST_PID=$!
  # Not a job of this shell: its SIGKILL is the point, not something to report.
  disown "$LAST_PID"
  PIDS+=("$LAST_PID")
}
consumer steady
STEADY=$LAST_PID
consumer victim-0
VICTIM=$LAST_PID

sample() { # label
  local rss fds
  rss=$(awk '/VmRSS/ { printf "%.1f", $2 / 1024 }' /proc/"$STEADY"/status)
  fds=$(ls /proc/"$STEADY"/fd | wc -l)
  SAMPLES+=("$(printf '%-8s rss=%s MiB fds=%s' "$1" "$rss" "$fds")")
}
SAMPLES=()

# Producer: RATE entries a second, one redis-cli pipe per second; a second with Redis down
# produces nothing (its XADDs fail, and nothing was written).
(
  end=$((SECONDS + DURATION)); i=0
  while [ $SECONDS -lt $end ]; do
    for _ in $(seq "$RATE"); do printf 'XADD soak * n %d msg soak-%d\n' $i $i; i=$((i + 1)); done \
      | redis-cli -p "$RPORT" >/dev/null 2>&1 || true
    sleep 1
  done
) &
PRODUCER=$!
PIDS+=("$PRODUCER")

echo "soak: ${DURATION}s, $RATE entries/s, victim killed every ${KILL_EVERY}s, redis restarted every ${RESTART_EVERY}s ..." >&2
start=$SECONDS; kills=0; restarts=0; next_kill=$KILL_EVERY; next_restart=$RESTART_EVERY; sampled_mid=0
sleep 5
sample start
while [ $((SECONDS - start)) -lt "$DURATION" ]; do
  t=$((SECONDS - start))
  if [ "$t" -ge "$next_kill" ]; then
    kill -9 "$VICTIM" 2>/dev/null || true
    kills=$((kills + 1))
    consumer "victim-$kills"
    VICTIM=$LAST_PID
    next_kill=$((next_kill + KILL_EVERY))
  fi
  if [ "$t" -ge "$next_restart" ]; then
    redis_stop
    sleep 2
    redis_start
    restarts=$((restarts + 1))
    next_restart=$((next_restart + RESTART_EVERY))
  fi
  if [ $sampled_mid = 0 ] && [ "$t" -ge $((DURATION / 2)) ]; then sample middle; sampled_mid=1; fi
  kill -0 "$STEADY" || { echo "the steady consumer died:" >&2; tail -20 "$OUT/steady.log" >&2; exit 1; }
  sleep 1
done
wait "$PRODUCER" || true

echo "draining ..." >&2
deadline=$((SECONDS + 180))
drained() {
  local info read pending len
  info=$(R XINFO GROUPS soak)
  read=$(awk 'prev == "entries-read" { print; exit } { prev = $0 }' <<<"$info")
  pending=$(awk 'prev == "pending" { print; exit } { prev = $0 }' <<<"$info")
  len=$(R XLEN soak)
  [ "$read" = "$len" ] && [ "$pending" = 0 ]
}
until drained || [ $SECONDS -ge $deadline ]; do sleep 1; done
sample end

python3 - "$RPORT" "$OUT/processed.log" <<'EOF' >"$OUT/account.txt"
import collections, json, subprocess, sys
port, processed_log = sys.argv[1], sys.argv[2]
def cli(*args):
    out = subprocess.run(["redis-cli", "-2", "-p", port, "--json", *args], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)
stream = [e[0] for e in cli("XRANGE", "soak", "-", "+")]
dead = []
for _, flat in cli("XRANGE", "soak-dlq", "-", "+"):
    fields = dict(zip(flat[0::2], flat[1::2]))
    dead.append(fields["runr-id"])
done = collections.Counter(l.split()[0] for l in open(processed_log) if l.strip())
lost = [i for i in stream if i not in done and i not in dead]
dup = sum(1 for c in done.values() if c > 1)
pending = cli("XPENDING", "soak", "soak-fn")[0]
print(f"entries={len(stream)} processed={len(done)} duplicates={dup} dead_lettered={len(dead)} lost={len(lost)} pending={pending}")
if lost:
    print("lost: " + " ".join(lost[:20]))
EOF

echo
echo "runr-queue soak  $(date -u +%FT%TZ)  $(nproc) cores"
echo "${DURATION}s at $RATE entries/s; victim consumer killed $kills times, redis restarted $restarts times"
cat "$OUT/account.txt"
echo "steady consumer:"
printf '  %s\n' "${SAMPLES[@]}"
echo "steady consumer's outage lines: $(grep -c 'redis is unavailable' "$OUT/steady.log" || true) (one per restart expected)"
grep -q ' lost=0 pending=0$' "$OUT/account.txt"
