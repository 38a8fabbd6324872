#include "model/cuda/runtime_library.h"

#include <dlfcn.h>

namespace kvvm::model::detail {

void* library_symbol(void* library, const char* name) { return ::dlsym(library, name); }

bool open_first_library(std::initializer_list<const char*> candidates,
                        const std::function<bool(void* library, std::string& error)>& bind,
                        std::string& tried) {
  for (const char* name : candidates) {
    void* handle = ::dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) {
      const char* why = ::dlerror();
      tried += std::string(tried.empty() ? "" : "; ") + (why != nullptr ? why : name);
      continue;
    }
    std::string error;
    if (bind(handle, error)) return true;  // kept open for the process
    tried += std::string(tried.empty() ? "" : "; ") + name + ": " + error;
    ::dlclose(handle);
  }
  return false;
}

}  // namespace kvvm::model::detail
