// Loads libcublasLt at run time: this toolkit's .so.13, then .so.12, then the development link,
// each by the loader's search path and then from the toolkit's default directory.
#include "model/cuda/cublaslt_library.h"

#include <mutex>

#include "model/cuda/runtime_library.h"

namespace kvvm::model::detail {
namespace {

template <typename Function>
bool load_lt_symbol(void* library, const char* name, Function& slot, std::string& error) {
  return bind_symbol(library, "libcublasLt", name, slot, error);
}

bool load_lt_table(void* library, CublasLtApi& api, std::string& error) {
  return load_lt_symbol(library, "cublasLtCreate", api.create, error) &&
         load_lt_symbol(library, "cublasLtDestroy", api.destroy, error) &&
         load_lt_symbol(library, "cublasLtMatmulDescCreate", api.desc_create, error) &&
         load_lt_symbol(library, "cublasLtMatmulDescDestroy", api.desc_destroy, error) &&
         load_lt_symbol(library, "cublasLtMatmulDescSetAttribute", api.desc_set, error) &&
         load_lt_symbol(library, "cublasLtMatrixLayoutCreate", api.layout_create, error) &&
         load_lt_symbol(library, "cublasLtMatrixLayoutDestroy", api.layout_destroy, error) &&
         load_lt_symbol(library, "cublasLtMatmulPreferenceCreate", api.preference_create, error) &&
         load_lt_symbol(library, "cublasLtMatmulPreferenceDestroy", api.preference_destroy,
                        error) &&
         load_lt_symbol(library, "cublasLtMatmulPreferenceSetAttribute", api.preference_set,
                        error) &&
         load_lt_symbol(library, "cublasLtMatmulAlgoGetHeuristic", api.heuristic, error) &&
         load_lt_symbol(library, "cublasLtMatmul", api.matmul, error) &&
         load_lt_symbol(library, "cublasLtGetStatusName", api.status_name, error);
}

CublasLtLibrary load_lt_library() {
  CublasLtLibrary library;
  std::string tried;
  const bool opened = open_first_library(
      {"libcublasLt.so.13", "/usr/local/cuda/lib64/libcublasLt.so.13", "libcublasLt.so.12",
       "/usr/local/cuda/lib64/libcublasLt.so.12", "libcublasLt.so"},
      [&library](void* handle, std::string& error) {
        if (load_lt_table(handle, library.api, error)) return true;
        library.api = CublasLtApi{};
        return false;
      },
      tried);
  if (!opened) {
    library.error = "cannot load cuBLASLt (" + tried +
                    "); install the CUDA toolkit's libcublasLt or add its directory to "
                    "LD_LIBRARY_PATH";
  }
  return library;
}

}  // namespace

const CublasLtLibrary& cublaslt_library() {
  static std::once_flag once;
  static CublasLtLibrary* library = nullptr;  // never destroyed: the library stays loaded
  std::call_once(once, [] { library = new CublasLtLibrary(load_lt_library()); });
  return *library;
}

}  // namespace kvvm::model::detail
