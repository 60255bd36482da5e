#!/usr/bin/env bash
# The wrapper's own work per exec-mode request in counts that hold on a busy machine (where the
# CPU columns of bench/wrapper.sh do not): user-space instructions (valgrind --tool=callgrind)
# and system calls (strace -c, the wrapper process alone, not its children), each the
# difference between a run of 50 and one of 350 sequential keep-alive requests (100-byte POSTs
# to `cat`, RUNR_INPUT=raw), divided by 300, so start-up and shutdown cancel out.
#
#   bash bench/exec_cost.sh [BINARY ...]   # default: builds the release musl binary
#   MODE=persistent bash bench/exec_cost.sh [BINARY ...]   # the same counts for persistent
#                                    # mode (one C echo worker, examples/c/echo_worker.c)
#
# A binary with symbols shows where the instructions go (callgrind_annotate bench/out/cost/*/cg.350):
#   CARGO_PROFILE_RELEASE_STRIP=false CARGO_PROFILE_RELEASE_DEBUG=line-tables-only \
#     cargo build --release --target x86_64-unknown-linux-musl -p runr-wrapper
set -euo pipefail
cd "$(dirname "$0")/.."

for tool in valgrind strace curl python3; do
  command -v "$tool" >/dev/null || { echo "needs $tool (apt-get install valgrind strace curl python3)" >&2; exit 1; }
done
if [ $# = 0 ]; then
  cargo build --quiet --release --target x86_64-unknown-linux-musl -p runr-wrapper --bin runr-wrapper
  set -- target/x86_64-unknown-linux-musl/release/runr-wrapper
fi
OUT=bench/out/cost
mkdir -p "$OUT"
MODE=${MODE:-exec}
case $MODE in
  exec) MODE_ENV=(RUNR_WRAPPER_MODE=exec RUNR_INPUT=raw RUNR_COMMAND=cat) ;;
  persistent)
    cc -O2 -o "$OUT/echo_worker" examples/c/echo_worker.c
    MODE_ENV=(RUNR_WRAPPER_MODE=persistent RUNR_WORKERS=1 RUNR_COMMAND="$PWD/$OUT/echo_worker") ;;
  *) echo "MODE is exec or persistent" >&2; exit 2 ;;
esac

free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
wait_port() { for _ in $(seq 600); do curl -s -o /dev/null -X POST --data x "http://127.0.0.1:$1/" && return; sleep 0.1; done; echo "not up" >&2; exit 1; }
requests() { # port count
  python3 - "$1" "$2" <<'PY'
import http.client, sys
c = http.client.HTTPConnection("127.0.0.1", int(sys.argv[1]))
for _ in range(int(sys.argv[2])):
    c.request("POST", "/", body=b"x" * 100, headers={"Content-Type": "text/plain"})
    r = c.getresponse()
    assert r.status == 200 and r.read() == b"x" * 100, r.status
PY
}
run() { # dir tool count binary
  local p pid
  p=$(free_port)
  case $2 in
    cg) set -- "$@" valgrind --tool=callgrind --callgrind-out-file="$1/cg.$3" ;;
    st) set -- "$@" strace -c -U calls,name -o "$1/st.$3" ;;
  esac
  env PORT="$p" RUNR_LOG=warn "${MODE_ENV[@]}" "${@:5}" "$4" >/dev/null 2>>"$1/log" &
  pid=$!
  wait_port "$p"
  requests "$p" "$3"
  # SIGTERM to the wrapper (under strace, the tracer's child): it stops, and the tool writes.
  if [ "$2" = st ]; then kill $(cat /proc/"$pid"/task/*/children); else kill "$pid"; fi
  wait "$pid" || true
}
calls() { awk '$1 ~ /^[0-9]+$/ && NF == 2 && $2 != "total" { print $2, $1 }' "$1" | sort; }

for bin in "$@"; do
  dir=$OUT/$MODE-$(basename "$(dirname "$(realpath "$bin")")")-$(basename "$bin")
  mkdir -p "$dir"
  : >"$dir/log"
  for tool in cg st; do for n in 50 350; do run "$dir" "$tool" "$n" "$bin"; done; done
  ir() { awk '/^summary:/ { print $2; exit }' "$dir/cg.$1"; }
  echo "$bin ($MODE mode): $(( ($(ir 350) - $(ir 50)) / 300 )) user-space instructions per request"
  join <(calls "$dir/st.50") <(calls "$dir/st.350") |
    awk '{ d = ($3 - $2) / 300; t += d; if (d >= 0.05) s = s sprintf(" %s=%.2f", $1, d) }
         END { printf "  %.1f system calls per request:%s\n", t, s }'
done
