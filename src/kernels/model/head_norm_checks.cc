// check_head_rmsnorm (include/kvvm/kernels/model_kernels.h) in every build, CUDA or not.
#include "kernels/model/head_norm_checks.h"

#include "kvvm/kernels/model_kernels.h"

namespace kvvm {

Status check_head_rmsnorm(const HeadRmsNormParams& params) {
  return kernels::head_rmsnorm_checks(params);
}

}  // namespace kvvm
