// KV handoff: the first P tokens of a sequence's KV passed to another process with no byte
// copied (docs/ARCHITECTURE.md "KV handoff between processes").
//
// Why handles and not bytes: the windows holding the tokens are physical handles; exported as
// file descriptors (Driver::export_handle: a dup of the handle's memory file on the host, a
// CUDA shareable handle on a GPU) and passed over a unix socket (SCM_RIGHTS), they are mapped
// by the receiver at its own addresses, read-only, like a shared prefix mapped into a slot.
// One copy of the bytes serves both processes, and the physical memory lives while either
// still maps it (the kernel and the CUDA driver count the references), so either side may die
// without freeing what the other maps.
//
// Protocol, on a connected SOCK_SEQPACKET unix socket (message boundaries keep each batch of
// descriptors with its entries):
//   sender -> receiver  manifest: backend, granule, geometry, layout, tokens, windows
//   sender -> receiver  batches: (fragment, window, bytes) entries, one descriptor each
//   receiver -> sender  reply: accepted, or refused with a status code and a message
// The sender seals the windows read-only and holds their handles until the reply (or the
// receiver's end of the socket closing, or a timeout); the receiver checks the manifest against
// its arena (a mismatch is refused naming the value), imports every handle, charges its own
// budget for them, and maps them into a free slot at the offsets its own plan gives. The
// receiving sequence's length is P; its first write past P copies the partial last window
// into a private handle (copy-on-write), so neither process ever writes the shared bytes.
//
// Thread-safety: as the arena's calls; one handoff per socket at a time.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>

#include "kvvm/base/status.h"
#include "kvvm/governor/governor.h"
#include "kvvm/kv/arena.h"

namespace kvvm {

// The receiver's steps, in order, for tests that stop it at each (a fault sweep by SIGKILL).
enum class HandoffStep {
  kManifest,      // about to read the manifest
  kBatch,         // about to read one batch of windows (once per batch)
  kImported,      // every handle imported and charged, none mapped yet
  kMapped,        // mapped into a slot, the reply not yet sent
  kAcknowledged,  // the reply sent
};

struct HandoffOptions {
  // How long either side waits for the other's next message before giving up.
  std::chrono::milliseconds timeout{10'000};
  // Descriptors per message (1 to 250: the kernel passes at most 253 in one message).
  std::uint32_t windows_per_message = 128;
  // How long the receiver waits for budget for the imported bytes (0: never blocks).
  std::chrono::milliseconds budget_wait{0};
  // Called by receive_kv before each step (tests); null: nothing.
  std::function<void(HandoffStep)> on_step = nullptr;
};

// What a handoff moved, on either side.
struct HandoffReport {
  std::uint64_t tokens = 0;
  std::uint64_t windows = 0;       // all fragments
  std::uint64_t shared_bytes = 0;  // windows * granule: mapped, not copied
  std::uint64_t messages = 0;      // sent or received on the socket, the reply included
  double seconds = 0;              // wall time of the call
};

// Sends the first `tokens` (1 to the live length) tokens of active `slot` of `arena` over
// `socket`, and waits for the receiver's reply. The windows holding them turn read-only in the
// slot (a later write there copies first) and stay mapped there; nothing is copied.
// FailedPrecondition when the arena's handles are not exportable (a host driver made without
// exportable_handles; a GPU without POSIX descriptor handles); InvalidArgument for a socket that
// is not SOCK_SEQPACKET or a bad token count; the receiver's refusal with its code and message;
// Unavailable when the receiver went away or did not reply in time. The slot is intact whatever
// the outcome.
Result<HandoffReport> send_kv(Arena& arena, SlotId slot, std::uint64_t tokens, int socket,
                              const HandoffOptions& options = {});

struct ReceivedKv {
  SlotId slot = 0;  // active, holding `report.tokens` tokens
  HandoffReport report;
};

// Receives a handoff from `socket` into a free slot of `arena`, paying for the imported handles
// with a grant from `governor` (the arena's tier, waiting up to options.budget_wait), and
// replies to the sender. InvalidArgument naming the value when the manifest does not match the
// arena (backend, granule, geometry, layout, a token count beyond its context); the import's,
// budget's or mapping's error otherwise (also sent to the sender). On failure nothing stays
// imported, mapped or charged here.
Result<ReceivedKv> receive_kv(Arena& arena, Governor& governor, int socket,
                              const HandoffOptions& options = {});

}  // namespace kvvm
