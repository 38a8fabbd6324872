#include "kvvm/base/log.h"

#include <atomic>
#include <cstdio>
#include <string>

namespace kvvm {
namespace {

class StderrLogger final : public Logger {
 public:
  void log(LogLevel level, std::string_view message) override {
    std::string line = "kvvm: ";
    if (level >= LogLevel::kWarning) {
      line += to_string(level);
      line += ": ";
    }
    line += message;
    line += '\n';
    // One write per message, so lines of concurrent threads do not interleave.
    std::fwrite(line.data(), 1, line.size(), stderr);
  }
};

std::atomic<Logger*> installed{nullptr};

}  // namespace

std::string_view to_string(LogLevel level) {
  switch (level) {
    case LogLevel::kDebug:
      return "DEBUG";
    case LogLevel::kInfo:
      return "INFO";
    case LogLevel::kWarning:
      return "WARNING";
    case LogLevel::kError:
      return "ERROR";
  }
  return "UNKNOWN";
}

Logger& stderr_logger() {
  // Never destroyed: destructors of static objects may still log at exit.
  static StderrLogger* const instance = new StderrLogger;
  return *instance;
}

Logger* set_logger(Logger* logger) {
  Logger* previous = installed.exchange(logger, std::memory_order_acq_rel);
  return previous != nullptr ? previous : &stderr_logger();
}

Logger& logger() {
  Logger* current = installed.load(std::memory_order_acquire);
  return current != nullptr ? *current : stderr_logger();
}

void log(LogLevel level, std::string_view message) { logger().log(level, message); }

}  // namespace kvvm
