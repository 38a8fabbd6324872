#!/usr/bin/env bash
# Tokenizer load time before and after a change, on the same made tokenizer.json (a byte-level
# BPE of Qwen2's size, about 9 MB) in one run:
#   after   `kvvm bench tokenizer-load` of this tree (where the time goes, per phase);
#   before  Tokenizer::load of the tokenizer sources at REV (git archive: src/tokenizer,
#           src/base, include), built here with g++ -O3 into a small timing program, beside
#           the part of it that read_json's DOM was (and nlohmann's plain parse of the file).
# Usage: CLI=build/time-release/tools/kvvm/kvvm bench/tokenizer-load.sh REV [LOADS]
# (REV: the commit to compare with; LOADS: loads timed each, default 5). Needs g++, PCRE2,
# utf8proc and nlohmann-json, as the build does. Runs on the CPU only.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CLI="${CLI:-$ROOT/build/time-release/tools/kvvm/kvvm}"
REV="${1:?usage: bench/tokenizer-load.sh REV [LOADS]}"
LOADS="${2:-5}"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT

echo "== after: this tree ($CLI)"
"$CLI" bench tokenizer-load --loads "$LOADS" --keep "$WORK/tokenizer.json"

echo "== before: $REV"
mkdir -p "$WORK/before"
git -C "$ROOT" archive "$REV" src/tokenizer src/base include | tar -x -C "$WORK/before"
cat > "$WORK/before/load.cc" <<'CC'
// Times Tokenizer::load (the median and the first of N loads, each with the tokenizer freed),
// and of the same file read_json's DOM (built and freed) and nlohmann's plain parse into a DOM,
// the part of a load that reading the JSON was.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "base/json_reader.h"
#include "kvvm/tokenizer/tokenizer.h"

template <typename F>
void report(const char* what, int loads, F run) {
  std::vector<double> ms;
  for (int i = 0; i < loads; ++i) {
    const auto start = std::chrono::steady_clock::now();
    run();
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
                     .count());
  }
  const double first = ms.front();
  std::sort(ms.begin(), ms.end());
  std::printf("%-52s median %7.1f ms   first %7.1f ms\n", what, ms[ms.size() / 2], first);
}

int main(int argc, char** argv) {
  const std::string path = argv[1];
  const int loads = std::atoi(argv[2]);
  bool ok = true;
  report("Tokenizer::load, then free the tokenizer", loads, [&] {
    ok = ok && kvvm::tokenizer::Tokenizer::load(path).ok();
  });
  report("  of which read_json_file: the DOM built and freed", loads, [&] {
    ok = ok && kvvm::read_json_file(path).ok();
  });
  std::ifstream file(path, std::ios::binary);
  const std::string text((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  report("  nlohmann::json::parse alone (DOM built and freed)", loads, [&] {
    ok = ok && !nlohmann::json::parse(text).is_null();
  });
  return ok ? 0 : 1;
}
CC
g++ -std=c++20 -O3 -DNDEBUG -w -I"$WORK/before/include" -I"$WORK/before/src" \
  "$WORK/before"/src/tokenizer/*.cc "$WORK/before"/src/base/*.cc "$WORK/before/load.cc" \
  -lpcre2-8 -lutf8proc -o "$WORK/before/load"
"$WORK/before/load" "$WORK/tokenizer.json" "$LOADS"
