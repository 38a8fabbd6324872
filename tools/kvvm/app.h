// The whole kvvm command line: builds every subcommand on one CLI11 app, parses, runs the
// chosen one and checks that what it wrote to `out` arrived. main.cc is this plus stdout;
// tests call it with string streams (or a stream on /dev/full) to see what a user would.
#pragma once

#include <iosfwd>
#include <string>
#include <vector>

namespace kvvm::cli {

// `args` is the command line without the program name. Returns the exit code: kExitUsage for
// a command line CLI11 refuses (with its message on `err`), an unknown subcommand (named,
// with the valid ones) or a failed write to `out`, else the subcommand's own code.
int run_cli(const std::vector<std::string>& args, const std::string& version, std::ostream& out,
            std::ostream& err);

}  // namespace kvvm::cli
