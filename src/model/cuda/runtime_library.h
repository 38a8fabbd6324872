// Shared libraries the CUDA model opens at run time (cuBLAS, cuBLASLt) rather than links: a
// CUDA-built binary must start, and run the CPU model, where they are absent. Each is a table
// of function pointers bound from the first candidate file that loads and has every symbol.
#pragma once

#include <functional>
#include <initializer_list>
#include <string>

namespace kvvm::model::detail {

// The address of `name` in an open library, or null.
void* library_symbol(void* library, const char* name);

// Binds `name` into `slot`; false with `error` naming the library and the symbol otherwise.
template <typename Function>
bool bind_symbol(void* library, const char* library_name, const char* name, Function& slot,
                 std::string& error) {
  void* symbol = library_symbol(library, name);
  if (symbol == nullptr) {
    error = std::string(library_name) + " has no symbol " + name;
    return false;
  }
  slot = reinterpret_cast<Function>(symbol);
  return true;
}

// dlopen's each candidate in turn (a bare name by the loader's search path, a path as given)
// until `bind` fills its table from one; that one stays open for the process, the others are
// closed. True when one bound; `tried` gets each failure's reason, "; "-separated.
bool open_first_library(std::initializer_list<const char*> candidates,
                        const std::function<bool(void* library, std::string& error)>& bind,
                        std::string& tried);

}  // namespace kvvm::model::detail
