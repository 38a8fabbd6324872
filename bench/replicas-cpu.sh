#!/usr/bin/env bash
# Requests served per second by N `kvvm serve` replicas behind nginx (scripts/replicas.sh)
# against one replica alone, and one replica behind nginx (what nginx itself costs), on the CPU
# with the demo model: `kvvm bench serve` closed-loop at CONCURRENCY requests in flight, the
# set-ups alternated ROUNDS times so a busy machine slows each alike. Prints one line per run
# and the median of each.
#
# Usage: CLI=build/release/tools/kvvm/kvvm bench/replicas-cpu.sh
# Environment: CLI (the kvvm binary, required), REPLICAS (3), ROUNDS (3), REQUESTS (2000),
#   CONCURRENCY (24), SERVE_ARGS (more `kvvm serve` options for every replica).
set -euo pipefail
cd "$(dirname "$0")/.."
: "${CLI:?set CLI to a built kvvm binary}"
replicas=${REPLICAS:-3}
rounds=${ROUNDS:-3}
requests=${REQUESTS:-2000}
concurrency=${CONCURRENCY:-24}
export OPENBLAS_NUM_THREADS=1
# Token-id prompts of the demo model's vocabulary (674) and context (128); open loop at a rate
# no run reaches, so the concurrency limit sets the load.
bench=(bench serve --rate 5000 --requests "$requests" --concurrency-limit "$concurrency"
  --tenants 0 --prompt-mean 12 --output-mean 8 --max-context 120 --vocab 600 --timeout 60
  --json)

served_per_s() {  # URL: completed / wall seconds of one run, and its 429s and errors
  "$CLI" "${bench[@]}" --url "$1" 2>/dev/null |
    python3 -c 'import json, sys
run = json.load(sys.stdin)["runs"][0]
print("%.1f %d %d" % (run["completed"] / run["wall_s"], run["rejected_429"],
                      run["errors"]["total"]))'
}

work=$(mktemp -d)
pool_pid="" single_pid="" alone_pid=""
cleanup() {
  local pid
  for pid in $pool_pid $single_pid $alone_pid; do kill -TERM "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

# shellcheck disable=SC2086  # SERVE_ARGS is a list of options
bash scripts/replicas.sh --kvvm "$CLI" -n "$replicas" -p 0 -- ${SERVE_ARGS:-} >"$work/pool.log" 2>&1 &
pool_pid=$!
# shellcheck disable=SC2086
bash scripts/replicas.sh --kvvm "$CLI" -n 1 -p 0 -- ${SERVE_ARGS:-} >"$work/single.log" 2>&1 &
single_pid=$!
# shellcheck disable=SC2086
"$CLI" serve --model models/kvvm-adder --backend cpu --port 0 ${SERVE_ARGS:-} >"$work/alone.log" 2>&1 &
alone_pid=$!
nginx_url() { grep -o 'nginx .* on http://[^ ]*' "$1" | grep -o 'http://[^ ]*' || true; }
pool="" single="" alone=""
for _ in $(seq 600); do
  pool=$(nginx_url "$work/pool.log")
  single=$(nginx_url "$work/single.log")
  alone=$(grep -o 'http://[^ ]*' "$work/alone.log" | head -n 1 || true)
  if [[ -n $pool && -n $single && -n $alone ]]; then break; fi
  sleep 0.1
done
if [[ -z $pool || -z $single || -z $alone ]]; then
  cat "$work/pool.log" "$work/single.log" "$work/alone.log" >&2
  echo "bench/replicas-cpu.sh: the servers did not come up (their output is above)" >&2
  exit 1
fi

echo "# setup                         req/s  429  errors"
pool_runs=() single_runs=() alone_runs=()
run() {  # label url: one run, printed; its rate in $rate
  local refused errors
  read -r rate refused errors < <(served_per_s "$2")
  printf '%-30s %6s %4s %7s\n' "$1" "$rate" "$refused" "$errors"
}
for ((r = 1; r <= rounds; r++)); do
  run "$replicas replicas behind nginx" "$pool"
  pool_runs+=("$rate")
  run "1 replica behind nginx" "$single"
  single_runs+=("$rate")
  run "1 replica alone" "$alone"
  alone_runs+=("$rate")
done
median() { printf '%s\n' "$@" | sort -g | awk '{v[NR] = $1} END {print v[int((NR + 1) / 2)]}'; }
pool_median=$(median "${pool_runs[@]}")
single_median=$(median "${single_runs[@]}")
alone_median=$(median "${alone_runs[@]}")
echo "median req/s: $replicas replicas behind nginx $pool_median, 1 replica behind nginx" \
  "$single_median, 1 replica alone $alone_median; $replicas behind nginx / 1 alone" \
  "$(awk -v a="$pool_median" -v b="$alone_median" 'BEGIN {printf "%.2f", a / b}')"
