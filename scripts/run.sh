#!/usr/bin/env bash
# Installs what is missing, builds, and runs kvvm's main job: `kvvm serve` on the embedded demo
# model (models/kvvm-adder, a 4M-parameter ChatML model that adds numbers) on loopback, one chat
# request sent through it and the exchange printed, then the server kept running until Ctrl-C
# with a curl line and a Python `openai` snippet to talk to it.
# It serves on CUDA when a GPU is present and on the CPU otherwise.
#
# Usage:
#   scripts/run.sh                     serve the demo model until Ctrl-C (port $KVVM_PORT, 8000)
#   scripts/run.sh --demo-only         the exchange, then stop the server and exit (CI runs this)
#   scripts/run.sh simulate [OPTIONS]  `kvvm simulate`: a request trace replayed through the
#                                      arena beside the paged and preallocated baselines
# Environment: KVVM_BUILD_DIR (default build/release), KVVM_ENABLE_CUDA (AUTO, ON, OFF),
#   KVVM_PORT (default 8000; 0: any free port), KVVM_SERVE_ARGS (more `kvvm serve` options).
set -euo pipefail
cd "$(dirname "$0")/.."

mode=serve
case "${1:-}" in
  simulate) mode=simulate; shift ;;
  --demo-only) mode=demo; shift ;;
  -h | --help)
    sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'
    exit 0
    ;;
esac
if [[ $mode != simulate && $# -gt 0 ]]; then
  echo "scripts/run.sh: unknown argument '$1' (try --help)" >&2
  exit 2
fi

source scripts/common.sh
# Only the tool is needed here; the tests and benchmarks are scripts/test.sh's.
kvvm_build_cli
kvvm=$KVVM_CLI
if [[ $mode == simulate ]]; then
  exec "$kvvm" simulate "$@"
fi

# --- serve the demo model ------------------------------------------------------------------
port=${KVVM_PORT:-8000}
if [[ $mode == demo ]]; then port=${KVVM_PORT:-0}; fi  # CI: never collide with a real server
log=$(mktemp)
# shellcheck disable=SC2086  # KVVM_SERVE_ARGS is a list of options
"$kvvm" serve --model models/kvvm-adder --port "$port" ${KVVM_SERVE_ARGS:-} >"$log" 2>&1 &
server=$!
stop_server() {
  if kill -0 "$server" 2>/dev/null; then
    kill -TERM "$server" 2>/dev/null || true
    wait "$server" 2>/dev/null || true
    tail -n +2 "$log" | grep -v '^kvvm serve: kvvm-adder on' | tail -n 5 || true
  fi
  rm -f "$log"
}
trap stop_server EXIT

# The server prints one line with its URL once it accepts requests.
url=""
for _ in $(seq 600); do
  url=$(grep -o 'http://[^ ]*' "$log" | head -n 1 || true)
  if [[ -n $url ]] || ! kill -0 "$server" 2>/dev/null; then break; fi
  sleep 0.1
done
cat "$log"
if [[ -z $url ]]; then
  echo "scripts/run.sh: kvvm serve did not come up (its output is above)" >&2
  exit 1
fi

request='{"model": "kvvm-adder", "messages": [{"role": "user", "content": "What is 482 + 39?"}], "max_tokens": 8, "temperature": 0}'
echo
echo "> POST $url/v1/chat/completions"
echo "> $request"
response=$(curl -sS --max-time 60 -H 'Content-Type: application/json' -d "$request" \
  -w '\n%{http_code}' "$url/v1/chat/completions")
status=${response##*$'\n'}
body=${response%$'\n'*}
echo "< HTTP $status"
echo "< $body"
answer=$(grep -o '"content": *"[^"]*"' <<<"$body" | head -n 1 | sed 's/.*: *"\(.*\)"/\1/' || true)
echo
echo "user:      What is 482 + 39?"
echo "assistant: $answer"
if [[ $status != 200 ]]; then
  echo "scripts/run.sh: the server answered HTTP $status" >&2
  exit 1
fi

if [[ $mode == demo ]]; then
  trap - EXIT
  kill -TERM "$server"
  code=0
  wait "$server" || code=$?
  tail -n +2 "$log" | grep -v '^kvvm serve: kvvm-adder on' || true
  rm -f "$log"
  exit "$code"
fi

cat <<EOF

kvvm serve is running on $url (Ctrl-C drains and stops it). Try:

  curl $url/v1/chat/completions -H 'Content-Type: application/json' \\
    -d '{"model": "kvvm-adder", "messages": [{"role": "user", "content": "What is 120 + 7?"}], "stream": true}'

  # pip install openai
  from openai import OpenAI
  client = OpenAI(base_url="$url/v1", api_key="none")
  reply = client.chat.completions.create(model="kvvm-adder",
      messages=[{"role": "user", "content": "What is 120 + 7?"}])
  print(reply.choices[0].message.content)

Metrics: curl $url/metrics
EOF
# Follow the server's log until it exits. Ctrl-C ends this script (a background job ignores
# SIGINT), and the EXIT trap then sends the server SIGTERM, which it answers by draining.
tail -n +2 -f "$log" --pid "$server" 2>/dev/null | grep -v '^kvvm serve: kvvm-adder on' || true
