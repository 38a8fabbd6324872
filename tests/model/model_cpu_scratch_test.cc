// The CPU model's activation buffers are sized for ModelLimits::max_step_tokens at creation but
// touched only by the rows a step uses: zeroing them at creation cost every start of `kvvm
// generate` their first page faults (a fifth of the demo model's start on a 2-core VM) for rows a
// short prompt never reaches.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <fstream>
#include <memory>

#include "kvvm/model/model.h"
#include "kvvm/model/weights.h"
#include "support/safetensors_writer.h"

namespace kvvm::model {
namespace {

// Resident bytes of this process (/proc/self/statm's second field, in pages).
std::uint64_t resident_bytes() {
  std::ifstream statm("/proc/self/statm");
  std::uint64_t size = 0, resident = 0;
  statm >> size >> resident;
  return resident * static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE));
}

TEST(ModelCpuScratch, ActivationBuffersAreNotTouchedAtCreation) {
  test::TinyModel tiny;
  test::TempDir dir;
  test::write_tiny_model(dir.path(), tiny);
  Result<ModelConfig> config = load_model_config(dir.path().string());
  ASSERT_TRUE(config.ok()) << config.status().to_string();
  Result<std::unique_ptr<WeightFiles>> files = WeightFiles::open_dir(dir.path().string());
  ASSERT_TRUE(files.ok()) << files.status().to_string();
  Result<ModelWeights> weights = bind_weights(*config, **files);
  ASSERT_TRUE(weights.ok()) << weights.status().to_string();

  // 64K tokens a step: ~2.7 KiB of activations each for this shape, ~170 MiB in all.
  CpuModelOptions options;
  options.limits.max_step_tokens = 1u << 16;
  const std::uint64_t before = resident_bytes();
  Result<std::unique_ptr<Model>> made = make_cpu_model(*config, *weights, options);
  ASSERT_TRUE(made.ok()) << made.status().to_string();
  const std::uint64_t grown = resident_bytes() - before;
  EXPECT_LT(grown, std::uint64_t{32} << 20)
      << "creating the model made " << (grown >> 20) << " MiB resident";
}

}  // namespace
}  // namespace kvvm::model
