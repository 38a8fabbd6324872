// kvvm: the command-line tool. Everything but stdout lives in app.cc (built into
// kvvm_cli_lib, so the test binary runs the same command lines).
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include "app.h"
#include "kit/cli_common.h"

#ifndef KVVM_VERSION_STRING
#define KVVM_VERSION_STRING "unknown"
#endif

int main(int argc, char** argv) {
  const std::vector<std::string> args(argv + 1, argv + argc);
  const int code = kvvm::cli::run_cli(args, KVVM_VERSION_STRING, std::cout, std::cerr);
  // std::cout shares stdout's buffer: a write error can surface only when stdio flushes it.
  // (When std::cout already failed, run_cli has said so.)
  if (std::cout.good() && (std::fflush(stdout) != 0 || std::ferror(stdout) != 0)) {
    std::cerr << "kvvm: writing standard output failed\n";
    return code == kvvm::cli::kExitOk ? kvvm::cli::kExitFailure : code;
  }
  return code;
}
