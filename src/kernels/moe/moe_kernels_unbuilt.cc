// The MoE kernels of a build without the CUDA compiler: each answers Unavailable with the reason,
// after the same argument checks (so a bad call is named the same way everywhere).
#include <string>

#include "kvvm/kernels/moe_kernels.h"

namespace kvvm {
namespace {

Status moe_unbuilt(const char* what) {
  return Status::Unavailable(std::string(what) +
                             ": kvvm was built without the CUDA compiler, so the MoE kernels "
                             "are not in this binary");
}

}  // namespace

bool moe_kernels_built() { return false; }
Status moe_route_cuda(const MoeRouteParams& params, void*) {
  KVVM_RETURN_IF_ERROR(check_moe_route(params));
  return moe_unbuilt("moe_route_cuda");
}
Status moe_permute_cuda(const MoePermuteParams& params, void*) {
  KVVM_RETURN_IF_ERROR(check_moe_permute(params));
  return moe_unbuilt("moe_permute_cuda");
}
Status moe_expert_gate_up_cuda(const MoeGateUpParams& params, void*) {
  KVVM_RETURN_IF_ERROR(check_moe_gate_up(params));
  return moe_unbuilt("moe_expert_gate_up_cuda");
}
Status moe_expert_down_cuda(const MoeDownParams& params, void*) {
  KVVM_RETURN_IF_ERROR(check_moe_down(params));
  return moe_unbuilt("moe_expert_down_cuda");
}

Status moe_residency_cuda(const MoeResidencyParams& params, void*) {
  KVVM_RETURN_IF_ERROR(check_moe_residency(params));
  return moe_unbuilt("moe_residency_cuda");
}

}  // namespace kvvm
