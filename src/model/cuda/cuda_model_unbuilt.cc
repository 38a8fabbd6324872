// make_cuda_model in a build without the CUDA compiler: Unavailable, saying why, so a caller
// choosing a backend reports it (the CPU model still runs).
#include "kvvm/model/model.h"

namespace kvvm::model {

Result<std::unique_ptr<Model>> make_cuda_model(const ModelConfig&, const ModelWeights&,
                                               const CudaModelOptions&) {
  return Status::Unavailable(
      "make_cuda_model: kvvm was built without the CUDA compiler, so the CUDA model is not in "
      "this binary; use the CPU backend");
}

}  // namespace kvvm::model
