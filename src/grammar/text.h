// Messages of the grammar room: parts joined into one string (numbers by their decimal digits),
// and a byte shown as a reader would type it.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>

namespace kvvm::grammar {

template <typename... Parts>
std::string concat(const Parts&... parts) {
  std::string out;
  const auto add = [&out](const auto& part) {
    using T = std::decay_t<decltype(part)>;
    if constexpr (std::is_same_v<T, char>) {
      out += part;
    } else if constexpr (std::is_arithmetic_v<T>) {
      out += std::to_string(part);
    } else {
      out += std::string_view(part);
    }
  };
  (add(parts), ...);
  return out;
}

// 'a', or \xNN for a byte that is not printable ASCII.
std::string show_byte(std::uint8_t byte);

}  // namespace kvvm::grammar
