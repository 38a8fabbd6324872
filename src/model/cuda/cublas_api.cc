// Loads libcublas at run time: libcublas.so.13 (this toolkit's), then .so.12, then the
// unversioned development link, each by the loader's search path and then from the toolkit's
// default directory (often not on that path); the first that loads and has every symbol wins.
#include "model/cuda/cublas_api.h"

#include <mutex>

#include "model/cuda/runtime_library.h"

namespace kvvm::model::detail {
namespace {

template <typename Function>
bool load_symbol(void* library, const char* name, Function& slot, std::string& error) {
  return bind_symbol(library, "libcublas", name, slot, error);
}

bool load_table(void* library, CublasApi& api, std::string& error) {
  return load_symbol(library, "cublasCreate_v2", api.create, error) &&
         load_symbol(library, "cublasDestroy_v2", api.destroy, error) &&
         load_symbol(library, "cublasSetStream_v2", api.set_stream, error) &&
         load_symbol(library, "cublasSetWorkspace_v2", api.set_workspace, error) &&
         load_symbol(library, "cublasGemmEx", api.gemm_ex, error) &&
         load_symbol(library, "cublasGetStatusName", api.get_status_name, error);
}

CublasLibrary load_library() {
  CublasLibrary library;
  std::string tried;
  const bool opened = open_first_library(
      {"libcublas.so.13", "/usr/local/cuda/lib64/libcublas.so.13", "libcublas.so.12",
       "/usr/local/cuda/lib64/libcublas.so.12", "libcublas.so"},
      [&library](void* handle, std::string& error) {
        if (load_table(handle, library.api, error)) return true;
        library.api = CublasApi{};
        return false;
      },
      tried);
  if (!opened) {
    library.error = "cannot load cuBLAS (" + tried +
                    "); install the CUDA toolkit's libcublas or add its directory to "
                    "LD_LIBRARY_PATH";
  }
  return library;
}

}  // namespace

const CublasLibrary& cublas_library() {
  static std::once_flag once;
  static CublasLibrary* library = nullptr;  // never destroyed: the library stays loaded
  std::call_once(once, [] { library = new CublasLibrary(load_library()); });
  return *library;
}

std::string cublas_status_name(cublasStatus_t status) {
  const CublasLibrary& library = cublas_library();
  if (library.usable()) {
    const char* name = library.api.get_status_name(status);
    if (name != nullptr) return name;
  }
  return "cublasStatus_t " + std::to_string(static_cast<int>(status));
}

}  // namespace kvvm::model::detail
