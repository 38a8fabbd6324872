#!/usr/bin/env bash
# serve-gpu.sh: `kvvm bench serve` against `kvvm serve`, then against the plain Hugging
# Face wrapper (bench/serve_hf.py: one request at a time under a lock), on the GPU
# machine, at the same arrival rates and the same trace. Builds nothing: CLI is a built kvvm.
#   serve.log / hf.log          the servers' output
#   bench-kvvm.json / .txt      kvvm bench serve --json against kvvm serve (one object per rate)
#   bench-hf.json / .txt        the same against the HF wrapper (HF=0 skips it; KVVM=0 runs
#                               only it, the kvvm runs kept)
#   summary.md                  a markdown table of both
# Everything lands in $OUT (default ./out/serve).
#
# The trace is kvvm simulate's generator with ShareGPT-like means (161 prompt, 338 output
# tokens) behind TENANTS system prompts of SYSTEM_PROMPT tokens, REQUESTS per rate; each rate's
# run stops issuing after DURATION seconds and cancels what is still in flight TIMEOUT seconds
# later, so a saturated server costs at most DURATION + TIMEOUT per rate.
#
# MODEL is a Llama-3-8B-shaped checkpoint directory; without one, a random bf16 one is made in
# $WORK/llama-3-8b by bench/generate_hf.py's make_checkpoint (as engine-gpu.sh does).
#
# Usage: CLI=build/gpu/tools/kvvm/kvvm MODEL=/tmp/kvvm-bench-models/llama-3-8b \
#          bench/serve-gpu.sh
#   RATES=1,4 REQUESTS=50 DURATION=30 HF=0 SERVE_ARGS="--kv-budget 40GiB" bench/serve-gpu.sh
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="${OUT:-$ROOT/out/serve}"
CLI="${CLI:-$ROOT/build/gpu/tools/kvvm/kvvm}"
WORK="${WORK:-/tmp/kvvm-bench-models}"
MODEL="${MODEL:-}"
RATES="${RATES:-1,4,16,64}"
REQUESTS="${REQUESTS:-200}"
DURATION="${DURATION:-60}"
TIMEOUT="${TIMEOUT:-30}"
TENANTS="${TENANTS:-4}"
SYSTEM_PROMPT="${SYSTEM_PROMPT:-512}"
PROMPT_MEAN="${PROMPT_MEAN:-161.31}"
OUTPUT_MEAN="${OUTPUT_MEAN:-337.99}"
VOCAB="${VOCAB:-32000}"
PORT="${PORT:-8000}"
HF_PORT="${HF_PORT:-8001}"
HF="${HF:-1}"
KVVM="${KVVM:-1}"  # 0: only the HF wrapper (the kvvm runs already in $OUT)
BACKEND="${BACKEND:-cuda}"    # kvvm serve's --backend (cpu: a dry run of this script anywhere)
HF_DEVICE="${HF_DEVICE:-cuda}"  # the HF wrapper's --device
READY_TIMEOUT="${READY_TIMEOUT:-900}"  # seconds to load a model and listen
STOP_TIMEOUT="${STOP_TIMEOUT:-120}"    # seconds a server gets to exit after SIGTERM
SERVE_ARGS="${SERVE_ARGS:-}"           # more `kvvm serve` options
BENCH_ARGS="${BENCH_ARGS:-}"           # more `kvvm bench serve` options
mkdir -p "$OUT" "$WORK"
export PYTHONPATH="$ROOT/bench${PYTHONPATH:+:$PYTHONPATH}"

if [[ ! -x "$CLI" ]]; then
  echo "serve-gpu: CLI=$CLI is not an executable kvvm (build it first)" >&2
  exit 2
fi
if [[ -z "$MODEL" ]]; then
  MODEL="$WORK/llama-3-8b"
  if [[ ! -f "$MODEL/config.json" ]]; then
    echo "== making a random llama-3-8b checkpoint in $MODEL"
    python3 -c "import generate_hf as b; b.make_checkpoint('llama-3-8b', '$MODEL')"
  fi
fi
if [[ ! -f "$MODEL/config.json" ]]; then
  echo "serve-gpu: MODEL=$MODEL has no config.json" >&2
  exit 2
fi

server_pid=""
stop_server() {
  [[ -n "$server_pid" ]] || return 0
  if kill -0 "$server_pid" 2>/dev/null; then
    kill -TERM "$server_pid" 2>/dev/null || true
    local waited=0
    while kill -0 "$server_pid" 2>/dev/null && ((waited < STOP_TIMEOUT)); do
      sleep 1
      waited=$((waited + 1))
    done
    if kill -0 "$server_pid" 2>/dev/null; then
      echo "serve-gpu: the server did not exit ${STOP_TIMEOUT} s after SIGTERM; killing it"
      kill -KILL "$server_pid" 2>/dev/null || true
    fi
  fi
  wait "$server_pid" 2>/dev/null && echo "server exit status 0" || echo "server exit status $?"
  server_pid=""
}
trap stop_server EXIT

# start_server LOG PATTERN COMMAND...: starts COMMAND in the background with its output in LOG
# and waits (at most READY_TIMEOUT seconds) for a line matching PATTERN, its ready line.
start_server() {
  local log="$1" pattern="$2"
  shift 2
  "$@" >"$log" 2>&1 &
  server_pid=$!
  local waited=0
  while ! grep -qE "$pattern" "$log"; do
    if ! kill -0 "$server_pid" 2>/dev/null; then
      echo "serve-gpu: the server exited before its ready line; the end of $log:" >&2
      tail -20 "$log" >&2
      wait "$server_pid" 2>/dev/null || true
      server_pid=""
      return 1
    fi
    if ((waited >= READY_TIMEOUT)); then
      echo "serve-gpu: no ready line in $log after ${READY_TIMEOUT} s" >&2
      tail -20 "$log" >&2
      stop_server
      return 1
    fi
    sleep 1
    waited=$((waited + 1))
  done
  grep -E "$pattern" "$log" | head -1
}

# bench NAME URL: kvvm bench serve at every rate, JSON and the text table into $OUT.
bench() {
  local name="$1" url="$2"
  # shellcheck disable=SC2086  # BENCH_ARGS is a list of options
  if ! "$CLI" bench serve --url "$url" --rates "$RATES" --requests "$REQUESTS" \
    --duration "$DURATION" --timeout "$TIMEOUT" --tenants "$TENANTS" \
    --system-prompt-tokens "$SYSTEM_PROMPT" --prompt-mean "$PROMPT_MEAN" \
    --output-mean "$OUTPUT_MEAN" --vocab "$VOCAB" --json $BENCH_ARGS >"$OUT/bench-$name.json"; then
    echo "serve-gpu: kvvm bench serve against $name failed" >&2
    return 1
  fi
}

status=0
if [[ "$KVVM" != 0 ]]; then
  echo "== kvvm serve on $MODEL"
  # shellcheck disable=SC2086  # SERVE_ARGS is a list of options
  if start_server "$OUT/serve.log" "^kvvm serve: .* on http://" \
    "$CLI" serve --model "$MODEL" --backend "$BACKEND" --port "$PORT" $SERVE_ARGS; then
    bench kvvm "http://127.0.0.1:$PORT" || status=1
    stop_server
  else
    status=1
  fi
fi

if [[ "$HF" != 0 ]]; then
  echo "== HF transformers wrapper on $MODEL"
  if start_server "$OUT/hf.log" "^serve_hf: ready on http://" \
    python3 "$ROOT/bench/serve_hf.py" --model "$MODEL" --port "$HF_PORT" \
    --device "$HF_DEVICE" --dtype bfloat16; then
    bench hf "http://127.0.0.1:$HF_PORT" || status=1
    stop_server
  else
    status=1
  fi
fi

python3 - "$OUT" <<'EOF' | tee "$OUT/summary.md"
import json, os, sys
out = sys.argv[1]
def cell(v, digits=1):
    return "-" if v is None else f"{v:.{digits}f}"
def pct(run, key, which):
    s = run.get(key)
    return cell(s[which]) if s else "-"
print("| server | rate req/s | sent | done | 429 | errors | cancelled | out tok/s | TTFT p50 / p99 ms "
      "| TPOT p50 / p99 ms | E2E p50 / p99 ms |")
print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
for name, label in (("kvvm", "kvvm serve"), ("hf", "HF transformers (one at a time)")):
    path = os.path.join(out, f"bench-{name}.json")
    if not os.path.exists(path):
        continue
    try:
        report = json.load(open(path))
    except ValueError:
        print(f"| {label} | (no report: {path} is not JSON) |")
        continue
    for run in report["runs"]:
        print(f"| {label} | {cell(run['rate'], 2)} | {run['sent']} | {run['completed']} "
              f"| {run['rejected_429']} | {run['errors']['total']} | {run['cancelled']} "
              f"| {cell(run['output_tokens_per_s'])} "
              f"| {pct(run, 'ttft_ms', 'p50')} / {pct(run, 'ttft_ms', 'p99')} "
              f"| {pct(run, 'tpot_ms', 'p50')} / {pct(run, 'tpot_ms', 'p99')} "
              f"| {pct(run, 'e2e_ms', 'p50')} / {pct(run, 'e2e_ms', 'p99')} |")
EOF
exit $status
