#!/usr/bin/env python3
"""make_fixtures.py: the parity oracle's fixtures and the embedded demo model.

Run on the GPU machine (transformers 5.17, tokenizers, torch; no network). Everything is made
from SEED: the training text is generated here, the tokenizers are trained with `tokenizers`,
the models are trained with torch under deterministic algorithms, so a second run on the same
machine writes the same bytes (--check-reproducible proves it for the fixtures).

Outputs (under --out, default the repository):
  tests/data/models/{llama-tiny,llama-tiny-bf16,qwen2-tiny,qwen2-tiny-bf16}/ and (--only qwen3,
  made last, from its own seeds, so the others' bytes do not depend on it)
  tests/data/models/{qwen3-tiny,qwen3-tiny-bf16}/
      config.json generation_config.json model.safetensors (as save_pretrained writes them)
      tokenizer.json tokenizer_config.json (chat_template.jinja when transformers writes it)
      expected.json: what Hugging Face computes, for the C++ tests to equal:
        dtype   the checkpoint's dtype ("float32" or "bfloat16")
        texts   [{text, ids, ids_with_special}]       encode without / with special tokens
        chat    [{messages, text, ids}]               apply_chat_template, then its ids (qwen3:
                with add_generation_prompt / enable_thinking where an entry sets them)
        logits  [{prompt_ids, last, last_fp32}]       last-position logits: `last` in the
                checkpoint's dtype (fp32 on CPU; bf16 on CUDA), `last_fp32` with the same
                weights computed in float32 on CPU (what kvvm's CPU path computes)
        greedy  [{prompt_ids, tokens, margins, tokens_fp32, margins_fp32}]  32 greedy tokens
                (no stop on EOS) and HF's top-1 minus top-2 logit at each step
      prompt_logprobs.json: each prompt's log-probabilities (float32 on CPU): row j scores
        token j + 1, with the top 5 (write_prompt_logprobs; --only prompt-logprobs alone)
  tests/data/models/{qwen3-tiny-fp8,qwen3-tiny-fp8-channel}/ (--only fp8, made last, from the
  saved qwen3-tiny-bf16 alone, drawing nothing random; needs CUDA):
      qwen3-tiny-fp8: qwen3-tiny-bf16 loaded with transformers' FineGrainedFP8Config() (each
        projection e4m3 with one float32 scale per 128 x 128 block, `weight_scale_inv`) and
        saved with save_pretrained
      qwen3-tiny-fp8-channel: written here, compressed-tensors' FP8-dynamic: each projection's
        rows quantized to e4m3 with scale amax / 448 (`weight_scale` [out, 1], float32), its
        quantization_config in config.json
      config.json generation_config.json model.safetensors, the tokenizer files copied from
        qwen3-tiny-bf16 (no prompt_logprobs.json), and expected.json as above (dtype
        "bfloat16", the unquantized tensors'; texts, chat and the prompts qwen3-tiny-bf16's)
        with `weight_quant` ("fp8-block128", "fp8-channel") and
        `reference` (what computed `last`): `last_fp32` / `tokens_fp32` / `margins_fp32` from
        the weights dequantized (e4m3 * scale) computed in float32 on CPU (what kvvm's CPU path
        computes); `last` / `tokens` / `margins` from transformers on CUDA: for qwen3-tiny-fp8 the
        FP8 model itself (its FP8 GEMMs, activations quantized per token and group of 128; its
        math emulated in torch when transformers' FP8 kernel cannot be loaded, which
        `reference` then says), for qwen3-tiny-fp8-channel the dequantized weights in bf16
  tests/data/models/{qwen3-moe-tiny,qwen3-moe-tiny-bf16,mixtral-tiny,mixtral-tiny-bf16,
  qwen2-moe-tiny,qwen2-moe-tiny-bf16}/ (--only moe, made last, from seeds of their own; the
  load-balancing loss in training, experts in transformers' eager loop throughout):
      qwen3-moe-tiny: Qwen3MoeForCausalLM, 3 layers, layer 1 dense (mlp_only_layers), the others
        8 experts, top 4, renormalised; Qwen3's tokenizer additions and template, as qwen3-tiny
      mixtral-tiny: MixtralForCausalLM, 2 layers of 4 experts, top 2; llama-tiny's tokenizer
      qwen2-moe-tiny: Qwen2MoeForCausalLM, 2 layers of 8 experts, top 2, not renormalised, a
        shared expert behind its sigmoid gate, q/k/v biases; qwen2-tiny's tokenizer (ChatML)
      the files of the fixtures above, expected.json with, besides (scripts/fixtures/
      moe_routing.py says each in full):
        expert_format  "per-expert" or "fused": the experts' tensors as save_pretrained wrote them
        moe            {num_experts, top_k, renormalize, layers, router_aux_loss_coef,
                       experts_implementation}
        expert_usage   [{layer, counts}]  how often each expert is chosen over the prompts
        routing        [{prompt, prompt_ids, layers: [{layer, ids, weights, margins, ids_fp32,
                       weights_fp32, margins_fp32}]}]  the first 3 prompts' top-k experts per
                       token, their float32 weights (renormalised where `renormalize`), and the
                       k-th minus the (k+1)-th probability; unsuffixed as `last`, _fp32 as
                       `last_fp32`
        routing_margin, routing_margin_fp32  the smallest of those margins
  tests/data/models/qwen3-moe-tiny-fp8/ (--only moe with CUDA, or --only moe-fp8 alone from the
  saved qwen3-moe-tiny-bf16, drawing nothing random): written here in the Hub's per-expert block
      FP8 layout (each attention, dense-MLP and expert projection e4m3 with a float32
      `weight_scale_inv` per 128 x 128 block; routers, embeddings, norms, lm_head bf16),
      config.json's quantization_config {quant_method fp8, activation_scheme dynamic, fmt e4m3,
      weight_block_size [128, 128], modules_to_not_convert}; expected.json as the FP8 fixtures'
      (`weight_quant` "fp8-block128", `reference`: the dequantized weights in bf16 on CUDA; `_fp32`
      in float32 on the CPU) with the MoE fields above from the same two models
  models/kvvm-adder/   the demo model (Qwen2, ChatML): adds two numbers below 1000;
      README.md (model card), eval.json (held-out prompts, HF's answers, accuracy)

Usage: python3 scripts/make_fixtures.py [--out DIR] [--quick]
       [--only fixtures|demo|qwen3|fp8|moe|moe-fp8|prompt-logprobs] [--check-reproducible]

The work is done by the modules of scripts/fixtures/, one concept each; this file is the command
line.
"""

import argparse
import os
import sys

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

import torch  # noqa: E402
import transformers  # noqa: E402

from fixtures.demo import make_demo  # noqa: E402
from fixtures.digest import check_reproducible  # noqa: E402
from fixtures.fp8 import FP8_FIXTURES, make_fp8_fixtures  # noqa: E402
from fixtures.llama_qwen2 import FIXTURES, make_fixtures  # noqa: E402
from fixtures.moe import MOE_FIXTURES, MOE_TRAINED, make_moe_fixtures  # noqa: E402
from fixtures.moe_fp8 import MOE_FP8_FIXTURES, make_moe_fp8_fixture  # noqa: E402
from fixtures.prompt_logprobs import write_prompt_logprobs  # noqa: E402
from fixtures.qwen3 import QWEN3_FIXTURES, make_qwen3_fixtures  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), ".."))
    parser.add_argument("--quick", action="store_true", help="a few steps only (smoke run)")
    parser.add_argument("--only", choices=["fixtures", "demo", "qwen3", "fp8", "moe", "moe-fp8",
                                           "prompt-logprobs"],
                        help="qwen3: only the Qwen3 fixtures; fp8: only the FP8 fixtures (from "
                             "the saved qwen3-tiny-bf16); moe: only the MoE fixtures; moe-fp8: "
                             "only qwen3-moe-tiny-fp8 (from the saved qwen3-moe-tiny-bf16); "
                             "prompt-logprobs: only prompt_logprobs.json of the saved fixtures")
    parser.add_argument("--check-reproducible", action="store_true",
                        help="make the fixtures twice and compare every byte")
    args = parser.parse_args()
    torch.use_deterministic_algorithms(True)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_num_threads(8)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    print(f"transformers {transformers.__version__}, torch {torch.__version__}, {device}",
          flush=True)
    if args.only == "prompt-logprobs":
        for name in FIXTURES + QWEN3_FIXTURES + MOE_TRAINED:
            directory = os.path.join(args.out, "tests", "data", "models", name)
            if name not in FIXTURES and not os.path.isdir(directory):
                continue  # not made yet (--only qwen3 / --only moe makes it)
            write_prompt_logprobs(directory)
            print(f"  wrote {directory}/prompt_logprobs.json", flush=True)
        return
    if args.only in (None, "fixtures"):
        make_fixtures(args.out, args.quick, device)
        if args.check_reproducible:
            check_reproducible(make_fixtures, FIXTURES, args.out, args.quick, device)
    if args.only in (None, "demo"):
        make_demo(args.out, args.quick, device)
    # Last: its training draws nothing the fixtures and the demo above draw.
    if args.only in (None, "qwen3"):
        make_qwen3_fixtures(args.out, args.quick, device)
        if args.check_reproducible:
            check_reproducible(make_qwen3_fixtures, QWEN3_FIXTURES, args.out, args.quick,
                               device)
    # After qwen3: made from its saved qwen3-tiny-bf16, drawing no random numbers.
    if args.only == "fp8" or (args.only is None and device == "cuda"):
        make_fp8_fixtures(args.out, args.quick, device)
        if args.check_reproducible:
            check_reproducible(
                lambda again, quick, dev: make_fp8_fixtures(again, quick, dev, args.out),
                FP8_FIXTURES, args.out, args.quick, device)
    elif args.only is None:
        print("  FP8 fixtures not made: they need CUDA", flush=True)
    # Last: from seeds of their own (and its FP8 fixture from its own saved bf16 checkpoint).
    if args.only in (None, "moe"):
        make_moe_fixtures(args.out, args.quick, device)
        if args.check_reproducible:
            check_reproducible(make_moe_fixtures, MOE_FIXTURES, args.out, args.quick, device)
    if args.only == "moe-fp8":
        if device != "cuda":
            sys.exit("--only moe-fp8 needs CUDA: its reference runs on a GPU")
        make_moe_fp8_fixture(args.out, args.quick, device)
        if args.check_reproducible:
            check_reproducible(
                lambda again, quick, dev: make_moe_fp8_fixture(again, quick, dev, args.out),
                MOE_FP8_FIXTURES, args.out, args.quick, device)


if __name__ == "__main__":
    main()
