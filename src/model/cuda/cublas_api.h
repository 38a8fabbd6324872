// cuBLAS as the CUDA model calls it: a table of function pointers filled once, at run time,
// from libcublas (dlopen + dlsym), as src/vmm/cuda_api.h does for libcuda.
//
// Why at run time: a binary built with CUDA must start, and run the CPU model, on a machine
// without the CUDA libraries; linking libcublas would stop it at load. The toolkit's
// <cublas_api.h> is included for its types and enums only; each entry names the exact symbol
// it is looked up by (cublas_v2.h #defines the unsuffixed names to these).
#pragma once

#include <cublas_api.h>

#include <string>

namespace kvvm::model::detail {

struct CublasApi {
  using Create = cublasStatus_t (*)(cublasHandle_t*);                  // "cublasCreate_v2"
  using Destroy = cublasStatus_t (*)(cublasHandle_t);                  // "cublasDestroy_v2"
  using SetStream = cublasStatus_t (*)(cublasHandle_t, cudaStream_t);  // "cublasSetStream_v2"
  using SetWorkspace = cublasStatus_t (*)(cublasHandle_t, void*,
                                          size_t);  // "cublasSetWorkspace_v2"
  using GemmEx = cublasStatus_t (*)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int,
                                    int, const void*, const void*, cudaDataType, int, const void*,
                                    cudaDataType, int, const void*, void*, cudaDataType, int,
                                    cublasComputeType_t,
                                    cublasGemmAlgo_t);    // "cublasGemmEx"
  using GetStatusName = const char* (*)(cublasStatus_t);  // "cublasGetStatusName"

  Create create = nullptr;
  Destroy destroy = nullptr;
  SetStream set_stream = nullptr;
  SetWorkspace set_workspace = nullptr;
  GemmEx gemm_ex = nullptr;
  GetStatusName get_status_name = nullptr;
};

// libcublas, loaded once per process (thread-safe; the library stays open).
struct CublasLibrary {
  CublasApi api;
  std::string error;  // why cuBLAS cannot be used here; empty when it can
  bool usable() const { return error.empty(); }
};
const CublasLibrary& cublas_library();

// "CUBLAS_STATUS_NOT_SUPPORTED"; "cublasStatus_t 7" when unnamed.
std::string cublas_status_name(cublasStatus_t status);

}  // namespace kvvm::model::detail
