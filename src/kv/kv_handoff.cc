// KV handoff between processes: see kv_handoff.h.
//
// Why the sender holds its handles until the reply: once a descriptor is in the socket the
// memory outlives any release (the kernel, or the CUDA driver, keeps the allocation for the
// descriptor), but holding until the receiver says it has its own references keeps the sender
// independent of how a driver counts descriptors in flight. What keeps the sender from ever
// writing or reusing memory the receiver maps is the pool's crosses_processes mark, which
// outlasts the hold: such a handle is copied before any write and released, never pooled.
//
// Why SOCK_SEQPACKET: each batch's descriptors arrive with exactly its entries, and a short
// or truncated message is an error rather than a resynchronisation problem.
#include "kvvm/kv/kv_handoff.h"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "base/format.h"
#include "kvvm/kv/prefix/shared_prefix.h"

namespace kvvm {
namespace {

using Clock = std::chrono::steady_clock;

constexpr std::uint32_t kMagic = 0x6b764b56;  // "VKvk"
constexpr std::uint32_t kVersion = 1;
constexpr std::uint32_t kMaxWindowsPerMessage = 250;

enum class Kind : std::uint32_t { kManifest = 1, kBatch = 2, kReply = 3 };

struct WireManifest {
  std::uint32_t magic = kMagic;
  std::uint32_t version = kVersion;
  Kind kind = Kind::kManifest;
  std::uint32_t layout = 0;
  char backend[16] = {};
  std::uint32_t layers = 0;
  std::uint32_t kv_heads = 0;
  std::uint32_t head_dim = 0;
  std::uint32_t dtype = 0;
  std::uint64_t granule = 0;
  std::uint64_t bytes_per_token = 0;
  std::uint64_t contiguous_bytes_per_token = 0;
  std::uint64_t fragments = 0;
  std::uint64_t tokens = 0;
  std::uint64_t windows_per_fragment = 0;
};

struct WireBatch {
  std::uint32_t magic = kMagic;
  Kind kind = Kind::kBatch;
  std::uint32_t count = 0;  // entries that follow, one descriptor each, in order
  std::uint32_t reserved = 0;
};

struct WireWindow {
  std::uint32_t fragment = 0;
  std::uint32_t window = 0;
  std::uint64_t bytes = 0;
};

struct WireReply {
  std::uint32_t magic = kMagic;
  Kind kind = Kind::kReply;
  std::uint32_t code = 0;  // StatusCode; 0: accepted
  std::uint32_t reserved = 0;
  std::uint64_t requested = 0;  // a ResourceExhausted refusal's numbers
  std::uint64_t available = 0;
  std::uint64_t limit = 0;
  char message[1024] = {};
};

static_assert(std::is_trivially_copyable_v<WireManifest> &&
              std::is_trivially_copyable_v<WireBatch> && std::is_trivially_copyable_v<WireWindow> &&
              std::is_trivially_copyable_v<WireReply>);

Status errno_error(std::string_view call, const std::string& what, int error) {
  return Status::DriverError(what + ": " + std::string(call) + ": " + std::strerror(error),
                             DriverFailure{std::string(call), errno_name(error), error});
}

void close_all(std::vector<int>& fds) {
  for (int fd : fds) ::close(fd);
  fds.clear();
}

Status check_socket(int socket, const HandoffOptions& options) {
  int type = 0;
  socklen_t length = sizeof(type);
  if (::getsockopt(socket, SOL_SOCKET, SO_TYPE, &type, &length) != 0) {
    return errno_error("getsockopt", "handoff socket " + std::to_string(socket), errno);
  }
  if (type != SOCK_SEQPACKET) {
    return Status::InvalidArgument("handoff socket " + std::to_string(socket) +
                                   " is not a SOCK_SEQPACKET unix socket (type " +
                                   std::to_string(type) + ")");
  }
  if (options.windows_per_message == 0 || options.windows_per_message > kMaxWindowsPerMessage) {
    return Status::InvalidArgument("handoff of " + std::to_string(options.windows_per_message) +
                                   " windows per message: between 1 and " +
                                   std::to_string(kMaxWindowsPerMessage));
  }
  return Status::Ok();
}

// Waits for `events` on the socket until `deadline`. Returns the events seen (POLLHUP and
// POLLERR included); Unavailable at the deadline.
Result<short> wait_for(int socket, short events, Clock::time_point deadline,
                       std::string_view what) {
  while (true) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left < 0) {
      return Status::Unavailable(std::string(what) + ": the other process did not answer in time");
    }
    pollfd entry{socket, events, 0};
    const int ready = ::poll(&entry, 1, static_cast<int>(std::min<long long>(left, 1 << 30)));
    if (ready < 0 && errno == EINTR) continue;
    if (ready < 0) return errno_error("poll", std::string(what), errno);
    if (ready > 0) return entry.revents;
  }
}

// Sends one message with `fds` attached. With `answered`, stops early with `*answered` set
// when the other side has a message for us first (a refusal sent before it read everything).
Status send_message(int socket, const std::vector<char>& bytes, std::span<const int> fds,
                    Clock::time_point deadline, bool* answered, std::string_view what) {
  std::vector<char> control(fds.empty() ? 0 : CMSG_SPACE(sizeof(int) * fds.size()));
  iovec io{const_cast<char*>(bytes.data()), bytes.size()};
  msghdr message{};
  message.msg_iov = &io;
  message.msg_iovlen = 1;
  if (!fds.empty()) {
    message.msg_control = control.data();
    message.msg_controllen = control.size();
    cmsghdr* header = CMSG_FIRSTHDR(&message);
    header->cmsg_level = SOL_SOCKET;
    header->cmsg_type = SCM_RIGHTS;
    header->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
    std::memcpy(CMSG_DATA(header), fds.data(), sizeof(int) * fds.size());
  }
  while (true) {
    const short wanted = answered != nullptr ? POLLOUT | POLLIN : POLLOUT;
    KVVM_ASSIGN_OR_RETURN(short events, wait_for(socket, wanted, deadline, what));
    if (answered != nullptr && (events & POLLIN) != 0) {
      *answered = true;
      return Status::Ok();
    }
    if ((events & (POLLHUP | POLLERR)) != 0 && (events & POLLOUT) == 0) {
      return Status::Unavailable(std::string(what) + ": the other process closed the socket");
    }
    const ssize_t sent = ::sendmsg(socket, &message, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (sent >= 0) return Status::Ok();
    if (errno == EINTR || errno == EAGAIN) continue;
    if (errno == EPIPE || errno == ECONNRESET) {
      return Status::Unavailable(std::string(what) + ": the other process closed the socket");
    }
    return errno_error("sendmsg", std::string(what), errno);
  }
}

// Receives one message into `bytes` (resized to what came) and its descriptors into `fds`
// (close-on-exec; the caller closes them). Unavailable when the other side closed the socket.
Status receive_message(int socket, std::vector<char>& bytes, std::vector<int>& fds,
                       Clock::time_point deadline, std::string_view what) {
  std::vector<char> control(CMSG_SPACE(sizeof(int) * kMaxWindowsPerMessage));
  bool reset = false;
  while (true) {
    KVVM_ASSIGN_OR_RETURN(short events, wait_for(socket, POLLIN, deadline, what));
    (void)events;  // readable or hung up: recvmsg tells which
    iovec io{bytes.data(), bytes.size()};
    msghdr message{};
    message.msg_iov = &io;
    message.msg_iovlen = 1;
    message.msg_control = control.data();
    message.msg_controllen = control.size();
    ssize_t got = ::recvmsg(socket, &message, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
    if (got < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      if (errno != ECONNRESET) return errno_error("recvmsg", std::string(what), errno);
      // The peer closed with messages of ours unread. The error is reported once, before what
      // it sent last (a refusal) is read: read again.
      if (!reset) {
        reset = true;
        continue;
      }
      got = 0;
    }
    for (cmsghdr* header = CMSG_FIRSTHDR(&message); header != nullptr;
         header = CMSG_NXTHDR(&message, header)) {
      if (header->cmsg_level != SOL_SOCKET || header->cmsg_type != SCM_RIGHTS) continue;
      const std::size_t count = (header->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      const std::size_t first = fds.size();
      fds.resize(first + count);
      std::memcpy(fds.data() + first, CMSG_DATA(header), sizeof(int) * count);
    }
    if (got <= 0) {
      close_all(fds);
      return Status::Unavailable(std::string(what) + ": the other process closed the socket");
    }
    if ((message.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) != 0) {
      close_all(fds);
      return Status::InvalidArgument(std::string(what) + ": a message larger than " +
                                     std::to_string(bytes.size()) +
                                     " bytes or with more descriptors than expected");
    }
    bytes.resize(static_cast<std::size_t>(got));
    return Status::Ok();
  }
}

template <typename T>
std::vector<char> to_bytes(const T& value) {
  std::vector<char> bytes(sizeof(T));
  std::memcpy(bytes.data(), &value, sizeof(T));
  return bytes;
}

// The reply, sent best effort: a sender that went away needs none.
void reply(int socket, const Status& status, const HandoffOptions& options) {
  WireReply answer;
  if (!status.ok()) {
    answer.code = static_cast<std::uint32_t>(status.code());
    if (const auto& numbers = status.exhaustion()) {
      answer.requested = numbers->requested;
      answer.available = numbers->available;
      answer.limit = numbers->limit;
    }
    const std::string text = status.message();
    std::memcpy(answer.message, text.data(), std::min(text.size(), sizeof(answer.message) - 1));
  }
  (void)send_message(socket, to_bytes(answer), {}, Clock::now() + options.timeout, nullptr,
                     "handoff reply");
  if (status.ok()) return;
  // A refusal may leave batches unread: their descriptors are closed now rather than with the
  // socket.
  std::vector<char> control(CMSG_SPACE(sizeof(int) * kMaxWindowsPerMessage));
  std::vector<char> bytes(sizeof(WireBatch) + sizeof(WireWindow) * kMaxWindowsPerMessage);
  while (true) {
    iovec io{bytes.data(), bytes.size()};
    msghdr message{};
    message.msg_iov = &io;
    message.msg_iovlen = 1;
    message.msg_control = control.data();
    message.msg_controllen = control.size();
    if (::recvmsg(socket, &message, MSG_CMSG_CLOEXEC | MSG_DONTWAIT) <= 0) break;
    for (cmsghdr* header = CMSG_FIRSTHDR(&message); header != nullptr;
         header = CMSG_NXTHDR(&message, header)) {
      if (header->cmsg_level != SOL_SOCKET || header->cmsg_type != SCM_RIGHTS) continue;
      std::vector<int> fds((header->cmsg_len - CMSG_LEN(0)) / sizeof(int));
      std::memcpy(fds.data(), CMSG_DATA(header), sizeof(int) * fds.size());
      close_all(fds);
    }
  }
}

// The receiver's refusal as a status of the same code, for the sender's caller.
Status refusal(const WireReply& answer) {
  const std::string text =
      "the receiver refused the handoff: " +
      std::string(answer.message, strnlen(answer.message, sizeof(answer.message)));
  switch (static_cast<StatusCode>(answer.code)) {
    case StatusCode::kInvalidArgument:
      return Status::InvalidArgument(text);
    case StatusCode::kResourceExhausted:
      return Status::ResourceExhausted(
          text, Exhaustion{answer.requested, answer.available, answer.limit});
    case StatusCode::kFailedPrecondition:
      return Status::FailedPrecondition(text);
    default:
      return Status::Unavailable(text);
  }
}

void fill_backend(char (&out)[16], const std::string& backend) {
  std::memcpy(out, backend.data(), std::min(backend.size(), sizeof(out) - 1));
}

WireManifest manifest_of(const Arena& arena, std::uint64_t tokens) {
  const LayoutPlan& plan = arena.plan();
  WireManifest m;
  m.layout = static_cast<std::uint32_t>(plan.layout);
  fill_backend(m.backend, arena.pool().driver().info().backend);
  m.layers = plan.geometry.layers;
  m.kv_heads = plan.geometry.kv_heads;
  m.head_dim = plan.geometry.head_dim;
  m.dtype = static_cast<std::uint32_t>(plan.geometry.dtype);
  m.granule = plan.granule;
  m.bytes_per_token = plan.bytes_per_token;
  m.contiguous_bytes_per_token = plan.contiguous_bytes_per_token;
  m.fragments = plan.fragments;
  m.tokens = tokens;
  m.windows_per_fragment = plan.windows_per_fragment(tokens);
  return m;
}

// InvalidArgument naming the first value of the sender's manifest this arena cannot take.
Status check_manifest(const WireManifest& theirs, const Arena& arena) {
  if (theirs.magic != kMagic || theirs.kind != Kind::kManifest) {
    return Status::InvalidArgument("handoff manifest: not a kvvm handoff manifest");
  }
  if (theirs.version != kVersion) {
    return Status::InvalidArgument("handoff manifest: version " + std::to_string(theirs.version) +
                                   ", this receiver speaks " + std::to_string(kVersion));
  }
  const LayoutPlan& plan = arena.plan();
  WireManifest mine = manifest_of(arena, 1);
  const auto differs = [](std::string_view field, const std::string& sent,
                          const std::string& here) {
    return Status::InvalidArgument("handoff manifest: " + std::string(field) + " is " + sent +
                                   " at the sender, " + here + " here");
  };
  const std::string backend(theirs.backend, strnlen(theirs.backend, sizeof(theirs.backend)));
  if (backend != mine.backend) return differs("backend", backend, mine.backend);
  const auto number = [](std::uint64_t value) { return std::to_string(value); };
  if (theirs.granule != mine.granule) {
    return differs("granule", number(theirs.granule), number(mine.granule));
  }
  if (theirs.layout != mine.layout) {
    const auto name = [](std::uint32_t value) {
      return value <= static_cast<std::uint32_t>(Layout::kTokenMajor)
                 ? std::string(to_string(static_cast<Layout>(value)))
                 : "layout " + std::to_string(value);
    };
    return differs("layout", name(theirs.layout), name(mine.layout));
  }
  const std::pair<std::string_view, std::pair<std::uint64_t, std::uint64_t>> values[] = {
      {"layers", {theirs.layers, mine.layers}},
      {"kv_heads", {theirs.kv_heads, mine.kv_heads}},
      {"head_dim", {theirs.head_dim, mine.head_dim}},
      {"dtype", {theirs.dtype, mine.dtype}},
      {"bytes_per_token", {theirs.bytes_per_token, mine.bytes_per_token}},
      {"contiguous_bytes_per_token",
       {theirs.contiguous_bytes_per_token, mine.contiguous_bytes_per_token}},
      {"fragments", {theirs.fragments, mine.fragments}},
  };
  for (const auto& [field, pair] : values) {
    if (pair.first != pair.second) return differs(field, number(pair.first), number(pair.second));
  }
  if (theirs.tokens == 0 || theirs.tokens > plan.max_context) {
    return differs("tokens", number(theirs.tokens),
                   "a context of 1 to " + number(plan.max_context));
  }
  if (theirs.windows_per_fragment != plan.windows_per_fragment(theirs.tokens)) {
    return differs("windows_per_fragment", number(theirs.windows_per_fragment),
                   number(plan.windows_per_fragment(theirs.tokens)) + " for " +
                       number(theirs.tokens) + " tokens");
  }
  return Status::Ok();
}

// Handles a handoff keeps a hold on, let go when it ends.
class Holds {
 public:
  explicit Holds(HandlePool& pool) : pool_(pool) {}
  Holds(const Holds&) = delete;
  Holds& operator=(const Holds&) = delete;
  ~Holds() { let_go(disposition_); }
  void add(Handle handle) {
    pool_.hold(handle);
    handles_.push_back(handle);
  }
  // On success the mappings keep the handles; on failure the receiver's imports are released.
  void on_exit(Disposition disposition) { disposition_ = disposition; }
  void let_go(Disposition disposition) {
    for (Handle handle : handles_) pool_.unhold(handle, disposition);
    handles_.clear();
  }

 private:
  HandlePool& pool_;
  std::vector<Handle> handles_;
  Disposition disposition_ = Disposition::kKeep;
};

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

}  // namespace

Result<HandoffReport> send_kv(Arena& arena, SlotId slot, std::uint64_t tokens, int socket,
                              const HandoffOptions& options) {
  const Clock::time_point start = Clock::now();
  const Clock::time_point deadline = start + options.timeout;
  const std::string what =
      "handoff of " + std::to_string(tokens) + " tokens of slot " + std::to_string(slot);
  KVVM_RETURN_IF_ERROR(check_socket(socket, options).with_context(what));
  if (tokens == 0 || tokens > arena.tokens(slot)) {
    return Status::InvalidArgument(what + ": the slot holds " + std::to_string(arena.tokens(slot)) +
                                   " tokens");
  }
  const LayoutPlan& plan = arena.plan();
  const std::uint64_t k = plan.windows_per_fragment(tokens);
  // Read-only from now on in the sender's slot too: the receiver reads these bytes.
  Result<std::vector<HandleInfo>> sealed = arena.seal_windows(slot, 0, k);
  if (!sealed.ok()) return sealed.status().with_context(what);
  const std::vector<HandleInfo>& handles = *sealed;
  HandlePool& pool = arena.pool();
  Holds holds(pool);
  for (const HandleInfo& info : handles) {
    if (info.bytes != plan.granule) {
      return Status::FailedPrecondition(what + ": handle " + std::to_string(info.handle) + " of " +
                                        std::to_string(info.bytes) +
                                        " bytes spans more than one window");
    }
    holds.add(info.handle);
  }
  // Every descriptor first: a failed export sends nothing.
  std::vector<int> fds;
  fds.reserve(handles.size());
  struct CloseAll {
    std::vector<int>& fds;
    ~CloseAll() { close_all(fds); }
  } close_fds{fds};
  for (const HandleInfo& info : handles) {
    Result<int> fd = pool.export_handle(info.handle);
    if (!fd.ok()) return fd.status().with_context(what);
    fds.push_back(*fd);
  }

  HandoffReport report;
  report.tokens = tokens;
  report.windows = handles.size();
  report.shared_bytes = handles.size() * plan.granule;
  bool answered = false;
  Status sent = send_message(socket, to_bytes(manifest_of(arena, tokens)), {}, deadline, &answered,
                             what + ": manifest");
  ++report.messages;
  for (std::size_t first = 0; sent.ok() && !answered && first < handles.size();
       first += options.windows_per_message) {
    const std::size_t count =
        std::min<std::size_t>(options.windows_per_message, handles.size() - first);
    WireBatch batch;
    batch.count = static_cast<std::uint32_t>(count);
    std::vector<char> bytes = to_bytes(batch);
    for (std::size_t i = first; i < first + count; ++i) {
      WireWindow window;
      window.fragment = static_cast<std::uint32_t>(i / k);
      window.window = static_cast<std::uint32_t>(i % k);
      window.bytes = handles[i].bytes;
      const std::vector<char> entry = to_bytes(window);
      bytes.insert(bytes.end(), entry.begin(), entry.end());
    }
    sent = send_message(socket, bytes, std::span<const int>(fds).subspan(first, count), deadline,
                        &answered, what + ": windows");
    ++report.messages;
  }
  // The kernel holds its own references to descriptors in flight.
  close_all(fds);
  // A refusal may be waiting even when sending failed: the receiver answered and closed.
  std::vector<char> bytes(sizeof(WireReply));
  std::vector<int> stray;
  Status received = receive_message(socket, bytes, stray, deadline, what + ": reply");
  close_all(stray);
  if (!received.ok()) return (sent.ok() ? received : sent).with_context(what);
  ++report.messages;
  WireReply answer;
  if (bytes.size() != sizeof(WireReply)) {
    return Status::InvalidArgument(what + ": a reply of " + std::to_string(bytes.size()) +
                                   " bytes, not " + std::to_string(sizeof(WireReply)));
  }
  std::memcpy(&answer, bytes.data(), sizeof(answer));
  if (answer.magic != kMagic || answer.kind != Kind::kReply) {
    return Status::InvalidArgument(what + ": the answer is not a handoff reply");
  }
  if (answer.code != 0) return refusal(answer).with_context(what);
  if (!sent.ok()) return sent.with_context(what);
  report.seconds = seconds_since(start);
  return report;
}

Result<ReceivedKv> receive_kv(Arena& arena, Governor& governor, int socket,
                              const HandoffOptions& options) {
  const Clock::time_point start = Clock::now();
  const Clock::time_point deadline = start + options.timeout;
  const auto step = [&](HandoffStep s) {
    if (options.on_step) options.on_step(s);
  };
  const std::string what = "receiving a KV handoff";
  KVVM_RETURN_IF_ERROR(check_socket(socket, options).with_context(what));
  // Every refusal is also the sender's answer.
  const auto refuse = [&](Status status) {
    reply(socket, status, options);
    return status.with_context(what);
  };
  ReceivedKv received;
  HandoffReport& report = received.report;

  step(HandoffStep::kManifest);
  std::vector<char> bytes(sizeof(WireManifest));
  std::vector<int> fds;
  KVVM_RETURN_IF_ERROR(receive_message(socket, bytes, fds, deadline, what).with_context(what));
  ++report.messages;
  if (!fds.empty() || bytes.size() != sizeof(WireManifest)) {
    close_all(fds);
    return refuse(Status::InvalidArgument("handoff manifest: " + std::to_string(bytes.size()) +
                                          " bytes, not " + std::to_string(sizeof(WireManifest))));
  }
  WireManifest manifest;
  std::memcpy(&manifest, bytes.data(), sizeof(manifest));
  if (Status valid = check_manifest(manifest, arena); !valid.ok()) return refuse(valid);

  const LayoutPlan& plan = arena.plan();
  const std::uint64_t k = manifest.windows_per_fragment;
  const std::uint64_t total = plan.fragments * k;
  Result<Grant> grant = governor.prepare(arena.tier(), total * plan.granule, options.budget_wait);
  if (!grant.ok()) return refuse(grant.status());
  HandlePool& pool = arena.pool();
  Holds holds(pool);
  holds.on_exit(Disposition::kRelease);  // until mapped: nothing imported stays
  std::vector<Handle> placed(total, kNoHandle);
  std::uint64_t imported = 0;
  const std::size_t capacity =
      sizeof(WireBatch) + sizeof(WireWindow) * std::size_t{kMaxWindowsPerMessage};
  while (imported < total) {
    step(HandoffStep::kBatch);
    bytes.assign(capacity, 0);
    KVVM_RETURN_IF_ERROR(receive_message(socket, bytes, fds, deadline, what).with_context(what));
    ++report.messages;
    WireBatch batch;
    if (bytes.size() >= sizeof(batch)) std::memcpy(&batch, bytes.data(), sizeof(batch));
    if (bytes.size() < sizeof(batch) || batch.magic != kMagic || batch.kind != Kind::kBatch ||
        bytes.size() != sizeof(batch) + batch.count * sizeof(WireWindow) ||
        fds.size() != batch.count || imported + batch.count > total) {
      close_all(fds);
      return refuse(Status::InvalidArgument("handoff batch: malformed (" +
                                            std::to_string(bytes.size()) + " bytes, " +
                                            std::to_string(fds.size()) + " descriptors)"));
    }
    Status status = Status::Ok();
    for (std::size_t i = 0; i < batch.count; ++i) {
      WireWindow window;
      std::memcpy(&window, bytes.data() + sizeof(batch) + i * sizeof(WireWindow), sizeof(window));
      const std::uint64_t at = std::uint64_t{window.fragment} * k + window.window;
      if (status.ok() && (window.fragment >= plan.fragments || window.window >= k ||
                          window.bytes != plan.granule || placed[at] != kNoHandle)) {
        status = Status::InvalidArgument("handoff batch: window " + std::to_string(window.window) +
                                         " of fragment " + std::to_string(window.fragment) + " (" +
                                         std::to_string(window.bytes) +
                                         " bytes) is outside the manifest or sent twice");
      }
      if (status.ok()) {
        Result<Handle> handle = pool.import_handle(fds[i], window.bytes, &*grant);
        if (handle.ok()) {
          holds.add(*handle);
          placed[at] = *handle;
          ++imported;
        } else {
          status = handle.status();
        }
      }
      ::close(fds[i]);  // the imported handle (or nothing) holds the memory now
    }
    fds.clear();
    if (!status.ok()) return refuse(status);
  }
  step(HandoffStep::kImported);

  std::vector<HandleInfo> infos;
  infos.reserve(total);
  for (Handle handle : placed) {
    Result<HandleInfo> info = pool.describe(handle);
    if (!info.ok()) return refuse(info.status());
    infos.push_back(*info);
  }
  // Mapped as a prefix of every window holding a token's bytes, the partial last one included:
  // no boundary to copy now (the sequence's first write past P copies that window).
  SharedPrefixInfo info;
  info.tokens = manifest.tokens;
  info.fragments = plan.fragments;
  info.windows_per_fragment = k;
  info.shared_bytes = total * plan.granule;
  std::shared_ptr<SharedPrefix> prefix = SharedPrefix::create(pool, plan, info, std::move(infos));
  Result<SlotId> slot = arena.admit_shared(*prefix, manifest.tokens);
  if (!slot.ok()) return refuse(slot.status());
  grant->commit_charged();
  holds.let_go(Disposition::kKeep);  // the slot's mappings keep them
  step(HandoffStep::kMapped);
  reply(socket, Status::Ok(), options);
  ++report.messages;
  step(HandoffStep::kAcknowledged);

  received.slot = *slot;
  report.tokens = manifest.tokens;
  report.windows = total;
  report.shared_bytes = total * plan.granule;
  report.seconds = seconds_since(start);
  return received;
}

}  // namespace kvvm
