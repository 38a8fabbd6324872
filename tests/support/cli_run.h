// Runs a kvvm command in-process and keeps what it said: its exit code and both streams.
#pragma once

#include <ostream>
#include <sstream>
#include <string>
#include <vector>

#include "app.h"

namespace kvvm::test {

struct CliRun {
  int code = -1;
  std::string out, err;
};

// `command(out, err)` returns the exit code: run_cli, or one subcommand's run_* on its options.
template <typename Command>
CliRun capture(Command&& command) {
  std::ostringstream out, err;
  CliRun result;
  result.code = command(out, err);
  result.out = out.str();
  result.err = err.str();
  return result;
}

// The whole command line, through run_cli (the same code path as the binary).
inline CliRun run(const std::vector<std::string>& args) {
  return capture(
      [&](std::ostream& out, std::ostream& err) { return cli::run_cli(args, "test", out, err); });
}

inline bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

}  // namespace kvvm::test
