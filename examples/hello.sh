#!/usr/bin/env bash
# Example exec-mode handler: reads the request envelope (JSON) on stdin, answers with a
# response envelope on stdout. Per-invocation details are also in RUNR_* variables.
set -euo pipefail
envelope=$(cat)
echo "handling ${RUNR_METHOD} ${RUNR_PATH} (request ${RUNR_REQUEST_ID})" >&2
name=$(printf '%s' "$envelope" | sed -n 's/.*"name":"\([^"]*\)".*/\1/p')
printf '{"statusCode": 200, "headers": {"Content-Type": "text/plain"}, "body": "hello, %s, from bash\\n"}\n' "${name:-world}"
