// Runs a kvvm command in-process and keeps what it said: its exit code and both streams.
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <ostream>
#include <sstream>
#include <string>
#include <vector>

#include "app.h"
#include "support/text_match.h"

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

// A directory of the running test's own under the system's temp directory, named
// PREFIX_<seed>_<test>, created.
inline std::filesystem::path scratch_dir(const std::string& prefix) {
  const ::testing::UnitTest& unit = *::testing::UnitTest::GetInstance();
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() /
      (prefix + "_" + std::to_string(unit.random_seed()) + "_" + unit.current_test_info()->name());
  std::filesystem::create_directories(dir);
  return dir;
}

}  // namespace kvvm::test
