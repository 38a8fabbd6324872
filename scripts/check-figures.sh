#!/usr/bin/env bash
# Checks that every figure the README quotes is the figure docs/PERFORMANCE.md gives for it.
#
#   scripts/check-figures.sh [README [REFERENCE]]     (defaults: README.md docs/PERFORMANCE.md)
#
# A quoted figure carries a marker right after it, in both files: `4.22 ms<!-- fig:ID -->`
# (an HTML comment: invisible when rendered). The figure is the last number before the marker
# on its line, or a range of two ("1.55–2.76×"); thousands separators and units are ignored.
# The README may round the reference's figure (4.22 for 4.223), never differ from it.
# A fenced code block preceded by a line `<!-- figblock:ID -->` (an output quoted whole) must
# hold the same numbers, in the same order, as the block with that id in the reference.
# Every id the README uses must be in the reference, once. Exits 1 naming each figure that
# disagrees (id, the README's value and line, the reference's value and line), 2 on a usage
# error. Needs python3's standard library only.
set -euo pipefail
absolute() { if [[ $1 == /* ]]; then echo "$1"; else echo "$PWD/$1"; fi; }
readme=${1:+$(absolute "$1")}
reference=${2:+$(absolute "$2")}
cd "$(dirname "$0")/.."
readme=${readme:-README.md}
reference=${reference:-docs/PERFORMANCE.md}
exec python3 - "$readme" "$reference" <<'PY'
import re
import sys
from decimal import ROUND_HALF_EVEN, ROUND_HALF_UP, Decimal

NUM = r"(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?"
# The last number (or range of two) before a marker: nothing numeric may follow it.
VALUE = re.compile(r"([+\u2212-]?" + NUM + r"(?:\s*[\u2013-]\s*" + NUM + r")?)\D*$")
MARK = re.compile(r"<!--\s*fig:([a-z0-9][a-z0-9.-]*)\s*-->")
BLOCK = re.compile(r"^\s*<!--\s*figblock:([a-z0-9][a-z0-9.-]*)\s*-->\s*$")
CODE_SPAN = re.compile(r"`[^`]*`")
NUMBER = re.compile(NUM)


def parse_value(text):
    """'1,382' -> (Decimal('1382'),); '3.02–3.27' -> two Decimals. Signs kept."""
    text = text.replace("\u2212", "-")
    m = re.fullmatch(r"([+-]?" + NUM + r")(?:\s*[\u2013-]\s*(" + NUM + r"))?", text.strip())
    parts = [p for p in m.groups() if p is not None]
    return tuple(Decimal(p.replace(",", "").lstrip("+")) for p in parts)


def agrees(quoted, exact):
    """The README's number is the reference's, or the reference's rounded to as many places."""
    if len(quoted) != len(exact):
        return False
    for q, e in zip(quoted, exact):
        places = -q.as_tuple().exponent
        if places > -e.as_tuple().exponent:
            return False  # the README may not be more precise than the reference
        step = Decimal(1).scaleb(-places)
        if q not in (e.quantize(step, ROUND_HALF_UP), e.quantize(step, ROUND_HALF_EVEN)):
            return False
    return True


def scan(path, errors):
    """Returns ({id: [(value text, line)]}, {block id: (line, [numbers])})."""
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().split("\n")
    except OSError as e:
        print(f"check-figures: cannot read {path}: {e.strerror}", file=sys.stderr)
        sys.exit(2)
    figures, blocks = {}, {}
    fence = None  # the fence that opened the code block we are in
    pending = None  # a figblock marker waiting for its code block: (id, line)
    block_numbers = None
    for number, line in enumerate(lines, 1):
        stripped = line.strip()
        if fence is not None:
            if stripped.startswith(fence):
                fence = None
                if block_numbers is not None:
                    blocks[block_numbers[0]] = (block_numbers[1], block_numbers[2])
                    block_numbers = None
            elif block_numbers is not None:
                block_numbers[2].extend((number, n) for n in NUMBER.findall(line))
            continue
        if stripped.startswith("```") or stripped.startswith("~~~"):
            fence = stripped[:3]
            if pending is not None:
                block_id, _ = pending
                if block_id in blocks:
                    errors.append(f"{path}:{number}: figblock:{block_id} is given twice")
                block_numbers = [block_id, number, []]
                pending = None
            continue
        block = BLOCK.match(line)
        if block:
            pending = (block.group(1), number)
            continue
        if pending is not None and stripped:
            errors.append(f"{path}:{pending[1]}: figblock:{pending[0]} is not followed by a code block")
            pending = None
        # Markers shown as code (`<!-- fig:... -->` in prose about them) are not markers.
        text = CODE_SPAN.sub(lambda m: " " * len(m.group(0)) if "<!--" in m.group(0) else m.group(0), line)
        for m in MARK.finditer(text):
            # Bold marks and earlier markers on the line are not part of the figure.
            before = MARK.sub("", text[: m.start()]).replace("*", "")
            v = VALUE.search(before)
            if not v:
                errors.append(f"{path}:{number}: fig:{m.group(1)} has no number before it")
            else:
                figures.setdefault(m.group(1), []).append((v.group(1), number))
    if pending is not None:
        errors.append(f"{path}:{pending[1]}: figblock:{pending[0]} is not followed by a code block")
    return figures, blocks


def main():
    readme_path, reference_path = sys.argv[1], sys.argv[2]
    errors = []
    quoted, quoted_blocks = scan(readme_path, errors)
    reference, reference_blocks = scan(reference_path, errors)
    for fig_id, places in reference.items():
        if len(places) > 1:
            lines = ", ".join(str(line) for _, line in places)
            errors.append(f"{reference_path}: fig:{fig_id} is given {len(places)} times (lines {lines}): "
                          "a measure appears once")
    checked = 0
    for fig_id, uses in sorted(quoted.items()):
        for value, line in uses:
            checked += 1
            if fig_id not in reference:
                errors.append(f"figure '{fig_id}': {readme_path}:{line} says {value}, "
                              f"but {reference_path} has no figure with this id")
                continue
            ref_value, ref_line = reference[fig_id][0]
            if not agrees(parse_value(value), parse_value(ref_value)):
                errors.append(f"figure '{fig_id}': {readme_path}:{line} says {value}, "
                              f"{reference_path}:{ref_line} says {ref_value}")
    for block_id, (line, numbers) in sorted(quoted_blocks.items()):
        checked += 1
        if block_id not in reference_blocks:
            errors.append(f"block '{block_id}': {readme_path}:{line} quotes it, "
                          f"but {reference_path} has no block with this id")
            continue
        ref_line, ref_numbers = reference_blocks[block_id]
        ours = [n.replace(",", "") for _, n in numbers]
        theirs = [n.replace(",", "") for _, n in ref_numbers]
        if ours != theirs:
            i = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), min(len(ours), len(theirs)))
            at = f"{readme_path}:{numbers[i][0]} says {numbers[i][1]}" if i < len(numbers) else f"{readme_path} ends"
            ref_at = (f"{reference_path}:{ref_numbers[i][0]} says {ref_numbers[i][1]}"
                      if i < len(ref_numbers) else f"{reference_path} ends")
            errors.append(f"block '{block_id}' (number {i + 1} of the block): {at}, {ref_at}")
    for e in errors:
        print(f"check-figures: {e}")
    if errors:
        print(f"check-figures: {len(errors)} disagreement(s) between {readme_path} and {reference_path}")
        return 1
    print(f"check-figures: {checked} figure(s) of {readme_path} agree with {reference_path}")
    return 0


sys.exit(main())
PY
