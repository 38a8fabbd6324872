// cuBLASLt as the CUDA model's FP8 GEMMs call it: a table of function pointers filled once, at
// run time, from libcublasLt (dlopen + dlsym), as cublas_api.h does for libcublas and for the
// same reason: a CUDA-built binary must start, and run the CPU model, where the library is
// absent. <cublasLt.h> is included for its types and enums only.
#pragma once

#include <cublasLt.h>

#include <string>

namespace kvvm::model::detail {

struct CublasLtApi {
  decltype(&cublasLtCreate) create = nullptr;
  decltype(&cublasLtDestroy) destroy = nullptr;
  decltype(&cublasLtMatmulDescCreate) desc_create = nullptr;
  decltype(&cublasLtMatmulDescDestroy) desc_destroy = nullptr;
  decltype(&cublasLtMatmulDescSetAttribute) desc_set = nullptr;
  decltype(&cublasLtMatrixLayoutCreate) layout_create = nullptr;
  decltype(&cublasLtMatrixLayoutDestroy) layout_destroy = nullptr;
  decltype(&cublasLtMatmulPreferenceCreate) preference_create = nullptr;
  decltype(&cublasLtMatmulPreferenceDestroy) preference_destroy = nullptr;
  decltype(&cublasLtMatmulPreferenceSetAttribute) preference_set = nullptr;
  decltype(&cublasLtMatmulAlgoGetHeuristic) heuristic = nullptr;
  decltype(&cublasLtMatmul) matmul = nullptr;
  decltype(&cublasLtGetStatusName) status_name = nullptr;
};

// libcublasLt, loaded once per process (thread-safe; the library stays open).
struct CublasLtLibrary {
  CublasLtApi api;
  std::string error;  // why cuBLASLt cannot be used here; empty when it can
  bool usable() const { return error.empty(); }
};
const CublasLtLibrary& cublaslt_library();

}  // namespace kvvm::model::detail
