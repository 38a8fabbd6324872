#!/usr/bin/env python3
"""make_tokenizer_fixtures.py: Hugging Face's ids for the tokenizer families kvvm loads.

Run on the GPU machine (the Python `tokenizers` and `transformers` packages; no network, no
GPU needed). Everything is made here from SEED: the training text is generated, each tokenizer
is trained with `tokenizers` (vocabularies of at most a few hundred tokens, so the committed
files stay small), and a second run writes the same bytes (--check-reproducible proves it).

Outputs, under --out (default the repository), tests/data/tokenizers/<name>/:
  tokenizer.json       as Tokenizer.save writes it
  tokenizer_config.json  (config-* only) the flags add_bos_token / add_eos_token
  expected.json        what Hugging Face computes, for tests/tokenizer/tokenizer_families_test.cc
                       and tests/tokenizer/tokenizer_config_flags_test.cc to equal:
    versions   {"tokenizers": ..., "transformers": ...}
    texts      [{text, ids, ids_with_special, decoded, decoded_skip_special}]  (families:
               Tokenizer.encode(text, add_special_tokens=False / True).ids, Tokenizer.decode
               of ids_with_special with skip_special_tokens False / True)
    flags      (config-*) {add_bos_token, add_eos_token}
    texts      (config-*) [{text, ids_with_special, ids_from_pretrained}]: ids_with_special is
               PreTrainedTokenizerFast.from_pretrained(dir, add_bos_token=..., add_eos_token=...)
               .encode(text), the flags passed as arguments; ids_from_pretrained the same
               without them (transformers 5 drops the file's flags when a tokenizer.json is
               present; kept for the record, not compared)

Families:
  deepseek-digits-punct  DeepSeek-LLM / -Coder style: Split patterns, Digits (individual),
                         Punctuation, ByteLevel without its regex
  starcoder-digits       StarCoder style: Digits (individual), ByteLevel with GPT-2's regex
  falcon-punct-digits    Falcon style: Punctuation (contiguous), ByteLevel, Digits (runs),
                         Split [0-9][0-9][0-9]
  punct-<behavior>       Punctuation with each behaviour (removed, isolated,
                         merged_with_previous, merged_with_next, contiguous), then ByteLevel
  metaspace-first        Mistral / Llama-2 (transformers >= 4.41 conversion): BPE with
                         byte_fallback and <unk>, Metaspace(prepend_scheme first, no split),
                         decoder Replace + ByteFallback + Fuse + Strip, "<s> $A" template
  metaspace-always       Metaspace(always, split), Metaspace decoder
  metaspace-never        Metaspace(never, split), Metaspace decoder
  llama2-legacy          Llama-2 as first converted: normalizer Prepend("▁") + Replace(" ",
                         "▁"), no pre-tokenizer, the same model and decoder as metaspace-first
  whitespace             Whitespace pre-tokenizer, BPE with [UNK] (fused), no decoder
  whitespace-split       WhitespaceSplit pre-tokenizer, BPE with [UNK] (not fused), no decoder
  config-*               a byte-level BPE with <s> and </s>, with and without a "<s> $A"
                         template, beside tokenizer_config.json flags in every combination

Usage: python3 scripts/make_tokenizer_fixtures.py [--out DIR] [--check-reproducible]
"""

import argparse
import hashlib
import json
import os
import random
import shutil
import sys
import tempfile

import tokenizers
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers
from tokenizers import processors, trainers
import transformers
from transformers import PreTrainedTokenizerFast

SEED = 20261202
SUBDIR = os.path.join("tests", "data", "tokenizers")

# The texts whose ids the tests compare: ASCII, digit runs, punctuation runs, every kind of
# white space, CJK, emoji (with joiners), combining marks, leading / trailing spaces, code,
# special tokens and byte-fallback spellings written in the text, and the empty string.
TEXTS = [
    "",
    " ",
    "   ",
    "The quick brown fox jumps over the lazy dog.",
    "Hello, world! How are you doing today?",
    "12345",
    "3.14",
    "x=100;",
    "1,000,000 and 2026-12-02 at 09:30",
    "call 0800 123 4567 now",
    "\u0663\u0664\u0665 \u00bd \u00b2 \u216b",
    "!!!",
    "...",
    "\u00bfQu\u00e9?",
    "\u00ab\u00bb",
    "\u2014",
    "\u201cquoted\u201d \u2018single\u2019 (parens) [brackets] {braces}",
    "a-b_c/d\\e|f~g^h`i$j+k<l>m=n@o#p%q&r*s",
    "wait... what?!?",
    "tab\there",
    "line\nbreak\r\nwindows",
    "a  b   c    d",
    "no\u00a0break",
    "ideographic\u3000space",
    "em\u2003space and thin\u2009space",
    "  leading and trailing  ",
    "\t\n \t",
    "\u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8",
    "\u4e2d\u6587\uff0c\u6807\u70b9\u3002",
    "emoji \U0001f44b\U0001f30d family \U0001f468\u200d\U0001f469\u200d\U0001f467 flag \U0001f1eb\U0001f1f7",
    "cafe\u0301 and e\u0301 decomposed, caf\u00e9 composed",
    "\u24b6\u24b7 circled, \U0001f130 squared",
    "def f(x):\n    return x ** 2  # square\n",
    "if (a && b) { c++; } else { d--; }",
    "for i in range(10): print(i, end='')",
    "\u2581already\u2581marked",
    "<0x41> written out",
    "<s>hello</s>",
    "mixed \U0001f600 text \u00e9 \u65e5 1",
]

# ---- training text --------------------------------------------------------------------------
WORDS = ("the quick brown fox jumps over lazy dog cat sat on mat a small bird sings in tree "
         "every morning sun rises east sets west river flows to sea mountain stands tall wind "
         "blows cold snow falls winter summer brings warm days children play garden hello "
         "world how are you doing today what time is it").split()
CODE = ["def f(x):\n    return x ** 2\n", "for i in range(10):\n\tprint(i)\n",
        "if (a && b) { c++; }", "x = [1, 2, 3]", "y = {'a': 1, 'b': 2}", "z += 100;"]
PUNCT = ["!", "?", ".", ",", ";", ":", "...", "!!", "?!", "(", ")", "\"", "'", "-", "--"]
FOREIGN = ["caf\u00e9 au lait", "na\u00efve fa\u00e7ade", "\u00bfqu\u00e9 tal?",
           "\u65e5\u672c\u8a9e", "\u4e2d\u6587", "\u043f\u0440\u0438\u0432\u0435\u0442"]


def training_text(rng, sentences):
    out = []
    for _ in range(sentences):
        kind = rng.randrange(5)
        if kind == 0:
            out.append(" ".join(rng.choice(WORDS) for _ in range(rng.randrange(3, 10))) +
                       rng.choice(PUNCT))
        elif kind == 1:
            out.append(f"{rng.randrange(100000)} {rng.choice(WORDS)} {rng.randrange(1000)}."
                       f"{rng.randrange(100)}")
        elif kind == 2:
            out.append(rng.choice(CODE))
        elif kind == 3:
            out.append(rng.choice(WORDS).capitalize() + rng.choice(PUNCT) + " " +
                       rng.choice(WORDS) + rng.choice(PUNCT) + rng.choice(PUNCT))
        else:
            out.append(rng.choice(FOREIGN) + " " + rng.choice(WORDS))
    return out


# ---- tokenizers -----------------------------------------------------------------------------
# DeepSeek-LLM's splits, shortened: newlines alone, a letter run with its space, a punctuation
# run with its space, trailing white space (the file's "$", a line end as Oniguruma reads it),
# CJK runs. The ranges hold the characters themselves, as DeepSeek's file does.
DEEPSEEK_SPLITS = ["[\r\n]", "\\s?[A-Za-z\u00c0-\u024f]+",
                   "\\s?[!-/:-~\uff01-\uff0f\u2018-\u201f\u3000-\u3002]+", "\\s+$",
                   "[\u4e00-\u9fa5\u3040-\u30ff\uac00-\ud7a3]+"]


def byte_level_tokenizer(pre_tokenizer, corpus, vocab_size, specials=()):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizer
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(specials),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(corpus, trainer=trainer)
    return tok


def byte_level_families(corpus):
    no_regex = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    families = {
        "deepseek-digits-punct": pre_tokenizers.Sequence(
            [pre_tokenizers.Split(Regex(p), behavior="isolated") for p in DEEPSEEK_SPLITS] +
            [pre_tokenizers.Digits(individual_digits=True),
             pre_tokenizers.Punctuation(behavior="isolated"), no_regex]),
        "starcoder-digits": pre_tokenizers.Sequence(
            [pre_tokenizers.Digits(individual_digits=True),
             pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)]),
        "falcon-punct-digits": pre_tokenizers.Sequence(
            [pre_tokenizers.Punctuation(behavior="contiguous"),
             pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
             pre_tokenizers.Digits(individual_digits=False),
             pre_tokenizers.Split(Regex("[0-9][0-9][0-9]"), behavior="isolated")]),
    }
    out = {}
    for name, pre_tokenizer in families.items():
        out[name] = byte_level_tokenizer(pre_tokenizer, corpus, 700, ["<|endoftext|>"])
    for behavior in ("removed", "isolated", "merged_with_previous", "merged_with_next",
                     "contiguous"):
        pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Punctuation(behavior=behavior), no_regex])
        out["punct-" + behavior.replace("_", "-")] = byte_level_tokenizer(
            pre_tokenizer, corpus, 400)
    return out


def with_byte_fallback(tok):
    """Llama's vocabulary layout: <unk> <s> </s>, then <0x00> .. <0xFF> as plain vocabulary
    tokens, then the trained ones; byte_fallback and fuse_unk on."""
    data = json.loads(tok.to_str())
    model = data["model"]
    specials = ["<unk>", "<s>", "</s>"]
    vocab = {token: i for i, token in enumerate(specials)}
    for byte in range(256):
        vocab[f"<0x{byte:02X}>"] = len(vocab)
    for token, _ in sorted(model["vocab"].items(), key=lambda item: item[1]):
        if token not in vocab:
            vocab[token] = len(vocab)
    model["vocab"] = vocab
    model["unk_token"] = "<unk>"
    model["byte_fallback"] = True
    model["fuse_unk"] = True
    for added in data["added_tokens"]:
        added["id"] = vocab[added["content"]]
    return Tokenizer.from_str(json.dumps(data))


def llama_decoder():
    return decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(),
                              decoders.Fuse(), decoders.Strip(content=" ", left=1)])


def metaspace_families(corpus):
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="always",
                                                 split=True)
    # A small alphabet: the rarer characters (CJK, emoji) go through <0xNN> tokens.
    trainer = trainers.BpeTrainer(vocab_size=600, special_tokens=["<unk>", "<s>", "</s>"],
                                  limit_alphabet=70, show_progress=False)
    tok.train_from_iterator(corpus, trainer=trainer)
    base = with_byte_fallback(tok)
    bos = base.token_to_id("<s>")
    out = {}
    first = Tokenizer.from_str(base.to_str())
    first.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first",
                                                   split=False)
    first.decoder = llama_decoder()
    first.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", bos)])
    out["metaspace-first"] = first
    for scheme in ("always", "never"):
        tok = Tokenizer.from_str(base.to_str())
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme=scheme,
                                                     split=True)
        tok.decoder = decoders.Metaspace(replacement="\u2581", prepend_scheme=scheme, split=True)
        out["metaspace-" + scheme] = tok
    legacy = Tokenizer.from_str(base.to_str())
    legacy.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"),
                                              normalizers.Replace(" ", "\u2581")])
    legacy.decoder = llama_decoder()
    legacy.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", bos)])
    data = json.loads(legacy.to_str())
    data["pre_tokenizer"] = None  # the normalizer does the Metaspace's work
    out["llama2-legacy"] = Tokenizer.from_str(json.dumps(data))
    return out


def whitespace_families(corpus):
    out = {}
    for name, pre_tokenizer, fuse in (("whitespace", pre_tokenizers.Whitespace(), True),
                                      ("whitespace-split", pre_tokenizers.WhitespaceSplit(),
                                       False)):
        tok = Tokenizer(models.BPE(unk_token="[UNK]", fuse_unk=fuse))
        tok.pre_tokenizer = pre_tokenizer
        trainer = trainers.BpeTrainer(vocab_size=500, special_tokens=["[UNK]"],
                                      limit_alphabet=60, show_progress=False)
        tok.train_from_iterator(corpus, trainer=trainer)
        out[name] = tok
    return out


# Every combination of the two flags, beside a tokenizer.json whose post-processor adds a BOS
# ("bos-template") or adds nothing ("no-template").
CONFIG_FLAGS = [(bos, eos) for bos in (True, False) for eos in (True, False)]


def config_tokenizers(corpus):
    plain = byte_level_tokenizer(
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True), corpus, 300,
        ["<s>", "</s>"])
    with_bos = Tokenizer.from_str(plain.to_str())
    bos = with_bos.token_to_id("<s>")
    with_bos.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", bos)])
    return {"no-template": plain, "bos-template": with_bos}


# ---- writing --------------------------------------------------------------------------------
def versions():
    return {"tokenizers": tokenizers.__version__, "transformers": transformers.__version__}


def write_json(path, value):
    with open(path, "w", encoding="utf-8") as f:
        json.dump(value, f, indent=1, ensure_ascii=False, sort_keys=True)
        f.write("\n")


def family_expected(tok):
    hf = PreTrainedTokenizerFast(tokenizer_object=tok)
    entries = []
    for text in TEXTS:
        ids = tok.encode(text, add_special_tokens=False).ids
        with_special = tok.encode(text, add_special_tokens=True).ids
        through_transformers = hf.encode(text, add_special_tokens=True)
        if through_transformers != with_special:
            print(f"  note: transformers gives {through_transformers} for {text!r}, "
                  f"tokenizers {with_special}", flush=True)
        entries.append({
            "text": text,
            "ids": ids,
            "ids_with_special": with_special,
            "decoded": tok.decode(with_special, skip_special_tokens=False),
            "decoded_skip_special": tok.decode(with_special, skip_special_tokens=True),
        })
    return {"versions": versions(), "texts": entries}


def config_expected(directory, add_bos, add_eos):
    if int(transformers.__version__.split(".")[0]) < 5:
        print("  warning: transformers < 5: PreTrainedTokenizerFast ignores the flags", flush=True)
    flagged = PreTrainedTokenizerFast.from_pretrained(directory, add_bos_token=add_bos,
                                                      add_eos_token=add_eos)
    plain = PreTrainedTokenizerFast.from_pretrained(directory)
    entries = []
    for text in TEXTS:
        entries.append({
            "text": text,
            "ids_with_special": flagged.encode(text, add_special_tokens=True),
            "ids_from_pretrained": plain.encode(text, add_special_tokens=True),
        })
    return {"versions": versions(), "flags": {"add_bos_token": add_bos, "add_eos_token": add_eos},
            "texts": entries}


def make_all(out_root):
    rng = random.Random(SEED)
    corpus = training_text(rng, 4000)
    root = os.path.join(out_root, SUBDIR)
    if os.path.isdir(root):
        shutil.rmtree(root)
    os.makedirs(root)
    families = {}
    families.update(byte_level_families(corpus))
    families.update(metaspace_families(corpus))
    families.update(whitespace_families(corpus))
    for name, tok in sorted(families.items()):
        directory = os.path.join(root, name)
        os.makedirs(directory)
        tok.save(os.path.join(directory, "tokenizer.json"))
        write_json(os.path.join(directory, "expected.json"), family_expected(tok))
        print(f"  {name}: vocab {tok.get_vocab_size()}", flush=True)
    for template, tok in sorted(config_tokenizers(corpus).items()):
        for add_bos, add_eos in CONFIG_FLAGS:
            name = (f"config-{template}-bos-{'true' if add_bos else 'false'}"
                    f"-eos-{'true' if add_eos else 'false'}")
            directory = os.path.join(root, name)
            os.makedirs(directory)
            tok.save(os.path.join(directory, "tokenizer.json"))
            write_json(os.path.join(directory, "tokenizer_config.json"), {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "bos_token": "<s>",
                "eos_token": "</s>",
                "add_bos_token": add_bos,
                "add_eos_token": add_eos,
            })
            write_json(os.path.join(directory, "expected.json"),
                       config_expected(directory, add_bos, add_eos))
            print(f"  {name}", flush=True)


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
    parser.add_argument("--check-reproducible", action="store_true",
                        help="make the fixtures twice and compare every byte")
    args = parser.parse_args()
    print(f"tokenizers {tokenizers.__version__}, transformers {transformers.__version__}",
          flush=True)
    make_all(args.out)
    if args.check_reproducible:
        with tempfile.TemporaryDirectory() as again:
            make_all(again)
            a = tree_digest(os.path.join(args.out, SUBDIR))
            b = tree_digest(os.path.join(again, SUBDIR))
            print(f"reproducible: {a == b} ({a[:16]} / {b[:16]})", flush=True)
            if a != b:
                sys.exit(1)


if __name__ == "__main__":
    main()
