// Text rendering shared by every subcommand that prints tables: padding by displayed
// characters, and a table whose columns size themselves to their widest cell. Numbers as text
// (str, fixed, significant, durations and rates) come from base/format.h, the one formatter of
// the library and the tool, included here for every table's cells.
#pragma once

#include <cstddef>
#include <cstdint>
#include <iosfwd>
#include <string>
#include <string_view>
#include <vector>

#include "base/format.h"

namespace kvvm::cli {

// Characters as displayed: UTF-8 continuation bytes do not count ("µs" is two wide).
std::size_t display_width(std::string_view text);

// `text` padded with spaces to `width` displayed characters: after it (left-aligned) or
// before it (right-aligned). Text already as wide is returned as is.
std::string pad_right(std::string_view text, std::size_t width);
std::string pad_left(std::string_view text, std::size_t width);

// Columns separated by two spaces, left-aligned for the first `left_columns` and
// right-aligned after; a row may be shorter than the header and carry a trailing note, left
// as is (a formula, why a row was skipped), under `note_header` when one is given. Trailing
// spaces are trimmed from every line.
class TextTable {
 public:
  TextTable(std::vector<std::string> header, std::size_t left_columns,
            std::string note_header = {});

  void add(std::vector<std::string> cells, std::string note = {});
  void print(std::ostream& out) const;

 private:
  std::vector<std::string> header_;
  std::size_t left_columns_;
  std::string note_header_;
  std::vector<std::vector<std::string>> rows_;
  std::vector<std::string> notes_;  // one per row
};

}  // namespace kvvm::cli
