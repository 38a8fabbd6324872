// The CUDA entry points of a build without the CUDA compiler: each answers Unavailable with
// the reason, so callers (the CLI, an engine choosing a backend) report it instead of failing
// to link. A build with nvcc compiles attention_cuda.cu instead of this file.
#include "kvvm/kernels/attention.h"

namespace kvvm {
namespace {

Status attention_unbuilt(const char* what) {
  return Status::Unavailable(std::string(what) +
                             ": kvvm was built without the CUDA compiler, so the attention "
                             "kernels are not in this binary");
}

}  // namespace

bool attention_kernels_built() { return false; }
Status append_kv_cuda(const AppendParams&, void*) { return attention_unbuilt("append_kv_cuda"); }
Status rope_append_kv_cuda(const RopeAppendParams&, void*) {
  return attention_unbuilt("rope_append_kv_cuda");
}
Result<DecodePlan> plan_decode_cuda(const DecodeParams&) {
  return attention_unbuilt("plan_decode_cuda");
}
Status decode_attention_cuda(const DecodeParams&, void*, std::size_t, void*) {
  return attention_unbuilt("decode_attention_cuda");
}
Status prefill_attention_cuda(const PrefillParams&, void*) {
  return attention_unbuilt("prefill_attention_cuda");
}

}  // namespace kvvm
