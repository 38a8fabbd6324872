#!/usr/bin/env python3
"""generate_hf.py: `kvvm generate` beside Hugging Face `generate` on the same weights.

Run on the GPU machine after the CUDA build (scripts/gpu-check.sh builds build/gpu). For each
shape (Qwen2.5-0.5B, Llama-3-8B; random bf16 weights saved by save_pretrained, not
committed), batch 1, a 128-token prompt and 128 new tokens (end tokens ignored by both):
  - HF transformers generate (sdpa attention, dynamic cache), timed with CUDA syncs: prefill
    (max_new_tokens=1, after a warm-up run) and the whole run; decode step = (whole -
    prefill) / 127;
  - kvvm generate --backend cuda --json --ignore-eos: its own prefill and decode timings, in
    a fresh process (its prefill includes the first use of cuBLAS and of every kernel);
  - the weight-read bound: weight bytes / the device-to-device copy bandwidth measured here
    (bytes read + written over the time of a 4 GiB copy, ~4.3 TB/s on the H200: the rate HBM
    moves bytes, taken as the rate a decode step can read its weights). The KV bytes of a
    256-token sequence are under 0.3 % of the weights on both shapes and are left out.
Writes generate.md (a table) and generate.json under --out.

Usage: python3 bench/generate_hf.py --kvvm build/gpu/tools/kvvm/kvvm --out DIR
       [--shapes qwen2.5-0.5b,llama-3-8b] [--new-tokens 128]
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

SHAPES = {
    "qwen2.5-0.5b": (Qwen2Config, Qwen2ForCausalLM, dict(
        vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
        num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=32768,
        rms_norm_eps=1e-6, rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
        tie_word_embeddings=True, use_sliding_window=False, eos_token_id=151645)),
    "llama-3-8b": (LlamaConfig, LlamaForCausalLM, dict(
        vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
        num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=131072,
        rms_norm_eps=1e-5, rope_parameters={
            "rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
            "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192},
        tie_word_embeddings=False, bos_token_id=128000, eos_token_id=128009)),
}


def byte_level_chars():
    """GPT-2's byte-to-character map (the characters byte-level BPE vocabularies use)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return [chr(c) for _, c in sorted(zip(bs, cs))]


def write_tokenizer(directory, vocab_size):
    """A byte-level BPE tokenizer.json covering every id of the model: the 256 byte
    characters, then distinct two- and three-character strings (no merges reach them; they
    only give every id a decoding)."""
    chars = byte_level_chars()
    vocab = {c: i for i, c in enumerate(chars)}
    n = len(vocab)
    for a in chars:
        for b in chars:
            if n >= vocab_size:
                break
            vocab[a + b] = n
            n += 1
    for a in chars:
        for b in chars:
            for c in chars[:8]:
                if n >= vocab_size:
                    break
                vocab[a + b + c] = n
                n += 1
    tokenizer = {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": [],
        "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                          "use_regex": True},
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                    "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None,
                  "continuing_subword_prefix": None, "end_of_word_suffix": None,
                  "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": vocab, "merges": []},
    }
    with open(os.path.join(directory, "tokenizer.json"), "w") as f:
        json.dump(tokenizer, f)


def copy_bandwidth():
    n = 4 << 30
    a = torch.empty(n, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    for _ in range(3):
        b.copy_(a)
    torch.cuda.synchronize()
    start = torch.cuda.Event(enable_timing=True)
    stop = torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(10):
        b.copy_(a)
    stop.record()
    torch.cuda.synchronize()
    seconds = start.elapsed_time(stop) / 1000 / 10
    del a, b
    return 2 * n / seconds  # read + written


@torch.no_grad()
def hf_timings(model, prompt, new_tokens, warm=(4,), **generate_kwargs):
    """HF generate timed with CUDA syncs: (seconds of max_new_tokens=1, seconds of
    new_tokens, the tokens). `prompt` is one list of ids or a list of equal-length lists (a
    batch); `warm` are the untimed runs first (a compiled model warms every length it meets);
    `generate_kwargs` go to generate (a cache implementation, say)."""
    batched = bool(prompt) and isinstance(prompt[0], list)
    x = torch.tensor(prompt if batched else [prompt], device="cuda")

    def run(n):
        torch.cuda.synchronize()
        t = time.perf_counter()
        out = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=n,
                             min_new_tokens=n, do_sample=False, eos_token_id=None,
                             pad_token_id=0, **generate_kwargs)
        torch.cuda.synchronize()
        return time.perf_counter() - t, out[:, x.shape[1]:].tolist()

    for n in warm:
        run(n)
    prefill, _ = run(1)
    whole, tokens = run(new_tokens)
    return prefill, whole, tokens if batched else tokens[0]


def make_checkpoint(shape, directory):
    """A model of `shape` (a SHAPES key) with random bf16 weights (seed 0) on the GPU, saved by
    save_pretrained into `directory` (replaced) with a byte-level tokenizer.json."""
    config_cls, model_cls, fields = SHAPES[shape]
    config = config_cls(**fields)
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = model_cls(config).to(torch.bfloat16).eval()
    shutil.rmtree(directory, ignore_errors=True)
    model.save_pretrained(directory)
    write_tokenizer(directory, config.vocab_size)
    return model


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--kvvm", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--shapes", default="qwen2.5-0.5b,llama-3-8b")
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--work", default="/tmp/kvvm-bench-models")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    bandwidth = copy_bandwidth()
    print(f"device-to-device copy: {bandwidth / 1e12:.2f} TB/s (read + written)", flush=True)
    rows = []
    for shape in args.shapes.split(","):
        t = time.time()
        directory = os.path.join(args.work, shape)
        model = make_checkpoint(shape, directory)
        weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
        print(f"{shape}: {weight_bytes / 1e9:.2f} GB of weights, made and saved in "
              f"{time.time() - t:.0f} s", flush=True)
        prompt = [int(v) for v in torch.randint(1000, 20000, (128,),
                                                generator=torch.Generator().manual_seed(1))]
        hf_prefill, hf_whole, _ = hf_timings(model, prompt, args.new_tokens)
        hf_step = (hf_whole - hf_prefill) / (args.new_tokens - 1)
        del model
        torch.cuda.empty_cache()
        cmd = [args.kvvm, "generate", "--model", directory, "--backend", "cuda", "--json",
               "--prompt-ids", ",".join(map(str, prompt)), "--max-tokens", str(args.new_tokens),
               "--ignore-eos"]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            print(proc.stdout[-2000:], proc.stderr[-4000:], file=sys.stderr)
            rows.append({"shape": shape, "error": proc.stderr[-500:]})
            continue
        result = json.loads(proc.stdout)
        timings = result["timings"]
        kv_step = timings["decode_seconds"] / max(1, timings["decode_steps"])
        bound = weight_bytes / bandwidth
        rows.append({
            "shape": shape, "weight_bytes": weight_bytes,
            "hf_tokens_per_s": args.new_tokens / hf_whole, "hf_step_ms": hf_step * 1e3,
            "kvvm_tokens_per_s": args.new_tokens / (timings["prefill_seconds"] +
                                                   timings["decode_seconds"]),
            "kvvm_step_ms": kv_step * 1e3, "kvvm_prefill_ms": timings["prefill_seconds"] * 1e3,
            "hf_prefill_ms": hf_prefill * 1e3,
            "bound_ms": bound * 1e3, "kvvm_of_bound": bound / kv_step,
            "hf_of_bound": bound / hf_step, "new_tokens": args.new_tokens})
        print(json.dumps(rows[-1]), flush=True)
        shutil.rmtree(directory, ignore_errors=True)
    with open(os.path.join(args.out, "generate.json"), "w") as f:
        json.dump({"copy_bandwidth_bytes_per_s": bandwidth, "rows": rows}, f, indent=1)
    lines = ["| shape | weights | HF tok/s | HF step ms | kvvm tok/s | kvvm step ms | "
             "bound ms | kvvm % of bound | kvvm prefill ms | HF prefill ms |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['shape']} | error: {r['error'][:80]} |")
            continue
        lines.append(
            f"| {r['shape']} | {r['weight_bytes'] / 1e9:.2f} GB | {r['hf_tokens_per_s']:.1f} | "
            f"{r['hf_step_ms']:.2f} | {r['kvvm_tokens_per_s']:.1f} | {r['kvvm_step_ms']:.2f} | "
            f"{r['bound_ms']:.2f} | {100 * r['kvvm_of_bound']:.0f} % | "
            f"{r['kvvm_prefill_ms']:.1f} | {r['hf_prefill_ms']:.1f} |")
    text = "\n".join(lines) + "\n"
    print(text)
    with open(os.path.join(args.out, "generate.md"), "w") as f:
        f.write(text)


if __name__ == "__main__":
    main()
