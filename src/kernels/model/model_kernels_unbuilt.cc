// The model kernels of a build without the CUDA compiler: each answers Unavailable with the
// reason, as attention_unbuilt.cc does for attention.
#include <string>

#include "kvvm/kernels/model_kernels.h"

namespace kvvm {
namespace {

Status model_kernels_unbuilt(const char* what) {
  return Status::Unavailable(std::string(what) +
                             ": kvvm was built without the CUDA compiler, so the model kernels "
                             "are not in this binary");
}

}  // namespace

bool model_kernels_built() { return false; }
void set_overlapped_launches(bool) {}
bool overlapped_launches() { return false; }
Status embedding_cuda(const EmbeddingParams&, void*) {
  return model_kernels_unbuilt("embedding_cuda");
}
Status rmsnorm_cuda(const RmsNormParams&, void*) { return model_kernels_unbuilt("rmsnorm_cuda"); }
Status rope_cuda(const RopeParams&, void*) { return model_kernels_unbuilt("rope_cuda"); }
Status head_rmsnorm_cuda(const HeadRmsNormParams&, void*) {
  return model_kernels_unbuilt("head_rmsnorm_cuda");
}
Status silu_mul_cuda(const SiluMulParams&, void*) { return model_kernels_unbuilt("silu_mul_cuda"); }
Status dummy_fill_cuda(const DummyFillParams&, void*) {
  return model_kernels_unbuilt("dummy_fill_cuda");
}
Status absmax_cuda(const AbsMaxParams&, void*) { return model_kernels_unbuilt("absmax_cuda"); }
Status broadcast_rows_cuda(const BroadcastRowsParams&, void*) {
  return model_kernels_unbuilt("broadcast_rows_cuda");
}
Status argmax_cuda(const ArgmaxParams&, void*) { return model_kernels_unbuilt("argmax_cuda"); }
Status gemv_cuda(const GemvParams&, void*) { return model_kernels_unbuilt("gemv_cuda"); }
Status sample_cuda(const SampleParams&, void*) { return model_kernels_unbuilt("sample_cuda"); }
Status logprobs_cuda(const LogprobsParams&, void*) {
  return model_kernels_unbuilt("logprobs_cuda");
}
Status logit_adjust_cuda(const LogitAdjustParams&, void*) {
  return model_kernels_unbuilt("logit_adjust_cuda");
}
Status token_mask_cuda(const TokenMaskParams&, void*) {
  return model_kernels_unbuilt("token_mask_cuda");
}

}  // namespace kvvm
