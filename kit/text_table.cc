#include "kit/text_table.h"

#include <algorithm>
#include <ostream>
#include <utility>

namespace kvvm::cli {

std::size_t display_width(std::string_view text) {
  std::size_t width = 0;
  for (const char c : text) {
    if ((static_cast<unsigned char>(c) & 0xC0) != 0x80) ++width;
  }
  return width;
}

std::string pad_right(std::string_view text, std::size_t width) {
  const std::size_t shown = display_width(text);
  return std::string(text) + std::string(shown < width ? width - shown : 0, ' ');
}

std::string pad_left(std::string_view text, std::size_t width) {
  const std::size_t shown = display_width(text);
  return std::string(shown < width ? width - shown : 0, ' ') + std::string(text);
}

TextTable::TextTable(std::vector<std::string> header, std::size_t left_columns,
                     std::string note_header)
    : header_(std::move(header)),
      left_columns_(left_columns),
      note_header_(std::move(note_header)) {}

void TextTable::add(std::vector<std::string> cells, std::string note) {
  rows_.push_back(std::move(cells));
  notes_.push_back(std::move(note));
}

void TextTable::print(std::ostream& out) const {
  std::vector<std::size_t> widths(header_.size());
  for (std::size_t c = 0; c < header_.size(); ++c) widths[c] = display_width(header_[c]);
  for (const std::vector<std::string>& cells : rows_) {
    if (cells.size() > widths.size()) widths.resize(cells.size(), 0);
    for (std::size_t c = 0; c < cells.size(); ++c) {
      widths[c] = std::max(widths[c], display_width(cells[c]));
    }
  }
  const auto line = [&](const std::vector<std::string>& cells, const std::string& note) {
    std::string text;
    for (std::size_t c = 0; c < cells.size(); ++c) {
      if (c > 0) text += "  ";
      text += c < left_columns_ ? pad_right(cells[c], widths[c]) : pad_left(cells[c], widths[c]);
    }
    if (!note.empty()) text += "  " + note;
    while (!text.empty() && text.back() == ' ') text.pop_back();
    out << text << "\n";
  };
  line(header_, note_header_);
  for (std::size_t r = 0; r < rows_.size(); ++r) line(rows_[r], notes_[r]);
}

}  // namespace kvvm::cli
