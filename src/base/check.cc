#include "kvvm/base/check.h"

#include <cstdlib>
#include <string>

#include "kvvm/base/log.h"

namespace kvvm {

void check_failed(const char* file, int line, const char* condition, std::string_view message) {
  std::string text = "CHECK failed: ";
  text += file;
  text += ':';
  text += std::to_string(line);
  text += ": ";
  text += condition;
  if (!message.empty()) {
    text += ": ";
    text += message;
  }
  log(LogLevel::kError, text);
  std::abort();
}

}  // namespace kvvm
