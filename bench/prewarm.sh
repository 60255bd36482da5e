#!/usr/bin/env bash
# Benchmark of runr-prewarm (issue 4): warming ~500 MiB (four random layers) plus a small
# multi-platform index through a freshly emptied pull-through cache (docker-registry 2.8 in
# proxy mode, loopback), against
#   - serial `skopeo copy docker://cache/… dir:…` of the same images (baseline),
#   - parallel curl GETs of every blob, timed when the bodies are in and when Range probes show
#     the cache stored them all (what any client waiting for the stores is bound by), and
#   - reading the upstream's blob files from disk (floor),
# then prewarm again on the warm cache, and a cold run stopped with SIGTERM once the cache stores
# its first blob (the time from the signal to the exit, target < 2 s). Reports medians of ROUNDS
# runs, ratios and peak RSS.
#
# Usage: bench/prewarm.sh [ROUNDS]   (default 3; needs docker-registry, skopeo, curl, python3;
#        about 20 s per round plus a minute to build and push the images)
# Env:   LAYER_MIB (default 125), PREWARM_BIN (default: release musl build of this checkout)
set -euo pipefail
cd "$(dirname "$0")/.."

ROUNDS=${1:-3}
LAYER_MIB=${LAYER_MIB:-125}
TARGET=x86_64-unknown-linux-musl

if [ -z "${PREWARM_BIN:-}" ]; then
  cargo build --release --locked --target "$TARGET" -p runr-prewarm >&2
  PREWARM_BIN=target/$TARGET/release/runr-prewarm
fi

WORK=$(mktemp -d /tmp/runr-bench-prewarm.XXXXXX)
PIDS=()
cleanup() {
  for pid in "${PIDS[@]}"; do kill -9 -- "-$pid" 2>/dev/null || kill -9 "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_v2() {
  for _ in $(seq 1 200); do
    code=$(curl -s -o /dev/null -w '%{http_code}' "http://$1/v2/" || true)
    [ "$code" = 200 ] && return 0
    sleep 0.05
  done
  echo "registry $1 did not come up" >&2; exit 1
}

# start_registry NAME PORT [REMOTE]: starts docker-registry with storage in $WORK/NAME.
start_registry() {
  local name=$1 port=$2 remote=${3:-}
  mkdir -p "$WORK/$name/storage"
  {
    printf 'version: 0.1\nlog:\n  level: error\n  accesslog:\n    disabled: true\n'
    printf 'storage:\n  filesystem:\n    rootdirectory: %s\n  delete:\n    enabled: true\n' "$WORK/$name/storage"
    printf 'http:\n  addr: 127.0.0.1:%s\n' "$port"
    [ -n "$remote" ] && printf 'proxy:\n  remoteurl: %s\n' "$remote"
  } >"$WORK/$name/config.yml"
  setsid docker-registry serve "$WORK/$name/config.yml" >"$WORK/$name.log" 2>&1 &
  eval "PID_$name=$!"
  PIDS+=("$!")
  wait_v2 "127.0.0.1:$port"
}
stop_registry() {
  local pid
  pid=$(eval echo "\$PID_$1")
  { kill -9 -- "-$pid" || kill -9 "$pid"; wait "$pid"; } 2>/dev/null || true
}
reset_cache() { stop_registry cache; rm -rf "$WORK/cache/storage"; start_registry cache "$CACHE_PORT" "http://127.0.0.1:$UP_PORT"; }

# --- images -------------------------------------------------------------------------------------
LAYOUT=$WORK/layout
mkdir -p "$LAYOUT/blobs/sha256"
echo '{"imageLayoutVersion":"1.0.0"}' >"$LAYOUT/oci-layout"
# blob FILE MEDIATYPE -> prints a descriptor JSON and stores FILE under its digest
blob() {
  local hex size
  hex=$(sha256sum "$1" | cut -d' ' -f1)
  size=$(stat -c %s "$1")
  mv "$1" "$LAYOUT/blobs/sha256/$hex"
  printf '{"mediaType":"%s","digest":"sha256:%s","size":%s}' "$2" "$hex" "$size"
}
# image ARCH MIB... -> descriptor of a manifest with one random layer per MIB argument
image() {
  local arch=$1; shift
  local layers="" diff="" i=0 d
  for mib in "$@"; do
    head -c "$((mib << 20))" /dev/urandom >"$WORK/layer"
    d=$(blob "$WORK/layer" application/vnd.oci.image.layer.v1.tar)
    layers+="${layers:+,}$d"
    diff+="${diff:+,}\"$(echo "$d" | sed 's/.*"digest":"\([^"]*\)".*/\1/')\""
    i=$((i + 1))
  done
  printf '{"architecture":"%s","os":"linux","rootfs":{"type":"layers","diff_ids":[%s]},"config":{}}' "$arch" "$diff" >"$WORK/config"
  local config
  config=$(blob "$WORK/config" application/vnd.oci.image.config.v1+json)
  printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":%s,"layers":[%s]}' "$config" "$layers" >"$WORK/manifest"
  blob "$WORK/manifest" application/vnd.oci.image.manifest.v1+json
}
push() { # push DESCRIPTOR REPO (tag 1)
  printf '{"schemaVersion":2,"manifests":[%s]}' "$(echo "$1" | sed 's/}$/,"annotations":{"org.opencontainers.image.ref.name":"1"}}/')" >"$LAYOUT/index.json"
  skopeo --insecure-policy copy --all --preserve-digests --dest-tls-verify=false -q "oci:$LAYOUT:1" "docker://127.0.0.1:$UP_PORT/$2:1"
}

UP_PORT=$(free_port)
CACHE_PORT=$(free_port)
start_registry upstream "$UP_PORT"
echo "generating and pushing $((4 * LAYER_MIB)) MiB of random layers and a multi-platform index..." >&2
big=$(image amd64 "$LAYER_MIB" "$LAYER_MIB" "$LAYER_MIB" "$LAYER_MIB")
push "$big" big
amd=$(image amd64 8 2)
arm=$(image arm64 8 2)
plat() { echo "$1" | sed "s/}\$/,\"platform\":{\"os\":\"linux\",\"architecture\":\"$2\"}}/"; }
printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.index.v1+json","manifests":[%s,%s]}' \
  "$(plat "$amd" amd64)" "$(plat "$arm" arm64)" >"$WORK/index"
multi=$(blob "$WORK/index" application/vnd.oci.image.index.v1+json)
push "$multi" multi
rm -rf "$LAYOUT"
start_registry cache "$CACHE_PORT" "http://127.0.0.1:$UP_PORT"

TOTAL_BYTES=$(find "$WORK/upstream/storage/docker/registry/v2/blobs" -name data -printf '%s\n' | awk '{s+=$1} END {print s}')

prewarm() { # leaves "seconds maxrss_kib" in $WORK/time; stops the bench if prewarm fails
  /usr/bin/time -f '%e %M %U %S' -o "$WORK/time" env -i \
    RUNR_PREWARM_REGISTRY="127.0.0.1:$CACHE_PORT" RUNR_PREWARM_IMAGES="big:1 multi:1" \
    RUNR_REGISTRY_PLAIN_HTTP=1 RUNR_PREWARM_LOG=warn "$PREWARM_BIN" >"$WORK/summary.json" 2>"$WORK/prewarm.log" \
    || { cat "$WORK/prewarm.log" >&2; exit 1; }
}
elapsed() { awk -v a="$1" -v b="$(date +%s.%N)" 'BEGIN { printf "%.3f\n", b - a }'; }
skopeo_serial() {
  local start
  start=$(date +%s.%N)
  rm -rf "$WORK/out" && mkdir -p "$WORK/out"
  skopeo --insecure-policy copy -q --src-tls-verify=false "docker://127.0.0.1:$CACHE_PORT/big:1" "dir:$WORK/out/big"
  skopeo --insecure-policy copy -q --all --src-tls-verify=false "docker://127.0.0.1:$CACHE_PORT/multi:1" "dir:$WORK/out/multi"
  elapsed "$start"
  rm -rf "$WORK/out"
}
curl_parallel() { # every blob at once, bodies discarded, nothing verified or confirmed
  local start repo hex
  start=$(date +%s.%N)
  for link in "$WORK"/upstream/storage/docker/registry/v2/repositories/*/_layers/sha256/*/link; do
    repo=${link#"$WORK"/upstream/storage/docker/registry/v2/repositories/}
    repo=${repo%%/*}
    hex=$(basename "$(dirname "$link")")
    curl -s -o /dev/null "http://127.0.0.1:$CACHE_PORT/v2/$repo/blobs/sha256:$hex" &
  done
  wait
  elapsed "$start" >"$WORK/curl-bodies"
  # Then the same Range probes prewarm uses, until the cache holds every blob.
  while :; do
    local missing=0
    for link in "$WORK"/upstream/storage/docker/registry/v2/repositories/*/_layers/sha256/*/link; do
      repo=${link#"$WORK"/upstream/storage/docker/registry/v2/repositories/}
      repo=${repo%%/*}
      hex=$(basename "$(dirname "$link")")
      code=$(curl -s -o /dev/null -w '%{http_code}' -r 0-0 "http://127.0.0.1:$CACHE_PORT/v2/$repo/blobs/sha256:$hex")
      [ "$code" = 206 ] || missing=$((missing + 1))
    done
    [ "$missing" = 0 ] && break
    sleep 0.1
  done
  echo "$(cat "$WORK/curl-bodies") $(elapsed "$start")"
}
sigterm_exit() { # a cold run stopped mid-transfer: seconds from SIGTERM to the exit
  local start pid
  env -i RUNR_PREWARM_REGISTRY="127.0.0.1:$CACHE_PORT" RUNR_PREWARM_IMAGES="big:1 multi:1" \
    RUNR_REGISTRY_PLAIN_HTTP=1 RUNR_PREWARM_LOG=warn "$PREWARM_BIN" >/dev/null 2>"$WORK/sigterm.log" &
  pid=$!
  until [ -n "$(find "$WORK/cache/storage" -name data -print -quit 2>/dev/null)" ]; do sleep 0.01; done
  start=$(date +%s.%N)
  kill -TERM "$pid"
  wait "$pid" || true
  elapsed "$start"
}
floor() {
  local start
  start=$(date +%s.%N)
  find "$WORK/upstream/storage/docker/registry/v2/blobs" -name data -exec cat {} + >/dev/null
  elapsed "$start"
}

: >"$WORK/results"
for round in $(seq 1 "$ROUNDS"); do
  reset_cache
  prewarm && read -r cold cold_rss cold_user cold_sys <"$WORK/time"
  echo "cold prewarm cpu: user ${cold_user}s sys ${cold_sys}s" >&2
  prewarm && read -r warm warm_rss _ <"$WORK/time"
  reset_cache
  sk=$(skopeo_serial)
  reset_cache
  read -r cu cs < <(curl_parallel)
  fl=$(floor)
  reset_cache
  sig=$(sigterm_exit)
  echo "$cold $cold_rss $warm $warm_rss $sk $fl $cu $cs $sig" >>"$WORK/results"
  echo "round $round: prewarm cold ${cold}s (rss ${cold_rss} KiB), warm ${warm}s, skopeo serial ${sk}s, parallel curl ${cu}s (all stored ${cs}s), disk floor ${fl}s, SIGTERM to exit ${sig}s" >&2
done

python3 - "$WORK/results" "$TOTAL_BYTES" "$ROUNDS" <<'EOF'
import statistics, sys
rows = [list(map(float, l.split())) for l in open(sys.argv[1]) if l.strip()]
total, rounds = int(sys.argv[2]), int(sys.argv[3])
col = lambda i: statistics.median(r[i] for r in rows)
cold, cold_rss, warm, warm_rss, sk, fl, cu, cs, sig = (col(i) for i in range(9))
mib = total / (1 << 20)
print(f"images: big:1 (4 random layers) + multi:1 (index, linux/amd64 + linux/arm64), {mib:.0f} MiB of blobs; medians of {rounds} rounds")
print(f"{'':34} {'seconds':>8} {'MiB/s':>8} {'vs prewarm':>10}")
for name, t in [("prewarm, cold cache (confirmed)", cold), ("skopeo copy, serial (baseline)", sk),
                ("parallel curl GETs, bodies read", cu), ("parallel curl, until cache stored", cs),
                ("read upstream blob files (floor)", fl), ("prewarm, warm cache (re-run)", warm)]:
    print(f"{name:34} {t:8.2f} {mib / t if t else 0:8.0f} {t / cold:10.2f}x")
print(f"speed-up over serial skopeo: {sk / cold:.2f}x (target >= 1.5x); warm re-run {warm:.2f}s (target < 0.5s)")
print(f"SIGTERM mid-transfer to exit: {sig:.3f}s (target < 2s)")
print(f"peak RSS: cold {max(r[1] for r in rows) / 1024:.1f} MiB, warm {max(r[3] for r in rows) / 1024:.1f} MiB (target < 32 MiB)")
EOF
