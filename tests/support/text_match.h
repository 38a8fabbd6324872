// Whether a message holds a phrase: the tests check errors and reports by the words a user
// reads, not by their whole text.
#pragma once

#include <string>

namespace kvvm::test {

inline bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

}  // namespace kvvm::test
