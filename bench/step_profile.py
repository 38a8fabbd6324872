"""Summarises an ncu CSV (--csv --page raw --print-units base) of consecutive decode steps:
kernels per step (a step starts at each embedding kernel), GPU time per step, and per kernel
class (name up to its template arguments) the launches per step, time per step and achieved
DRAM bandwidth ((read + write bytes) / time). Only whole steps (between two embedding
kernels) are counted.

Usage: python3 bench/step_profile.py NCU.csv [--step-ms MS]  (MS: the step's wall time from
`kvvm bench engine` with graphs; the difference to the summed kernel time is launch gaps).
--phases: the profile holds several runs (e.g. the graphs, eager and preallocated modes of one
`kvvm bench engine`, each a warm-up and a timed run); a phase is a run of decode-only steps
(no prefill kernel) and each is summarised on its own, in order.
--by-grid: each class split by its launches' grid sizes (a GEMV's grid tells its projection
apart: at batch 1 on the 8B shape q|k|v, o and down, gate|up and lm_head)."""
import argparse
import collections
import csv
import json
import sys


def number(text):
    """ncu's CSV writes thousands separators: "19,520"."""
    return float(text.replace(",", ""))


def kernel_class(name):
    """`void kvvm::kernels::gemv_kernel<...>(...)` -> `gemv_kernel`."""
    for anonymous in ("<unnamed>::", "unnamed>::", "(anonymous namespace)::"):
        name = name.replace(anonymous, "")
    head = name.split("<")[0].split("(")[0].strip()
    return head.split()[-1].split("::")[-1] if head else name


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("csv")
    parser.add_argument("--step-ms", type=float)
    parser.add_argument("--phases", action="store_true")
    parser.add_argument("--by-grid", action="store_true")
    args = parser.parse_args()
    rows = []
    with open(args.csv, newline="") as f:
        lines = [line for line in f if line.startswith('"')]
    reader = csv.DictReader(lines)
    for row in reader:
        try:
            time_ns = number(row["gpu__time_duration.sum"])
        except (KeyError, ValueError):
            continue  # the units row
        moved = 0.0
        for key in ("dram__bytes_read.sum", "dram__bytes_write.sum"):
            try:
                moved += number(row.get(key) or "0")
            except ValueError:
                pass
        rows.append((row["Kernel Name"], time_ns, moved, row.get("Grid Size", "")))
    starts = [i for i, (name, *_) in enumerate(rows) if kernel_class(name) == "embedding_kernel"]
    if len(starts) < 2:
        sys.exit("fewer than two embedding kernels: no whole step in the profile")
    if args.phases:
        summarise_phases(rows, starts, args.by_grid)
        return
    steps = len(starts) - 1
    whole = rows[starts[0]:starts[-1]]
    classes = collections.defaultdict(lambda: [0, 0.0, 0.0])
    for name, time_ns, moved, grid in whole:
        c = classes[label(name, grid, args.by_grid)]
        c[0] += 1
        c[1] += time_ns
        c[2] += moved
    kernel_ms = sum(t for _, t, *_ in whole) / steps / 1e6
    summary = {
        "steps": steps,
        "kernels_per_step": len(whole) / steps,
        "kernel_ms_per_step": kernel_ms,
        "classes": {},
    }
    if args.step_ms:
        summary["step_ms"] = args.step_ms
        summary["gap_ms_per_step"] = args.step_ms - kernel_ms
    for name, (count, time_ns, moved) in sorted(classes.items(), key=lambda kv: -kv[1][1]):
        summary["classes"][name] = {
            "per_step": count / steps,
            "ms_per_step": time_ns / steps / 1e6,
            "gb_per_s": moved / time_ns if time_ns else 0.0,
        }
    print(json.dumps(summary, indent=1))
    print(f"{steps} steps: {summary['kernels_per_step']:.0f} kernels and {kernel_ms:.3f} ms of "
          f"kernel time per step" + (f"; step {args.step_ms:.3f} ms, gaps "
                                     f"{summary['gap_ms_per_step']:.3f} ms" if args.step_ms else ""),
          file=sys.stderr)
    for name, c in summary["classes"].items():
        print(f"  {name:40} {c['per_step']:6.1f}/step {c['ms_per_step']:8.3f} ms/step "
              f"{c['gb_per_s']:8.1f} GB/s", file=sys.stderr)


def label(name, grid, by_grid):
    """A kernel's class, with its grid size under --by-grid."""
    return kernel_class(name) + (f" {grid}" if by_grid else "")


def summarise_phases(rows, starts, by_grid):
    """Per phase of consecutive decode-only steps: steps, kernel ms per step, top classes."""
    phases, current = [], []
    for begin, end in zip(starts, starts[1:]):
        step = rows[begin:end]
        if any("prefill" in kernel_class(name) for name, *_ in step):
            if current:
                phases.append(current)
            current = []
        else:
            current.append(step)
    if current:
        phases.append(current)
    for index, phase in enumerate(phases):
        kernels = [k for step in phase for k in step]
        total = sum(t for _, t, *_ in kernels)
        print(f"phase {index}: {len(phase)} decode steps, {len(kernels) / len(phase):.0f} kernels "
              f"and {total / len(phase) / 1e6:.3f} ms of kernel time per step")
        classes = collections.defaultdict(float)
        for name, time_ns, _, grid in kernels:
            classes[label(name, grid, by_grid)] += time_ns
        for name, time_ns in sorted(classes.items(), key=lambda kv: -kv[1])[:6]:
            print(f"  {name:40} {time_ns / len(phase) / 1e6:8.3f} ms/step")


if __name__ == "__main__":
    main()
