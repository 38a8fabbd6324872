// The FP8 kernels of a build without the CUDA compiler: each answers Unavailable with the
// reason, after the same argument checks (so a bad call is named the same way everywhere).
#include <string>

#include "kernels/fp8/fp8_checks.h"
#include "kvvm/kernels/fp8_kernels.h"

namespace kvvm {
namespace {

Status fp8_unbuilt(const char* what) {
  return Status::Unavailable(std::string(what) +
                             ": kvvm was built without the CUDA compiler, so the FP8 kernels "
                             "are not in this binary");
}

}  // namespace

bool fp8_kernels_built() { return false; }
Status fp8_gemv_cuda(const Fp8GemvArgs& args, void*) {
  KVVM_RETURN_IF_ERROR(kernels::check_fp8_gemv(args));
  return fp8_unbuilt("fp8_gemv_cuda");
}
Status fp8_quantize_cuda(const Fp8QuantizeArgs& args, void*) {
  KVVM_RETURN_IF_ERROR(kernels::check_fp8_quantize(args));
  return fp8_unbuilt("fp8_quantize_cuda");
}

}  // namespace kvvm
