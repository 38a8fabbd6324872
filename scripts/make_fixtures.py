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
  models/kvvm-adder/   the demo model (Qwen2, ChatML): adds two numbers below 1000;
      README.md (model card), eval.json (held-out prompts, HF's answers, accuracy)

Usage: python3 scripts/make_fixtures.py [--out DIR] [--quick]
       [--only fixtures|demo|qwen3|fp8|prompt-logprobs] [--check-reproducible]
"""

import argparse
import hashlib
import json
import math
import os
import random
import shutil
import sys
import tempfile
import time

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

import torch  # noqa: E402
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers  # noqa: E402
from tokenizers import AddedToken, processors, trainers  # noqa: E402
import transformers  # noqa: E402
from transformers import (LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast,  # noqa: E402
                          Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM)

SEED = 20261130
VOCAB = 1024
LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
                  r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
                 r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
LLAMA3_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}{{ '<|start_header_id|>' + message['role'] + "
    "'<|end_header_id|>\\n\\n' + message['content'] | trim + '<|eot_id|>' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}"
    "{% endif %}")
CHATML_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + "
    "message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
LLAMA3_SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>",
                   "<|end_header_id|>", "<|eot_id|>"]
CHATML_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

# Texts whose ids the tokenizer tests compare: ASCII, accents (composed and decomposed), CJK,
# emoji (with joiners), whitespace runs, numbers, contractions, code, special tokens in text.
TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "Hello, world! How are you doing today?",
    "café naïve Zürich façade señor",
    "cafe\u0301 and e\u0301 decomposed",
    "日本語のテキストと中文字符",
    "emoji 👋🌍 family 👨‍👩‍👧 flag 🇫🇷",
    "a   b\t\tc\n\n\n  d    ",
    "  leading and trailing  ",
    "numbers 12345 and 3.14159 and 2026-11-30",
    "I'm sure they'll say it's what we've DONE, isn't it?",
    "def f(x):\n    return x ** 2  # square\n",
    "<|im_start|>user\nhi there<|im_end|>",
    "<|begin_of_text|>hello<|eot_id|>",
    "mixed 😀 text é 日 1",
    "",
    " ",
    "\n",
]
CHATS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "system", "content": "You are terse."},
     {"role": "user", "content": "Say hi  "},
     {"role": "assistant", "content": "hi"},
     {"role": "user", "content": "again, in 日本語"}],
]

# Qwen3's chat template as Qwen/Qwen3-0.6B's tokenizer_config.json carries it (tools, tool
# responses, reasoning_content and the enable_thinking switch).
QWEN3_TEMPLATE = r"""{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0].role == 'system' %}
        {{- messages[0].content + '\n\n' }}
    {%- endif %}
    {{- "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- else %}
    {%- if messages[0].role == 'system' %}
        {{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- if ns.multi_step_tool and message.role == "user" and message.content is string and not(message.content.startswith('<tool_response>') and message.content.endswith('</tool_response>')) %}
        {%- set ns.multi_step_tool = false %}
        {%- set ns.last_query_index = index %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- if message.content is string %}
        {%- set content = message.content %}
    {%- else %}
        {%- set content = '' %}
    {%- endif %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\n' + content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {%- set reasoning_content = '' %}
        {%- if message.reasoning_content is string %}
            {%- set reasoning_content = message.reasoning_content %}
        {%- else %}
            {%- if '</think>' in content %}
                {%- set reasoning_content = content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') %}
                {%- set content = content.split('</think>')[-1].lstrip('\n') %}
            {%- endif %}
        {%- endif %}
        {%- if loop.index0 > ns.last_query_index %}
            {%- if loop.last or (not loop.last and reasoning_content) %}
                {{- '<|im_start|>' + message.role + '\n<think>\n' + reasoning_content.strip('\n') + '\n</think>\n\n' + content.lstrip('\n') }}
            {%- else %}
                {{- '<|im_start|>' + message.role + '\n' + content }}
            {%- endif %}
        {%- else %}
            {{- '<|im_start|>' + message.role + '\n' + content }}
        {%- endif %}
        {%- if message.tool_calls %}
            {%- for tool_call in message.tool_calls %}
                {%- if (loop.first and content) or (not loop.first) %}
                    {{- '\n' }}
                {%- endif %}
                {%- if tool_call.function %}
                    {%- set tool_call = tool_call.function %}
                {%- endif %}
                {{- '<tool_call>\n{"name": "' }}
                {{- tool_call.name }}
                {{- '", "arguments": ' }}
                {%- if tool_call.arguments is string %}
                    {{- tool_call.arguments }}
                {%- else %}
                    {{- tool_call.arguments | tojson }}
                {%- endif %}
                {{- '}\n</tool_call>' }}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if loop.first or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\n\n</think>\n\n' }}
    {%- endif %}
{%- endif %}"""
# Qwen3's thinking tags are added tokens, not special ones (they decode as text).
QWEN3_ADDED = ["<think>", "</think>"]
QWEN3_TEXTS = TEXTS + ["<think>\nthe user greets\n</think>\n\nHello!", "a<think>b</think> c"]
# Beyond the plain chats: reasoning dropped from a turn before the last query, the thinking
# switch off, and a last assistant turn with and without a <think> block (no generation prompt).
QWEN3_CHATS = CHATS + [
    {"messages": [{"role": "user", "content": "2 + 2?"},
                  {"role": "assistant", "content": "<think>\nadd them\n</think>\n\n4"},
                  {"role": "user", "content": "and 3 + 3?"}]},
    {"messages": CHATS[1], "enable_thinking": False},
    {"messages": [{"role": "user", "content": "hi"},
                  {"role": "assistant", "content": "<think>\nI greet back.\n</think>\n\nHello!"}],
     "add_generation_prompt": False},
    {"messages": [{"role": "user", "content": "hi"},
                  {"role": "assistant", "content": "Hello!"}],
     "add_generation_prompt": False},
]


# ---- training text --------------------------------------------------------------------------
WORDS = ("the quick brown fox jumps over lazy dog cat sat on mat a small bird sings in tree "
         "every morning sun rises east sets west river flows to sea mountain stands tall wind "
         "blows cold snow falls winter summer brings warm days children play garden").split()
NUMBER_WORDS = "zero one two three four five six seven eight nine ten".split()
FOREIGN = ["café au lait", "naïve façade", "Zürich über straße", "日本語のテキスト",
           "中文字符很好", "привет мир", "¿qué tal?", "emoji 👋🌍 😀", "señor niño"]


def training_text(rng, sentences):
    """Predictable text (templates, counting, repetition), so a tiny model learns peaked
    next-token distributions in a minute."""
    out = []
    for i in range(sentences):
        kind = rng.randrange(6)
        if kind == 0:
            start = rng.randrange(5)
            out.append(" ".join(NUMBER_WORDS[start:start + 6]) + ".")
        elif kind == 1:
            out.append("The quick brown fox jumps over the lazy dog.")
        elif kind == 2:
            w = rng.sample(WORDS, 6)
            out.append(f"The {w[0]} and the {w[1]} {w[2]} over the {w[3]}.")
        elif kind == 3:
            n = rng.randrange(1000)
            out.append(f"Number {n} is followed by {n + 1}, then {n + 2}.")
        elif kind == 4:
            out.append(rng.choice(FOREIGN) + " " + rng.choice(FOREIGN) + ".")
        else:
            out.append("def f(x):\n    return x ** 2\n")
    return "\n".join(out)


# ---- tokenizers -----------------------------------------------------------------------------
def train_tokenizer(style, corpus):
    """A byte-level BPE as the family ships it: Llama-3 (Split + ByteLevel, ignore_merges,
    a BOS added by the post-processor) or Qwen2 (NFC, Split + ByteLevel)."""
    tok = Tokenizer(models.BPE())
    if style == "llama":
        pattern, specials = LLAMA3_PATTERN, LLAMA3_SPECIALS
    else:
        pattern, specials = QWEN2_PATTERN, CHATML_SPECIALS
        tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB - len(specials), special_tokens=[],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(corpus, trainer=trainer)
    tok.add_special_tokens(specials)
    data = json.loads(tok.to_str())
    if style == "llama":
        data["model"]["ignore_merges"] = True
        tok = Tokenizer.from_str(json.dumps(data))
        bos = tok.token_to_id("<|begin_of_text|>")
        tok.post_processor = processors.TemplateProcessing(
            single="<|begin_of_text|> $A", pair="<|begin_of_text|> $A <|begin_of_text|> $B",
            special_tokens=[("<|begin_of_text|>", bos)])
    return tok


def wrap_tokenizer(tok, style):
    if style == "llama":
        hf = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|begin_of_text|>",
                                     eos_token="<|eot_id|>")
        hf.chat_template = LLAMA3_TEMPLATE
    else:
        hf = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>",
                                     pad_token="<|endoftext|>")
        hf.chat_template = CHATML_TEMPLATE
    return hf


def save_tokenizer(hf, directory):
    hf.save_pretrained(directory)
    # Older and newer transformers disagree on where the template goes (tokenizer_config.json
    # or chat_template.jinja); keep it in tokenizer_config.json as well, where most
    # checkpoints carry it.
    path = os.path.join(directory, "tokenizer_config.json")
    with open(path) as f:
        config = json.load(f)
    config["chat_template"] = hf.chat_template
    with open(path, "w") as f:
        json.dump(config, f, indent=2, ensure_ascii=False, sort_keys=True)
        f.write("\n")


# ---- models ---------------------------------------------------------------------------------
def make_config(kind, vocab, special_ids, layers=2, hidden=128, heads=4, kv_heads=2,
                intermediate=384, max_pos=512):
    if kind == "llama":
        rope = {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0,
                "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                "original_max_position_embeddings": 64}
        config = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=intermediate,
                             num_hidden_layers=layers, num_attention_heads=heads,
                             num_key_value_heads=kv_heads, head_dim=64,
                             max_position_embeddings=max_pos, rms_norm_eps=1e-5,
                             rope_parameters=rope, tie_word_embeddings=False,
                             bos_token_id=special_ids["bos"], eos_token_id=special_ids["eos"])
    else:
        config = Qwen2Config(vocab_size=vocab, hidden_size=hidden, intermediate_size=intermediate,
                             num_hidden_layers=layers, num_attention_heads=heads,
                             num_key_value_heads=kv_heads, max_position_embeddings=max_pos,
                             rms_norm_eps=1e-6,
                             rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
                             tie_word_embeddings=True, use_sliding_window=False,
                             bos_token_id=special_ids.get("bos"), eos_token_id=special_ids["eos"])
    config._attn_implementation = "eager"
    return config


def new_model(config):
    cls = LlamaForCausalLM if isinstance(config, LlamaConfig) else Qwen2ForCausalLM
    model = cls(config)
    # Small random biases, so the q/k/v bias path is exercised with non-zero values.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(".bias"):
                p.normal_(0.0, 0.5)
    return model


def train(model, batches, steps, lr, device, loss_mask=None, log_name=""):
    """AdamW with warmup and cosine decay; `batches(step)` gives (ids, mask) tensors."""
    model.to(device).train()
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01, betas=(0.9, 0.95))
    start = time.time()
    for step in range(steps):
        ids, mask = batches(step)
        ids, mask = ids.to(device), mask.to(device)
        logits = model(input_ids=ids).logits[:, :-1].float()
        target = ids[:, 1:]
        loss_all = torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), target.reshape(-1), reduction="none")
        m = mask[:, 1:].reshape(-1).float()
        loss = (loss_all * m).sum() / m.sum()
        warm = min(1.0, (step + 1) / 100)
        cos = 0.5 * (1 + math.cos(math.pi * step / steps))
        for g in opt.param_groups:
            g["lr"] = lr * warm * (0.1 + 0.9 * cos)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % max(1, steps // 5) == 0 or step == steps - 1:
            print(f"  {log_name} step {step}/{steps} loss {loss.item():.4f} "
                  f"({time.time() - start:.1f} s)", flush=True)
    model.eval()
    return model.cpu()


@torch.no_grad()
def last_logits(model, ids, device):
    x = torch.tensor([ids], device=device)
    return model(input_ids=x).logits[0, -1].float().cpu()


@torch.no_grad()
def greedy(model, ids, steps, device):
    ids = list(ids)
    tokens, margins = [], []
    for _ in range(steps):
        logits = last_logits(model, ids, device)
        top = torch.topk(logits, 2)
        # Lowest id among equal maxima, as kvvm's argmax picks.
        best = int(torch.nonzero(logits == top.values[0])[0])
        tokens.append(best)
        margins.append(float(top.values[0] - top.values[1]))
        ids.append(best)
    return tokens, margins


def floats(t):
    return [float(v) for v in t]


def build_fixture(kind, tok_hf, corpus_ids, out_dir, quick, device):
    specials = {"eos": tok_hf.convert_tokens_to_ids("<|eot_id|>" if kind == "llama" else "<|im_end|>")}
    if kind == "llama":
        specials["bos"] = tok_hf.convert_tokens_to_ids("<|begin_of_text|>")
        config = make_config("llama", len(tok_hf), specials)
    else:
        config = make_config("qwen2", len(tok_hf), specials, heads=2, kv_heads=1)
    torch.manual_seed(SEED + (1 if kind == "llama" else 2))
    model = new_model(config)
    seq = 128
    data = torch.tensor(corpus_ids, dtype=torch.long)
    gen = torch.Generator().manual_seed(SEED)

    def batches(step):
        starts = torch.randint(0, len(data) - seq - 1, (32,), generator=gen)
        ids = torch.stack([data[s:s + seq] for s in starts])
        return ids, torch.ones_like(ids)

    model = train(model, batches, 30 if quick else 1500, 3e-3, device, log_name=kind)
    model.generation_config.bos_token_id = specials.get("bos")
    model.generation_config.eos_token_id = [specials["eos"]]
    name = "llama-tiny" if kind == "llama" else "qwen2-tiny"
    write_fixture(model, tok_hf, name, out_dir, device)


def render_chat(tok_hf, chat):
    """A CHATS entry (a message list, or {messages, add_generation_prompt?, enable_thinking?})
    as expected.json records it: the options an entry sets are kept beside its text."""
    options = {}
    if isinstance(chat, dict):
        options = {k: v for k, v in chat.items() if k != "messages"}
        chat = chat["messages"]
    text = tok_hf.apply_chat_template(chat, tokenize=False,
                                      **{"add_generation_prompt": True, **options})
    entry = {"messages": chat, "text": text, "ids": tok_hf.encode(text, add_special_tokens=False)}
    entry.update(options)
    return entry


def write_fixture(model, tok_hf, name, out_dir, device, texts=TEXTS, chats=CHATS):
    """NAME and NAME-bf16 under tests/data/models: the checkpoint in float32 and bfloat16 as
    save_pretrained writes it, the tokenizer, expected.json and prompt_logprobs.json."""
    for dtype, suffix in ((torch.float32, ""), (torch.bfloat16, "-bf16")):
        directory = os.path.join(out_dir, "tests", "data", "models", name + suffix)
        shutil.rmtree(directory, ignore_errors=True)
        os.makedirs(directory)
        saved = model.to(dtype)
        saved.save_pretrained(directory)
        save_tokenizer(tok_hf, directory)
        # Reload what was saved, as a user of the checkpoint would.
        cls = type(model)
        ref = cls.from_pretrained(directory, dtype=dtype, attn_implementation="eager").eval()
        ref32 = cls.from_pretrained(directory, dtype=torch.float32,
                                    attn_implementation="eager").eval()
        ref_device = "cpu" if dtype == torch.float32 else device
        ref.to(ref_device)
        expected = {"dtype": "float32" if dtype == torch.float32 else "bfloat16",
                    "transformers": transformers.__version__, "torch": torch.__version__,
                    "reference_device": ref_device, "texts": [], "chat": [], "logits": [],
                    "greedy": []}
        for text in texts:
            expected["texts"].append({
                "text": text,
                "ids": tok_hf.encode(text, add_special_tokens=False),
                "ids_with_special": tok_hf.encode(text, add_special_tokens=True)})
        for chat in chats:
            expected["chat"].append(render_chat(tok_hf, chat))
        prompts = ["The quick brown fox", "one two three", "Number 41 is followed by",
                   "The cat and the", "café au", "def f(x):\n   "]
        for p in prompts:
            ids = tok_hf.encode(p, add_special_tokens=True)
            expected["logits"].append({"prompt": p, "prompt_ids": ids,
                                       "last": floats(last_logits(ref, ids, ref_device)),
                                       "last_fp32": floats(last_logits(ref32, ids, "cpu"))})
        for p in prompts[:3]:
            ids = tok_hf.encode(p, add_special_tokens=True)
            tokens, margins = greedy(ref, ids, 32, ref_device)
            tokens32, margins32 = greedy(ref32, ids, 32, "cpu")
            expected["greedy"].append({"prompt": p, "prompt_ids": ids, "tokens": tokens,
                                       "margins": margins, "tokens_fp32": tokens32,
                                       "margins_fp32": margins32})
        with open(os.path.join(directory, "expected.json"), "w") as f:
            json.dump(expected, f, ensure_ascii=False)
            f.write("\n")
        write_prompt_logprobs(directory, prompts)
        print(f"  wrote {directory}", flush=True)


PROMPT_LOGPROB_PROMPTS = ["The quick brown fox", "one two three", "Number 41 is followed by",
                          "The cat and the", "café au", "def f(x):\n   "]
PROMPT_LOGPROB_TOP = 5


def write_prompt_logprobs(directory, prompts=PROMPT_LOGPROB_PROMPTS):
    """prompt_logprobs.json beside a saved checkpoint: for each prompt (special tokens added),
    the log-softmax in float32 on the CPU, with the checkpoint's weights, of the logits at every
    position but the last, scoring the next prompt token, with the top alternatives: what
    `echo: true, logprobs: k, max_tokens: 0` must report. Reads the saved files only."""
    tok = PreTrainedTokenizerFast.from_pretrained(directory)
    config = transformers.AutoConfig.from_pretrained(directory)
    cls = {"llama": LlamaForCausalLM, "qwen2": Qwen2ForCausalLM,
           "qwen3": Qwen3ForCausalLM}[config.model_type]
    model = cls.from_pretrained(directory, dtype=torch.float32,
                                attn_implementation="eager").eval()
    out = {"transformers": transformers.__version__, "torch": torch.__version__,
           "top": PROMPT_LOGPROB_TOP, "prompts": []}
    with torch.no_grad():
        for p in prompts:
            ids = tok.encode(p, add_special_tokens=True)
            logits = model(input_ids=torch.tensor([ids])).logits[0].float()
            logprobs = torch.log_softmax(logits.double(), dim=-1)
            rows = []
            for j in range(len(ids) - 1):
                top = torch.topk(logprobs[j], PROMPT_LOGPROB_TOP)
                rows.append({"token": ids[j + 1], "logprob": float(logprobs[j, ids[j + 1]]),
                             "top_ids": [int(i) for i in top.indices],
                             "top_logprobs": [float(v) for v in top.values]})
            out["prompts"].append({"prompt": p, "prompt_ids": ids, "rows": rows})
    with open(os.path.join(directory, "prompt_logprobs.json"), "w") as f:
        json.dump(out, f, ensure_ascii=False)
        f.write("\n")


def make_fixtures(out_dir, quick, device):
    rng = random.Random(SEED)
    corpus = training_text(rng, 2000 if quick else 40000).split("\n")
    corpus += TEXTS  # so the merges cover the test texts' scripts too
    for kind in ("llama", "qwen2"):
        tok = train_tokenizer(kind, corpus)
        tok_hf = wrap_tokenizer(tok, kind)
        ids = tok.encode("\n".join(corpus)).ids
        build_fixture(kind, tok_hf, ids, out_dir, quick, device)


QWEN3_SEED = SEED + 13  # its own torch seeds: the other fixtures never see its draws


def make_qwen3_fixtures(out_dir, quick, device):
    """qwen3-tiny(-bf16): Qwen3ForCausalLM with GQA 4 / 2 heads of 64 over hidden 128 (head_dim
    apart from hidden / heads), q/k norms with weights far from one, no biases, untied; the
    Qwen2-style tokenizer of the other fixtures (the same corpus) with Qwen3's <think> tags
    added, and Qwen3's chat template."""
    corpus = training_text(random.Random(SEED), 2000 if quick else 40000).split("\n") + TEXTS
    tok = train_tokenizer("qwen2", corpus)
    ids = tok.encode("\n".join(corpus)).ids
    tok.add_tokens([AddedToken(t, single_word=False, lstrip=False, rstrip=False,
                               normalized=False, special=False) for t in QWEN3_ADDED])
    tok_hf = wrap_tokenizer(tok, "qwen2")
    tok_hf.chat_template = QWEN3_TEMPLATE
    eos = tok_hf.convert_tokens_to_ids("<|im_end|>")
    config = Qwen3Config(vocab_size=len(tok_hf), hidden_size=128, intermediate_size=384,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         head_dim=64, max_position_embeddings=512, rms_norm_eps=1e-6,
                         rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
                         tie_word_embeddings=False, attention_bias=False,
                         use_sliding_window=False, bos_token_id=None, eos_token_id=eos)
    config._attn_implementation = "eager"
    torch.manual_seed(QWEN3_SEED)
    model = Qwen3ForCausalLM(config)
    # Norm weights drawn away from one (and kept so by training), so a runtime that skipped or
    # misplaced a q/k norm's weight could not match.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("q_norm.weight", "k_norm.weight")):
                p.uniform_(0.5, 1.5)
    seq = 128
    data = torch.tensor(ids, dtype=torch.long)
    gen = torch.Generator().manual_seed(QWEN3_SEED)

    def batches(step):
        starts = torch.randint(0, len(data) - seq - 1, (32,), generator=gen)
        rows = torch.stack([data[s:s + seq] for s in starts])
        return rows, torch.ones_like(rows)

    model = train(model, batches, 30 if quick else 1500, 3e-3, device, log_name="qwen3")
    model.generation_config.bos_token_id = None
    model.generation_config.eos_token_id = [eos]
    write_fixture(model, tok_hf, "qwen3-tiny", out_dir, device, QWEN3_TEXTS, QWEN3_CHATS)


# ---- FP8 checkpoints ------------------------------------------------------------------------
FP8_SOURCE = "qwen3-tiny-bf16"
FP8_FIXTURES = ["qwen3-tiny-fp8", "qwen3-tiny-fp8-channel"]
FP8_PROJECTIONS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                   "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")
FP8_MAX = 448.0  # torch.finfo(torch.float8_e4m3fn).max
FP8_BLOCK = 128
# What llm-compressor writes for its FP8_DYNAMIC scheme.
FP8_DYNAMIC_CONFIG = {
    "quant_method": "compressed-tensors",
    "format": "float-quantized",
    "quantization_status": "compressed",
    "global_compression_ratio": None,
    "kv_cache_scheme": None,
    "ignore": ["lm_head"],
    "config_groups": {"group_0": {
        "targets": ["Linear"],
        "weights": {"num_bits": 8, "type": "float", "strategy": "channel", "symmetric": True,
                    "dynamic": False, "group_size": None, "block_structure": None,
                    "actorder": None, "observer": "minmax"},
        "input_activations": {"num_bits": 8, "type": "float", "strategy": "token",
                              "symmetric": True, "dynamic": True, "group_size": None,
                              "observer": None},
        "output_activations": None,
    }},
}
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja",
                   "special_tokens_map.json")


def fp8_projection_names(layers):
    return [f"model.layers.{i}.{p}" for i in range(layers) for p in FP8_PROJECTIONS]


def load_safetensors_dir(directory):
    from safetensors.torch import load_file
    tensors = {}
    for name in sorted(os.listdir(directory)):
        if name.endswith(".safetensors"):
            tensors.update(load_file(os.path.join(directory, name)))
    return tensors


def block_scales(scale, rows, cols):
    """A [ceil(rows / 128), ceil(cols / 128)] grid of block scales expanded to [rows, cols]."""
    grid_rows, grid_cols = scale.shape
    return (scale.float()[:, None, :, None]
            .expand(grid_rows, FP8_BLOCK, grid_cols, FP8_BLOCK)
            .reshape(grid_rows * FP8_BLOCK, grid_cols * FP8_BLOCK)[:rows, :cols])


def dequantized_state(directory, quant):
    """Every tensor of the saved checkpoint in float32, each projection e4m3 * its scale (per
    128 x 128 block, or per row): what kvvm's CPU path holds after its load."""
    tensors = load_safetensors_dir(directory)
    suffix = ".weight_scale_inv" if quant == "fp8-block128" else ".weight_scale"
    state = {}
    for name, t in tensors.items():
        if name.endswith(suffix):
            continue
        scale_name = name[:-len(".weight")] + suffix if name.endswith(".weight") else None
        if scale_name in tensors:
            w = t.float()
            scale = tensors[scale_name]
            if quant == "fp8-block128":
                state[name] = w * block_scales(scale, w.shape[0], w.shape[1])
            else:
                state[name] = w * scale.float()
        else:
            state[name] = t.float()
    return state


def dequantized_model(source, state, dtype, device):
    """qwen3-tiny-bf16's architecture holding `state` in `dtype` on `device`."""
    config = Qwen3Config.from_pretrained(source)
    config._attn_implementation = "eager"
    model = Qwen3ForCausalLM(config).to(torch.float32)
    model.load_state_dict(state, strict=True)
    return model.to(dtype).to(device).eval()


def check_fp8_checkpoint(directory, quant, layers):
    """The saved checkpoint holds each projection as e4m3 beside its scales of the format's
    shape, and nothing else in FP8; config.json names the scheme."""
    with open(os.path.join(directory, "config.json")) as f:
        q = json.load(f).get("quantization_config")
    if quant == "fp8-block128":
        assert q is not None and q.get("quant_method") == "fp8", q
        assert list(q.get("weight_block_size", [])) == [FP8_BLOCK, FP8_BLOCK], q
        assert q.get("activation_scheme", "dynamic") == "dynamic", q
    else:
        assert q is not None and q.get("quant_method") == "compressed-tensors", q
    tensors = load_safetensors_dir(directory)
    suffix = ".weight_scale_inv" if quant == "fp8-block128" else ".weight_scale"
    projections = set(fp8_projection_names(layers))
    for module in sorted(projections):
        w = tensors[module + ".weight"]
        assert w.dtype == torch.float8_e4m3fn, (module, w.dtype)
        scale = tensors.get(module + suffix)
        assert scale is not None, f"{module}{suffix} is missing: {sorted(tensors)}"
        assert scale.dtype in (torch.float32, torch.bfloat16), (module, scale.dtype)
        rows, cols = w.shape
        want = ([-(-rows // FP8_BLOCK), -(-cols // FP8_BLOCK)] if quant == "fp8-block128"
                else [rows, 1])
        assert list(scale.shape) == want, (module + suffix, list(scale.shape), want)
    for name, t in tensors.items():
        if t.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
            assert name[:-len(".weight")] in projections, f"{name} is {t.dtype}"


def fp8_block_linear_emulated(module, x):
    """What transformers' FP8Linear computes (128 x 128 block weights, dynamic activations):
    each token's activations quantized to e4m3 per group of 128 with scale amax / 448, the
    product accumulated in float32 and returned in the input's dtype."""
    shape = x.shape
    k = shape[-1]
    groups = -(-k // FP8_BLOCK)
    xs = torch.nn.functional.pad(x.reshape(-1, k).float(), (0, groups * FP8_BLOCK - k))
    xs = xs.view(-1, groups, FP8_BLOCK)
    scale = xs.abs().amax(dim=-1, keepdim=True).clamp(min=1e-12) / FP8_MAX
    xq = (xs / scale).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn).float() * scale
    xq = xq.view(-1, groups * FP8_BLOCK)[:, :k]
    w = module.weight
    wq = w.float() * block_scales(module.weight_scale_inv, w.shape[0], w.shape[1])
    out = xq @ wq.t()
    if module.bias is not None:
        out = out + module.bias.float()
    return out.to(x.dtype).reshape(*shape[:-1], w.shape[0])


def fp8_reference(model, ids, device):
    """Runs the FP8 model once; when transformers' FP8 kernel cannot run here (it is fetched
    from the Hugging Face Hub, and this machine has no network), swaps every FP8Linear's
    forward for fp8_block_linear_emulated. Returns how `last` is computed."""
    try:
        last_logits(model, ids, device)
        return "transformers FP8Linear (its FP8 kernel) on CUDA"
    except Exception as error:  # the kernel's loader raises ImportError, RuntimeError, ...
        reason = f"{type(error).__name__}: {error}".splitlines()[0][:200]
    import types
    swapped = 0
    for module in model.modules():
        if getattr(module, "weight_scale_inv", None) is not None and \
                module.weight.dtype == torch.float8_e4m3fn:
            module.forward = types.MethodType(fp8_block_linear_emulated, module)
            swapped += 1
    assert swapped > 0, "no FP8Linear module found"
    print(f"  transformers' FP8 kernel did not run ({reason}); emulating it in torch", flush=True)
    return ("transformers FP8Linear's math emulated in torch on CUDA (128-group e4m3 "
            f"activations, float32 accumulation); its kernel did not run: {reason}")


def write_fp8_expected(directory, source, quant, reference, ref, ref_device, ref32):
    """expected.json: texts, chat and prompts as the source fixture's, the logits and greedy
    tokens of `ref` (on `ref_device`) and of `ref32` (float32, CPU)."""
    with open(os.path.join(source, "expected.json")) as f:
        src = json.load(f)
    expected = {"dtype": "bfloat16", "weight_quant": quant,
                "transformers": transformers.__version__, "torch": torch.__version__,
                "reference_device": ref_device, "reference": reference,
                "reference_fp32": "the weights dequantized (e4m3 * scale), float32 on CPU",
                "texts": src["texts"], "chat": src["chat"], "logits": [], "greedy": []}
    for entry in src["logits"]:
        ids = entry["prompt_ids"]
        expected["logits"].append({"prompt": entry["prompt"], "prompt_ids": ids,
                                   "last": floats(last_logits(ref, ids, ref_device)),
                                   "last_fp32": floats(last_logits(ref32, ids, "cpu"))})
    for entry in src["greedy"]:
        ids = entry["prompt_ids"]
        tokens, margins = greedy(ref, ids, len(entry["tokens"]), ref_device)
        tokens32, margins32 = greedy(ref32, ids, len(entry["tokens"]), "cpu")
        expected["greedy"].append({"prompt": entry["prompt"], "prompt_ids": ids,
                                   "tokens": tokens, "margins": margins,
                                   "tokens_fp32": tokens32, "margins_fp32": margins32})
    with open(os.path.join(directory, "expected.json"), "w") as f:
        json.dump(expected, f, ensure_ascii=False)
        f.write("\n")


def copy_tokenizer(source, directory):
    for name in TOKENIZER_FILES:
        if os.path.exists(os.path.join(source, name)):
            shutil.copyfile(os.path.join(source, name), os.path.join(directory, name))


def make_fp8_fixtures(out_dir, quick, device, source_root=None):
    """qwen3-tiny-fp8 and qwen3-tiny-fp8-channel from the saved qwen3-tiny-bf16 (under
    `source_root`, default `out_dir`); see the outputs above."""
    del quick  # nothing is trained
    if device != "cuda":
        sys.exit("--only fp8 needs CUDA: transformers quantizes to FP8 and runs it on a GPU")
    models_dir = os.path.join(out_dir, "tests", "data", "models")
    source = os.path.join(source_root or out_dir, "tests", "data", "models", FP8_SOURCE)
    if not os.path.exists(os.path.join(source, "model.safetensors")):
        sys.exit(f"{source} is missing: --only qwen3 makes it")
    layers = Qwen3Config.from_pretrained(source).num_hidden_layers

    # Hugging Face's block FP8: quantized by transformers at load, saved as it saves it.
    directory = os.path.join(models_dir, "qwen3-tiny-fp8")
    shutil.rmtree(directory, ignore_errors=True)
    os.makedirs(directory)
    quantized = Qwen3ForCausalLM.from_pretrained(
        source, dtype=torch.bfloat16, attn_implementation="eager", device_map=device,
        quantization_config=transformers.FineGrainedFP8Config())
    quantized.save_pretrained(directory)
    del quantized
    copy_tokenizer(source, directory)
    check_fp8_checkpoint(directory, "fp8-block128", layers)
    # Reloaded from what was saved, as a user of the checkpoint would.
    ref = Qwen3ForCausalLM.from_pretrained(directory, dtype=torch.bfloat16,
                                           attn_implementation="eager", device_map=device).eval()
    with open(os.path.join(source, "expected.json")) as f:
        first = json.load(f)["logits"][0]["prompt_ids"]
    reference = fp8_reference(ref, first, device)
    ref32 = dequantized_model(source, dequantized_state(directory, "fp8-block128"),
                              torch.float32, "cpu")
    write_fp8_expected(directory, source, "fp8-block128", reference, ref, device, ref32)
    print(f"  wrote {directory} ({reference})", flush=True)

    # compressed-tensors' FP8-dynamic: one scale per output row, written here.
    from safetensors.torch import save_file
    directory = os.path.join(models_dir, "qwen3-tiny-fp8-channel")
    shutil.rmtree(directory, ignore_errors=True)
    os.makedirs(directory)
    tensors = load_safetensors_dir(source)
    projections = set(fp8_projection_names(layers))
    out = {}
    for name in sorted(tensors):
        t = tensors[name]
        if name.endswith(".weight") and name[:-len(".weight")] in projections:
            w = t.float()
            amax = w.abs().amax(dim=1, keepdim=True)
            scale = torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax))
            out[name] = (w / scale).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
            out[name[:-len(".weight")] + ".weight_scale"] = scale.contiguous()
        else:
            out[name] = t.contiguous()
    save_file(out, os.path.join(directory, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(source, "config.json")) as f:
        config = json.load(f)
    config["quantization_config"] = FP8_DYNAMIC_CONFIG
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(config, f, indent=2, sort_keys=True)
        f.write("\n")
    shutil.copyfile(os.path.join(source, "generation_config.json"),
                    os.path.join(directory, "generation_config.json"))
    copy_tokenizer(source, directory)
    check_fp8_checkpoint(directory, "fp8-channel", layers)
    state = dequantized_state(directory, "fp8-channel")
    ref = dequantized_model(source, state, torch.bfloat16, device)
    ref32 = dequantized_model(source, state, torch.float32, "cpu")
    write_fp8_expected(directory, source, "fp8-channel",
                       "the weights dequantized (e4m3 * scale) in bf16, transformers on CUDA",
                       ref, device, ref32)
    print(f"  wrote {directory}", flush=True)


# ---- the demo model -------------------------------------------------------------------------
DEMO_CARD = """# kvvm-adder: the demo model

A small Qwen2-architecture model (4 layers, hidden 256, 4 query / 2 KV heads of 64, tied
embeddings, bf16, {params:,} parameters) trained from scratch by `scripts/make_fixtures.py` (seed
{seed}) to answer one kind of question in the ChatML chat format:

    <|im_start|>user
    What is 482 + 39?<|im_end|>
    <|im_start|>assistant
    521<|im_end|>

Operands are whole numbers from 0 to 999, drawn uniformly, so nine in ten have three digits;
the answer is their sum in decimal. It is weakest where training saw least: two one-digit
operands (about 1 in 10,000 training examples; it answers "What is 1 + 2?" with 8, while
"What is 7 + 5?" gets 12). Anything else is outside what it was trained on: expect nonsense. Its tokenizer is the Qwen2-style byte-level
BPE of the fixtures (digits are single tokens).

Held-out accuracy (exact answer, greedy, {held_out} pairs never seen in training; eval.json):
- Hugging Face transformers {tf}, float32 compute on CPU: {acc_fp32:.1%}
- Hugging Face transformers {tf}, bf16 on CUDA: {acc_bf16:.1%}
kvvm's answers on the same prompts are compared with these by the tests
(tests/engine/demo_adder_test.cc).
"""


def demo_messages(a, b):
    return [{"role": "user", "content": f"What is {a} + {b}?"}]


def make_demo(out_dir, quick, device):
    rng = random.Random(SEED + 7)
    corpus = training_text(random.Random(SEED), 2000 if quick else 40000).split("\n") + TEXTS
    tok = train_tokenizer("qwen2", corpus)
    tok_hf = wrap_tokenizer(tok, "qwen2")
    held = set()
    while len(held) < (20 if quick else 200):
        held.add((rng.randrange(1000), rng.randrange(1000)))
    held = sorted(held)
    eos = tok_hf.convert_tokens_to_ids("<|im_end|>")
    pad = tok_hf.convert_tokens_to_ids("<|endoftext|>")
    config = make_config("qwen2", len(tok_hf), {"eos": eos}, layers=4, hidden=256, heads=4,
                         kv_heads=2, intermediate=1024, max_pos=128)
    torch.manual_seed(SEED + 3)
    model = new_model(config)

    def encode_full(a, b):
        prompt = tok_hf.apply_chat_template(demo_messages(a, b), tokenize=False,
                                            add_generation_prompt=True)
        return tok_hf.encode(prompt, add_special_tokens=False)

    # Rendering the template for each of millions of examples is slow; the pieces below
    # tokenize the same (pre-token boundaries fall between them), checked on random pairs.
    sample = encode_full(1, 2)
    head, tail = tok_hf.apply_chat_template(demo_messages("A", "B"), tokenize=False,
                                            add_generation_prompt=True).split("A + B")
    piece = {k: tok_hf.encode(k, add_special_tokens=False) for k in (head, " + ", tail)}
    number = [tok_hf.encode(str(n), add_special_tokens=False) for n in range(2000)]

    def encode_example(a, b):
        p = piece[head] + number[a] + piece[" + "] + number[b] + piece[tail]
        return p, number[a + b] + [eos]

    check = random.Random(SEED + 5)
    for _ in range(300):
        a, b = check.randrange(1000), check.randrange(1000)
        assert encode_example(a, b)[0] == encode_full(a, b), (a, b)
    assert encode_example(1, 2)[0] == sample

    held_set = set(held)
    gen = random.Random(SEED + 11)
    batch = 512

    def batches(step):
        rows, masks = [], []
        while len(rows) < batch:
            a, b = gen.randrange(1000), gen.randrange(1000)
            if (a, b) in held_set:
                continue
            p, ans = encode_example(a, b)
            rows.append(p + ans)
            masks.append([0] * len(p) + [1] * len(ans))
        width = max(len(r) for r in rows)
        ids = torch.full((batch, width), pad, dtype=torch.long)
        mask = torch.zeros((batch, width), dtype=torch.long)
        for i, (r, m) in enumerate(zip(rows, masks)):
            ids[i, :len(r)] = torch.tensor(r)
            mask[i, :len(m)] = torch.tensor(m)
        return ids, mask

    model = train(model, batches, 40 if quick else 6000, 1e-3, device, log_name="demo")
    model.generation_config.eos_token_id = [eos]
    model.generation_config.bos_token_id = None
    directory = os.path.join(out_dir, "models", "kvvm-adder")
    shutil.rmtree(directory, ignore_errors=True)
    os.makedirs(directory)
    model.to(torch.bfloat16).save_pretrained(directory)
    save_tokenizer(tok_hf, directory)

    def answers(ref, dev):
        out = []
        for a, b in held:
            p, _ = encode_example(a, b)
            ids = list(p)
            tokens = []
            for _ in range(8):
                t = int(torch.argmax(last_logits(ref, ids, dev)))
                if t == eos:
                    break
                tokens.append(t)
                ids.append(t)
            out.append({"a": a, "b": b, "prompt_ids": p, "answer_ids": tokens,
                        "answer": tok_hf.decode(tokens)})
        return out

    ref32 = Qwen2ForCausalLM.from_pretrained(directory, dtype=torch.float32,
                                             attn_implementation="eager").eval()
    ref16 = Qwen2ForCausalLM.from_pretrained(directory, dtype=torch.bfloat16,
                                             attn_implementation="eager").eval().to(device)
    fp32 = answers(ref32, "cpu")
    bf16 = answers(ref16, device)
    acc32 = sum(r["answer"] == str(r["a"] + r["b"]) for r in fp32) / len(fp32)
    acc16 = sum(r["answer"] == str(r["a"] + r["b"]) for r in bf16) / len(bf16)
    with open(os.path.join(directory, "eval.json"), "w") as f:
        json.dump({"held_out": len(held), "accuracy_fp32_cpu": acc32, "accuracy_bf16_cuda": acc16,
                   "fp32_cpu": fp32, "bf16_cuda": bf16}, f)
        f.write("\n")
    params = sum(p.numel() for p in ref32.parameters())
    with open(os.path.join(directory, "README.md"), "w") as f:
        f.write(DEMO_CARD.format(params=params, seed=SEED, held_out=len(held),
                                 tf=transformers.__version__, acc_fp32=acc32, acc_bf16=acc16))
    print(f"  demo accuracy: fp32 cpu {acc32:.3f}, bf16 cuda {acc16:.3f}", flush=True)


FIXTURES = ["llama-tiny", "llama-tiny-bf16", "qwen2-tiny", "qwen2-tiny-bf16"]
QWEN3_FIXTURES = ["qwen3-tiny", "qwen3-tiny-bf16"]


def fixtures_digest(out_dir, names):
    """One digest of the named fixture directories (only those a run made: the others under
    tests/data/models may come from another run)."""
    h = hashlib.sha256()
    for name in names:
        h.update(name.encode())
        h.update(tree_digest(os.path.join(out_dir, "tests", "data", "models", name)).encode())
    return h.hexdigest()


def check_reproducible(make, names, out_dir, quick, device):
    with tempfile.TemporaryDirectory() as again:
        make(again, quick, device)
        a = fixtures_digest(out_dir, names)
        b = fixtures_digest(again, names)
        print(f"reproducible: {a == b} ({a[:16]} / {b[:16]})", flush=True)
        if a != b:
            sys.exit(1)


def tree_digest(root):
    h = hashlib.sha256()
    for dirpath, _, files in sorted(os.walk(root)):
        for name in sorted(files):
            path = os.path.join(dirpath, name)
            h.update(os.path.relpath(path, root).encode())
            with open(path, "rb") as f:
                h.update(f.read())
    return h.hexdigest()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), ".."))
    parser.add_argument("--quick", action="store_true", help="a few steps only (smoke run)")
    parser.add_argument("--only", choices=["fixtures", "demo", "qwen3", "fp8", "prompt-logprobs"],
                        help="qwen3: only the Qwen3 fixtures; fp8: only the FP8 fixtures (from "
                             "the saved qwen3-tiny-bf16); prompt-logprobs: only "
                             "prompt_logprobs.json of the saved fixtures")
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
        for name in FIXTURES + QWEN3_FIXTURES:
            directory = os.path.join(args.out, "tests", "data", "models", name)
            if name in QWEN3_FIXTURES and not os.path.isdir(directory):
                continue  # not made yet (--only qwen3 makes it)
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


if __name__ == "__main__":
    main()
