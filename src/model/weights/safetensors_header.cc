// The safetensors format: an 8-byte little-endian header length N, N bytes of JSON
// {name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__": {...}}, then the data
// section the offsets count in. Every number in the header is checked before a view is made,
// so a truncated or hostile file is an error naming the file and the tensor, never a read
// outside the mapping.
#include "model/weights/safetensors_header.h"

#include <algorithm>
#include <array>
#include <utility>

#include "base/json_reader.h"
#include "model/json_show.h"

namespace kvvm::model {
namespace {

struct DTypeName {
  TensorDType dtype;
  const char* name;
  std::uint32_t size;
};
constexpr std::array<DTypeName, 15> kDTypes = {{
    {TensorDType::kBool, "BOOL", 1},
    {TensorDType::kU8, "U8", 1},
    {TensorDType::kI8, "I8", 1},
    {TensorDType::kI16, "I16", 2},
    {TensorDType::kU16, "U16", 2},
    {TensorDType::kF16, "F16", 2},
    {TensorDType::kBf16, "BF16", 2},
    {TensorDType::kI32, "I32", 4},
    {TensorDType::kU32, "U32", 4},
    {TensorDType::kF32, "F32", 4},
    {TensorDType::kI64, "I64", 8},
    {TensorDType::kU64, "U64", 8},
    {TensorDType::kF64, "F64", 8},
    {TensorDType::kF8E4M3, "F8_E4M3", 1},
    {TensorDType::kF8E5M2, "F8_E5M2", 1},
}};

const DTypeName* entry_of(TensorDType dtype) {
  for (const DTypeName& entry : kDTypes) {
    if (entry.dtype == dtype) return &entry;
  }
  return nullptr;
}

std::string known_dtypes() {
  std::string names;
  for (const DTypeName& entry : kDTypes)
    names += (names.empty() ? "" : ", ") + std::string(entry.name);
  return names;
}

}  // namespace

std::string_view to_string(TensorDType dtype) {
  const DTypeName* entry = entry_of(dtype);
  return entry == nullptr ? "unknown" : entry->name;
}

std::uint32_t element_size(TensorDType dtype) {
  const DTypeName* entry = entry_of(dtype);
  return entry == nullptr ? 0 : entry->size;
}

namespace detail {
namespace {

// The header is string -> {string, [numbers], [numbers]}, with string -> string metadata.
constexpr std::size_t kMaxHeaderDepth = 8;

std::string range_string(std::uint64_t begin, std::uint64_t end) {
  return "[" + std::to_string(begin) + ", " + std::to_string(end) + "]";
}

struct Entry {
  TensorView view;          // data still null
  std::uint64_t begin = 0;  // in the data section
};

// One header entry checked on its own (dtype, shape, offsets and their agreement).
Result<Entry> parse_entry(const std::string& name, const nlohmann::json& entry,
                          std::uint64_t data_size, const std::string& where) {
  if (!entry.is_object()) {
    return Status::InvalidArgument(where + ": its header entry is " + show(entry) +
                                   ", expected {\"dtype\", \"shape\", \"data_offsets\"}");
  }
  TensorView view;
  view.name = name;
  const auto dtype = entry.find("dtype");
  if (dtype == entry.end() || !dtype->is_string()) {
    return Status::InvalidArgument(where + ": 'dtype' is " +
                                   (dtype == entry.end() ? "missing" : show(*dtype)) +
                                   ", expected one of " + known_dtypes());
  }
  const std::optional<TensorDType> parsed = parse_tensor_dtype(dtype->get<std::string>());
  if (!parsed) {
    return Status::InvalidArgument(where + ": unknown dtype " + show(*dtype) +
                                   " (known: " + known_dtypes() + ")");
  }
  view.dtype = *parsed;

  const auto shape = entry.find("shape");
  if (shape == entry.end() || !shape->is_array() ||
      !std::all_of(shape->begin(), shape->end(),
                   [](const nlohmann::json& d) { return d.is_number_unsigned(); })) {
    return Status::InvalidArgument(where + ": 'shape' is " +
                                   (shape == entry.end() ? "missing" : show(*shape)) +
                                   ", expected a list of whole numbers");
  }
  std::uint64_t elements = 1;
  bool overflow = false;
  for (const nlohmann::json& dimension : *shape) {
    view.shape.push_back(dimension.get<std::uint64_t>());
    overflow = overflow || __builtin_mul_overflow(elements, view.shape.back(), &elements);
  }
  std::uint64_t bytes = 0;
  overflow = overflow || __builtin_mul_overflow(elements, element_size(view.dtype), &bytes);
  if (overflow) {
    return Status::InvalidArgument(where + ": shape " + shape_string(view.shape) +
                                   " holds more bytes than 64 bits count");
  }

  const auto offsets = entry.find("data_offsets");
  if (offsets == entry.end() || !offsets->is_array() || offsets->size() != 2 ||
      !(*offsets)[0].is_number_unsigned() || !(*offsets)[1].is_number_unsigned() ||
      (*offsets)[0].get<std::uint64_t>() > (*offsets)[1].get<std::uint64_t>()) {
    return Status::InvalidArgument(where + ": 'data_offsets' is " +
                                   (offsets == entry.end() ? "missing" : show(*offsets)) +
                                   ", expected [begin, end] with begin <= end");
  }
  const auto begin = (*offsets)[0].get<std::uint64_t>();
  const auto end = (*offsets)[1].get<std::uint64_t>();
  if (end - begin != bytes) {
    return Status::InvalidArgument(where + ": shape " + shape_string(view.shape) + " of " +
                                   std::string(to_string(view.dtype)) + " is " +
                                   std::to_string(bytes) + " bytes, but data_offsets " +
                                   range_string(begin, end) + " hold " +
                                   std::to_string(end - begin));
  }
  if (end > data_size) {
    return Status::InvalidArgument(where + ": data_offsets " + range_string(begin, end) +
                                   " run past the end of the data section (" +
                                   std::to_string(data_size) + " bytes; a truncated file?)");
  }
  view.bytes = bytes;
  return Entry{std::move(view), begin};
}

}  // namespace

std::optional<TensorDType> parse_tensor_dtype(std::string_view name) {
  for (const DTypeName& entry : kDTypes) {
    if (name == entry.name) return entry.dtype;
  }
  return std::nullopt;
}

Result<std::vector<TensorView>> parse_safetensors(const std::byte* bytes, std::uint64_t size,
                                                  const std::string& origin) {
  constexpr std::uint64_t kLengthBytes = 8;
  if (size < kLengthBytes) {
    return Status::InvalidArgument(origin + ": truncated: " + std::to_string(size) +
                                   " bytes, shorter than the 8-byte header length");
  }
  std::uint64_t header_bytes = 0;
  for (std::uint64_t i = 0; i < kLengthBytes; ++i) {
    header_bytes |= std::uint64_t{std::to_integer<std::uint8_t>(bytes[i])} << (8 * i);
  }
  if (header_bytes > kMaxHeaderBytes) {
    return Status::InvalidArgument(origin + ": header length " + std::to_string(header_bytes) +
                                   " is over the limit of " + std::to_string(kMaxHeaderBytes) +
                                   " bytes (not a safetensors file, or a corrupt one)");
  }
  if (header_bytes > size - kLengthBytes) {
    return Status::InvalidArgument(origin + ": truncated: the header length is " +
                                   std::to_string(header_bytes) + " bytes, but only " +
                                   std::to_string(size - kLengthBytes) + " follow it");
  }
  JsonLimits limits;
  limits.max_bytes = kMaxHeaderBytes;
  limits.max_depth = kMaxHeaderDepth;
  const std::string_view text(reinterpret_cast<const char*>(bytes + kLengthBytes), header_bytes);
  KVVM_ASSIGN_OR_RETURN(nlohmann::json header, read_json(text, limits, origin + ": header"));
  if (!header.is_object()) {
    return Status::InvalidArgument(origin + ": header is " + show(header) +
                                   ", expected a JSON object of tensors");
  }

  const std::byte* data = bytes + kLengthBytes + header_bytes;
  const std::uint64_t data_size = size - kLengthBytes - header_bytes;
  std::vector<Entry> entries;
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      if (!entry.is_object()) {
        return Status::InvalidArgument(origin + ": '__metadata__' is " + show(entry) +
                                       ", expected an object of strings");
      }
      continue;
    }
    KVVM_ASSIGN_OR_RETURN(Entry parsed,
                          parse_entry(name, entry, data_size, origin + ": tensor '" + name + "'"));
    entries.push_back(std::move(parsed));
  }

  // Ranges in file order: each non-empty one must start at or after every earlier one's end.
  std::vector<const Entry*> by_offset;
  for (const Entry& entry : entries) {
    if (entry.view.bytes > 0) by_offset.push_back(&entry);
  }
  std::sort(by_offset.begin(), by_offset.end(),
            [](const Entry* a, const Entry* b) { return a->begin < b->begin; });
  const Entry* reaching = nullptr;  // of the earlier ranges, the one that ends last
  for (const Entry* entry : by_offset) {
    const std::uint64_t end = entry->begin + entry->view.bytes;
    const std::uint64_t reached = reaching == nullptr ? 0 : reaching->begin + reaching->view.bytes;
    if (reaching != nullptr && entry->begin < reached) {
      return Status::InvalidArgument(origin + ": tensors '" + reaching->view.name + "' " +
                                     range_string(reaching->begin, reached) + " and '" +
                                     entry->view.name + "' " + range_string(entry->begin, end) +
                                     " overlap in the data section");
    }
    if (reaching == nullptr || end > reached) reaching = entry;
  }

  std::vector<TensorView> tensors;
  tensors.reserve(entries.size());
  for (Entry& entry : entries) {
    entry.view.data = data + entry.begin;
    tensors.push_back(std::move(entry.view));
  }
  // nlohmann keeps object keys sorted, so the views already are; sorting states the contract.
  std::sort(tensors.begin(), tensors.end(),
            [](const TensorView& a, const TensorView& b) { return a.name < b.name; });
  return tensors;
}

}  // namespace detail
}  // namespace kvvm::model
