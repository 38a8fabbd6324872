// The tool's side of a checkpoint's load progress: the line it formats from the library's
// LoadProgress, and how it is written: rewritten in place on a terminal, one line per shard in
// a log.
#include <gtest/gtest.h>

#include <cstdint>
#include <sstream>
#include <string>

#include "kit/load_progress_printer.h"
#include "kit/progress_line.h"
#include "kvvm/model/load_progress.h"
#include "support/text_match.h"

namespace kvvm::cli::load_progress_test {
namespace {

using test::contains;

constexpr std::uint64_t kGiB = std::uint64_t{1} << 30;

model::LoadProgress at(std::uint32_t done, std::uint64_t bytes, double seconds,
                       bool shard_done = false) {
  return model::LoadProgress{.shards_done = done,
                             .shards = 30,
                             .bytes = bytes,
                             .total_bytes = 130 * kGiB,
                             .seconds = seconds,
                             .shard_done = shard_done};
}

TEST(CliLoadProgress, TheLineGivesShardsBytesRateAndTimeLeft) {
  EXPECT_EQ(load_progress_text(at(2, 13 * kGiB, 6.5)),
            "loading weights: 2/30 shards, 13 GiB / 130 GiB (10%), 2 GiB/s, 58.5 s left");
  EXPECT_EQ(load_progress_text(at(30, 130 * kGiB, 65)),
            "loading weights: 30/30 shards, 130 GiB / 130 GiB (100%), 2 GiB/s, 0 s left");
  // Before any time has passed there is no rate to tell.
  EXPECT_EQ(load_progress_text(at(0, 0, 0)),
            "loading weights: 0/30 shards, 0 B / 130 GiB (0%), n/a, n/a left");
}

TEST(CliLoadProgress, ALogGetsOneLinePerShard) {
  std::ostringstream err;
  {
    LoadProgressPrinter printer(err, "kvvm serve", false);
    printer(at(0, kGiB, 0.5));
    printer(at(1, 5 * kGiB, 2.5, true));
    printer(at(1, 6 * kGiB, 3.0));
    printer(at(2, 13 * kGiB, 6.5, true));
  }
  EXPECT_EQ(err.str(),
            "kvvm serve: loading weights: 1/30 shards, 5 GiB / 130 GiB (3%), 2 GiB/s, 1 min 03 s "
            "left\n"
            "kvvm serve: loading weights: 2/30 shards, 13 GiB / 130 GiB (10%), 2 GiB/s, 58.5 s "
            "left\n");
}

TEST(CliLoadProgress, ATerminalGetsOneLineRewrittenInPlaceAndClearedAtTheEnd) {
  std::ostringstream err;
  {
    LoadProgressPrinter printer(err, "kvvm serve", true);
    printer(at(1, 5 * kGiB, 2.5, true));
    printer(at(2, 13 * kGiB, 6.5, true));
  }
  const std::string text = err.str();
  EXPECT_EQ(text.find('\n'), std::string::npos) << text;
  EXPECT_TRUE(contains(text, "\r\033[Kkvvm serve: loading weights: 1/30 shards")) << text;
  EXPECT_TRUE(contains(text, "\r\033[Kkvvm serve: loading weights: 2/30 shards")) << text;
  EXPECT_TRUE(text.ends_with("58.5 s left\r\033[K")) << text;
}

TEST(CliProgressLine, RewritesOnATerminalAndWritesLinesInALog) {
  std::ostringstream tty, log;
  {
    ProgressLine on_tty(&tty, true);
    ProgressLine in_log(&log, false);
    for (const char* text : {"one", "two"}) {
      on_tty.show(text);
      in_log.show(text);
    }
  }
  EXPECT_EQ(tty.str(), "\r\033[Kone\r\033[Ktwo\r\033[K");
  EXPECT_EQ(log.str(), "one\ntwo\n");
  ProgressLine nowhere(nullptr, true);
  nowhere.show("nothing");  // no stream: nothing to do
}

}  // namespace
}  // namespace kvvm::cli::load_progress_test
