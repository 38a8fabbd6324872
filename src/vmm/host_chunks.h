// The host driver's memory files: handles are ranges of a few large memfds ("chunks").
//
// Why chunks: one memory file per handle costs one descriptor per granule committed, so a
// 40 GiB budget at a 2 MiB granule needs 20,480 descriptors and meets the process's limit.
// A chunk is sized (ftruncate), never populated by itself: pages arrive when a handle's range
// is fallocated or touched and leave when it is punched out, so a chunk costs no memory for
// the ranges nobody holds, and a range mapped twice is still one copy of its bytes.
//
// Not thread-safe: the host driver calls it under its own lock. Populating and punching a
// range (the slow parts) need no lock: a taken range is never handed out again, nor its file
// closed, before it is given back.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <set>
#include <tuple>

#include "kvvm/base/status.h"

namespace kvvm {

// `bytes` of memory file `fd` from `offset`; the file belongs to chunk `chunk`.
struct ChunkRange {
  std::uint64_t chunk = 0;
  int fd = -1;
  std::size_t offset = 0;
  std::size_t bytes = 0;
};

class HostChunks {
 public:
  // REQUIRES: chunk_bytes is a positive multiple of the granule (so of the page).
  explicit HostChunks(std::size_t chunk_bytes);
  // Closes every file. Live mappings keep their pages: the kernel holds the file for them.
  ~HostChunks();
  HostChunks(const HostChunks&) = delete;
  HostChunks& operator=(const HostChunks&) = delete;

  // A range of `bytes` (a positive multiple of the granule) nobody holds: the smallest free
  // run that fits, in the oldest file among equals (so newer files drain and close), else a
  // new file of max(chunk_bytes, bytes). Fails only when a new file cannot be made (EMFILE,
  // ENOMEM), with the errno in the status.
  Result<ChunkRange> take(std::size_t bytes);

  // Returns a range from take() to the free runs and closes its file once no range of it is
  // taken. REQUIRES: its pages were punched out (or never populated), so the next holder
  // reads zeros and the memory is already back with the system.
  void give_back(const ChunkRange& range);

  std::size_t files() const { return chunks_.size(); }
  // The bytes of memory the files hold (allocated pages, from fstat), summed.
  std::size_t resident_bytes() const;

 private:
  struct Chunk {
    int fd = -1;
    std::size_t bytes = 0;
    std::size_t taken = 0;                     // bytes handed out and not given back
    std::map<std::size_t, std::size_t> free_;  // offset -> length, coalesced
  };
  // (length, chunk, offset): lower_bound finds the smallest run that fits, oldest file first.
  using FreeRun = std::tuple<std::size_t, std::uint64_t, std::size_t>;

  Result<std::uint64_t> open_chunk(std::size_t bytes);
  void add_free(std::uint64_t id, Chunk& chunk, std::size_t offset, std::size_t length);

  const std::size_t chunk_bytes_;
  std::map<std::uint64_t, Chunk> chunks_;
  std::set<FreeRun> free_runs_;
  std::uint64_t next_chunk_ = 1;
};

}  // namespace kvvm
