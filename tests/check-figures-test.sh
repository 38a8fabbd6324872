#!/usr/bin/env bash
# Shows that scripts/check-figures.sh fails when the README and docs/PERFORMANCE.md disagree:
# it runs the check on temporary copies of the README, each with one change, and expects exit 1
# with the figure named. Prints "ok" / "not ok" per case; exits 1 if any case is not ok.
set -uo pipefail
cd "$(dirname "$0")/.."
check=scripts/check-figures.sh
reference=docs/PERFORMANCE.md
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
failures=0

report() {  # name, then 0 for ok
  if [[ $2 == 0 ]]; then echo "ok - $1"; else
    echo "not ok - $1"
    failures=$((failures + 1))
  fi
}

# edit OUT PYTHON: writes the README changed by a python expression over its text `s`, and
# prints what the case expects to be named (the python code sets `name`).
edit() {
  python3 - "$1" "$2" <<'PY'
import re
import sys
out, code = sys.argv[1], sys.argv[2]
s = open("README.md", encoding="utf-8").read()
name = None
exec(code)
open(out, "w", encoding="utf-8").write(s)
print(name)
PY
}

# expect_failure NAME FILE WORD...: the check on FILE exits 1 and its output holds every WORD.
expect_failure() {
  local name=$1 file=$2 out rc word
  shift 2
  out=$(bash "$check" "$file" "$reference" 2>&1)
  rc=$?
  local ok=0
  [[ $rc == 1 ]] || ok=1
  for word in "$@"; do grep -qF -- "$word" <<<"$out" || ok=1; done
  if [[ $ok != 0 ]]; then echo "$out" | sed 's/^/    /'; fi
  report "$name (exit $rc)" $ok
}

bash "$check" >/dev/null 2>&1
report "the README's figures agree with docs/PERFORMANCE.md" $?

# The first marked figure of the README, its last digit changed: named with both values.
read -r id value < <(edit "$tmp/altered.md" '
m = re.search(r"(\d)((?:[^\d<]|<(?!!--))*)<!--\s*fig:([a-z0-9.-]+)\s*-->", s)
if m:
    s = s[: m.start(1)] + str((int(m.group(1)) + 1) % 10) + s[m.end(1):]
    v = re.search(r"[\d,.]*$", s[: m.start(1) + 1]).group(0)
    name = m.group(3) + " " + v')
expect_failure "an altered figure is named with both values" "$tmp/altered.md" \
  "figure '$id'" "$value" "$reference:"

# A figure whose id the reference does not carry.
edit "$tmp/unknown.md" 's += "\nA figure: 12.5 ms<!-- fig:no-such-figure -->\n"' >/dev/null
expect_failure "a figure the reference does not carry is named" "$tmp/unknown.md" \
  "figure 'no-such-figure'" "has no figure with this id"

# A number inside a quoted output block.
block=$(edit "$tmp/block.md" '
m = re.search(r"<!--\s*figblock:([a-z0-9.-]+)\s*-->\s*\n```[^\n]*\n", s)
if m:
    d = re.compile(r"\d").search(s, m.end())
    s = s[: d.start()] + str((int(d.group(0)) + 1) % 10) + s[d.end():]
    name = m.group(1)')
expect_failure "an altered number in a quoted block is named" "$tmp/block.md" "block '$block'"

echo "check-figures-test: $failures case(s) not ok"
((failures == 0))
