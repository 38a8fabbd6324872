#!/usr/bin/env bash
# weights-gpu.sh: weights streamed through the ring, on the GPU machine (PARTS picks, default
# all, comma-separated):
#   8b     a random bf16 Llama-3-8B-shaped checkpoint (bench/generate_hf.py makes it), `kvvm
#          bench engine` decode at batches 1 and 64, every weight resident and with an 8 GiB
#          weight budget (~8 GB streamed per step): graphs, eager and preallocated side by side
#          -> 8b-resident.json, 8b-streamed.json; the load's bytes/s from the page cache.
#   70b    a Llama-3-70B-shaped model (--load-format dummy: a config only, 141 GB of weights
#          drawn on the device) with a 100 GiB weight budget, batches 1 and 128 -> 70b.json.
#   hf     bench/weights_hf.py on the 8B checkpoint: pinned and pageable copy rates,
#          from_pretrained(device_map="cuda") load bytes/s, accelerate's offload at the same
#          8 GiB (decode tokens/s at batches 1 and 64) -> hf.json.
# weights.txt sums up what is there: step time against max(compute, streamed bytes / copy
# rate), graphs vs eager, kvvm vs HF offload. Everything lands in $OUT (default ./out/weights).
#
# Usage: CLI=build/gpu/tools/kvvm/kvvm PARTS=8b,70b bench/weights-gpu.sh
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="${OUT:-$ROOT/out/weights}"
CLI="${CLI:-$ROOT/build/gpu/tools/kvvm/kvvm}"
WORK="${WORK:-/tmp/kvvm-bench-models}"
PARTS="${PARTS:-8b,70b,hf}"
BUDGET="${BUDGET:-8GiB}"
BUDGET_70B="${BUDGET_70B:-100GiB}"
DECODE="${DECODE:-32}"
mkdir -p "$OUT" "$WORK"
export PYTHONPATH="$ROOT/bench${PYTHONPATH:+:$PYTHONPATH}"
has() { [[ ",$PARTS," == *",$1,"* ]]; }

dir8="$WORK/llama-3-8b"
if (has 8b || has hf) && [[ ! -f "$dir8/model.safetensors.index.json" ]]; then
  echo "== making the llama-3-8b checkpoint in $dir8"
  python3 -c "import generate_hf as b; b.make_checkpoint('llama-3-8b', '$dir8')"
fi
if has 8b; then
  for run in resident streamed; do
    budget=()
    [[ "$run" == streamed ]] && budget=(--weight-budget "$BUDGET")
    echo "== kvvm bench engine, llama-3-8b, $run"
    "$CLI" bench engine --model "$dir8" --backend cuda "${budget[@]}" --kv-budget 16GiB \
      --max-context 2048 --batches 1,64 --prompt-tokens 128 --decode-tokens "$DECODE" \
      --no-trace --json >"$OUT/8b-$run.json"
  done
fi
if has 70b; then
  dir70="$WORK/llama-3-70b"
  python3 "$ROOT/bench/weights_hf.py" --model "$dir70" --config-only llama-3-70b
  echo "== kvvm bench engine, llama-3-70b (dummy), weight budget $BUDGET_70B"
  "$CLI" bench engine --model "$dir70" --backend cuda --load-format dummy \
    --weight-budget "$BUDGET_70B" --kv-budget 12GiB --max-context 1024 --batches 1,128 \
    --prompt-tokens 32 --decode-tokens 12 --no-trace --json >"$OUT/70b.json"
fi
if has hf; then
  echo "== Hugging Face: copy rates, load, offload at $BUDGET"
  python3 "$ROOT/bench/weights_hf.py" --model "$dir8" --max-memory "$BUDGET" --batches 1,64 \
    --decode-tokens 8 --out "$OUT/hf.json" >/dev/null
fi

python3 - "$OUT" <<'PY' | tee "$OUT/weights.txt"
import json, os, sys
out = sys.argv[1]
def load(name):
    path = os.path.join(out, name)
    return json.load(open(path)) if os.path.exists(path) else None
hf = load("hf.json")
rate = hf["pinned_copy_bytes_per_s"] if hf else 54.7e9  # measured on this H200 before
print(f"pinned host-to-device copy rate: {rate / 1e9:.1f} GB/s" + ("" if hf else " (not measured in this run)"))
if hf:
    print(f"pageable: {hf['pageable_copy_bytes_per_s'] / 1e9:.1f} GB/s; HF load "
          f"(device_map=cuda): {hf['load']['bytes_per_s'] / 1e9:.2f} GB/s")
def rows(report):
    return {(r["mode"], r["batch"]): r for r in report["decode"]["runs"]} if report else {}
resident, streamed, big = load("8b-resident.json"), load("8b-streamed.json"), load("70b.json")
for name, report in (("8b resident", resident), ("8b streamed", streamed), ("70b", big)):
    if report:
        w = report["weights"]
        print(f"{name}: {w['placement']}; load {w['load_bytes'] / 1e9:.2f} GB in "
              f"{w['load_seconds']:.2f} s = {w['load_bytes'] / max(w['load_seconds'], 1e-9) / 1e9:.2f} GB/s")
r, s = rows(resident), rows(streamed)
for (mode, batch), row in sorted(s.items(), key=lambda kv: (kv[0][1], kv[0][0])):
    if mode == "preallocated" or "ms_per_step" not in row:
        continue
    copy_ms = streamed["weights"]["streamed_bytes_per_step"] / rate * 1e3
    compute = r.get(("graphs", batch), {}).get("ms_per_step")
    bound = max(compute or 0, copy_ms)
    print(f"8b batch {batch} {mode}: {row['ms_per_step']:.2f} ms/step, "
          f"{row['decode_tokens_per_s']:.1f} tok/s; compute (resident graphs) "
          f"{compute if compute is None else round(compute, 2)} ms, copy {copy_ms:.2f} ms -> "
          f"{row['ms_per_step'] / bound:.3f} x max(compute, copy)")
for batch in sorted({b for (_, b) in s}):
    g, e = s.get(("graphs", batch)), s.get(("eager", batch))
    if g and e and "ms_per_step" in g and "ms_per_step" in e:
        print(f"8b streamed batch {batch}: graphs vs eager {e['ms_per_step'] / g['ms_per_step']:.3f}x faster")
if hf and streamed:
    for row in hf["offload"]:
        k = s.get(("graphs", row["batch"]))
        if k and "decode_tokens_per_s" in k:
            print(f"batch {row['batch']}: kvvm streamed {k['decode_tokens_per_s']:.1f} tok/s vs "
                  f"HF offload {row['decode_tokens_per_s']:.2f} tok/s = "
                  f"{k['decode_tokens_per_s'] / row['decode_tokens_per_s']:.1f}x")
if big:
    copy_ms = big["weights"]["streamed_bytes_per_step"] / rate * 1e3
    for (mode, batch), row in sorted(rows(big).items(), key=lambda kv: (kv[0][1], kv[0][0])):
        if "ms_per_step" in row:
            print(f"70b batch {batch} {mode}: {row['ms_per_step']:.1f} ms/step, "
                  f"{row['decode_tokens_per_s']:.2f} tok/s; link bound {copy_ms:.1f} ms/step "
                  f"({row['ms_per_step'] / copy_ms:.3f}x)")
PY
