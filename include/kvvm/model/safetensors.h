// Safetensors checkpoints, read through mmap: one file (model.safetensors) or shards listed by
// model.safetensors.index.json. Nothing is copied at open: a TensorView points into the
// mapping, which lives as long as the WeightFiles.
//
// The header is checked before any tensor is used: its JSON is bounded (size, depth, UTF-8),
// every entry's dtype is known, its shape's element count times the element size equals its
// byte range, and every range lies inside the file's data section without overlap.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "kvvm/base/status.h"

namespace kvvm::model {

// Element types a safetensors header may name. The runtime computes with kBf16, kF16, kF32;
// the others are recognised so that a checkpoint holding them opens, and refused by name when
// a tensor the model needs has one.
enum class TensorDType : std::uint8_t {
  kBool,
  kU8,
  kI8,
  kI16,
  kU16,
  kF16,
  kBf16,
  kI32,
  kU32,
  kF32,
  kI64,
  kU64,
  kF64,
  kF8E4M3,
  kF8E5M2
};
std::string_view to_string(TensorDType dtype);  // the header's spelling: "BF16", "F32", ...
std::uint32_t element_size(TensorDType dtype);

struct TensorView {
  std::string name;
  TensorDType dtype = TensorDType::kF32;
  std::vector<std::uint64_t> shape;
  const std::byte* data = nullptr;  // inside the mapping; alignment: whatever the file gives
  std::uint64_t bytes = 0;
  // The shard holding it: its file's place among the checkpoint's files in name order (0 for a
  // single file), for a load's progress shard by shard.
  std::uint32_t file = 0;
  std::uint64_t elements() const;
};

// "[896, 4864]".
std::string shape_string(const std::vector<std::uint64_t>& shape);

class WeightFiles {
 public:
  // DIR/model.safetensors.index.json when present (every shard it names must exist and hold
  // the tensors it maps there), else DIR/model.safetensors. NotFound naming the paths tried;
  // InvalidArgument naming the file and the defect (truncated, bad header, overlap, ...).
  static Result<std::unique_ptr<WeightFiles>> open_dir(const std::string& dir);
  // One file.
  static Result<std::unique_ptr<WeightFiles>> open_file(const std::string& path);

  WeightFiles(const WeightFiles&) = delete;
  WeightFiles& operator=(const WeightFiles&) = delete;
  ~WeightFiles();

  // Null when absent.
  const TensorView* find(std::string_view name) const;
  std::vector<std::string> names() const;  // sorted
  std::uint64_t total_bytes() const;       // of every tensor

 private:
  struct Mapping;
  WeightFiles() = default;
  std::vector<std::unique_ptr<Mapping>> mappings_;
  std::vector<TensorView> tensors_;  // sorted by name
};

}  // namespace kvvm::model
