// Where the time of a Tokenizer::load goes, for `kvvm bench tokenizer-load`.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "kvvm/base/status.h"
#include "kvvm/tokenizer/tokenizer.h"

namespace kvvm::tokenizer {
namespace detail {

struct LoadProfile {
  std::size_t file_bytes = 0;
  double read_ms = 0;        // the file into memory
  double json_ms = 0;        // the whole reading (what the next two are part of)
  double vocab_ms = 0;       //   of which model.vocab: parsed into the vocabulary's table
  double merges_ms = 0;      //   of which model.merges: parsed and resolved into their table
  double model_ms = 0;       // the model's checks (and merges read before the vocabulary)
  double components_ms = 0;  // normalizer, pre-tokenizer (regexes compiled), decoder
  double tables_ms = 0;      // the by-id tables: every token's spelling and decoded bytes
  double added_ms = 0;       // added tokens and the post-processor
  double config_ms = 0;      // tokenizer_config.json's flags
  double release_ms = 0;     // freeing what only the load needed (the text, the DOM)
  double total_ms = 0;
  // Filled by the benchmark, not by a load: its own pass over the JSON syntax, and the load's
  // time with the tokenizer's teardown after it.
  double syntax_ms = 0;
  double load_and_free_ms = 0;
};

}  // namespace detail

// Tokenizer::load, filling `profile` when not null.
Result<std::unique_ptr<Tokenizer>> load_profiled(const std::string& path,
                                                 detail::LoadProfile* profile);

}  // namespace kvvm::tokenizer
