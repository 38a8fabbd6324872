#!/usr/bin/env python3
"""Medians of repeated attention benchmark runs, and the acceptance goals.

Each run is a directory holding sdpa.json (bench/sdpa_baseline.py --json), decode.json
(kvvm bench decode --json) and prefill.json (kvvm bench prefill --json); a missing file leaves
its rows out. Prints a markdown report: per decode row (shape x layout) the median ms, its
spread (max - min) / median over the runs, TB/s of KV read, % of the device copy bandwidth,
PyTorch's median ms and spread, and the ratio PyTorch ms / ours (> 1: we are faster); per
prefill row the median ms, spread, TFLOP/s, PyTorch's TFLOP/s and backend, and the ratio. Ratios
and rates are taken from the medians, not per run.

Then the goals, each MET, MISSED or NOT MEASURED, with the row that decides it:
  - decode ratio >= 1.0 on every shape (every layout measured);
  - decode ratio >= 1.3 at 1,32768,32/8,128;
  - large batches (64,4096,32/8,128  256,2048,32/8,128  64,2048,64/8,128  128,1024,14/2,64)
    read KV at >= 85% of the copy bandwidth;
  - prefill ratio >= 0.8 for the full 4K and 16K prefills;
  - no layout more than 5% slower than another on the same shape (decode and prefill).

Usage: python3 bench/attention_summary.py run1 run2 run3 [--out summary.md]
Standard library only.
"""
import argparse
import json
import os
import statistics
import sys

LONG_SHAPE = "1,32768,32/8,128"
LARGE_BATCHES = ["64,4096,32/8,128", "256,2048,32/8,128", "64,2048,64/8,128",
                 "128,1024,14/2,64"]
PREFILL_GOAL_TOKENS = [4096, 16384]
DECODE_RATIO = 1.0
LONG_RATIO = 1.3
COPY_FRACTION = 0.85
PREFILL_RATIO = 0.8
LAYOUT_SLACK = 1.05


def load(directory, name):
    path = os.path.join(directory, name)
    try:
        with open(path) as f:
            return json.load(f)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as error:
        print(f"attention_summary: skipping {path}: {error}", file=sys.stderr)
        return None


def median(values):
    return statistics.median(values) if values else None


def spread(values):
    """(max - min) / median over the runs; None with fewer than two."""
    if len(values) < 2:
        return None
    m = statistics.median(values)
    return (max(values) - min(values)) / m if m > 0 else None


def fmt(value, digits=2, suffix=""):
    return "-" if value is None else f"{value:.{digits}f}{suffix}"


def pct(value):
    return "-" if value is None else f"{100 * value:.1f}%"


class Series:
    """Values of one row gathered over the runs, in first-seen order of the rows."""

    def __init__(self):
        self.rows = {}

    def add(self, key, field, value):
        if value is None or value <= 0:
            return
        self.rows.setdefault(key, {}).setdefault(field, []).append(value)

    def get(self, key, field):
        return self.rows.get(key, {}).get(field, [])


def grouped(keys):
    """(shape, layout) keys with each shape's layouts together, shapes in first-seen order."""
    order = {}
    for shape, _ in keys:
        order.setdefault(shape, len(order))
    return sorted(keys, key=lambda key: order[key[0]])


def gather(runs):
    decode, prefill, torch_decode, torch_prefill = Series(), Series(), Series(), Series()
    copy, torch_backend, meta = [], {}, {}
    for run in runs:
        sdpa = load(run, "sdpa.json")
        if sdpa:
            meta.setdefault("torch", sdpa.get("torch"))
            meta.setdefault("device", sdpa.get("device"))
            for row in sdpa.get("rows", []):
                torch_decode.add(row["shape"], "ms", row.get("ms"))
            for row in sdpa.get("prefill_rows", []):
                torch_prefill.add(row["key"], "ms", row.get("ms"))
                torch_backend[row["key"]] = row.get("backend", "?")
                if "mask_check" in row:
                    torch_backend[row["key"]] += f", mask {row['mask_check'].split()[0]}"
        dec = load(run, "decode.json")
        if dec:
            meta.setdefault("device", dec.get("device"))
            meta.setdefault("element", dec.get("element", "fp16"))
            if dec.get("copy_bytes_per_second"):
                copy.append(dec["copy_bytes_per_second"])
            for row in dec.get("rows", []):
                key = (row["shape"], row["layout"])
                decode.add(key, "ms", row.get("ms"))
                decode.add(key, "kv_bytes", row.get("kv_bytes"))
        pre = load(run, "prefill.json")
        if pre:
            meta.setdefault("device", pre.get("device"))
            for row in pre.get("rows", []):
                key = (row["key"], row["layout"])
                prefill.add(key, "ms", row.get("ms"))
                prefill.add(key, "flops", row.get("flops"))
                prefill.add(key, "tokens", row.get("tokens"))
    return decode, prefill, torch_decode, torch_prefill, copy, torch_backend, meta


def decode_table(decode, torch_decode, copy_bw, lines):
    results = {}
    lines.append("## Decode (kvvm bench decode vs PyTorch SDPA flash)\n")
    lines.append("| shape | layout | ms | spread | TB/s | % copy | torch ms | torch spread | ratio |")
    lines.append("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for (shape, layout) in grouped(decode.rows):
        ms_runs = decode.get((shape, layout), "ms")
        ms = median(ms_runs)
        kv_bytes = median(decode.get((shape, layout), "kv_bytes"))
        rate = kv_bytes / (ms * 1e-3) if ms and kv_bytes else None
        fraction = rate / copy_bw if rate and copy_bw else None
        torch_runs = torch_decode.get(shape, "ms")
        torch_ms = median(torch_runs)
        ratio = torch_ms / ms if torch_ms and ms else None
        results[(shape, layout)] = {"ms": ms, "fraction": fraction, "ratio": ratio}
        lines.append(f"| {shape} | {layout} | {fmt(ms, 4)} | {pct(spread(ms_runs))} | "
                     f"{fmt(rate / 1e12 if rate else None)} | {pct(fraction)} | "
                     f"{fmt(torch_ms, 4)} | {pct(spread(torch_runs))} | {fmt(ratio)} |")
    lines.append("")
    return results


def prefill_table(prefill, torch_prefill, torch_backend, lines):
    results = {}
    lines.append("## Prefill (kvvm bench prefill vs PyTorch SDPA)\n")
    lines.append("Rows are T@P,Hq/Hkv,D: T query tokens after P cached ones; TFLOP/s count the "
                 "causal work exactly (4 x Hq x D x keys seen per query row).\n")
    lines.append("| row | layout | ms | spread | TFLOP/s | tokens/s | torch ms | torch spread "
                 "| torch TFLOP/s | torch backend | ratio |")
    lines.append("|---|---|---:|---:|---:|---:|---:|---:|---:|---|---:|")
    for (key, layout) in grouped(prefill.rows):
        ms_runs = prefill.get((key, layout), "ms")
        ms = median(ms_runs)
        flops = median(prefill.get((key, layout), "flops"))
        tokens = median(prefill.get((key, layout), "tokens"))
        torch_runs = torch_prefill.get(key, "ms")
        torch_ms = median(torch_runs)
        ratio = torch_ms / ms if torch_ms and ms else None
        tflops = flops / (ms * 1e-3) / 1e12 if flops and ms else None
        torch_tflops = flops / (torch_ms * 1e-3) / 1e12 if flops and torch_ms else None
        results[(key, layout)] = {"ms": ms, "ratio": ratio, "tokens": tokens}
        lines.append(f"| {key} | {layout} | {fmt(ms, 4)} | {pct(spread(ms_runs))} | "
                     f"{fmt(tflops, 1)} | {fmt(tokens / (ms * 1e-3) if tokens and ms else None, 0)}"
                     f" | {fmt(torch_ms, 4)} | {pct(spread(torch_runs))} | {fmt(torch_tflops, 1)} "
                     f"| {torch_backend.get(key, '-')} | {fmt(ratio)} |")
    lines.append("")
    return results


def verdict(values, goal, at_least=True, absent=()):
    """values: [(label, value or None)]; absent: rows the goal needs that no run measured. The
    worst value decides; a row without a figure, or an absent one, leaves the goal NOT MEASURED
    unless a measured row already misses it."""
    measured = [(label, v) for label, v in values if v is not None]
    unmeasured = [label for label, v in values if v is None] + list(absent)
    note = f"; not measured: {', '.join(unmeasured)}" if unmeasured else ""
    if not measured:
        return "NOT MEASURED", "no row" + note
    worst = min(measured, key=lambda x: x[1]) if at_least else max(measured, key=lambda x: x[1])
    met = worst[1] >= goal if at_least else worst[1] <= goal
    state = "MISSED" if not met else ("NOT MEASURED" if unmeasured else "MET")
    return state, f"worst {worst[0]}: {worst[1]:.3f}{note}"


def layout_spreads(results):
    """Per shape with two or more layouts: slowest median ms / fastest."""
    by_shape = {}
    for (shape, layout), r in results.items():
        if r["ms"]:
            by_shape.setdefault(shape, {})[layout] = r["ms"]
    return [(shape, max(ms.values()) / min(ms.values()))
            for shape, ms in by_shape.items() if len(ms) > 1]


def goals(decode, prefill, lines):
    lines.append("## Acceptance goals\n")
    lines.append("| goal | verdict | deciding row |")
    lines.append("|---|---|---|")
    checks = []
    checks.append((f"decode ratio >= {DECODE_RATIO} on every shape",
                   verdict([(f"{s} {l}", r["ratio"]) for (s, l), r in decode.items()],
                           DECODE_RATIO)))
    shapes = {s for s, _ in decode}
    checks.append((f"decode ratio >= {LONG_RATIO} at {LONG_SHAPE}",
                   verdict([(f"{s} {l}", r["ratio"]) for (s, l), r in decode.items()
                            if s == LONG_SHAPE], LONG_RATIO,
                           absent=[LONG_SHAPE] if LONG_SHAPE not in shapes else [])))
    checks.append((f"large batches >= {COPY_FRACTION:.0%} of copy",
                   verdict([(f"{s} {l}", r["fraction"]) for (s, l), r in decode.items()
                            if s in LARGE_BATCHES], COPY_FRACTION,
                           absent=[s for s in LARGE_BATCHES if s not in shapes])))
    full = {(k, l): r for (k, l), r in prefill.items() if k.split("@")[1].startswith("0,")}
    checks.append((f"prefill ratio >= {PREFILL_RATIO} at 4K and 16K",
                   verdict([(f"{k} {l}", r["ratio"]) for (k, l), r in full.items()
                            if r["tokens"] in PREFILL_GOAL_TOKENS], PREFILL_RATIO,
                           absent=[f"{t} tokens" for t in PREFILL_GOAL_TOKENS
                                   if t not in {r["tokens"] for r in full.values()}])))
    spreads = layout_spreads(decode) + layout_spreads(prefill)
    if spreads:
        checks.append((f"no layout more than {LAYOUT_SLACK - 1:.0%} slower than another",
                       verdict(spreads, LAYOUT_SLACK, at_least=False)))
    else:
        checks.append((f"no layout more than {LAYOUT_SLACK - 1:.0%} slower than another",
                       ("NOT MEASURED", "one layout per shape")))
    for goal, (state, detail) in checks:
        lines.append(f"| {goal} | **{state}** | {detail} |")
    lines.append("")
    return checks


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", help="run directories (sdpa/decode/prefill.json)")
    parser.add_argument("--out", help="also write the report here")
    args = parser.parse_args()
    (decode, prefill, torch_decode, torch_prefill, copy, torch_backend,
     meta) = gather(args.runs)
    if not decode.rows and not prefill.rows:
        print("attention_summary: no decode.json or prefill.json rows in " +
              " ".join(args.runs), file=sys.stderr)
        return 1
    copy_bw = median(copy)
    lines = [f"# Attention benchmarks: medians of {len(args.runs)} run(s)\n",
             f"device {meta.get('device', '?')}, torch {meta.get('torch', '?')}, decode element "
             f"{meta.get('element', '?')}; device copy (kvvm, read + write) "
             f"{fmt(copy_bw / 1e12 if copy_bw else None)} TB/s, spread {pct(spread(copy))}; "
             "ratio = torch ms / ours (> 1: kvvm faster)\n"]
    decode_results = decode_table(decode, torch_decode, copy_bw, lines)
    prefill_results = prefill_table(prefill, torch_prefill, torch_backend, lines)
    goals(decode_results, prefill_results, lines)
    report = "\n".join(lines)
    print(report)
    if args.out:
        with open(args.out, "w") as f:
            f.write(report + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
