// The FP8 GEMM through cuBLASLt (model/fp8_matmul.h): plans made once per shape, then one
// cublasLtMatmul per call with that call's scale pointers.
#include "model/cuda/fp8_matmul.h"

#include <string>

#include "model/cuda/cublaslt_library.h"

namespace kvvm::model::detail {
namespace {

// Plans kept at most: a serving process sees a few decode shapes and one prefill shape per
// step's token count; past this the oldest shapes are planned again.
constexpr std::size_t kMostPlans = 1024;

std::string dims(std::uint64_t value) { return std::to_string(value); }

Status lt_call(const char* call, cublasStatus_t status) {
  if (status == CUBLAS_STATUS_SUCCESS) return Status::Ok();
  const CublasLtLibrary& library = cublaslt_library();
  const char* named = library.usable() ? library.api.status_name(status) : nullptr;
  const std::string name =
      named != nullptr ? named : "cublasStatus_t " + std::to_string(static_cast<int>(status));
  return Status::DriverError(std::string(call) + " failed: " + name,
                             DriverFailure{call, name, static_cast<int>(status)});
}

template <typename T>
Status set_attribute(const CublasLtApi& api, cublasLtMatmulDesc_t desc,
                     cublasLtMatmulDescAttributes_t what, const T& value) {
  return lt_call("cublasLtMatmulDescSetAttribute", api.desc_set(desc, what, &value, sizeof(value)));
}

std::string shape(const Fp8MatmulArgs& a) {
  return std::string(a.scales_kind == Fp8Scales::kBlock128 ? "block-scaled" : "per-channel") +
         " FP8 GEMM of " + dims(a.rows) + " x " + dims(a.in) + " by " + dims(a.out) + " x " +
         dims(a.in);
}

}  // namespace

Result<std::unique_ptr<Fp8Matmul>> Fp8Matmul::create(void* workspace, std::uint64_t bytes) {
  const CublasLtLibrary& library = cublaslt_library();
  if (!library.usable()) return Status::Unavailable("FP8 GEMM: " + library.error);
  std::unique_ptr<Fp8Matmul> out(new Fp8Matmul());
  KVVM_RETURN_IF_ERROR(lt_call("cublasLtCreate", library.api.create(&out->handle_)));
  out->workspace_ = workspace;
  out->workspace_bytes_ = bytes;
  return out;
}

Fp8Matmul::~Fp8Matmul() {
  for (auto& [key, plan] : plans_) destroy(plan);
  if (handle_ != nullptr) (void)cublaslt_library().api.destroy(handle_);
}

void Fp8Matmul::destroy(Plan& plan) {
  const CublasLtApi& api = cublaslt_library().api;
  if (plan.desc != nullptr) (void)api.desc_destroy(plan.desc);
  for (cublasLtMatrixLayout_t layout : {plan.a, plan.b, plan.d}) {
    if (layout != nullptr) (void)api.layout_destroy(layout);
  }
  plan = Plan{};
}

Result<Fp8Matmul::Plan*> Fp8Matmul::plan_for(const Fp8MatmulArgs& a) {
  const Key key{static_cast<int>(a.scales_kind),
                static_cast<int>(a.element),
                a.rows,
                a.in,
                a.out,
                a.beta != 0.0f};
  if (auto found = plans_.find(key); found != plans_.end()) return &found->second;
  if (plans_.size() >= kMostPlans) {
    destroy(plans_.begin()->second);
    plans_.erase(plans_.begin());
  }
  const CublasLtApi& api = cublaslt_library().api;
  Plan plan;
  // A failure below destroys what was made so far.
  struct Guard {
    Fp8Matmul* self;
    Plan* plan;
    bool keep = false;
    ~Guard() {
      if (!keep) self->destroy(*plan);
    }
  } guard{this, &plan};
  KVVM_RETURN_IF_ERROR(lt_call("cublasLtMatmulDescCreate",
                               api.desc_create(&plan.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F)));
  const cublasOperation_t transpose = CUBLAS_OP_T, plain = CUBLAS_OP_N;
  KVVM_RETURN_IF_ERROR(set_attribute(api, plan.desc, CUBLASLT_MATMUL_DESC_TRANSA, transpose));
  KVVM_RETURN_IF_ERROR(set_attribute(api, plan.desc, CUBLASLT_MATMUL_DESC_TRANSB, plain));
  const bool block = a.scales_kind == Fp8Scales::kBlock128;
  const std::int32_t a_mode = block ? CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F
                                    : CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
  const std::int32_t b_mode =
      block ? CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F : CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
  KVVM_RETURN_IF_ERROR(set_attribute(api, plan.desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, a_mode));
  KVVM_RETURN_IF_ERROR(set_attribute(api, plan.desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, b_mode));
  // The heuristic sees scale pointers of the right kind; each call sets its own.
  KVVM_RETURN_IF_ERROR(
      set_attribute(api, plan.desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, a.w_scales));
  KVVM_RETURN_IF_ERROR(
      set_attribute(api, plan.desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, a.x_scales));
  const cudaDataType y_type = a.element == DType::kFp16 ? CUDA_R_16F : CUDA_R_16BF;
  KVVM_RETURN_IF_ERROR(lt_call("cublasLtMatrixLayoutCreate",
                               api.layout_create(&plan.a, CUDA_R_8F_E4M3, a.in, a.out, a.in)));
  KVVM_RETURN_IF_ERROR(lt_call("cublasLtMatrixLayoutCreate",
                               api.layout_create(&plan.b, CUDA_R_8F_E4M3, a.in, a.rows, a.in)));
  KVVM_RETURN_IF_ERROR(lt_call("cublasLtMatrixLayoutCreate",
                               api.layout_create(&plan.d, y_type, a.out, a.rows, a.out)));
  cublasLtMatmulPreference_t preference = nullptr;
  KVVM_RETURN_IF_ERROR(
      lt_call("cublasLtMatmulPreferenceCreate", api.preference_create(&preference)));
  const std::uint64_t workspace = workspace_bytes_;
  Status status = lt_call("cublasLtMatmulPreferenceSetAttribute",
                          api.preference_set(preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                             &workspace, sizeof(workspace)));
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  if (status.ok()) {
    status = lt_call("cublasLtMatmulAlgoGetHeuristic",
                     api.heuristic(handle_, plan.desc, plan.a, plan.b, plan.d, plan.d, preference,
                                   1, &result, &found));
  }
  (void)api.preference_destroy(preference);
  KVVM_RETURN_IF_ERROR(status.with_context(shape(a)));
  if (found == 0) {
    return Status::Unavailable("cuBLASLt has no algorithm for the " + shape(a) + " on this GPU");
  }
  plan.algo = result.algo;
  guard.keep = true;
  return &plans_.emplace(key, plan).first->second;
}

Status Fp8Matmul::run(const Fp8MatmulArgs& a, void* stream) {
  if (a.element != DType::kBf16 && a.element != DType::kFp16) {
    return Status::InvalidArgument("FP8 GEMM: output type " + std::string(to_string(a.element)) +
                                   " is not bf16 or fp16");
  }
  if (a.rows == 0) return Status::Ok();
  if (a.rows % 4 != 0 || a.in % 16 != 0 || a.out % 16 != 0) {
    return Status::InvalidArgument("FP8 GEMM: rows " + dims(a.rows) + ", in " + dims(a.in) +
                                   ", out " + dims(a.out) +
                                   ": rows a multiple of 4, in and out of 16");
  }
  if (a.xq == nullptr || a.x_scales == nullptr || a.weight == nullptr || a.w_scales == nullptr ||
      a.y == nullptr) {
    return Status::InvalidArgument(
        "FP8 GEMM: a null pointer among xq, x_scales, weight, "
        "w_scales, y");
  }
  KVVM_ASSIGN_OR_RETURN(Plan * planned, plan_for(a));
  Plan& plan = *planned;
  const CublasLtApi& api = cublaslt_library().api;
  KVVM_RETURN_IF_ERROR(
      set_attribute(api, plan.desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, a.w_scales));
  KVVM_RETURN_IF_ERROR(
      set_attribute(api, plan.desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, a.x_scales));
  const float alpha = 1.0f;
  return lt_call("cublasLtMatmul",
                 api.matmul(handle_, plan.desc, &alpha, a.weight, plan.a, a.xq, plan.b, &a.beta,
                            a.y, plan.d, a.y, plan.d, &plan.algo, workspace_, workspace_bytes_,
                            static_cast<cudaStream_t>(stream)))
      .with_context(shape(a));
}

}  // namespace kvvm::model::detail
