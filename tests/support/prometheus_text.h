// A strict parser of the Prometheus text exposition format 0.0.4, for tests that read
// GET /metrics: it accepts what a scraper accepts and rejects what the format forbids
// (samples outside a declared family, a TYPE after its samples, a family declared twice,
// label syntax and escapes, values, histograms whose buckets are not cumulative).
#pragma once

#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace kvvm::test {

using PromLabels = std::map<std::string, std::string>;

struct PromSample {
  std::string name;  // as written: FAMILY, FAMILY_bucket, FAMILY_sum, FAMILY_count
  PromLabels labels;
  double value = 0;
  int line = 0;  // 1-based, for messages
};

struct PromFamily {
  std::string name;
  std::string type;  // counter, gauge, histogram, summary, untyped
  std::string help;  // unescaped; empty without a HELP line
  std::vector<PromSample> samples;
};

struct PromParse {
  std::vector<PromFamily> families;
  std::string error;  // "line N: why: `the line`"; empty when the text is valid
  bool ok() const { return error.empty(); }
};

PromParse parse_prometheus_text(std::string_view text);

// The family named `name`; nullptr when absent.
const PromFamily* find_family(const std::vector<PromFamily>& families, std::string_view name);

// The value of the sample `sample_name` whose labels are exactly `labels`; nullopt when absent.
std::optional<double> value(const std::vector<PromFamily>& families, std::string_view sample_name,
                            const PromLabels& labels);

}  // namespace kvvm::test
