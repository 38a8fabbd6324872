// A JSON value as an error message quotes it.
#pragma once

#include <cstddef>
#include <nlohmann/json.hpp>
#include <string>

namespace kvvm::model::detail {

// The value as it would appear in the file, cut short when long: a hostile file may put a
// megabyte where a number belongs, and the message stays readable.
inline std::string show(const nlohmann::json& value) {
  constexpr std::size_t kMaxShown = 80;
  std::string text = value.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  if (text.size() > kMaxShown) text = text.substr(0, kMaxShown) + "...";
  return text;
}

}  // namespace kvvm::model::detail
