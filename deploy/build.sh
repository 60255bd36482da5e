#!/usr/bin/env bash
# Release builds of the workspace's five binaries, musl-static, and their FROM scratch images.
#
#   deploy/build.sh [binaries] [--cross] [ARCH...]
#       cargo build --release for each ARCH (amd64, arm64; default: amd64, plus arm64 when its
#       toolchain is installed) and copies the binaries to target/dist/<ARCH>/. --cross builds with
#       `cross` (Cross.toml) instead of the native toolchain.
#   deploy/build.sh images [--prefix PREFIX] [--tag TAG] [ARCH]
#       docker build of deploy/Dockerfile.<binary> for each binary from target/dist/<ARCH>/
#       (default amd64), tagged PREFIX/<name>:TAG (default ghcr.io/brf-tech/runr/<name>:<version>),
#       then prints every image's size.
#
# Directories are named after Docker's architectures (amd64, arm64), not Rust's, so that
# `docker buildx build --platform linux/amd64,linux/arm64 -f deploy/Dockerfile.X target/dist` picks
# each platform's binary through the TARGETARCH argument with no mapping in between.
#
# Environment: RUNR_DIST_DIR (default <repo>/target/dist), CARGO_TARGET_DIR as cargo knows it,
# RUNR_BUILD_LOCKED=0 to build without --locked; CC_<triple> and CARGO_TARGET_<TRIPLE>_LINKER are
# respected when set.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

# The binary of each crate, in build order of interest: these five ship as images.
BINARIES=(runr-wrapper runr-tick runr-image-upload runr-prewarm runr-queue)
DIST=${RUNR_DIST_DIR:-$ROOT/target/dist}
TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
# Release builds use exactly Cargo.lock; RUNR_BUILD_LOCKED=0 lets cargo update it (development).
LOCKED=--locked
[ "${RUNR_BUILD_LOCKED:-1}" = 1 ] || LOCKED=""

log() { printf '[build] %s\n' "$*" >&2; }
die() { printf '[build] error: %s\n' "$*" >&2; exit 1; }

# --- shared helpers (check.sh sources this file with RUNR_BUILD_LIB=1) ----------------------------

# Rust target triple of a Docker architecture name.
triple_of() {
  case "$1" in
    amd64) echo x86_64-unknown-linux-musl ;;
    arm64) echo aarch64-unknown-linux-musl ;;
    *) die "unknown architecture '$1' (amd64 or arm64)" ;;
  esac
}

# The CPU name GNU toolchains use for a Docker architecture name.
cpu_of() {
  case "$1" in
    amd64) echo x86_64 ;;
    arm64) echo aarch64 ;;
  esac
}

host_arch() {
  case "$(uname -m)" in
    x86_64) echo amd64 ;;
    aarch64 | arm64) echo arm64 ;;
    *) uname -m ;;
  esac
}

# Workspace version and git revision, for the images' OCI labels.
workspace_version() {
  sed -n '/^\[workspace.package\]/,/^\[/{s/^version *= *"\(.*\)"/\1/p}' "$ROOT/Cargo.toml" | head -n1
}
git_revision() {
  local rev
  rev=$(git -C "$ROOT" rev-parse HEAD 2>/dev/null) || { echo unknown; return; }
  # A build from a dirty tree must not claim to be that commit.
  if [ -n "$(git -C "$ROOT" status --porcelain --untracked-files=no 2>/dev/null)" ]; then
    rev="$rev-dirty"
  fi
  echo "$rev"
}
workspace_repository() {
  sed -n '/^\[workspace.package\]/,/^\[/{s/^repository *= *"\(.*\)"/\1/p}' "$ROOT/Cargo.toml" | head -n1
}

# Sets up the environment for a native build of ARCH, or sets MISSING to what is missing and
# returns 1 (not through stdout: the exports must happen in this shell, not a subshell). Only the C side needs care: the Rust side is the rustup target alone, since the musl
# targets link their own C runtime (crt objects and libc.a) into the static binary.
toolchain_env() {
  local arch=$1 triple cpu var_cc var_linker missing=() cc=""
  MISSING=""
  triple=$(triple_of "$arch")
  cpu=$(cpu_of "$arch")
  var_cc="CC_${triple//-/_}"
  var_linker="CARGO_TARGET_$(echo "${triple//-/_}" | tr '[:lower:]' '[:upper:]')_LINKER"

  if [ ! -d "$(rustc --print sysroot)/lib/rustlib/$triple/lib" ]; then
    missing+=("the Rust standard library for $triple (rustup target add $triple)")
  fi
  if [ "$arch" = "$(host_arch)" ]; then
    # Native: ring and any other crate with C sources compile with musl-gcc (Debian: musl-tools);
    # rustc links with the host cc and its own musl crt objects.
    if [ -z "${!var_cc:-}" ]; then
      if command -v musl-gcc >/dev/null; then
        export "$var_cc=musl-gcc"
      else
        missing+=("musl-gcc for crates that compile C, e.g. ring (Debian: apt-get install musl-tools)")
      fi
    fi
  else
    # Cross: one GNU cross compiler is both the C compiler and the linker driver. A glibc-targeted
    # gcc is fine here: ring's C is freestanding and rustc passes its own musl crt/libc.a.
    for c in "$cpu-linux-musl-gcc" "$cpu-linux-gnu-gcc"; do
      if command -v "$c" >/dev/null; then cc=$c; break; fi
    done
    if [ -z "${!var_cc:-}" ] || [ -z "${!var_linker:-}" ]; then
      if [ -n "$cc" ]; then
        [ -n "${!var_cc:-}" ] || export "$var_cc=$cc"
        [ -n "${!var_linker:-}" ] || export "$var_linker=$cc"
      else
        missing+=("a C cross compiler and linker for $cpu (Debian: apt-get install gcc-$cpu-linux-gnu, or a musl cross toolchain providing $cpu-linux-musl-gcc)")
      fi
    fi
  fi
  if [ ${#missing[@]} -gt 0 ]; then
    MISSING=$(printf '%s; ' "${missing[@]}")
    MISSING=${MISSING%; }
    return 1
  fi
}

# --- binaries ------------------------------------------------------------------------------------

# Architectures built by this process, for check.sh.
BUILT=()

build_binaries() {
  local use_cross=0 explicit=() archs=() arch triple
  for a in "$@"; do
    case "$a" in
      --cross) use_cross=1 ;;
      amd64 | arm64) explicit+=("$a") ;;
      x86_64) explicit+=(amd64) ;;
      aarch64) explicit+=(arm64) ;;
      *) die "unknown argument '$a' (usage: deploy/build.sh [binaries] [--cross] [amd64] [arm64])" ;;
    esac
  done
  if [ ${#explicit[@]} -gt 0 ]; then archs=("${explicit[@]}"); else archs=(amd64 arm64); fi

  local pkgs=()
  for b in "${BINARIES[@]}"; do pkgs+=(-p "$b"); done

  for arch in "${archs[@]}"; do
    triple=$(triple_of "$arch")
    if [ "$use_cross" = 1 ]; then
      command -v cross >/dev/null || die "cross is not installed (cargo install cross; it needs Docker)"
      log "$arch: cross build --release --target $triple"
      cross build --release $LOCKED --target "$triple" "${pkgs[@]}"
    else
      if ! toolchain_env "$arch"; then
        # An architecture asked for by name must build; the default arm64 is best effort.
        if [ ${#explicit[@]} -gt 0 ] || [ "$arch" = "$(host_arch)" ]; then
          die "cannot build $arch ($triple): missing $MISSING"
        fi
        log "skipping $arch ($triple): missing $MISSING"
        continue
      fi
      log "$arch: cargo build --release --target $triple"
      cargo build --release $LOCKED --target "$triple" "${pkgs[@]}"
    fi
    mkdir -p "$DIST/$arch"
    for b in "${BINARIES[@]}"; do
      cp -f "$TARGET_DIR/$triple/release/$b" "$DIST/$arch/$b"
    done
    BUILT+=("$arch")
    log "$arch: binaries in ${DIST#"$ROOT"/}/$arch/"
  done
}

# --- images --------------------------------------------------------------------------------------

# Image name under the prefix: the binary without its runr- prefix (runr-wrapper → wrapper), as
# in the spec's ghcr.io/brf-tech/runr/wrapper and ghcr.io/brf-tech/runr/image-upload.
image_name() { echo "${1#runr-}"; }

# docker build of one binary's image: build_image BINARY ARCH REF
build_image() {
  local bin=$1 arch=$2 ref=$3
  [ -x "$DIST/$arch/$bin" ] || die "$DIST/$arch/$bin is missing: run deploy/build.sh binaries $arch first"
  # The context is the dist directory only: a few MiB, nothing else of the checkout is sent.
  # Output is shown only on failure (the legacy builder also warns about itself on every call).
  local log build=(docker build)
  if [ "$arch" != "$(host_arch)" ]; then
    # The legacy builder labels a FROM scratch image with the engine's own architecture whatever
    # binary it holds, and refuses --platform for it: another architecture needs BuildKit.
    docker buildx version >/dev/null 2>&1 \
      || die "an image for $arch on this $(host_arch) engine needs BuildKit (docker buildx): the legacy builder would label it $(host_arch)"
    build=(docker buildx build --load --platform "linux/$arch")
  fi
  log=$(mktemp)
  if ! "${build[@]}" --quiet \
    --build-arg "TARGETARCH=$arch" \
    --build-arg "VERSION=$(workspace_version)" \
    --build-arg "REVISION=$(git_revision)" \
    --build-arg "SOURCE=$(workspace_repository)" \
    -f "$ROOT/deploy/Dockerfile.$bin" -t "$ref" "$DIST" >"$log" 2>&1; then
    cat "$log" >&2
    rm -f "$log"
    return 1
  fi
  rm -f "$log"
}

build_images() {
  local prefix=ghcr.io/brf-tech/runr tag arch=amd64
  tag=$(workspace_version)
  while [ $# -gt 0 ]; do
    case "$1" in
      --prefix) prefix=$2; shift 2 ;;
      --tag) tag=$2; shift 2 ;;
      amd64 | arm64) arch=$1; shift ;;
      *) die "unknown argument '$1' (usage: deploy/build.sh images [--prefix P] [--tag T] [amd64|arm64])" ;;
    esac
  done
  command -v docker >/dev/null && docker info >/dev/null 2>&1 || die "no Docker engine answers 'docker info'"
  printf '%-45s %10s\n' IMAGE SIZE
  for b in "${BINARIES[@]}"; do
    local ref="$prefix/$(image_name "$b"):$tag"
    build_image "$b" "$arch" "$ref" || die "docker build of deploy/Dockerfile.$b failed"
    printf '%-45s %10s\n' "$ref" "$(docker image inspect -f '{{.Size}}' "$ref" | awk '{ printf "%.2f MiB", $1 / 1048576 }')"
  done
}

if [ "${RUNR_BUILD_LIB:-0}" != 1 ]; then
  cmd=${1:-binaries}
  case "$cmd" in
    binaries) shift || true; build_binaries "$@" ;;
    images) shift; build_images "$@" ;;
    -h | --help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0" ;;
    *) build_binaries "$@" ;;
  esac
fi
