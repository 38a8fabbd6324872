#!/usr/bin/env python3
"""engine_hf.py: Hugging Face `generate` decode throughput on a checkpoint directory, the
side `kvvm bench engine` is compared against (docs/ARCHITECTURE.md "Anchors for speed").

For each batch size (--batches, default 1,32): B random prompts of --prompt-tokens ids (seeded),
greedy, end tokens ignored, every sequence generating --decode-tokens tokens as in
`kvvm bench engine` (one from the prefill, then decode-tokens - 1 decode steps). Decode is
timed apart from prefill: generate with max_new_tokens=1 (prefill and the first token) and with
max_new_tokens=decode-tokens, each after untimed warm-up runs, CUDA-synchronized; the
difference is the decode steps' time:
  decode tokens/s = B x (decode-tokens - 1) / (whole - prefill), ms/step = (whole - prefill) /
  (decode-tokens - 1).
Modes (--modes):
  eager           sdpa attention, the dynamic cache;
  static-compile  generation_config.cache_implementation = "static" and model.forward compiled
                  (torch.compile, mode reduce-overhead); warm-up runs compile each length. A
                  failure (of compilation, say) is caught and reported in the JSON as the
                  row's "error", and the other rows still run.
Prints one JSON object (also written to --out when given). No network: the checkpoint is read
from --model; --make SHAPE first writes a random checkpoint of a bench/generate_hf.py shape
(qwen2.5-0.5b, llama-3-8b) there, so `kvvm bench engine --model DIR` can run on the same weights.

Usage: python3 bench/engine_hf.py --model DIR [--make qwen2.5-0.5b] [--batches 1,32]
       [--prompt-tokens 128] [--decode-tokens 128] [--modes eager,static-compile]
       [--dtype bfloat16] [--seed 1] [--out FILE]
"""

import argparse
import json
import os
import sys
import traceback

import torch
import transformers
from transformers import AutoModelForCausalLM

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from generate_hf import SHAPES, copy_bandwidth, hf_timings, make_checkpoint  # noqa: E402

MODES = ("eager", "static-compile")


def positive_list(text, name):
    try:
        values = [int(v) for v in text.split(",")]
    except ValueError:
        raise SystemExit(f"--{name} {text!r}: expected comma-separated whole numbers")
    if not values or any(v < 1 for v in values):
        raise SystemExit(f"--{name} {text!r}: every value must be at least 1")
    return values


def random_prompts(batch, tokens, vocab, seed):
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (batch, tokens), generator=generator)
    return [[int(v) for v in row] for row in ids]


def load(directory, dtype):
    model = AutoModelForCausalLM.from_pretrained(directory, dtype=dtype)
    return model.to("cuda").eval()


def measure(model, mode, batch, args):
    """One row: the timings of `mode` at `batch`, or the error that stopped it."""
    row = {"mode": mode, "batch": batch}
    prompts = random_prompts(batch, args.prompt_tokens, model.config.vocab_size, args.seed)
    steps = args.decode_tokens - 1
    try:
        if mode == "eager":
            prefill, whole, _ = hf_timings(model, prompts, args.decode_tokens)
        else:
            prefill, whole, _ = hf_timings(model, prompts, args.decode_tokens,
                                           warm=(1, args.decode_tokens),
                                           cache_implementation="static")
    except Exception as error:  # a compile or cache failure is a result to report
        row["error"] = f"{type(error).__name__}: {error}"[:2000]
        traceback.print_exc(file=sys.stderr)
        return row
    decode = whole - prefill
    row.update({
        "decode_tokens_per_s": batch * steps / decode if decode > 0 else None,
        "ms_per_step": decode / steps * 1e3,
        "decode_seconds": decode,
        "prefill_seconds": prefill,
        "whole_seconds": whole,
    })
    return row


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True, help="checkpoint directory")
    parser.add_argument("--make", choices=sorted(SHAPES),
                        help="first write a random checkpoint of this shape into --model")
    parser.add_argument("--batches", default="1,32")
    parser.add_argument("--prompt-tokens", type=int, default=128)
    parser.add_argument("--decode-tokens", type=int, default=128)
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--dtype", default="bfloat16",
                        help="torch dtype of the weights and activations (default bfloat16, "
                        "kvvm's CUDA compute type); 'auto': the checkpoint's")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", help="also write the JSON here")
    args = parser.parse_args()
    batches = positive_list(args.batches, "batches")
    modes = args.modes.split(",")
    for mode in modes:
        if mode not in MODES:
            raise SystemExit(f"--modes: unknown mode {mode!r}; expected one of {', '.join(MODES)}")
    if args.prompt_tokens < 1:
        raise SystemExit(f"--prompt-tokens {args.prompt_tokens}: must be at least 1")
    if args.decode_tokens < 2:
        raise SystemExit(f"--decode-tokens {args.decode_tokens}: must be at least 2 "
                         "(one token from the prefill, then decode steps)")
    if not torch.cuda.is_available():
        raise SystemExit("no CUDA device: this benchmark runs on the GPU machine")
    if args.make:
        make_checkpoint(args.make, args.model)  # the model it returns is dropped here
        torch.cuda.empty_cache()
    elif not os.path.isfile(os.path.join(args.model, "config.json")):
        raise SystemExit(f"--model {args.model}: no config.json there (use --make SHAPE to "
                         "write a random checkpoint)")
    dtype = args.dtype if args.dtype == "auto" else getattr(torch, args.dtype)
    result = {
        "model": args.model,
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "dtype": args.dtype,
        "prompt_tokens": args.prompt_tokens,
        "decode_tokens": args.decode_tokens,
        "copy_bandwidth_bytes_per_s": copy_bandwidth(),
        "runs": [],
    }
    for mode in modes:
        # A fresh model per mode: compiling replaces model.forward.
        model = load(args.model, dtype)
        result["weight_bytes"] = sum(p.numel() * p.element_size() for p in model.parameters())
        if mode == "static-compile":
            try:
                model.forward = torch.compile(model.forward, mode="reduce-overhead",
                                              fullgraph=True)
            except Exception as error:
                for batch in batches:
                    result["runs"].append({"mode": mode, "batch": batch,
                                           "error": f"torch.compile: {error}"[:2000]})
                continue
        for batch in batches:
            row = measure(model, mode, batch, args)
            print(json.dumps(row), file=sys.stderr, flush=True)
            result["runs"].append(row)
        del model
        torch.cuda.empty_cache()
    text = json.dumps(result, indent=1)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
