#!/usr/bin/env bash
# Runs every fuzz target for SECONDS (default 60) each, one after the other, and fails if any
# target found a crash. Crashes land in fuzz/artifacts/<target>/; turn each into a named
# regression test in the fuzzed crate's normal test suite before fixing it.
#   fuzz/run.sh [SECONDS] [TARGET...]
# Needs a nightly toolchain and cargo-fuzz:
#   rustup toolchain install nightly --profile minimal && cargo install cargo-fuzz --locked
set -uo pipefail
cd "$(dirname "$0")"
seconds=${1:-60}
shift || true
if ! cargo +nightly fuzz --version >/dev/null 2>&1; then
  echo "cargo-fuzz with a nightly toolchain is needed: rustup toolchain install nightly --profile minimal && cargo install cargo-fuzz --locked" >&2
  exit 2
fi
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  mapfile -t targets < <(cargo +nightly fuzz list)
fi
failed=()
for t in "${targets[@]}"; do
  mkdir -p "corpus/$t"
  printf '=== %s (%ss) ===\n' "$t" "$seconds"
  # -rss_limit_mb: a target must stay bounded on hostile input; -max_len keeps inputs realistic.
  if ! cargo +nightly fuzz run "$t" "corpus/$t" -- -max_total_time="$seconds" -rss_limit_mb=2048 \
      -print_final_stats=1 2>&1 | tail -n 12; then
    failed+=("$t")
  fi
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "crashes or errors in: ${failed[*]} (see fuzz/artifacts/)" >&2
  exit 1
fi
echo "all ${#targets[@]} targets ran ${seconds}s each without a crash"
