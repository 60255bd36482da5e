#!/usr/bin/env bash
# Benchmark of runr-image-upload (issue 6): a ~1 GiB `docker save` archive of four incompressible
# 256 MiB layers, uploaded through the chunk API (8 MiB chunks, one connection, loopback), then
# complete → completed into a freshly emptied docker-registry, against
#   - `openssl dgst -sha256` of the same file (the floor for ingest: every byte must be hashed),
#   - `skopeo copy docker-archive:… docker://…` of the same file into the same emptied registry
#     (the baseline for complete → completed),
# with RUNR_UPLOAD_COMPRESS=gzip and =none, plus a second upload of the same file while the
# registry holds its blobs already. Chunks go in order (offset 0 upward, as the console, the CLI
# and the spec's curl loop send them), so the receiver's follower pushes blobs while the upload
# arrives; one `none` run sends the last chunk first (the follower cannot start before the very
# end: the after-complete pass alone), and one sends an OCI layout of the same image (skopeo
# oci-archive:, blobs named by their digest, streamed into the registry as they arrive). Reports medians of ROUNDS rounds, ratios against the
# issue's targets, and the receiver's peak RSS (VmHWM) and CPU time.
#
# Usage: bench/receiver.sh [ROUNDS]   (default 3; needs docker-registry, skopeo, openssl, python3)
# Env:   RECEIVER_BIN (default: release musl build of this checkout),
#        BENCH_CACHE (default target/bench-receiver: the generated archive is kept there)
set -euo pipefail
cd "$(dirname "$0")/.."

ROUNDS=${1:-3}
TARGET=x86_64-unknown-linux-musl
CHUNK=$((8 << 20))
LAYER_MIB=${LAYER_MIB:-256}
CACHE=${BENCH_CACHE:-target/bench-receiver}

if [ -z "${RECEIVER_BIN:-}" ]; then
  cargo build --release --locked --target "$TARGET" -p runr-image-upload >&2
  RECEIVER_BIN=target/$TARGET/release/runr-image-upload
fi

WORK=$(mktemp -d /tmp/runr-bench-receiver.XXXXXX)
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

# --- the archive: classic docker save layout, written directly -------------------------------
ARCHIVE=$CACHE/big-docker-archive-${LAYER_MIB}m.tar
if [ ! -s "$ARCHIVE" ]; then
  echo "creating $ARCHIVE (4 x $LAYER_MIB MiB random layers)" >&2
  mkdir -p "$CACHE"
  A=$WORK/archive
  mkdir -p "$A"
  layers="" diffs=""
  for i in 1 2 3 4; do
    mkdir -p "$WORK/layer$i"
    openssl rand -out "$WORK/layer$i/blob$i.bin" $((LAYER_MIB << 20))
    tar -C "$WORK/layer$i" -cf "$WORK/layer$i.tar" "blob$i.bin"
    rm -rf "$WORK/layer$i"
    hex=$(sha256sum "$WORK/layer$i.tar" | cut -d' ' -f1)
    mkdir -p "$A/$hex"
    mv "$WORK/layer$i.tar" "$A/$hex/layer.tar"
    layers+="${layers:+,}\"$hex/layer.tar\""
    diffs+="${diffs:+,}\"sha256:$hex\""
  done
  printf '{"architecture":"amd64","os":"linux","config":{},"rootfs":{"type":"layers","diff_ids":[%s]}}' "$diffs" >"$A/config.json"
  cfg=$(sha256sum "$A/config.json" | cut -d' ' -f1)
  mv "$A/config.json" "$A/$cfg.json"
  printf '[{"Config":"%s.json","RepoTags":["bench/big:1"],"Layers":[%s]}]' "$cfg" "$layers" >"$A/manifest.json"
  out=$(cd "$CACHE" && pwd)/$(basename "$ARCHIVE").tmp
  (cd "$A" && tar -cf "$out" manifest.json "$cfg.json" */layer.tar)
  rm -rf "$A"
  mv "$ARCHIVE.tmp" "$ARCHIVE"
fi
SIZE=$(stat -c %s "$ARCHIVE")
SUM=$(openssl dgst -sha256 -r "$ARCHIVE" | cut -d' ' -f1)
# The same image as an OCI layout (same layer bytes and digests), made once by skopeo.
OCI_ARCHIVE=$CACHE/big-oci-archive-${LAYER_MIB}m.tar
if [ ! -s "$OCI_ARCHIVE" ]; then
  skopeo --insecure-policy copy -q "docker-archive:$ARCHIVE" "oci-archive:$OCI_ARCHIVE.tmp:bench/big:1"
  mv "$OCI_ARCHIVE.tmp" "$OCI_ARCHIVE"
fi
OCI_SIZE=$(stat -c %s "$OCI_ARCHIVE")
OCI_SUM=$(openssl dgst -sha256 -r "$OCI_ARCHIVE" | cut -d' ' -f1)

# --- registry ------------------------------------------------------------------------------------
REG_PORT=$(free_port)
REG_PID=""
# fresh_registry: (re)starts docker-registry on REG_PORT with empty storage.
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

# --- one receiver run ----------------------------------------------------------------------------
# receive COMPRESS TAG [ORDER] [FILE SIZE SUM]: starts a receiver on an empty directory, uploads
# the archive in 8 MiB chunks (ORDER: in, the default, or rev: last chunk first), completes,
# waits for completed; prints "ingest_s complete_s hwm_kib cpu_s first_byte_to_completed_s".
receive() {
  local compress=$1 tag=$2 order=${3:-in} file=${4:-$ARCHIVE} size=${5:-$SIZE} sum=${6:-$SUM} port dir pid out
  port=$(free_port)
  dir=$WORK/upload
  rm -rf "$dir"; mkdir -p "$dir"
  PORT=$port RUNR_UPLOAD_DIR=$dir RUNR_UPLOAD_SIZE=$size RUNR_UPLOAD_SHA256=$sum \
    RUNR_UPLOAD_TARGET=127.0.0.1:$REG_PORT/runr-uploads/bench/big:$tag RUNR_UPLOAD_NAME=bench/big:1 \
    RUNR_UPLOAD_COMPRESS=$compress RUNR_REGISTRY_PLAIN_HTTP=1 RUNR_LOG=warn \
    setsid "$RECEIVER_BIN" serve >>"$WORK/receiver.log" 2>&1 &
  pid=$!
  PIDS+=("$pid")
  wait_http "http://127.0.0.1:$port/healthz"
  out=$(python3 - "$port" "$file" "$CHUNK" "$pid" "$order" <<'PY' || echo FAILED
import http.client, json, mmap, os, sys, time
port, path, chunk, pid, order = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5]
fd = os.open(path, os.O_RDONLY)
size = os.fstat(fd).st_size
view = memoryview(mmap.mmap(fd, size, prot=mmap.PROT_READ))
conn = http.client.HTTPConnection("127.0.0.1", port)
def call(method, url, body=None):
    conn.request(method, url, body=body, headers={"Content-Type": "application/octet-stream"})
    r = conn.getresponse()
    return r.status, json.loads(r.read())
t0 = time.perf_counter()
offsets = list(range(0, size, chunk))
if order == "rev":
    offsets.reverse()
for off in offsets:
    code, body = call("PUT", f"/chunk?offset={off}", view[off:off + chunk])
    if code != 200:
        sys.exit(f"chunk at {off}: {code} {body}")
t1 = time.perf_counter()
code, body = call("POST", "/complete")
if code != 202:
    sys.exit(f"complete: {code} {body}")
while True:
    code, body = call("GET", "/status")
    if body["status"] in ("completed", "failed"):
        break
    time.sleep(0.01)
t2 = time.perf_counter()
if body["status"] != "completed":
    sys.exit(f"upload failed: {body}")
hwm = next(int(l.split()[1]) for l in open(f"/proc/{pid}/status") if l.startswith("VmHWM"))
fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
print(f"{t1 - t0:.3f} {t2 - t1:.3f} {hwm} {cpu:.2f} {t2 - t0:.3f}")
PY
)
  kill -9 -- "-$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  rm -rf "$dir"
  case $out in *FAILED*) tail -5 "$WORK/receiver.log" >&2; exit 1 ;; esac
  echo "$out"
}

# --- the registry floor ---------------------------------------------------------------------------
# floor N: PUTs the archive's four layers (their digests known: the names they have in the
# archive) into the running registry, N at a time, each in one monolithic PUT from the archive's
# bytes in place; prints the wall time.
floor() {
  python3 - "$REG_PORT" "$ARCHIVE" "$1" <<'PY'
import concurrent.futures, http.client, mmap, os, sys, tarfile, time
port, path, n = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
with tarfile.open(path) as t:
    layers = [(m.name.split("/")[0], m.offset_data, m.size) for m in t.getmembers()
              if m.name.endswith("/layer.tar")]
fd = os.open(path, os.O_RDONLY)
view = memoryview(mmap.mmap(fd, os.fstat(fd).st_size, prot=mmap.PROT_READ))
def put(layer):
    hexd, off, size = layer
    c = http.client.HTTPConnection("127.0.0.1", port)
    c.request("POST", "/v2/floor/big/blobs/uploads/", headers={"Content-Length": "0"})
    r = c.getresponse(); r.read()
    if r.status != 202:
        sys.exit(f"POST: {r.status}")
    loc = r.getheader("Location")
    if loc.startswith("http"):
        loc = "/" + loc.split("/", 3)[3]
    sep = "&" if "?" in loc else "?"
    c.request("PUT", f"{loc}{sep}digest=sha256:{hexd}", body=view[off:off + size],
              headers={"Content-Type": "application/octet-stream", "Content-Length": str(size)})
    r = c.getresponse(); r.read()
    if r.status != 201:
        sys.exit(f"PUT {hexd}: {r.status}")
t0 = time.perf_counter()
with concurrent.futures.ThreadPoolExecutor(n) as pool:
    list(pool.map(put, layers))
print(f"{time.perf_counter() - t0:.3f}")
PY
}

# small_chunks: a receiver for a 20,000-byte file takes it in 20,000 one-byte chunks on one
# keep-alive connection; prints "wall_s cpu_s".
small_chunks() {
  local port dir pid file sum
  port=$(free_port)
  dir=$WORK/small
  rm -rf "$dir"; mkdir -p "$dir/w"
  file=$dir/f
  head -c 20000 /dev/urandom >"$file"
  sum=$(openssl dgst -sha256 -r "$file" | cut -d' ' -f1)
  PORT=$port RUNR_UPLOAD_DIR=$dir/w RUNR_UPLOAD_SIZE=20000 RUNR_UPLOAD_SHA256=$sum \
    RUNR_UPLOAD_TARGET=127.0.0.1:9/runr-uploads/bench/small:1 \
    setsid "$RECEIVER_BIN" serve >>"$WORK/receiver.log" 2>&1 &
  pid=$!
  PIDS+=("$pid")
  wait_http "http://127.0.0.1:$port/healthz"
  python3 - "$port" "$file" "$pid" <<'PY'
import http.client, os, sys, time
port, path, pid = int(sys.argv[1]), sys.argv[2], sys.argv[3]
data = open(path, "rb").read()
c = http.client.HTTPConnection("127.0.0.1", port)
t0 = time.perf_counter()
for i in range(len(data)):
    c.request("PUT", f"/chunk?offset={i}", body=data[i:i + 1])
    r = c.getresponse(); r.read()
    if r.status != 200:
        sys.exit(f"chunk {i}: {r.status}")
wall = time.perf_counter() - t0
fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
print(f"{wall:.3f} {cpu:.2f}")
PY
  kill -9 -- "-$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
}

# --- rounds --------------------------------------------------------------------------------------
RESULTS=$WORK/results
: >"$RESULTS"
for round in $(seq 1 "$ROUNDS"); do
  echo "round $round/$ROUNDS" >&2
  # openssl: the SHA-256 floor (file in the page cache, as the receiver's is).
  t=$( { /usr/bin/time -f '%e' openssl dgst -sha256 "$ARCHIVE" >/dev/null; } 2>&1 | tail -1)
  echo "openssl $t" >>"$RESULTS"
  fresh_registry
  r=$(receive gzip "g$round"); echo "gzip $r" >>"$RESULTS"
  fresh_registry
  r=$(receive none "n$round"); echo "none $r" >>"$RESULTS"
  # Same registry: every blob is there already.
  r=$(receive none "a$round"); echo "again $r" >>"$RESULTS"
  fresh_registry
  r=$(receive none "r$round" rev); echo "rev $r" >>"$RESULTS"
  fresh_registry
  r=$(receive none "o$round" in "$OCI_ARCHIVE" "$OCI_SIZE" "$OCI_SUM"); echo "oci $r" >>"$RESULTS"
  fresh_registry
  t=$( { /usr/bin/time -f '%e %U %S %M' skopeo --insecure-policy copy -q --dest-tls-verify=false \
        "docker-archive:$ARCHIVE" "docker://127.0.0.1:$REG_PORT/skopeo/big:$round" >/dev/null; } 2>&1 | tail -1)
  echo "skopeo $t" >>"$RESULTS"
  for n in 1 2 4; do
    fresh_registry
    echo "floor$n $(floor "$n")" >>"$RESULTS"
  done
  echo "small $(small_chunks)" >>"$RESULTS"
done

python3 - "$RESULTS" "$SIZE" "$ROUNDS" <<'PY'
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    k, *v = line.split()
    rows.setdefault(k, []).append([float(x) for x in v])
size, rounds = int(sys.argv[2]), sys.argv[3]
med = lambda k, i: statistics.median(r[i] for r in rows[k])
mib = size / 2**20
ssl = med("openssl", 0)
sk_wall, sk_cpu, sk_rss = med("skopeo", 0), med("skopeo", 1) + med("skopeo", 2), med("skopeo", 3) / 1024
print(f"archive: {mib:.0f} MiB docker save, 4 incompressible layers; 8 MiB chunks over loopback; medians of {rounds} rounds")
f1, f2, f4 = med("floor1", 0), med("floor2", 0), med("floor4", 0)
best = min(f1, f2, f4)
print(f"registry floor (4 layers PUT with known digests): {f1:.2f} s one at a time, {f2:.2f} s two, {f4:.2f} s four at a time")
print(f"{'measure':44} {'ours':>10} {'baseline':>10} {'ratio':>7}  target")
ing = mib / med("gzip", 0)
print(f"{'ingest MiB/s (gzip run) vs openssl sha256':44} {ing:10.0f} {mib / ssl:10.0f} {ing * ssl / mib:7.2f}  >= 0.80")
ing = mib / med("none", 0)
print(f"{'ingest MiB/s (none run) vs openssl sha256':44} {ing:10.0f} {mib / ssl:10.0f} {ing * ssl / mib:7.2f}  >= 0.80")
g, n, a = med("gzip", 1), med("none", 1), med("again", 1)
print(f"{'complete->completed s, none vs best registry floor':44} {n:10.2f} {best:10.2f} {n / best:7.2f}  <= 1.10")
print(f"{'complete->completed s, gzip vs skopeo':44} {g:10.2f} {sk_wall:10.2f} {g / sk_wall:7.2f}  <= 0.85")
print(f"{'complete->completed s, none vs skopeo':44} {n:10.2f} {sk_wall:10.2f} {n / sk_wall:7.2f}")
print(f"{'complete->completed s, blobs already there':44} {a:10.2f} {'':>10} {'':>7}  < 1 s")
rv, o = med("rev", 1), med("oci", 1)
print(f"{'complete->completed s, none, last chunk first':44} {rv:10.2f} {best:10.2f} {rv / best:7.2f}  no slower than before")
print(f"{'complete->completed s, OCI layout vs skopeo':44} {o:10.2f} {sk_wall:10.2f} {o / sk_wall:7.2f}  <= 0.15")
for k, name in (("none", "none"), ("gzip", "gzip"), ("oci", "OCI layout")):
    fb, up = med(k, 4), med(k, 0)
    print(f"{'first byte->completed s, ' + name + ' vs upload+skopeo':44} {fb:10.2f} {up + sk_wall:10.2f} {fb / (up + sk_wall):7.2f}  <= 0.60")
ing = mib / med("oci", 0)
print(f"{'ingest MiB/s (OCI run, pushing meanwhile)':44} {ing:10.0f} {mib / ssl:10.0f} {ing * ssl / mib:7.2f}  >= 0.70")
for k, name in (("gzip", "gzip"), ("none", "none"), ("again", "again"), ("oci", "oci")):
    rss = med(k, 2) / 1024
    print(f"{'peak RSS MiB (' + name + ') vs skopeo':44} {rss:10.1f} {sk_rss:10.1f} {rss / sk_rss:7.2f}  <= 64 MiB")
for k in ("gzip", "none", "again"):
    print(f"{'receiver CPU s, whole run (' + k + ')':44} {med(k, 3):10.2f} {sk_cpu:10.2f} {med(k, 3) / sk_cpu:7.2f}")
print(f"{'20,000 one-byte chunks, wall s (receiver CPU s)':44} {med('small', 0):10.2f} {'(' + format(med('small', 1), '.2f') + ')':>10} {'':>7}  < 5 s")
PY
