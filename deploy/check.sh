#!/usr/bin/env bash
# Release checks, run by .ci/run after the tests (and by hand: deploy/check.sh):
#   1. release builds: deploy/build.sh binaries (amd64, and arm64 when its toolchain is installed)
#   2. every binary is statically linked (file, ldd) and stripped, and within its size budget;
#      binaries for another CPU run `version` under qemu user-mode emulation where installed
#   3. every manifest in deploy/k8s validates offline (kubernetes-validate, deploy/validate-manifests.py;
#      KEDA's resources against its CRD schemas vendored in deploy/schemas/)
#   where `docker info` answers:
#   4. every image builds from its Dockerfile; `docker run --read-only --user 65532 --cap-drop ALL
#      IMAGE version` works for each
#   5. the init-container flow: a volume, `runr-wrapper install`, then a FROM scratch + busybox
#      function image runs the installed wrapper in exec mode with a shell handler and answers curl
#   6. the receiver image takes a `docker save` archive of one of these images through its chunk
#      API and pushes it into a docker-registry on the host; the image is pulled back and run
#   7. the prewarm image warms an image from that registry
#   8. the queue image delivers a stream entry from a redis-server on the host to an exec-mode
#      function (the installed wrapper of step 5, a queue handler in the busybox image) and
#      acknowledges it
#   9. deploy/sandbox/check.py, with or without an engine: every binary as PID 1 of an OCI bundle
#      under gVisor (runsc), and the same checks under runc; skipped with a line saying why where
#      runsc cannot start a sandbox
# Without an engine, steps 4-8 print one line each saying they were skipped; 1-3 and 9 still run.
#
# Environment: RUNR_CHECK_ARCHS="amd64 arm64" to choose the architectures (default: what
# deploy/build.sh builds by default), RUNR_BUILD_LOCKED=0 to build without --locked,
# RUNR_CHECK_PREBUILT=1 to check the binaries already in target/dist instead of building (for
# working on this script; CI always builds), RUNR_SANDBOX_RUNTIMES="runsc" to leave out runc in
# step 9 (default: runsc, and runc where installed).
set -euo pipefail
cd "$(dirname "$0")/.."
RUNR_BUILD_LIB=1 source deploy/build.sh

MIB=$((1024 * 1024))
declare -A BUDGET=(
  [runr-wrapper]=$((3 * MIB))
  [runr-tick]=$((3 * MIB))
  [runr-image-upload]=$((12 * MIB))
  [runr-prewarm]=$((12 * MIB))
  # Measured 3.15 MiB (redis-rs with rustls on ring and the built-in roots, hyper client).
  [runr-queue]=$((4 * MIB))
)

FAILED=()
SKIPPED=()
TIMINGS=()
CHECK_START=$SECONDS

say() { printf '[check] %s\n' "$*"; }
fail() { printf '[check] FAIL: %s\n' "$*"; FAILED+=("$*"); }
skip() { printf '[check] skip: %s\n' "$*"; SKIPPED+=("$*"); }
step() { printf '\n[check] --- %s\n' "$*"; STEP_NAME=$*; STEP_START=$SECONDS; }
step_done() { TIMINGS+=("$(printf '%5ss  %s' "$((SECONDS - STEP_START))" "$STEP_NAME")"); }
mib() { awk -v b="$1" 'BEGIN { printf "%.2f MiB", b / 1048576 }'; }

# A loopback port nobody listens on right now (released before use; the server's bind shows it).
free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# wait_until SECONDS WHAT COMMAND...: polls COMMAND until it succeeds or the deadline passes.
wait_until() {
  local limit=$1 what=$2 deadline=$((SECONDS + $1))
  shift 2
  until "$@" >/dev/null 2>&1; do
    if [ $SECONDS -ge $deadline ]; then
      say "timed out after ${limit}s waiting for $what"
      return 1
    fi
    sleep 0.2
  done
}

# --- cleanup: everything this script creates is named here and removed on exit ---------------------
WORK=$(mktemp -d -t runr-check.XXXXXX)
CONTAINERS=()
IMAGES=()
VOLUMES=()
REGISTRY_PID=""
QREDIS_PID=""
cleanup() {
  local rc=$?
  for c in "${CONTAINERS[@]}"; do docker rm -f "$c" >/dev/null 2>&1 || true; done
  for v in "${VOLUMES[@]}"; do docker volume rm -f "$v" >/dev/null 2>&1 || true; done
  for i in "${IMAGES[@]}"; do docker image rm -f "$i" >/dev/null 2>&1 || true; done
  if [ -n "$REGISTRY_PID" ]; then kill "$REGISTRY_PID" 2>/dev/null || true; wait "$REGISTRY_PID" 2>/dev/null || true; fi
  if [ -n "$QREDIS_PID" ]; then kill "$QREDIS_PID" 2>/dev/null || true; wait "$QREDIS_PID" 2>/dev/null || true; fi
  rm -rf "$WORK"
  exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# === 1. release builds ===========================================================================
step "release builds (musl, LTO)"
read -r -a ARCHS <<<"${RUNR_CHECK_ARCHS:-}"
# build.sh says itself which architecture it skips and why; only what this run built is checked.
if [ "${RUNR_CHECK_PREBUILT:-0}" = 1 ]; then
  for a in "${ARCHS[@]:-amd64 arm64}"; do
    for a1 in $a; do [ -d "$DIST/$a1" ] && BUILT+=("$a1"); done
  done
  say "RUNR_CHECK_PREBUILT=1: checking the binaries in $DIST (${BUILT[*]}) without building"
else
  build_binaries "${ARCHS[@]}"
fi
BUILT_ARCHS=("${BUILT[@]}")
step_done
if [[ " ${BUILT_ARCHS[*]} " != *" arm64 "* ]]; then
  if [ ${#ARCHS[@]} -gt 0 ]; then
    skip "arm64 binaries (RUNR_CHECK_ARCHS=${ARCHS[*]})"
  else
    skip "arm64 binaries (toolchain not installed: see the [build] line above for what is missing)"
  fi
fi

# === 2. static, stripped, within budget ==========================================================
step "static linking and sizes"
printf '%-6s %-18s %12s %12s  %s\n' ARCH BINARY SIZE BUDGET LINKING
for arch in "${BUILT_ARCHS[@]}"; do
  for b in "${BINARIES[@]}"; do
    f="$DIST/$arch/$b"
    if [ ! -x "$f" ]; then fail "$arch/$b was not built"; continue; fi
    desc=$(file -b "$f")
    size=$(stat -c %s "$f")
    linking=$(grep -oE 'static-pie linked|statically linked|dynamically linked' <<<"$desc" || echo "unknown linking")
    printf '%-6s %-18s %12s %12s  %s\n' "$arch" "$b" "$(mib "$size")" "$(mib "${BUDGET[$b]}")" "$linking"
    case "$desc" in
      *"static-pie linked"* | *"statically linked"*) ;;
      *) fail "$arch/$b is not statically linked: $desc" ;;
    esac
    [[ "$desc" == *", stripped"* ]] || fail "$arch/$b is not stripped: $desc"
    [[ "$desc" != *"interpreter"* ]] || fail "$arch/$b asks for a program interpreter: $desc"
    if [ "$arch" = "$(host_arch)" ]; then
      # glibc's ldd: "statically linked" for static-pie, "not a dynamic executable" for static.
      ldd_out=$(ldd "$f" 2>&1 || true)
      case "$ldd_out" in
        *"statically linked"* | *"not a dynamic executable"*) ;;
        *) fail "$arch/$b: ldd lists shared libraries: $ldd_out" ;;
      esac
    fi
    [ "$size" -le "${BUDGET[$b]}" ] || fail "$arch/$b is $(mib "$size"), over its budget of $(mib "${BUDGET[$b]}")"
  done
done
# A binary for another CPU must also run: under qemu's user-mode emulator (Debian: qemu-user-static),
# which needs nothing but the static binary itself.
for arch in "${BUILT_ARCHS[@]}"; do
  [ "$arch" != "$(host_arch)" ] || continue
  qemu=$(command -v "qemu-$(cpu_of "$arch")-static" || command -v "qemu-$(cpu_of "$arch")" || true)
  if [ -z "$qemu" ]; then
    skip "running the $arch binaries: no qemu-$(cpu_of "$arch")-static (Debian: qemu-user-static)"
    continue
  fi
  for b in "${BINARIES[@]}"; do
    out=$("$qemu" "$DIST/$arch/$b" version 2>&1 | head -n1) || true
    if [[ "$out" == *"$(workspace_version)"* ]]; then
      say "$arch/$b runs under $(basename "$qemu"): $out"
    else
      fail "$arch/$b version under $(basename "$qemu") printed '$out'"
    fi
  done
done
step_done

# === 3. manifests =================================================================================
step "Kubernetes manifests (offline)"
mapfile -t MANIFESTS < <(find deploy/k8s -maxdepth 1 -name '*.yaml' ! -name kustomization.yaml | sort)
if command -v kubernetes-validate >/dev/null; then
  # The package's own CLI over every file; it can only warn about the Knative Service and KEDA's
  # ScaledObject and TriggerAuthentication (CRDs it has no schema for), which
  # deploy/validate-manifests.py then checks: Knative with a bundled schema, KEDA against its own
  # CRDs vendored in deploy/schemas/.
  say "kubernetes-validate --strict over ${#MANIFESTS[@]} files (WARNs for the Knative Service and KEDA's kinds are expected: CRDs)"
  kubernetes-validate --strict --quiet "${MANIFESTS[@]}" || fail "kubernetes-validate rejected a manifest"
  deploy/validate-manifests.py || fail "deploy/validate-manifests.py rejected a manifest"
else
  fail "kubernetes-validate is not installed (pip install -r tests/requirements.txt; .ci/run does it)"
fi
step_done

# === 4-6. images ================================================================================
DOCKER=0
if command -v docker >/dev/null && docker info >/dev/null 2>&1; then DOCKER=1; fi
HOST_ARCH=$(host_arch)
TAG="check-$$"
declare -A REF

if [ $DOCKER = 0 ]; then
  skip "image builds and 'docker run --read-only --user 65532 --cap-drop ALL IMAGE version' (no Docker engine answers 'docker info')"
  skip "init-container flow: runr-wrapper install + exec mode in a FROM scratch busybox image (no Docker engine answers 'docker info')"
  skip "receiver image upload of a docker save archive into docker-registry (no Docker engine answers 'docker info')"
  skip "prewarm image run against docker-registry (no Docker engine answers 'docker info')"
  skip "queue image delivering a stream entry to an exec-mode function (no Docker engine answers 'docker info')"
elif [[ " ${BUILT_ARCHS[*]} " != *" $HOST_ARCH "* ]]; then
  skip "image steps: no $HOST_ARCH binaries were built in this run to put into images"
else
  # --- 4. build every image, run `version` locked down ---
  step "images: build and run 'version' (read-only, user 65532, no capabilities)"
  VERSION=$(workspace_version)
  printf '%-36s %12s  %s\n' IMAGE SIZE "VERSION OUTPUT"
  for b in "${BINARIES[@]}"; do
    ref="runr-check/$(image_name "$b"):$TAG"
    if ! build_image "$b" "$HOST_ARCH" "$ref"; then
      fail "docker build of deploy/Dockerfile.$b"
      continue
    fi
    IMAGES+=("$ref")
    REF[$b]=$ref
    out=$(docker run --rm --read-only --user 65532 --cap-drop ALL "$ref" version 2>&1) \
      || fail "$ref: 'version' exited non-zero: $out"
    printf '%-36s %12s  %s\n' "$ref" "$(mib "$(docker image inspect -f '{{.Size}}' "$ref")")" "$(head -n1 <<<"$out")"
    [[ "$out" == *"$VERSION"* ]] || fail "$ref: 'version' does not print the workspace version $VERSION: $out"
    labels=$(docker image inspect -f '{{index .Config.Labels "org.opencontainers.image.version"}} {{index .Config.Labels "org.opencontainers.image.revision"}} {{index .Config.Labels "org.opencontainers.image.source"}} {{.Config.User}}' "$ref")
    read -r l_version l_revision l_source l_user <<<"$labels"
    [ "$l_version" = "$VERSION" ] && [ -n "$l_revision" ] && [ "$l_revision" != unknown ] \
      && [ -n "$l_source" ] && [ "$l_user" = "65532:65532" ] \
      || fail "$ref: OCI labels or USER wrong: version=$l_version revision=$l_revision source=$l_source user=$l_user"
  done
  step_done

  # --- 5. init-container flow ---
  step "init-container flow: install into a volume, exec mode in a FROM scratch + busybox image"
  if [ -z "${REF[runr-wrapper]:-}" ]; then
    skip "init-container flow: the wrapper image did not build"
  elif ! command -v busybox >/dev/null || ! file -b "$(command -v busybox)" | grep -q 'statically linked'; then
    skip "init-container flow: no static busybox on this machine (Debian: busybox-static)"
  else
    # The function image: what a runtime image is to RunR, reduced to a static busybox (its
    # applets as /bin symlinks, so /bin/sh exists) and the handler at /app/code.
    fctx="$WORK/function-image"
    mkdir -p "$fctx"
    cp "$(command -v busybox)" "$fctx/busybox"
    cat >"$fctx/main.sh" <<'EOF'
#!/bin/sh
# exec mode, RUNR_INPUT=raw: the body on stdin, the request in RUNR_* variables, stdout answers.
set -eu
body=$(cat)
printf 'Hello from sh! You called %s %s with %s' "$RUNR_METHOD" "$RUNR_PATH" "$body"
EOF
    cat >"$fctx/Dockerfile" <<'EOF'
FROM scratch
COPY busybox /bin/busybox
RUN ["/bin/busybox", "--install", "-s", "/bin"]
COPY main.sh /app/code/main.sh
EOF
    fref="runr-check/function-busybox:$TAG"
    if ! docker build -q -t "$fref" "$fctx" >"$WORK/fbuild.log" 2>&1; then
      fail "docker build of the busybox function image: $(tail -5 "$WORK/fbuild.log")"
    else
      IMAGES+=("$fref")
      vol="runr-check-runr-$$"
      docker volume create "$vol" >/dev/null
      VOLUMES+=("$vol")
      # The kubelet creates an emptyDir world-writable (0777); a fresh Docker volume is root's
      # 0755. Make it what the pod would see, so the install below runs as 65532 like in the pod.
      docker run --rm --user 0 --cap-drop ALL -v "$vol:/runr" --entrypoint /bin/busybox "$fref" chmod 0777 /runr
      if ! out=$(docker run --rm --read-only --user 65532 --cap-drop ALL -v "$vol:/runr" \
        "${REF[runr-wrapper]}" install /runr/runr-wrapper 2>&1); then
        fail "runr-wrapper install /runr/runr-wrapper exited non-zero: $out"
      elif ! docker run --rm --user 65532 -v "$vol:/runr:ro" --entrypoint /bin/busybox "$fref" \
        test -x /runr/runr-wrapper; then
        fail "runr-wrapper install exited 0 but /runr/runr-wrapper is not an executable file: $out"
      else
        say "installed /runr/runr-wrapper into volume $vol as user 65532"
        port=$(free_port)
        fn="runr-check-fn-$$"
        CONTAINERS+=("$fn")
        docker run -d --name "$fn" --read-only --user 65532 --cap-drop ALL \
          -p "127.0.0.1:$port:8080" -v "$vol:/runr:ro" \
          -e PORT=8080 -e RUNR_WRAPPER_MODE=exec -e 'RUNR_COMMAND=["/bin/sh", "/app/code/main.sh"]' \
          -e RUNR_INPUT=raw -e RUNR_TIMEOUT=10 \
          --entrypoint /runr/runr-wrapper "$fref" >/dev/null
        # Any HTTP answer counts as answered; its status and body are checked below.
        answered() {
          local c
          c=$(curl -sS -m 5 -o "$WORK/fn.out" -w '%{http_code}' -X POST --data-binary world \
            "http://127.0.0.1:$port/hello" 2>/dev/null) && [ "$c" != 000 ] && echo "$c" >"$WORK/fn.code"
        }
        running() { [ "$(docker inspect -f '{{.State.Running}}' "$fn")" = true ]; }
        deadline=$((SECONDS + 30))
        until answered || ! running || [ $SECONDS -ge $deadline ]; do sleep 0.2; done
        if answered; then
          want="Hello from sh! You called POST /hello with world"
          got=$(cat "$WORK/fn.out")
          if [ "$got" = "$want" ] && [ "$(cat "$WORK/fn.code")" = 200 ]; then
            say "curl http://127.0.0.1:$port/hello answered: $got"
          else
            fail "exec-mode function answered $(cat "$WORK/fn.code") '$got', want 200 '$want'; wrapper log: $(docker logs "$fn" 2>&1 | tail -5)"
          fi
          # What the schedule CronJob runs for an exec-mode function: one invocation with the
          # schedule envelope, the response on stdout, exit 0 below 400.
          if out=$(docker run --rm --read-only --user 65532 --cap-drop ALL -v "$vol:/runr:ro" \
            -e RUNR_WRAPPER_MODE=exec -e RUNR_TRIGGER=schedule -e RUNR_INPUT=raw -e RUNR_TIMEOUT=10 \
            -e 'RUNR_COMMAND=["/bin/sh", "/app/code/main.sh"]' \
            --entrypoint /runr/runr-wrapper "$fref" 2>"$WORK/tick.err"); then
            want='Hello from sh! You called POST / with {"trigger":"schedule"}'
            if [ "$out" = "$want" ]; then
              say "schedule one-shot (RUNR_TRIGGER=schedule) printed: $out"
            else
              fail "schedule one-shot printed '$out', want '$want'; log: $(tail -5 "$WORK/tick.err")"
            fi
          else
            fail "schedule one-shot (RUNR_TRIGGER=schedule) exited non-zero: $out $(tail -5 "$WORK/tick.err")"
          fi
        else
          logs=$(docker logs "$fn" 2>&1 | tail -20)
          code=$(docker inspect -f '{{.State.ExitCode}}' "$fn")
          fail "the installed wrapper did not answer on 127.0.0.1:$port (running=$(running && echo yes || echo no), exit $code): $logs"
        fi
      fi
    fi
  fi
  step_done

  # The registry of steps 6 and 7: CNCF distribution from Debian, plain HTTP on a free loopback
  # port, started once on first use; the containers reach it through --network host.
  regport=""
  start_registry() {
    [ -z "$regport" ] || return 0
    regport=$(free_port)
    mkdir -p "$WORK/registry"
    cat >"$WORK/registry/config.yml" <<EOF
version: 0.1
log:
  level: warn
storage:
  filesystem:
    rootdirectory: $WORK/registry/storage
http:
  addr: 127.0.0.1:$regport
EOF
    docker-registry serve "$WORK/registry/config.yml" >"$WORK/registry/log" 2>&1 &
    REGISTRY_PID=$!
    wait_until 20 "docker-registry on 127.0.0.1:$regport" curl -fsS "http://127.0.0.1:$regport/v2/"
  }

  # --- 6. receiver: upload a docker save archive into a registry on the host ---
  step "receiver image: chunked upload of a docker save archive into docker-registry"
  if [ -z "${REF[runr-image-upload]:-}" ] || [ -z "${REF[runr-tick]:-}" ]; then
    skip "receiver upload: the receiver or tick image did not build"
  elif ! command -v docker-registry >/dev/null; then
    skip "receiver upload: docker-registry is not installed (Debian: docker-registry; .ci/run installs it)"
  else
    # The upload: the tick image, saved by this very engine.
    src="${REF[runr-tick]}"
    archive="$WORK/upload.tar"
    docker save "$src" -o "$archive"
    size=$(stat -c %s "$archive")
    sha=$(sha256sum "$archive" | cut -d' ' -f1)
    if ! start_registry; then
      fail "docker-registry did not start: $(tail -5 "$WORK/registry/log")"
    else
      rport=$(free_port)
      repo="runr-uploads/platform/runr-tick"
      target="127.0.0.1:$regport/$repo:check"
      recv="runr-check-recv-$$"
      # The pod's restrictions: read-only root, user 65532, no capabilities; /work as the only
      # writable place (the pod's emptyDir); host network so that 127.0.0.1 is the registry.
      CONTAINERS+=("$recv")
      docker run -d --name "$recv" --network host --read-only --user 65532 --cap-drop ALL \
        --security-opt no-new-privileges --tmpfs "/work:rw,size=$((2 * size + 64 * MIB)),mode=1777" \
        -e "PORT=$rport" -e RUNR_UPLOAD_DIR=/work -e "RUNR_UPLOAD_SIZE=$size" -e "RUNR_UPLOAD_SHA256=$sha" \
        -e RUNR_UPLOAD_FILENAME=runr-tick.tar -e "RUNR_UPLOAD_NAME=runr-tick:check" \
        -e "RUNR_UPLOAD_TARGET=$target" -e RUNR_REGISTRY_PLAIN_HTTP=1 \
        "${REF[runr-image-upload]}" serve >/dev/null
      base="http://127.0.0.1:$rport"
      rrunning() { [ "$(docker inspect -f '{{.State.Running}}' "$recv")" = true ]; }
      deadline=$((SECONDS + 30))
      until curl -fsS -m 5 "$base/status" >/dev/null 2>&1 || ! rrunning || [ $SECONDS -ge $deadline ]; do sleep 0.2; done
      if ! curl -fsS -m 5 "$base/status" >/dev/null 2>&1; then
        logs=$(docker logs "$recv" 2>&1 | tail -20)
        code=$(docker inspect -f '{{.State.ExitCode}}' "$recv")
        fail "the receiver did not answer GET /status on 127.0.0.1:$rport (exit $code): $logs"
      else
        # Chunks of 256 KiB sent last to first: the receiver must place them by offset.
        chunk=$((256 * 1024))
        split -b "$chunk" -d -a 4 "$archive" "$WORK/chunk."
        mapfile -t parts < <(ls "$WORK"/chunk.* | sort -r)
        ok=1
        for part in "${parts[@]}"; do
          offset=$((10#${part##*.} * chunk))
          code=$(curl -sS -m 30 -o "$WORK/put.out" -w '%{http_code}' -X PUT \
            -H 'Content-Type: application/octet-stream' --data-binary "@$part" "$base/chunk?offset=$offset")
          if [ "${code:0:1}" != 2 ]; then
            fail "PUT /chunk?offset=$offset answered $code: $(cat "$WORK/put.out")"
            ok=0
            break
          fi
        done
        if [ $ok = 1 ]; then
          code=$(curl -sS -m 30 -o "$WORK/complete.out" -w '%{http_code}' -X POST "$base/complete")
          [ "${code:0:1}" = 2 ] || { fail "POST /complete answered $code: $(cat "$WORK/complete.out")"; ok=0; }
        fi
        if [ $ok = 1 ]; then
          state() { curl -fsS -m 5 "$base/status" | python3 -c 'import json, sys; print(json.load(sys.stdin)["status"])'; }
          finished() { s=$(state) && { [ "$s" = completed ] || [ "$s" = failed ]; }; }
          wait_until 120 "the receiver to finish" finished || true
          status_json=$(curl -fsS -m 5 "$base/status" || echo '{}')
          if [ "$(state || true)" != completed ]; then
            fail "upload did not complete: $status_json; receiver log: $(docker logs "$recv" 2>&1 | tail -10)"
          else
            say "receiver: $status_json"
            # The registry must hold the very image the engine saved: the pushed manifest names
            # its config, whose digest is the engine's image ID (with the containerd image store,
            # the ID is the manifest's or index's digest instead, which the receiver reports). Then
            # skopeo must pull it back whole and the engine run it.
            accept='application/vnd.docker.distribution.manifest.v2+json,application/vnd.oci.image.manifest.v1+json'
            config=$(curl -fsS -H "Accept: $accept" "http://127.0.0.1:$regport/v2/$repo/manifests/check" \
              | python3 -c 'import json, sys; print(json.load(sys.stdin)["config"]["digest"])' || echo none)
            pushed=$(python3 -c 'import json, sys; print((json.loads(sys.argv[1]).get("image") or {}).get("digest"))' "$status_json")
            image_id=$(docker image inspect -f '{{.Id}}' "$src")
            if [ "$config" != "$image_id" ] && [ "$pushed" != "$image_id" ]; then
              fail "pushed manifest's config is $config (manifest $pushed), the saved image's ID is $image_id"
            else
              back="runr-check/tick-roundtrip:$TAG"
              IMAGES+=("$back")
              if skopeo --insecure-policy copy -q --src-tls-verify=false "docker://$target" "docker-daemon:$back" >"$WORK/skopeo.log" 2>&1 \
                && out=$(docker run --rm --read-only --user 65532 --cap-drop ALL "$back" version 2>&1); then
                say "pushed $target (config $config); pulled back with skopeo and ran it: $out"
              else
                fail "pulling $target back and running it: $(tail -5 "$WORK/skopeo.log") ${out:-}"
              fi
            fi
          fi
        fi
      fi
    fi
  fi
  step_done

  # --- 7. prewarm: warm an image from a registry on the host ---
  step "prewarm image: warm an image from docker-registry"
  if [ -z "${REF[runr-prewarm]:-}" ] || [ -z "${REF[runr-tick]:-}" ]; then
    skip "prewarm run: the prewarm or tick image did not build"
  elif ! command -v docker-registry >/dev/null || ! command -v skopeo >/dev/null; then
    skip "prewarm run: docker-registry or skopeo is not installed (.ci/run installs both)"
  elif ! start_registry; then
    fail "docker-registry did not start: $(tail -5 "$WORK/registry/log")"
  else
    # Pushed by skopeo, independently of the receiver; a plain registry answers the requests a
    # pull-through cache does (manifests, blob Range probes) for what it holds.
    warm="library/runr-tick:warm"
    if ! skopeo --insecure-policy copy -q --dest-tls-verify=false "docker-daemon:${REF[runr-tick]}" \
      "docker://127.0.0.1:$regport/$warm" >"$WORK/skopeo-push.log" 2>&1; then
      fail "skopeo push of the tick image for prewarm: $(tail -5 "$WORK/skopeo-push.log")"
    else
      # The registry by name: in scratch there is no NSS, so this is musl's resolver reading the
      # /etc/hosts the engine mounts (as the kubelet does), the path in-cluster names take too.
      code=0
      out=$(docker run --rm --network host --read-only --user 65532 --cap-drop ALL \
        --security-opt no-new-privileges \
        -e "RUNR_PREWARM_REGISTRY=localhost:$regport" -e "RUNR_PREWARM_IMAGES=$warm" \
        -e RUNR_REGISTRY_PLAIN_HTTP=1 -e RUNR_PREWARM_WAIT=10 -e RUNR_PREWARM_ATTEMPTS=1 \
        "${REF[runr-prewarm]}" run 2>"$WORK/prewarm.err") || code=$?
      if [ $code = 0 ]; then
        say "prewarm warmed localhost:$regport/$warm; summary: $(tail -n1 <<<"$out" | cut -c1-300)"
      else
        fail "runr-prewarm run exited $code: $(tail -n1 <<<"$out" | cut -c1-300) $(tail -n5 "$WORK/prewarm.err")"
      fi
    fi
  fi
  step_done

  # --- 8. queue: a stream entry delivered to an exec-mode function and acknowledged ---
  step "queue image: a redis-server entry delivered to an exec-mode function"
  if [ -z "${REF[runr-queue]:-}" ] || [ -z "${vol:-}" ] || [ -z "${fref:-}" ]; then
    skip "queue delivery: the queue image, or step 5's wrapper volume and busybox image, is missing"
  elif ! command -v redis-server >/dev/null || ! command -v redis-cli >/dev/null; then
    skip "queue delivery: redis-server is not installed (Debian: redis-server; .ci/run installs it)"
  else
    # The spec's queue handler, for busybox sh: the event body is stdin (RUNR_INPUT=raw).
    qctx="$WORK/queue-function"
    mkdir -p "$qctx"
    printf '%s\n' '#!/bin/sh' "printf 'processed %s (from sh)' \"\$(cat)\"" >"$qctx/queue.sh"
    printf 'FROM %s\nCOPY queue.sh /app/code/queue.sh\n' "$fref" >"$qctx/Dockerfile"
    qfref="runr-check/function-queue:$TAG"
    qport=$(free_port)
    redis-server --port "$qport" --bind 127.0.0.1 --save '' --appendonly no --protected-mode no \
      --dir "$WORK" >"$WORK/qredis.log" 2>&1 &
    QREDIS_PID=$!
    if ! docker build -q -t "$qfref" "$qctx" >"$WORK/qbuild.log" 2>&1; then
      fail "docker build of the queue function image: $(tail -5 "$WORK/qbuild.log")"
    elif ! wait_until 20 "redis-server on 127.0.0.1:$qport" redis-cli -p "$qport" ping; then
      fail "redis-server did not start: $(tail -5 "$WORK/qredis.log")"
    else
      IMAGES+=("$qfref")
      fport=$(free_port)
      qfn="runr-check-qfn-$$"
      qc="runr-check-queue-$$"
      CONTAINERS+=("$qfn" "$qc")
      # Host network: 127.0.0.1 is the host's redis-server and the function's port for both.
      docker run -d --name "$qfn" --network host --read-only --user 65532 --cap-drop ALL \
        -v "$vol:/runr:ro" -e "PORT=$fport" -e RUNR_WRAPPER_MODE=exec -e RUNR_TRIGGER=queue \
        -e 'RUNR_COMMAND=["/bin/sh", "/app/code/queue.sh"]' -e RUNR_INPUT=raw -e RUNR_TIMEOUT=10 \
        --entrypoint /runr/runr-wrapper "$qfref" >/dev/null
      docker run -d --name "$qc" --network host --read-only --user 65532 --cap-drop ALL \
        --security-opt no-new-privileges \
        -e "RUNR_QUEUE_REDIS_URL=redis://127.0.0.1:$qport" -e RUNR_QUEUE_STREAM=check \
        -e RUNR_QUEUE_GROUP=check-fn -e RUNR_QUEUE_CONSUMER=check \
        -e "RUNR_QUEUE_TARGET=http://127.0.0.1:$fport/" -e RUNR_QUEUE_LOG=debug \
        "${REF[runr-queue]}" >/dev/null
      consuming() { docker logs "$qc" 2>&1 | grep -q ' consuming '; }
      if ! wait_until 30 "runr-queue to consume" consuming; then
        fail "runr-queue did not start consuming: $(docker logs "$qc" 2>&1 | tail -5)"
      else
        id=$(redis-cli -p "$qport" XADD check '*' msg hi)
        # As the log line quotes it (logfmt: the value holds spaces and quotes).
        want='answer="processed {\"msg\":\"hi\"} (from sh)"'
        acked() {
          docker logs "$qc" 2>&1 | grep -qF "$want" \
            && [ "$(redis-cli -p "$qport" XPENDING check check-fn | head -n1)" = 0 ]
        }
        if wait_until 30 "the entry to be delivered and acknowledged" acked; then
          say "runr-queue delivered $id to the function and acknowledged it: $want"
        else
          fail "entry $id not delivered and acknowledged; queue log: $(docker logs "$qc" 2>&1 | tail -5); function log: $(docker logs "$qfn" 2>&1 | tail -5)"
        fi
        # SIGTERM: it stops and exits 0 within its drain limit (what the kubelet does on scale-down).
        docker stop -t 30 "$qc" >/dev/null
        code=$(docker inspect -f '{{.State.ExitCode}}' "$qc")
        [ "$code" = 0 ] || fail "runr-queue exited $code after SIGTERM: $(docker logs "$qc" 2>&1 | tail -3)"
      fi
    fi
  fi
  step_done
fi

# === 9. sandboxes ================================================================================
# Its own script (deploy/sandbox/check.py: bundles, checks and what each proves); each of its
# FAIL lines joins this summary.
step "sandboxes: the release binaries as PID 1 under gVisor (runsc) and runc"
if [[ " ${BUILT_ARCHS[*]} " != *" $HOST_ARCH "* ]]; then
  skip "sandbox checks: no $HOST_ARCH binaries were built"
else
  runtimes=${RUNR_SANDBOX_RUNTIMES:-runsc runc}
  if [[ " $runtimes " == *" runc "* ]] && [ -z "${RUNR_SANDBOX_RUNTIMES:-}" ] && ! command -v runc >/dev/null; then
    skip "sandbox checks under runc, for comparison: runc is not installed (Debian: runc)"
    runtimes=runsc
  fi
  sandbox_log="$WORK/sandbox.log"
  code=0
  RUNR_SANDBOX_RUNTIMES="$runtimes" deploy/sandbox/check.py --dist "$DIST/$HOST_ARCH" 2>&1 | tee "$sandbox_log" || code=$?
  case $code in
    0) ;;
    3) skip "gVisor sandbox checks: $(sed -n 's/^\[sandbox\] skip: //p' "$sandbox_log" | head -n1)" ;;
    *)
      mapfile -t sandbox_failures < <(sed -n 's/^\[sandbox\] FAIL: //p' "$sandbox_log")
      [ ${#sandbox_failures[@]} -gt 0 ] || sandbox_failures=("deploy/sandbox/check.py exited $code")
      for f in "${sandbox_failures[@]}"; do fail "sandbox: ${f:0:400}"; done
      ;;
  esac
fi
step_done

# === summary =======================================================================================
printf '\n[check] timings (2 cores shared with whatever else runs):\n'
printf '[check] %s\n' "${TIMINGS[@]}"
printf '[check] %5ss  total\n' "$((SECONDS - CHECK_START))"
if [ ${#SKIPPED[@]} -gt 0 ]; then
  printf '[check] skipped (%d):\n' "${#SKIPPED[@]}"
  printf '[check]   %s\n' "${SKIPPED[@]}"
fi
if [ ${#FAILED[@]} -gt 0 ]; then
  printf '[check] FAILED (%d):\n' "${#FAILED[@]}"
  printf '[check]   %s\n' "${FAILED[@]}"
  exit 1
fi
say "all checks passed"
