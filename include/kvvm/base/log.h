// The log sink: where the library's diagnostics go (a leaked handle at teardown, a failed
// release, a governor complaint). By default they are written to stderr; an application that
// owns its own logging (a server with structured logs, a test that checks the words) installs
// its own Logger and nothing more reaches stderr.
#pragma once

#include <string_view>

namespace kvvm {

enum class LogLevel { kDebug = 0, kInfo, kWarning, kError };

std::string_view to_string(LogLevel level);

class Logger {
 public:
  virtual ~Logger() = default;
  // Called from any thread, possibly from destructors and with library locks held: it must
  // not call back into kvvm. `message` has no trailing newline.
  virtual void log(LogLevel level, std::string_view message) = 0;
};

// The default sink: "kvvm: WARNING: <message>\n" on stderr (the level word is left out below
// kWarning).
Logger& stderr_logger();

// Installs `logger` process-wide and returns the previous one. nullptr restores the stderr
// sink. The caller keeps `logger` alive until it is replaced.
Logger* set_logger(Logger* logger);

// The sink in use now.
Logger& logger();

// Sends one message to the sink in use.
void log(LogLevel level, std::string_view message);

// Installs a sink for a scope (tests), restoring the previous one on exit.
class ScopedLogger {
 public:
  explicit ScopedLogger(Logger* logger) : previous_(set_logger(logger)) {}
  ~ScopedLogger() { set_logger(previous_); }
  ScopedLogger(const ScopedLogger&) = delete;
  ScopedLogger& operator=(const ScopedLogger&) = delete;

 private:
  Logger* previous_;
};

}  // namespace kvvm
