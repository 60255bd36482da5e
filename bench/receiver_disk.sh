#!/usr/bin/env bash
# runr-image-upload at large sizes (issue 24): the memory and the disk an upload needs.
# Two archives, generated once and kept in BENCH_CACHE:
#   - big: a classic `docker save` layout of four incompressible LAYER_MIB layers (default
#     1024: a 4 GiB archive);
#   - 8x:  a classic archive of one layer whose tar is about 8x its gzip (1 KiB of random bytes
#     then 7 KiB of zeros, repeated; EIGHT_MIB of content, default 2048), compressed whole with
#     `gzip -1` (what `docker save | gzip` uploads).
# Each is uploaded through the chunk API in 8 MiB chunks in order into a freshly emptied
# docker-registry, with RUNR_UPLOAD_COMPRESS=none and =gzip for the big one and the default
# (gzip) for the 8x one; while it runs, the receiver's resident memory (VmHWM at the end) and the
# disk its RUNR_UPLOAD_DIR holds (allocated blocks, sampled every 0.1 s) are recorded. Prints
# one line per run: peak RSS against the 64 MiB target, peak disk against size + 64 MiB.
# These are sizes, not times: they hold on a busy machine.
#
# Usage: bench/receiver_disk.sh   (needs docker-registry, openssl, python3, gzip, ~5 x the
#        archive size of free disk; about 10 minutes at the default sizes)
# Env:   LAYER_MIB (1024), EIGHT_MIB (2048), RECEIVER_BIN, BENCH_CACHE (target/bench-receiver)
set -euo pipefail
cd "$(dirname "$0")/.."

TARGET=x86_64-unknown-linux-musl
CHUNK=$((8 << 20))
LAYER_MIB=${LAYER_MIB:-1024}
EIGHT_MIB=${EIGHT_MIB:-2048}
CACHE=${BENCH_CACHE:-target/bench-receiver}

if [ -z "${RECEIVER_BIN:-}" ]; then
  cargo build --release --locked --target "$TARGET" -p runr-image-upload >&2
  RECEIVER_BIN=target/$TARGET/release/runr-image-upload
fi

WORK=$(mktemp -d /tmp/runr-bench-disk.XXXXXX)
PIDS=()
cleanup() {
  for pid in "${PIDS[@]}"; do kill -9 -- "-$pid" 2>/dev/null || kill -9 "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_http() {
  for _ in $(seq 1 400); do
    code=$(curl -s -o /dev/null -w '%{http_code}' "$1" || true)
    [ "$code" = 200 ] && return 0
    sleep 0.05
  done
  echo "$1 did not come up" >&2; exit 1
}

# classic OUT LAYER_FILE...: a `docker save` classic archive of the given layer tars.
classic() {
  local out=$1 a=$WORK/archive layers="" diffs="" hex cfg
  shift
  rm -rf "$a"; mkdir -p "$a"
  for layer in "$@"; do
    hex=$(sha256sum "$layer" | cut -d' ' -f1)
    mkdir -p "$a/$hex"
    mv "$layer" "$a/$hex/layer.tar"
    layers+="${layers:+,}\"$hex/layer.tar\""
    diffs+="${diffs:+,}\"sha256:$hex\""
  done
  printf '{"architecture":"amd64","os":"linux","config":{},"rootfs":{"type":"layers","diff_ids":[%s]}}' "$diffs" >"$a/config.json"
  cfg=$(sha256sum "$a/config.json" | cut -d' ' -f1)
  mv "$a/config.json" "$a/$cfg.json"
  printf '[{"Config":"%s.json","RepoTags":["bench/disk:1"],"Layers":[%s]}]' "$cfg" "$layers" >"$a/manifest.json"
  (cd "$a" && tar -cf "$out.tmp" manifest.json "$cfg.json" */layer.tar)
  rm -rf "$a"
  mv "$out.tmp" "$out"
}

mkdir -p "$CACHE"
CACHE=$(cd "$CACHE" && pwd)
BIG=$CACHE/disk-big-${LAYER_MIB}m.tar
if [ ! -s "$BIG" ]; then
  echo "creating $BIG (4 x $LAYER_MIB MiB random layers)" >&2
  files=()
  for i in 1 2 3 4; do
    mkdir -p "$WORK/l$i"
    openssl rand -out "$WORK/l$i/blob$i.bin" $((LAYER_MIB << 20))
    tar -C "$WORK/l$i" -cf "$WORK/l$i.tar" "blob$i.bin"
    rm -rf "$WORK/l$i"
    files+=("$WORK/l$i.tar")
  done
  classic "$BIG" "${files[@]}"
fi
EIGHT=$CACHE/disk-8x-${EIGHT_MIB}m.tar.gz
if [ ! -s "$EIGHT" ]; then
  echo "creating $EIGHT ($EIGHT_MIB MiB of content, about 8x its gzip)" >&2
  mkdir -p "$WORK/e"
  python3 - "$WORK/e/blob.bin" "$EIGHT_MIB" <<'PY'
import os, sys
path, mib = sys.argv[1], int(sys.argv[2])
zeros = bytes(7 * 1024)
with open(path, "wb") as f:
    for _ in range(mib):
        block = bytearray()
        for _ in range(128):
            block += os.urandom(1024) + zeros
        f.write(block)
PY
  tar -C "$WORK/e" -cf "$WORK/e.tar" blob.bin
  rm -rf "$WORK/e"
  classic "$WORK/eight.tar" "$WORK/e.tar"
  gzip -1 -c "$WORK/eight.tar" >"$EIGHT.tmp"
  rm -f "$WORK/eight.tar"
  mv "$EIGHT.tmp" "$EIGHT"
fi

REG_PORT=$(free_port)
REG_PID=""
fresh_registry() {
  if [ -n "$REG_PID" ]; then kill -9 -- "-$REG_PID" 2>/dev/null || true; wait "$REG_PID" 2>/dev/null || true; fi
  rm -rf "$WORK/registry"
  mkdir -p "$WORK/registry/storage"
  printf 'version: 0.1\nlog:\n  level: error\n  accesslog:\n    disabled: true\nstorage:\n  filesystem:\n    rootdirectory: %s\nhttp:\n  addr: 127.0.0.1:%s\n' \
    "$WORK/registry/storage" "$REG_PORT" >"$WORK/registry.yml"
  setsid docker-registry serve "$WORK/registry.yml" >"$WORK/registry.log" 2>&1 &
  REG_PID=$!
  PIDS+=("$REG_PID")
  wait_http "http://127.0.0.1:$REG_PORT/v2/"
}

# run NAME FILE COMPRESS: one upload; prints "NAME size peak_rss_kib peak_disk_bytes wall_s".
run() {
  local name=$1 file=$2 compress=$3 port dir pid size sum out
  fresh_registry
  size=$(stat -c %s "$file")
  sum=$(openssl dgst -sha256 -r "$file" | cut -d' ' -f1)
  port=$(free_port)
  dir=$WORK/upload
  rm -rf "$dir"; mkdir -p "$dir"
  PORT=$port RUNR_UPLOAD_DIR=$dir RUNR_UPLOAD_SIZE=$size RUNR_UPLOAD_SHA256=$sum \
    RUNR_UPLOAD_TARGET=127.0.0.1:$REG_PORT/runr-uploads/bench/disk:$name RUNR_UPLOAD_NAME=bench/disk:1 \
    RUNR_UPLOAD_COMPRESS=$compress RUNR_REGISTRY_PLAIN_HTTP=1 RUNR_LOG=warn \
    setsid "$RECEIVER_BIN" serve >>"$WORK/receiver.log" 2>&1 &
  pid=$!
  PIDS+=("$pid")
  wait_http "http://127.0.0.1:$port/healthz"
  out=$(python3 - "$port" "$file" "$CHUNK" "$pid" "$dir" <<'PY' || echo FAILED
import http.client, json, mmap, os, sys, threading, time
port, path, chunk, pid, updir = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5]
peak = [0]
stop = threading.Event()
def allocated():
    total = 0
    for root, _, files in os.walk(updir):
        for f in files:
            try:
                total += os.lstat(os.path.join(root, f)).st_blocks * 512
            except FileNotFoundError:
                pass
    return total
def sample():
    while not stop.is_set():
        peak[0] = max(peak[0], allocated())
        time.sleep(0.1)
threading.Thread(target=sample, daemon=True).start()
fd = os.open(path, os.O_RDONLY)
size = os.fstat(fd).st_size
view = memoryview(mmap.mmap(fd, size, prot=mmap.PROT_READ))
conn = http.client.HTTPConnection("127.0.0.1", port)
def call(method, url, body=None):
    conn.request(method, url, body=body, headers={"Content-Type": "application/octet-stream"})
    r = conn.getresponse()
    return r.status, json.loads(r.read())
t0 = time.perf_counter()
for off in range(0, size, chunk):
    code, body = call("PUT", f"/chunk?offset={off}", view[off:off + chunk])
    if code != 200:
        sys.exit(f"chunk at {off}: {code} {body}")
code, body = call("POST", "/complete")
if code != 202:
    sys.exit(f"complete: {code} {body}")
while True:
    code, body = call("GET", "/status")
    if body["status"] in ("completed", "failed"):
        break
    time.sleep(0.05)
t1 = time.perf_counter()
stop.set()
peak[0] = max(peak[0], allocated())
if body["status"] != "completed":
    sys.exit(f"upload failed: {body}")
hwm = next(int(l.split()[1]) for l in open(f"/proc/{pid}/status") if l.startswith("VmHWM"))
print(f"{size} {hwm} {peak[0]} {t1 - t0:.1f}")
PY
)
  kill -9 -- "-$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  rm -rf "$dir"
  case $out in *FAILED*) tail -5 "$WORK/receiver.log" >&2; exit 1 ;; esac
  echo "$name $out"
}

{
  run big-none "$BIG" none
  run big-gzip "$BIG" gzip
  run 8x-gzip "$EIGHT" gzip
} >"$WORK/results"

echo
echo "runr-image-upload at large sizes  $(date -u +%FT%TZ)  $(git rev-parse --short HEAD)  load before: $(cut -d' ' -f1-3 /proc/loadavg)"
printf '%-9s %12s %14s %10s %18s %14s %8s\n' run size_bytes peak_rss_MiB "(<= 64)" "disk over size MiB" "(<= 64)" wall_s
while read -r name size hwm disk wall; do
  awk -v n="$name" -v s="$size" -v h="$hwm" -v d="$disk" -v w="$wall" 'BEGIN {
    rss = h / 1024; over = (d - s) / 1048576
    printf "%-9s %12.0f %14.1f %10s %18.1f %14s %8s\n", n, s, rss, (rss <= 64 ? "ok" : "OVER"), over, (over <= 64 ? "ok" : "OVER"), w }'
done <"$WORK/results"
