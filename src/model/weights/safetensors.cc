// WeightFiles: safetensors files mapped read-only, their headers checked
// (safetensors_header.cc), one file or the shards an index names.
//
// Why mmap rather than read: a checkpoint is gigabytes that the CPU backend converts once and
// the CUDA backend copies to the device once; the page cache serves both without a second
// copy in memory. MAP_PRIVATE and PROT_READ: nothing here ever writes to the file.
#include "kvvm/model/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <map>
#include <system_error>
#include <utility>

#include "base/json_reader.h"
#include "model/json_show.h"
#include "model/weights/safetensors_header.h"

namespace kvvm::model {

struct WeightFiles::Mapping {
  std::string path;
  void* base = nullptr;
  std::uint64_t size = 0;
  std::vector<TensorView> tensors;  // sorted by name, pointing into [base, base + size)

  Mapping() = default;
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  ~Mapping() {
    if (base != nullptr) ::munmap(base, size);
  }

  static Result<std::unique_ptr<Mapping>> open(const std::string& path) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      const int error = errno;
      if (error == ENOENT) return Status::NotFound("'" + path + "' not found");
      return Status::InvalidArgument("cannot open '" + path + "': " + std::strerror(error));
    }
    auto mapping = std::make_unique<Mapping>();
    mapping->path = path;
    Status status = mapping->map(fd);
    ::close(fd);
    if (!status.ok()) return status;
    KVVM_ASSIGN_OR_RETURN(std::vector<TensorView> tensors,
                          detail::parse_safetensors(static_cast<const std::byte*>(mapping->base),
                                                    mapping->size, path));
    mapping->tensors = std::move(tensors);
    return mapping;
  }

 private:
  Status map(int fd) {
    struct stat info {};
    if (::fstat(fd, &info) != 0) {
      return Status::InvalidArgument("cannot stat '" + path + "': " + std::strerror(errno));
    }
    if (!S_ISREG(info.st_mode)) {
      return Status::InvalidArgument("'" + path + "' is not a regular file");
    }
    size = static_cast<std::uint64_t>(info.st_size);
    if (size == 0) return Status::Ok();  // nothing to map; the header check names it empty
    void* mapped = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (mapped == MAP_FAILED) {
      return Status::InvalidArgument("cannot map '" + path + "' (" + std::to_string(size) +
                                     " bytes): " + std::strerror(errno));
    }
    base = mapped;
    return Status::Ok();
  }
};

namespace {

constexpr const char* kIndexName = "model.safetensors.index.json";
constexpr const char* kSingleName = "model.safetensors";

// A shard named by the index must be a file in the index's own directory: a path that climbs
// out of it ("../x", "/etc/x") or into a subdirectory is refused.
bool is_plain_file_name(const std::string& name) {
  return !name.empty() && name != "." && name != ".." &&
         name.find_first_of(std::string("/\\\0", 3)) == std::string::npos;
}

// `views` sorted by name.
const TensorView* find_in(const std::vector<TensorView>& views, std::string_view name) {
  const auto found = std::lower_bound(
      views.begin(), views.end(), name,
      [](const TensorView& view, std::string_view wanted) { return view.name < wanted; });
  if (found == views.end() || found->name != name) return nullptr;
  return &*found;
}

bool exists(const std::string& path) {
  std::error_code error;
  return std::filesystem::exists(path, error);
}

}  // namespace

WeightFiles::~WeightFiles() = default;

Result<std::unique_ptr<WeightFiles>> WeightFiles::open_file(const std::string& path) {
  KVVM_ASSIGN_OR_RETURN(std::unique_ptr<Mapping> mapping, Mapping::open(path));
  std::unique_ptr<WeightFiles> files(new WeightFiles());
  files->tensors_ = std::move(mapping->tensors);
  files->mappings_.push_back(std::move(mapping));
  return files;
}

Result<std::unique_ptr<WeightFiles>> WeightFiles::open_dir(const std::string& dir) {
  const std::filesystem::path base(dir);
  const std::string index_path = (base / kIndexName).string();
  if (!exists(index_path)) {
    const std::string single_path = (base / kSingleName).string();
    if (!exists(single_path)) {
      return Status::NotFound("no checkpoint in '" + dir + "': neither '" + index_path + "' nor '" +
                              single_path + "' exists");
    }
    return open_file(single_path);
  }

  KVVM_ASSIGN_OR_RETURN(nlohmann::json index, read_json_file(index_path));
  const auto weight_map = index.is_object() ? index.find("weight_map") : index.end();
  if (!index.is_object() || weight_map == index.end() || !weight_map->is_object() ||
      weight_map->empty()) {
    return Status::InvalidArgument(index_path +
                                   ": expected an object whose 'weight_map' maps each tensor "
                                   "name to its shard file");
  }
  // Each shard is opened once, whatever number of tensors the index maps to it.
  std::map<std::string, std::vector<std::string>> names_by_file;
  for (const auto& [name, file] : weight_map->items()) {
    if (!file.is_string() || !is_plain_file_name(file.get<std::string>())) {
      return Status::InvalidArgument(index_path + ": tensor '" + name + "' maps to " +
                                     detail::show(file) +
                                     ", expected the name of a file in the same directory");
    }
    names_by_file[file.get<std::string>()].push_back(name);
  }

  std::unique_ptr<WeightFiles> files(new WeightFiles());
  struct Owned {
    TensorView view;
    std::size_t file;
  };
  std::vector<Owned> owned;
  for (const auto& [file, names] : names_by_file) {
    Result<std::unique_ptr<Mapping>> mapping = Mapping::open((base / file).string());
    if (!mapping.ok()) return mapping.status().with_context(index_path + " names a shard");
    const std::vector<TensorView>& held = (*mapping)->tensors;
    for (const std::string& name : names) {
      const bool present = find_in(held, name) != nullptr;
      if (!present) {
        return Status::InvalidArgument(index_path + " maps tensor '" + name + "' to '" +
                                       (*mapping)->path + "', which does not hold it");
      }
    }
    for (TensorView& view : (*mapping)->tensors) {
      view.file = static_cast<std::uint32_t>(files->mappings_.size());
      owned.push_back(Owned{std::move(view), files->mappings_.size()});
    }
    (*mapping)->tensors.clear();
    files->mappings_.push_back(std::move(*mapping));
  }
  std::sort(owned.begin(), owned.end(),
            [](const Owned& a, const Owned& b) { return a.view.name < b.view.name; });
  for (std::size_t i = 0; i < owned.size(); ++i) {
    if (i > 0 && owned[i].view.name == files->tensors_.back().name) {
      return Status::InvalidArgument("tensor '" + owned[i].view.name + "' is in both '" +
                                     files->mappings_[owned[i - 1].file]->path + "' and '" +
                                     files->mappings_[owned[i].file]->path + "'");
    }
    files->tensors_.push_back(std::move(owned[i].view));
  }
  return files;
}

const TensorView* WeightFiles::find(std::string_view name) const { return find_in(tensors_, name); }

std::vector<std::string> WeightFiles::names() const {
  std::vector<std::string> names;
  names.reserve(tensors_.size());
  for (const TensorView& view : tensors_) names.push_back(view.name);
  return names;
}

std::uint64_t WeightFiles::total_bytes() const {
  std::uint64_t total = 0;
  for (const TensorView& view : tensors_) total += view.bytes;
  return total;
}

}  // namespace kvvm::model
