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
#              fsync always: what it acknowledged survives); or, with SENTINEL=1, a master, its
#              replica and one redis-sentinel, every client on `redis+sentinel://` (the producer
#              asks the sentinel for the master each second), and `SENTINEL FAILOVER` every
#              FAILOVER_EVERY seconds instead of the restarts. Writes the old master took and did
#              not replicate before a promotion are gone from the stream: the producer ends each
#              second with `WAIT 1`, and an entry processed but gone is counted apart
#              (processed_ids_not_in_stream), as are duplicates (acks the old master took last)
#   redrive    during the first half the producer also XADDs POISON_RATE "poison" entries a second,
#              which the handler fails every time until it is "fixed": they are dead-lettered after
#              RUNR_QUEUE_MAX_ATTEMPTS. At two thirds of the run the handler is fixed and
#              `runr-queue redrive` runs while the load, the kills and the restarts go on; after the
#              drain a second redrive moves what was dead-lettered meanwhile, and the soak drains
#              again. POISON_RATE=0 leaves the redrive out.
# Afterwards it waits until the group has read and acknowledged everything, then reports every
# entry of the stream that was neither processed nor dead-lettered (lost: must be 0), duplicates,
# dead letters, and the steady consumer's RSS and fds. An entry is its `msg` field (a redriven entry
# is a new stream entry with the same fields), so a poison entry counts as processed when its
# redriven copy was. Exits 1 when anything was lost or a redrive failed.
#
#   bash bench/queue_soak.sh     # DURATION=180 RATE=40 POISON_RATE=2 KILL_EVERY=25 RESTART_EVERY=45
#   SENTINEL=1 bash bench/queue_soak.sh    # FAILOVER_EVERY=40 instead of the restarts
set -euo pipefail
cd "$(dirname "$0")/.."

DURATION=${DURATION:-180}
RATE=${RATE:-40}
POISON_RATE=${POISON_RATE:-2}
KILL_EVERY=${KILL_EVERY:-25}
RESTART_EVERY=${RESTART_EVERY:-45}
SENTINEL=${SENTINEL:-0}
FAILOVER_EVERY=${FAILOVER_EVERY:-40}
TARGET=x86_64-unknown-linux-musl
OUT=$PWD/bench/out/queue-soak
rm -rf "$OUT"
mkdir -p "$OUT/redis"

tools=(redis-server redis-cli python3 bash)
[ "$SENTINEL" = 1 ] && tools+=(redis-sentinel)
for tool in "${tools[@]}"; do
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
  for p in "${REDIS_PID:-}" "${REPLICA_PID:-}" "${SENTINEL_PID:-}"; do
    [ -n "$p" ] && kill -9 "$p" 2>/dev/null || true
  done
  wait 2>/dev/null || true
}
trap cleanup EXIT

RPORT=$(free_port)
R2PORT=$(free_port)
SPORT=$(free_port)
SERVICE=soak-master
# The master's port: the sentinel's word with SENTINEL=1.
master_port() {
  if [ "$SENTINEL" = 1 ]; then
    redis-cli -p "$SPORT" SENTINEL get-master-addr-by-name "$SERVICE" 2>/dev/null | sed -n 2p
  else
    echo "$RPORT"
  fi
}
R() { redis-cli -p "$(master_port)" "$@"; }
REDIS_PID=""
if [ "$SENTINEL" = 1 ]; then URL="redis+sentinel://127.0.0.1:$SPORT/$SERVICE"; else URL="redis://127.0.0.1:$RPORT"; fi
redis_start() {
  redis-server --port "$RPORT" --bind 127.0.0.1 --protected-mode no --dir "$OUT/redis" \
    --appendonly yes --appendfsync always --save '' --logfile "$OUT/redis/redis.log" &
  REDIS_PID=$!
  for _ in $(seq 200); do redis-cli -p "$RPORT" ping >/dev/null 2>&1 && return 0; sleep 0.05; done
  echo "redis-server did not start" >&2
  exit 1
}
redis_stop() { kill -TERM "$REDIS_PID"; wait "$REDIS_PID" 2>/dev/null || true; REDIS_PID=""; }
redis_start
if [ "$SENTINEL" = 1 ]; then
  mkdir -p "$OUT/replica" "$OUT/sentinel"
  redis-server --port "$R2PORT" --bind 127.0.0.1 --protected-mode no --dir "$OUT/replica" \
    --appendonly yes --appendfsync always --save '' --logfile "$OUT/replica/redis.log" \
    --replicaof 127.0.0.1 "$RPORT" &
  REPLICA_PID=$!
  printf 'port %s\nbind 127.0.0.1\nprotected-mode no\ndir %s\nlogfile %s/sentinel.log\nsentinel monitor %s 127.0.0.1 %s 1\nsentinel down-after-milliseconds %s 1000\nsentinel failover-timeout %s 10000\n' \
    "$SPORT" "$OUT/sentinel" "$OUT/sentinel" "$SERVICE" "$RPORT" "$SERVICE" "$SERVICE" >"$OUT/sentinel/sentinel.conf"
  redis-sentinel "$OUT/sentinel/sentinel.conf" &
  SENTINEL_PID=$!
  for _ in $(seq 400); do
    redis-cli -p "$SPORT" SENTINEL replicas "$SERVICE" 2>/dev/null | grep -q "$R2PORT" && break
    sleep 0.05
  done
  redis-cli -p "$SPORT" SENTINEL replicas "$SERVICE" | grep -q "$R2PORT" || { echo "the sentinel never saw the replica" >&2; exit 1; }
fi
R XGROUP CREATE soak soak-fn 0 MKSTREAM >/dev/null

cat >"$OUT/handler.sh" <<EOF
#!/usr/bin/env bash
set -euo pipefail
body=\$(cat)
# A poison entry fails every attempt until the operator's "fix".
if [[ \$body == *poison-* ]] && [ ! -e "$OUT/fixed" ]; then echo "poison, not fixed yet" >&2; exit 1; fi
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
  env RUNR_QUEUE_REDIS_URL="$URL" RUNR_QUEUE_STREAM=soak RUNR_QUEUE_GROUP=soak-fn \
    RUNR_QUEUE_CONSUMER="$1" RUNR_QUEUE_TARGET="http://127.0.0.1:$WPORT/" RUNR_QUEUE_CONCURRENCY=8 \
    RUNR_QUEUE_MAX_ATTEMPTS=5 RUNR_QUEUE_BACKOFF=100ms RUNR_QUEUE_BACKOFF_MAX=1s \
    RUNR_QUEUE_CLAIM_IDLE=2s RUNR_QUEUE_TIMEOUT=10s "$QUEUE" 2>>"$OUT/$1.log" &
  LAST_PID=$!
  # Not a job of this shell: its SIGKILL is the point, not something to report.
  disown "$LAST_PID"
  PIDS+=("$LAST_PID")
}
redrive() { # output file: runs `runr-queue redrive` for every dead letter of soak-dlq
  env RUNR_QUEUE_REDIS_URL="$URL" RUNR_QUEUE_STREAM=soak RUNR_QUEUE_GROUP=soak-fn \
    "$QUEUE" redrive >"$1" 2>"$1.log"
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
  end=$((SECONDS + DURATION)); poison_end=$((SECONDS + DURATION / 2)); i=0
  while [ $SECONDS -lt $end ]; do
    # The numbers are counted here, not in the pipe's subshell (whose counts would be lost).
    poison=0
    [ $SECONDS -lt $poison_end ] && poison=$POISON_RATE
    {
      for k in $(seq 0 $((RATE - 1))); do printf 'XADD soak * n %d msg soak-%d\n' $((i + k)) $((i + k)); done
      for k in $(seq "$RATE" $((RATE + poison - 1))); do printf 'XADD soak * n %d msg poison-%d\n' $((i + k)) $((i + k)); done
      # Replicated before the next second (what a failover could take away is at most a second).
      [ "$SENTINEL" = 1 ] && printf 'WAIT 1 1000\n'
    } | redis-cli -p "$(master_port)" >/dev/null 2>&1 || true
    i=$((i + RATE + poison))
    sleep 1
  done
) &
PRODUCER=$!
PIDS+=("$PRODUCER")

faults="redis restarted every ${RESTART_EVERY}s"
[ "$SENTINEL" = 1 ] && faults="a sentinel failover every ${FAILOVER_EVERY}s"
echo "soak: ${DURATION}s, $RATE entries/s, victim killed every ${KILL_EVERY}s, $faults ..." >&2
start=$SECONDS; kills=0; restarts=0; next_kill=$KILL_EVERY; next_restart=$RESTART_EVERY; sampled_mid=0
failovers=0; next_failover=$FAILOVER_EVERY
[ "$SENTINEL" = 1 ] && next_restart=$((DURATION + 1))
fix_at=$((DURATION * 2 / 3)); REDRIVE=""
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
  if [ "$SENTINEL" = 1 ] && [ "$t" -ge "$next_failover" ]; then
    before=$(master_port)
    # Refused while the last one settles (INPROG, NOGOODSLAVE): asked again each 100 ms.
    for _ in $(seq 300); do
      [ "$(redis-cli -p "$SPORT" SENTINEL FAILOVER "$SERVICE" 2>&1)" = OK ] && break
      sleep 0.1
    done
    for _ in $(seq 300); do [ "$(master_port)" != "$before" ] && break; sleep 0.1; done
    [ "$(master_port)" != "$before" ] || { echo "the failover did not happen" >&2; exit 1; }
    failovers=$((failovers + 1))
    next_failover=$((next_failover + FAILOVER_EVERY))
  fi
  if [ $sampled_mid = 0 ] && [ "$t" -ge $((DURATION / 2)) ]; then sample middle; sampled_mid=1; fi
  if [ "$POISON_RATE" -gt 0 ] && [ -z "$REDRIVE" ] && [ "$t" -ge "$fix_at" ]; then
    touch "$OUT/fixed"
    redrive "$OUT/redrive-1.out" &
    REDRIVE=$!
    redrive_at=$t
  fi
  kill -0 "$STEADY" || { echo "the steady consumer died:" >&2; tail -20 "$OUT/steady.log" >&2; exit 1; }
  sleep 1
done
wait "$PRODUCER" || true
redrive_fail=0
if [ -n "$REDRIVE" ]; then wait "$REDRIVE" || redrive_fail=1; fi

echo "draining ..." >&2
deadline=$((SECONDS + 180))
# Read up to the last entry and nothing pending (by ids: the group's entries-read counter is off
# after a failover, the promoted replica's count of what was read differs from the old master's).
drained() {
  local info last pending top
  info=$(R XINFO GROUPS soak)
  last=$(awk 'prev == "last-delivered-id" { print; exit } { prev = $0 }' <<<"$info")
  pending=$(awk 'prev == "pending" { print; exit } { prev = $0 }' <<<"$info")
  top=$(R XREVRANGE soak + - COUNT 1 | head -1)
  [ -n "$last" ] && [ "$last" = "$top" ] && [ "$pending" = 0 ]
}
until drained || [ $SECONDS -ge $deadline ]; do sleep 1; done
if [ -n "$REDRIVE" ]; then
  # What was dead-lettered after the first redrive began (or while it ran), then drain again.
  redrive "$OUT/redrive-2.out" || redrive_fail=1
  until drained || [ $SECONDS -ge $deadline ]; do sleep 1; done
fi
sample end

python3 - "$(master_port)" "$OUT/processed.log" <<'EOF' >"$OUT/account.txt"
import collections, json, subprocess, sys
port, processed_log = sys.argv[1], sys.argv[2]
def cli(*args):
    out = subprocess.run(["redis-cli", "-2", "-p", port, "--json", *args], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)
# An entry is its msg: a redriven dead letter is a new stream entry with the same fields.
msg_of = {}
for id, flat in cli("XRANGE", "soak", "-", "+"):
    msg_of[id] = dict(zip(flat[0::2], flat[1::2]))["msg"]
entries = list(dict.fromkeys(msg_of.values()))
redriven = len(msg_of) - len(entries)
dead = set()
for _, flat in cli("XRANGE", "soak-dlq", "-", "+"):
    dead.add(dict(zip(flat[0::2], flat[1::2]))["msg"])
done = collections.Counter(msg_of.get(l.split()[0], "?" + l.split()[0]) for l in open(processed_log) if l.strip())
lost = [m for m in entries if m not in done and m not in dead]
dup = sum(1 for c in done.values() if c > 1)
poison = [m for m in entries if m.startswith("poison-")]
poison_done = sum(1 for m in poison if m in done)
unknown = sum(1 for m in done if m.startswith("?"))
pending = cli("XPENDING", "soak", "soak-fn")[0]
print(f"entries={len(entries)} processed={len(done)} duplicates={dup} dead_lettered={len(dead)} lost={len(lost)} pending={pending}")
print(f"poison={len(poison)} poison_processed={poison_done} redriven_entries={redriven} processed_ids_not_in_stream={unknown}")
# Delivered, then gone from the stream: written to a master that a failover demoted before it
# replicated them (the promoted replica never had them). Counted apart, not as entries.
if lost:
    print("lost: " + " ".join(lost[:20]))
EOF

echo
echo "runr-queue soak  $(date -u +%FT%TZ)  $(nproc) cores"
echo "${DURATION}s at $RATE entries/s; victim consumer killed $kills times, redis restarted $restarts times, sentinel failovers $failovers"
cat "$OUT/account.txt"
echo "steady consumer:"
printf '  %s\n' "${SAMPLES[@]}"
echo "steady consumer's outage lines: $(grep -c 'redis is unavailable' "$OUT/steady.log" || true) (one per restart or failover expected)"
if [ -n "$REDRIVE" ]; then
  echo "redrive at ${redrive_at}s (load running): $(cat "$OUT/redrive-1.out")"
  echo "redrive after the drain: $(cat "$OUT/redrive-2.out")"
  [ $redrive_fail = 0 ] || { echo "a redrive failed:" >&2; tail -5 "$OUT"/redrive-*.out.log >&2; }
fi
grep -q ' lost=0 pending=0$' "$OUT/account.txt" && [ $redrive_fail = 0 ]
