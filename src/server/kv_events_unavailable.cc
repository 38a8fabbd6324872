// make_kv_events_publisher in a build without ZeroMQ or msgpack-cxx: the flag is still parsed,
// and asking for events says which library the build lacked. KVVM_KV_EVENTS_MISSING is set
// by src/server/CMakeLists.txt.
#include "kvvm/server/kv_events.h"

namespace kvvm::server {

Result<std::unique_ptr<KvEventsPublisher>> make_kv_events_publisher(const KvEventsConfig&,
                                                                    std::string) {
  return Status::Unavailable(
      "--kv-events-config: KV-cache events need " KVVM_KV_EVENTS_MISSING
      ", which this build of kvvm was configured without (install it and configure again)");
}

}  // namespace kvvm::server
