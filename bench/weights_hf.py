#!/usr/bin/env python3
"""weights_hf.py: the Hugging Face side of kvvm's weight streaming figures, on one checkpoint.

  copy rates      host-to-device copies of 1 GiB from pinned and from pageable memory (torch),
                  the bound a streamed step is measured against;
  load            from_pretrained(device_map="cuda") of the checkpoint, timed to the last byte
                  on the device (CUDA-synchronized): bytes / seconds, beside `kvvm bench
                  engine`'s load figure;
  offload         from_pretrained(device_map="auto", max_memory={0: --max-memory, "cpu": ...}),
                  accelerate's offload of what does not fit: decode tokens/s at each batch
                  (random prompts, greedy, end tokens ignored; decode timed apart from prefill as
                  in bench/engine_hf.py).
  --config-only SHAPE writes a config.json and tokenizer.json of a shape (llama-3-70b too)
                  into --model and exits: what `kvvm bench engine --load-format dummy` needs.

Prints one JSON object (also to --out). No network.

Usage: python3 bench/weights_hf.py --model DIR [--max-memory 8GiB] [--batches 1,64]
       [--prompt-tokens 128] [--decode-tokens 8] [--out FILE]
       python3 bench/weights_hf.py --model DIR --config-only llama-3-70b
"""

import argparse
import json
import os
import sys
import time

import torch
from transformers import AutoModelForCausalLM, LlamaConfig

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from engine_hf import positive_list, random_prompts  # noqa: E402
from generate_hf import SHAPES, hf_timings, write_tokenizer  # noqa: E402

LLAMA_3_70B = dict(
    vocab_size=128256, hidden_size=8192, intermediate_size=28672, num_hidden_layers=80,
    num_attention_heads=64, num_key_value_heads=8, max_position_embeddings=8192,
    rms_norm_eps=1e-5, rope_parameters={"rope_type": "default", "rope_theta": 500000.0},
    tie_word_embeddings=False, bos_token_id=128000, eos_token_id=128009,
    dtype="bfloat16")


def write_config(shape, directory):
    os.makedirs(directory, exist_ok=True)
    if shape == "llama-3-70b":
        config = LlamaConfig(**LLAMA_3_70B)
    else:
        config_cls, _, fields = SHAPES[shape]
        config = config_cls(**fields, dtype="bfloat16")
    config.to_json_file(os.path.join(directory, "config.json"))
    write_tokenizer(directory, config.vocab_size)


def copy_rate(pinned):
    n = 1 << 30
    host = torch.empty(n, dtype=torch.uint8, pin_memory=pinned)
    device = torch.empty(n, dtype=torch.uint8, device="cuda")
    for _ in range(2):
        device.copy_(host, non_blocking=pinned)
    torch.cuda.synchronize()
    reps = 10 if pinned else 3
    t = time.perf_counter()
    for _ in range(reps):
        device.copy_(host, non_blocking=pinned)
    torch.cuda.synchronize()
    return n * reps / (time.perf_counter() - t)


def checkpoint_bytes(directory):
    return sum(os.path.getsize(os.path.join(directory, f)) for f in os.listdir(directory)
               if f.endswith(".safetensors"))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--config-only", choices=sorted(SHAPES) + ["llama-3-70b"])
    parser.add_argument("--max-memory", default="8GiB")
    parser.add_argument("--batches", default="1,64")
    parser.add_argument("--prompt-tokens", type=int, default=128)
    parser.add_argument("--decode-tokens", type=int, default=8)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out")
    args = parser.parse_args()
    if args.config_only:
        write_config(args.config_only, args.model)
        return
    batches = positive_list(args.batches, "batches")
    result = {"model": args.model, "max_memory": args.max_memory,
              "pinned_copy_bytes_per_s": copy_rate(True),
              "pageable_copy_bytes_per_s": copy_rate(False)}

    size = checkpoint_bytes(args.model)
    torch.cuda.synchronize()
    t = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.bfloat16,
                                                 device_map="cuda")
    torch.cuda.synchronize()
    seconds = time.perf_counter() - t
    result["load"] = {"bytes": size, "seconds": seconds, "bytes_per_s": size / seconds}
    del model
    torch.cuda.empty_cache()

    model = AutoModelForCausalLM.from_pretrained(
        args.model, dtype=torch.bfloat16, device_map="auto",
        max_memory={0: args.max_memory, "cpu": "200GiB"}).eval()
    on_gpu = sum(1 for d in model.hf_device_map.values() if d in (0, "cuda", "cuda:0"))
    result["offload_device_map_gpu_entries"] = on_gpu
    result["offload_device_map_entries"] = len(model.hf_device_map)
    rows = []
    steps = args.decode_tokens - 1
    for batch in batches:
        prompts = random_prompts(batch, args.prompt_tokens, model.config.vocab_size, args.seed)
        prefill, whole, _ = hf_timings(model, prompts, args.decode_tokens, warm=(1,))
        decode = whole - prefill
        rows.append({"batch": batch, "decode_tokens_per_s": batch * steps / decode,
                     "ms_per_step": decode / steps * 1e3, "prefill_seconds": prefill})
        print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    result["offload"] = rows
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
