#include "kit/progress_line.h"

#include <ostream>

namespace kvvm::cli {
namespace {

// Back to the line's start and erase it (ANSI: carriage return, erase to the end of line).
constexpr const char* kRewrite = "\r\033[K";

}  // namespace

void ProgressLine::show(std::string_view text) {
  if (err_ == nullptr) return;
  if (terminal_) {
    *err_ << kRewrite << text << std::flush;
    shown_ = true;
  } else {
    *err_ << text << "\n" << std::flush;
  }
}

void ProgressLine::clear() {
  if (err_ == nullptr || !shown_) return;
  *err_ << kRewrite << std::flush;
  shown_ = false;
}

}  // namespace kvvm::cli
