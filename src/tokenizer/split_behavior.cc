#include "tokenizer/split_behavior.h"

namespace kvvm::tokenizer::detail {

Result<Behavior> parse_behavior(const Json& json, std::string_view where,
                                std::optional<Behavior> fallback) {
  if (fallback && find_member(json, "behavior") == nullptr) return *fallback;
  KVVM_ASSIGN_OR_RETURN(std::string name, string_member(json, "behavior", where));
  if (name == "Removed") return Behavior::kRemoved;
  if (name == "Isolated") return Behavior::kIsolated;
  if (name == "MergedWithPrevious") return Behavior::kMergedWithPrevious;
  if (name == "MergedWithNext") return Behavior::kMergedWithNext;
  if (name == "Contiguous") return Behavior::kContiguous;
  return field_error(member_path(where, "behavior"),
                     "unknown behavior '" + name +
                         "' (Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous)");
}

std::vector<Segment> apply_behavior(std::vector<Segment> in, Behavior behavior) {
  std::vector<Segment> out;
  bool previous_match = false;
  switch (behavior) {
    case Behavior::kIsolated:
      return in;
    case Behavior::kRemoved:
      for (const Segment& s : in) {
        if (!s.is_match) out.push_back(s);
      }
      return out;
    case Behavior::kMergedWithPrevious:
      for (const Segment& s : in) {
        if (s.is_match && !previous_match && !out.empty()) {
          out.back().end = s.end;
        } else {
          out.push_back(s);
        }
        previous_match = s.is_match;
      }
      return out;
    case Behavior::kMergedWithNext:
      for (auto it = in.rbegin(); it != in.rend(); ++it) {
        if (it->is_match && !previous_match && !out.empty()) {
          out.back().begin = it->begin;
        } else {
          out.push_back(*it);
        }
        previous_match = it->is_match;
      }
      return {out.rbegin(), out.rend()};
    case Behavior::kContiguous:
      for (const Segment& s : in) {
        if (s.is_match == previous_match && !out.empty()) {
          out.back().end = s.end;
        } else {
          out.push_back(s);
        }
        previous_match = s.is_match;
      }
      return out;
  }
  return in;
}

}  // namespace kvvm::tokenizer::detail
