// allOf as one schema: its parts (and a $ref beside other keywords, which is one more part)
// merged keyword by keyword where the merge means the same as "all of them": properties
// united (a property in several parts gets the allOf of its schemas), required united, types
// intersected, bounds tightened. Keywords whose values differ otherwise are refused by name.
#include <algorithm>
#include <functional>
#include <set>

#include "grammar/json_schema_compiler.h"

namespace kvvm::grammar {

namespace {

struct MergeState {
  // Parts whose additionalProperties is not true: the property names each lists.
  std::vector<std::pair<std::set<std::string>, std::string>> closed;
  std::set<std::string> names;  // every part's
};

std::set<std::string> type_set(const SchemaJson& type) {
  std::set<std::string> out;
  if (type.is_string()) out.insert(type.get<std::string>());
  if (type.is_array()) {
    for (const SchemaJson& t : type) {
      if (t.is_string()) out.insert(t.get<std::string>());
    }
  }
  return out;
}

bool tighter_lower(std::string_view key) {
  return key == "minLength" || key == "minItems" || key == "minProperties" || key == "minimum" ||
         key == "exclusiveMinimum";
}
bool tighter_upper(std::string_view key) {
  return key == "maxLength" || key == "maxItems" || key == "maxProperties" || key == "maximum" ||
         key == "exclusiveMaximum";
}

class AllOfMerge {
 public:
  AllOfMerge(const std::function<Result<const SchemaJson*>(const SchemaJson&, const std::string&)>&
                 resolve,
             const std::function<Status(const std::string&, int)>& depth_bound)
      : resolve_(resolve), depth_bound_(depth_bound) {}

  Status part(SchemaJson& into, const SchemaJson& part, const std::string& path, int depth) {
    KVVM_RETURN_IF_ERROR(depth_bound_(path, depth));
    if (part.is_boolean()) {
      if (part.get<bool>()) return Status::Ok();
      return schema_error(path, "false matches no value");
    }
    if (!part.is_object()) {
      return schema_error(path, "a schema is an object or a boolean, not ", part.dump());
    }
    for (const auto& [key, value] : part.items()) {
      if (!is_known_keyword(key)) return schema_error(path, "\"", key, "\" is not supported");
    }
    if (part.contains("$ref")) {
      KVVM_ASSIGN_OR_RETURN(const SchemaJson* target,
                            resolve_(part["$ref"], child_path(path, "$ref")));
      KVVM_RETURN_IF_ERROR(
          this->part(into, *target, part["$ref"].get<std::string>().substr(1), depth + 1));
    }
    if (part.contains("allOf")) {
      const SchemaJson& parts = part["allOf"];
      if (!parts.is_array()) return schema_error(path, "\"allOf\" is not an array");
      for (std::size_t i = 0; i < parts.size(); ++i) {
        KVVM_RETURN_IF_ERROR(this->part(
            into, parts[i], child_path(child_path(path, "allOf"), std::to_string(i)), depth + 1));
      }
    }
    std::set<std::string> names;
    if (part.contains("properties") && part["properties"].is_object()) {
      for (const auto& [name, sub] : part["properties"].items()) names.insert(name);
    }
    state_.names.insert(names.begin(), names.end());
    if (part.contains("additionalProperties") &&
        !(part["additionalProperties"].is_boolean() && part["additionalProperties"].get<bool>())) {
      state_.closed.emplace_back(names, path);
    }
    for (const auto& [key, value] : part.items()) {
      if (key == "$ref" || key == "allOf" || key == "$defs" || key == "definitions" ||
          is_annotation(key)) {
        continue;
      }
      KVVM_RETURN_IF_ERROR(keyword(into, key, value, path));
    }
    return Status::Ok();
  }

  // Every closed part lists every property of the others: otherwise its additionalProperties
  // would judge them, which one merged schema cannot say.
  Status finish() const {
    for (const auto& [listed, path] : state_.closed) {
      for (const std::string& name : state_.names) {
        if (!listed.contains(name)) {
          return schema_error(path, "allOf: property \"", name,
                              "\" of another part meets this part's additionalProperties: not "
                              "supported");
        }
      }
    }
    return Status::Ok();
  }

 private:
  Status keyword(SchemaJson& into, const std::string& key, const SchemaJson& value,
                 const std::string& path) {
    if (!into.contains(key)) {
      into[key] = value;
      return Status::Ok();
    }
    SchemaJson& have = into[key];
    if (have == value) return Status::Ok();
    if (key == "properties" && have.is_object() && value.is_object()) {
      for (const auto& [name, sub] : value.items()) {
        if (!have.contains(name)) {
          have[name] = sub;
        } else if (have[name] != sub) {
          have[name] = SchemaJson{{"allOf", SchemaJson::array({have[name], sub})}};
        }
      }
      return Status::Ok();
    }
    if (key == "required" && have.is_array() && value.is_array()) {
      for (const SchemaJson& name : value) {
        if (std::find(have.begin(), have.end(), name) == have.end()) have.push_back(name);
      }
      return Status::Ok();
    }
    if (key == "type") {
      const std::set<std::string> a = type_set(have), b = type_set(value);
      SchemaJson both = SchemaJson::array();
      for (const std::string& t : a) {
        if (b.contains(t) || (t == "integer" && b.contains("number"))) both.push_back(t);
      }
      if (a.contains("number") && b.contains("integer") && !a.contains("integer")) {
        both.push_back("integer");
      }
      if (both.empty()) {
        return schema_error(path, "allOf: its parts' types ", have.dump(), " and ", value.dump(),
                            " have none in common");
      }
      have = std::move(both);
      return Status::Ok();
    }
    if (have.is_number() && value.is_number() && !have.is_boolean() &&
        (tighter_lower(key) || tighter_upper(key))) {
      const bool take = tighter_lower(key) ? value.get<double>() > have.get<double>()
                                           : value.get<double>() < have.get<double>();
      if (take) have = value;
      return Status::Ok();
    }
    return schema_error(path, "allOf: its parts give \"", key,
                        "\" different values, which do not merge: not supported");
  }

  std::function<Result<const SchemaJson*>(const SchemaJson&, const std::string&)> resolve_;
  std::function<Status(const std::string&, int)> depth_bound_;
  MergeState state_;
};

}  // namespace

Result<SchemaJson> JsonSchemaCompiler::merge_all_of(const SchemaJson& s, const std::string& path,
                                                    int depth) {
  AllOfMerge merge(
      [this](const SchemaJson& ref, const std::string& at) { return resolve(ref, at); },
      [this](const std::string& at, int d) { return depth_bound(at, d); });
  SchemaJson merged = SchemaJson::object();
  KVVM_RETURN_IF_ERROR(merge.part(merged, s, path, depth));
  KVVM_RETURN_IF_ERROR(merge.finish());
  return merged;
}

}  // namespace kvvm::grammar
