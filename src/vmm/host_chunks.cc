// The host driver's memory files (see host_chunks.h).
#include "vmm/host_chunks.h"

#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <iterator>
#include <string>

#include "base/format.h"
#include "kvvm/base/bytes.h"

namespace kvvm {

HostChunks::HostChunks(std::size_t chunk_bytes) : chunk_bytes_(chunk_bytes) {}

HostChunks::~HostChunks() {
  for (auto& [id, chunk] : chunks_) ::close(chunk.fd);
}

Result<std::uint64_t> HostChunks::open_chunk(std::size_t bytes) {
  const int fd = ::memfd_create("kvvm-handles", MFD_CLOEXEC);
  auto failure = [&](std::string_view call, int error) {
    return Status::DriverError("memory file of " + format_bytes(bytes) + " (" +
                                   std::to_string(chunks_.size()) + " open): " + std::string(call) +
                                   ": " + std::strerror(error),
                               DriverFailure{std::string(call), errno_name(error), error});
  };
  if (fd < 0) return failure("memfd_create", errno);
  // Only the size: a chunk holds pages for the ranges its handles populate or touch.
  if (::ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    const int error = errno;
    ::close(fd);
    return failure("ftruncate", error);
  }
  const std::uint64_t id = next_chunk_++;
  Chunk& chunk = chunks_[id];
  chunk.fd = fd;
  chunk.bytes = bytes;
  add_free(id, chunk, 0, bytes);
  return id;
}

void HostChunks::add_free(std::uint64_t id, Chunk& chunk, std::size_t offset, std::size_t length) {
  // Coalesce with the runs on either side, so a large handle can reuse small ones' room.
  auto next = chunk.free_.lower_bound(offset);
  if (next != chunk.free_.end() && offset + length == next->first) {
    free_runs_.erase({next->second, id, next->first});
    length += next->second;
    next = chunk.free_.erase(next);
  }
  if (next != chunk.free_.begin()) {
    auto previous = std::prev(next);
    if (previous->first + previous->second == offset) {
      free_runs_.erase({previous->second, id, previous->first});
      offset = previous->first;
      length += previous->second;
      chunk.free_.erase(previous);
    }
  }
  chunk.free_.emplace(offset, length);
  free_runs_.emplace(length, id, offset);
}

Result<ChunkRange> HostChunks::take(std::size_t bytes) {
  auto run = free_runs_.lower_bound({bytes, 0, 0});
  if (run == free_runs_.end()) {
    KVVM_ASSIGN_OR_RETURN(std::uint64_t opened, open_chunk(std::max(chunk_bytes_, bytes)));
    run = free_runs_.lower_bound({bytes, opened, 0});
  }
  const auto [length, id, offset] = *run;
  free_runs_.erase(run);
  Chunk& chunk = chunks_.at(id);
  chunk.free_.erase(offset);
  if (length > bytes) {
    chunk.free_.emplace(offset + bytes, length - bytes);
    free_runs_.emplace(length - bytes, id, offset + bytes);
  }
  chunk.taken += bytes;
  return ChunkRange{id, chunk.fd, offset, bytes};
}

void HostChunks::give_back(const ChunkRange& range) {
  auto it = chunks_.find(range.chunk);
  if (it == chunks_.end()) return;
  Chunk& chunk = it->second;
  chunk.taken -= range.bytes;
  if (chunk.taken == 0) {
    // Nothing lives in it: the descriptor goes too, not only the pages.
    for (const auto& [offset, length] : chunk.free_)
      free_runs_.erase({length, range.chunk, offset});
    ::close(chunk.fd);
    chunks_.erase(it);
    return;
  }
  add_free(range.chunk, chunk, range.offset, range.bytes);
}

std::size_t HostChunks::resident_bytes() const {
  std::size_t bytes = 0;
  for (const auto& [id, chunk] : chunks_) {
    struct stat status {};
    if (::fstat(chunk.fd, &status) == 0) bytes += static_cast<std::size_t>(status.st_blocks) * 512;
  }
  return bytes;
}

}  // namespace kvvm
