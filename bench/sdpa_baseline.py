#!/usr/bin/env python3
"""PyTorch baseline for `kvvm bench decode`.

Times torch.nn.functional.scaled_dot_product_attention on the flash backend with
enable_gqa=True for the same decode shapes (one query token per sequence, fp16, contiguous
[batch, heads, context, head_dim] K and V), and the device-to-device copy bandwidth in the same
process as the ceiling. Median of `--samples` samples of `--iterations` back-to-back calls
timed with CUDA events, after a warm-up; the same method as the kvvm command.

Usage: python3 bench/sdpa_baseline.py [--json sdpa.json]
Then:  kvvm bench decode --baseline sdpa.json
"""
import argparse
import json
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

SHAPES = ["1,32768,32/8,128", "16,4096,32/8,128", "64,4096,32/8,128", "256,2048,32/8,128",
          "32,8192,14/2,64"]


def parse(text):
    batch, context, heads, dim = text.split(",")
    qo, kv = heads.split("/")
    return int(batch), int(context), int(qo), int(kv), int(dim)


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


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", action="append", help="batch,context,qo/kv,dim")
    parser.add_argument("--iterations", type=int, default=20)
    parser.add_argument("--samples", type=int, default=15)
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

    result = {"benchmark": "sdpa_decode", "device": torch.cuda.get_device_name(),
              "torch": torch.__version__, "copy_bytes_per_second": copy_bw, "rows": []}
    print(f"device: {result['device']}, torch {torch.__version__}")
    print(f"device-to-device copy: {copy_bw / 1e12:.2f} TB/s (read + write)")
    print(f"{'shape':<20} {'ms':>9} {'TB/s':>8} {'%copy':>7}")
    for text in args.shape or SHAPES:
        batch, context, qo, kv, dim = parse(text)
        q = torch.empty(batch, qo, 1, dim, dtype=torch.float16, device=device).uniform_(-2, 2)
        k = torch.empty(batch, kv, context, dim, dtype=torch.float16, device=device).uniform_(-1, 1)
        v = torch.empty_like(k).uniform_(-1, 1)
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            ms = median_ms(lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True),
                           args.iterations, args.samples)
        kv_bytes = batch * context * 2 * kv * dim * 2
        row = {"shape": text, "ms": ms, "kv_bytes": kv_bytes, "bytes_per_second": kv_bytes / (ms * 1e-3),
               "backend": "flash"}
        result["rows"].append(row)
        print(f"{text:<20} {ms:9.4f} {row['bytes_per_second'] / 1e12:8.2f} "
              f"{100 * row['bytes_per_second'] / copy_bw:6.1f}%")
        del q, k, v
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
