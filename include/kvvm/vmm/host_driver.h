// The host driver: the driver seam over Linux memory files and mmap.
//
// A handle is a range of a memory file (memfd) (or, with exportable_handles, a memory file of its
// own, which export_handle dups and import_handle maps in another process), allocated for real with
// fallocate (so a commit that succeeded has its bytes); reserve is mmap(PROT_NONE); map is
// mmap(MAP_FIXED | MAP_SHARED) of the handle's range at the address; set_access is mprotect;
// unmap puts the PROT_NONE placeholder back so the addresses stay reserved. One range mapped at
// two addresses is one copy of the bytes, exactly like one CUDA handle mapped twice, and a
// write through a read-only mapping faults (SIGSEGV), as a GPU kernel's would.
//
// The memory files are chunks of many handles (1 GiB by default, a new one when the others are
// full), not one per handle, so committing a budget costs a few descriptors rather than one per
// granule. A released handle's range is punched out of its file (its memory goes back to the
// system at once) and a file is closed once no handle lives in it.
//
// The driver keeps its own table of reservations, handles and mappings and refuses what the
// CUDA driver refuses (mapping over a mapping, unmapping part of one, releasing an unknown
// handle), so host tests catch the bookkeeping bugs a GPU would.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "kvvm/vmm/driver.h"

namespace kvvm {

struct HostDriverOptions {
  // The granule in bytes: 0 means the page size; otherwise a multiple of the page size
  // (2 MiB makes the host behave like a current NVIDIA GPU).
  std::size_t granule = 0;
  // true: create() allocates every page (fallocate), so a commit that succeeded has its
  // bytes. false: the handle is only sized and pages arrive on first touch (a SIGBUS if the
  // machine is out of memory then) — for simulations that account bytes but never write them,
  // so a 40 GiB budget can be replayed on a smaller host.
  bool populate = true;
  // Bytes per memory file: 0 means kDefaultHostChunkBytes rounded up to the granule; otherwise
  // a multiple of the granule. A handle larger than a chunk gets a file of its own size.
  std::size_t chunk_bytes = 0;
  // true: every handle is a memory file of its own, so export_handle can pass it to another
  // process (a dup of its descriptor) without exposing other handles' bytes: the host's
  // counterpart of creating CUDA allocations with a POSIX file descriptor handle type. Costs
  // one descriptor per handle. false: handles are ranges of shared chunks and are not
  // exportable. Imported handles are files of their own either way.
  bool exportable_handles = false;
};

inline constexpr std::size_t kDefaultHostChunkBytes = std::size_t{1} << 30;

// Fails with InvalidArgument when the granule is not a positive multiple of the page size or
// chunk_bytes not one of the granule.
Result<std::unique_ptr<Driver>> make_host_driver(HostDriverOptions options = {});

// The number of live reservations, handles and mappings the host driver holds; for tests
// that check nothing was leaked. REQUIRES: `driver` was made by make_host_driver.
struct HostDriverTables {
  std::size_t reservations = 0;
  std::size_t handles = 0;
  std::size_t mappings = 0;
  std::size_t handle_bytes = 0;
  std::size_t files = 0;           // memory files open (chunks)
  std::size_t resident_bytes = 0;  // memory those files hold (allocated pages)
  std::size_t handle_files = 0;    // handles that are files of their own (exportable, imported)
};
HostDriverTables host_driver_tables(const Driver& driver);

// The machine's available memory (MemAvailable), what the host driver reports as free: the
// figure a caller checks before pinning or filling host memory. 0 when it cannot be read.
std::uint64_t host_available_bytes();

}  // namespace kvvm
