// A progress line on stderr: on a terminal one line rewritten in place, in a log (stderr
// redirected) a line of its own each time. Who calls it decides how often; this only writes.
//
// Why a class of its own: both the simulator's run and a checkpoint's load show progress, and a
// line left on a terminal must be cleared before the next output, whoever wrote it.
#pragma once

#include <iosfwd>
#include <string_view>

namespace kvvm::cli {

class ProgressLine {
 public:
  // err null: nothing is written.
  ProgressLine(std::ostream* err, bool terminal) : err_(err), terminal_(terminal) {}
  ProgressLine(const ProgressLine&) = delete;
  ProgressLine& operator=(const ProgressLine&) = delete;
  ~ProgressLine() { clear(); }

  bool terminal() const { return terminal_; }
  // On a terminal `text` replaces the line; in a log it is written as a line.
  void show(std::string_view text);
  // Removes a line left on a terminal, so what follows starts at the line's beginning.
  void clear();

 private:
  std::ostream* err_;
  bool terminal_;
  bool shown_ = false;  // a line is on the terminal
};

}  // namespace kvvm::cli
