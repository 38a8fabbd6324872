#!/usr/bin/env python3
"""PyTorch baseline for `kvvm bench decode` and `kvvm bench prefill`.

Decode: torch.nn.functional.scaled_dot_product_attention on the flash backend with
enable_gqa=True for the same decode shapes (one query token per sequence, fp16, contiguous
[batch, heads, context, head_dim] K and V), and the device-to-device copy bandwidth in the same
process as the ceiling. Rows in "rows", keyed by "shape" (batch,context,qo/kv,dim).

Prefill: the same function, causal, for the rows of `kvvm bench prefill` (q [1, Hq, T, D], k
and v [1, Hkv, P + T, D], fp16). A full prefill (P = 0) is is_causal=True on the flash backend.
A chunk after a cached prefix (P > 0) needs the mask aligned BOTTOM-RIGHT (query i sits at
position P + i and sees keys <= P + i), which is_causal (top-left) is not: it passes
torch.nn.attention.bias.causal_lower_right(T, P + T) as attn_mask. PyTorch runs that on flash
when it can, else on the efficient kernel, else on a materialized mask; the row's "backend"
says which, and "mask_check" compares its first and last query rows with unmasked attention
over the keys they may see. Rows in "prefill_rows", keyed "T@P,Hq/Hkv,D" as kvvm keys them.

Median of `--samples` samples of `--iterations` back-to-back calls timed with CUDA events,
after a warm-up; the same method as the kvvm commands.

Usage: python3 bench/sdpa_baseline.py [--json sdpa.json]
Then:  kvvm bench decode --baseline sdpa.json; kvvm bench prefill --baseline sdpa.json
"""
import argparse
import json
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

SHAPES = ["1,32768,32/8,128", "16,4096,32/8,128", "8,16384,32/8,128", "64,4096,32/8,128",
          "256,2048,32/8,128", "64,2048,64/8,128", "32,8192,14/2,64", "128,1024,14/2,64"]

# (start P, tokens T) as `kvvm bench prefill` runs them by default.
PREFILL_ROWS = [(0, 1024), (0, 4096), (0, 16384), (4096, 512)]


def parse(text):
    batch, context, heads, dim = text.split(",")
    qo, kv = heads.split("/")
    return int(batch), int(context), int(qo), int(kv), int(dim)


def parse_chunk(text):
    start, tokens = text.split(":")
    return int(start), int(tokens)


def prefill_key(start, tokens, qo, kv, dim):
    return f"{tokens}@{start},{qo}/{kv},{dim}"


def prefill_flops(start, tokens, qo, dim):
    """Causal work counted exactly: query row i sees start + i + 1 keys, 2 matmuls x 2 flops."""
    return 4.0 * qo * dim * (tokens * start + tokens * (tokens + 1) / 2)


def median_ms(fn, iterations, samples):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(samples):
        start = torch.cuda.Event(enable_timing=True)
        stop = torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iterations):
            fn()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop) / iterations)
    times.sort()
    return times[len(times) // 2]


def lower_right_backend(q, k, v):
    """The kernel CausalBias's lower-right dispatch picks for these tensors (as PyTorch decides
    it: flash when it can run, else efficient attention, else a materialized mask)."""
    from torch.backends.cuda import SDPAParams, can_use_efficient_attention, can_use_flash_attention
    try:
        params = SDPAParams(q, k, v, None, 0.0, False, True)
    except TypeError:  # an SDPAParams without enable_gqa
        params = SDPAParams(q, k, v, None, 0.0, False)
    if can_use_flash_attention(params):
        return "flash"
    if can_use_efficient_attention(params):
        return "efficient"
    return "math-materialized-mask"


def check_bottom_right(out, q, k, v, start):
    """Query row 0 (position `start`) sees keys [0, start]; the last row sees every key."""
    with torch.no_grad():
        first = F.scaled_dot_product_attention(q[:, :, :1], k[:, :, :start + 1],
                                               v[:, :, :start + 1], enable_gqa=True)
        last = F.scaled_dot_product_attention(q[:, :, -1:], k, v, enable_gqa=True)
    error = max((out[:, :, :1] - first).abs().max().item(),
                (out[:, :, -1:] - last).abs().max().item())
    return ("ok" if error < 2e-2 else "MISMATCH") + f" (max abs diff {error:.1e})"


def bench_prefill(start, tokens, qo, kv, dim, iterations, samples, device):
    from torch.nn.attention.bias import causal_lower_right
    q = torch.empty(1, qo, tokens, dim, dtype=torch.float16, device=device).uniform_(-2, 2)
    k = torch.empty(1, kv, start + tokens, dim, dtype=torch.float16, device=device).uniform_(-1, 1)
    v = torch.empty_like(k).uniform_(-1, 1)
    row = {"key": prefill_key(start, tokens, qo, kv, dim), "start": start, "tokens": tokens,
           "qo_heads": qo, "kv_heads": kv, "head_dim": dim}
    if start == 0:
        row["backend"] = "flash"
        row["mask"] = "is_causal"

        def call():
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)

        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            ms = median_ms(call, iterations, samples)
    else:
        mask = causal_lower_right(tokens, start + tokens)
        row["backend"] = lower_right_backend(q, k, v)
        row["mask"] = "causal_lower_right"

        def call():
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)

        if row["backend"] == "flash":
            with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                ms = median_ms(call, iterations, samples)
                out = call()
        else:
            ms = median_ms(call, iterations, samples)
            out = call()
        row["mask_check"] = check_bottom_right(out, q, k, v, start)
        del out
    row["ms"] = ms
    row["flops"] = prefill_flops(start, tokens, qo, dim)
    row["tflops"] = row["flops"] / (ms * 1e-3) / 1e12
    row["tokens_per_second"] = tokens / (ms * 1e-3)
    del q, k, v
    return row


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", action="append", help="decode: batch,context,qo/kv,dim")
    parser.add_argument("--iterations", type=int, default=20, help="decode calls per sample")
    parser.add_argument("--samples", type=int, default=15, help="decode samples")
    parser.add_argument("--prefill-case", type=int, action="append", metavar="T",
                        help="prefill: a full causal prefill of T tokens; repeatable")
    parser.add_argument("--prefill-chunk", action="append", metavar="P:T",
                        help="prefill: T query tokens after a prefix of P; repeatable")
    parser.add_argument("--heads", default="32/8", help="prefill: query/KV heads (default 32/8)")
    parser.add_argument("--head-dim", type=int, default=128, help="prefill: head dim")
    parser.add_argument("--prefill-iterations", type=int, default=5)
    parser.add_argument("--prefill-samples", type=int, default=9)
    parser.add_argument("--no-decode", action="store_true", help="only the prefill rows")
    parser.add_argument("--no-prefill", action="store_true", help="only the decode rows")
    parser.add_argument("--dtype", choices=["float16", "bfloat16"], default="float16",
                        help="decode: the element type of q, k, v (default float16)")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("sdpa_baseline: no CUDA device", file=sys.stderr)
        return 1
    torch.manual_seed(20261129)
    device = torch.device("cuda")

    copy_bytes = 2 << 30
    a = torch.empty(copy_bytes, dtype=torch.uint8, device=device).random_(1, 255)
    b = torch.empty_like(a)
    copy_ms = median_ms(lambda: b.copy_(a), 5, args.samples)
    copy_bw = 2 * copy_bytes / (copy_ms * 1e-3)
    del a, b

    result = {"benchmark": "sdpa", "device": torch.cuda.get_device_name(), "dtype": args.dtype,
              "torch": torch.__version__, "copy_bytes_per_second": copy_bw, "rows": [],
              "prefill_rows": []}
    print(f"device: {result['device']}, torch {torch.__version__}")
    print(f"device-to-device copy: {copy_bw / 1e12:.2f} TB/s (read + write)")
    if not args.no_decode:
        print(f"{'shape':<20} {'ms':>9} {'TB/s':>8} {'%copy':>7}")
        for text in args.shape or SHAPES:
            batch, context, qo, kv, dim = parse(text)
            dtype = getattr(torch, args.dtype)
            q = torch.empty(batch, qo, 1, dim, dtype=dtype, device=device).uniform_(-2, 2)
            k = torch.empty(batch, kv, context, dim, dtype=dtype, device=device).uniform_(-1, 1)
            v = torch.empty_like(k).uniform_(-1, 1)
            with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                ms = median_ms(lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True),
                               args.iterations, args.samples)
            kv_bytes = batch * context * 2 * kv * dim * 2
            row = {"shape": text, "ms": ms, "kv_bytes": kv_bytes,
                   "bytes_per_second": kv_bytes / (ms * 1e-3), "backend": "flash"}
            result["rows"].append(row)
            print(f"{text:<20} {ms:9.4f} {row['bytes_per_second'] / 1e12:8.2f} "
                  f"{100 * row['bytes_per_second'] / copy_bw:6.1f}%", flush=True)
            del q, k, v
    if not args.no_prefill:
        qo, kv = (int(x) for x in args.heads.split("/"))
        rows = [(0, t) for t in args.prefill_case or []]
        rows += [parse_chunk(c) for c in args.prefill_chunk or []]
        print(f"\nprefill, fp16, {qo}/{kv} heads, head dim {args.head_dim}, causal")
        print(f"{'row':<20} {'ms':>9} {'TFLOP/s':>8} {'tokens/s':>12}  backend")
        for start, tokens in rows or PREFILL_ROWS:
            row = bench_prefill(start, tokens, qo, kv, args.head_dim, args.prefill_iterations,
                                args.prefill_samples, device)
            result["prefill_rows"].append(row)
            check = f", mask {row['mask_check']}" if "mask_check" in row else ""
            print(f"{row['key']:<20} {row['ms']:9.4f} {row['tflops']:8.1f} "
                  f"{row['tokens_per_second']:12.0f}  {row['backend']} ({row['mask']}{check})",
                  flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
