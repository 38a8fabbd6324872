// The independent JSON Schema validator the structured-output tests use: Debian's
// python3-jsonschema through tests/grammar/validate_json.py, fed through a temporary file of
// this call's own (tests run as concurrent processes: a shared name would let one test read
// another's instances).
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "support/test_data.h"

namespace kvvm::test {

// Whether python3 and its jsonschema module are there (scripts/test.sh installs and checks them).
inline bool have_json_validator() {
  return std::system("python3 -c 'import jsonschema' >/dev/null 2>&1") == 0;
}

// validate_json.py's exit status (0: every instance valid, 1: some invalid, 2: jsonschema
// missing or bad input; -1: it could not run) and its output, for `instances` (JSON texts)
// against `schema` (a JSON text).
inline std::pair<int, std::string> validate_json(const std::string& schema,
                                                 const std::vector<std::string>& instances) {
  std::string path = (std::filesystem::temp_directory_path() / "kvvm-json-XXXXXX").string();
  const int fd = mkstemp(path.data());
  if (fd < 0) return {-1, "mkstemp failed"};
  const nlohmann::json input = {{"schema", nlohmann::json::parse(schema)},
                                {"instances", instances}};
  // Invalid UTF-8 replaced rather than thrown: a bad byte shows as a failed validation.
  const std::string text = input.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  const bool written = write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
  close(fd);
  if (!written) {
    std::remove(path.c_str());
    return {-1, "could not write " + path};
  }
  const std::string script = (data_dir() / ".." / "grammar" / "validate_json.py").string();
  const std::string command = "python3 '" + script + "' '" + path + "' 2>&1";
  FILE* pipe = popen(command.c_str(), "r");
  std::string output;
  int status = -1;
  if (pipe != nullptr) {
    std::array<char, 4096> buffer;
    while (const std::size_t n = fread(buffer.data(), 1, buffer.size(), pipe)) {
      output.append(buffer.data(), n);
    }
    const int raw = pclose(pipe);
    status = WIFEXITED(raw) ? WEXITSTATUS(raw) : -1;
  } else {
    output = "popen failed";
  }
  std::remove(path.c_str());
  return {status, output};
}

}  // namespace kvvm::test
