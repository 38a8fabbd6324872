#include "model/config/config_fields.h"

#include <cmath>
#include <limits>

namespace kvvm::model::detail {

JsonLimits config_limits() {
  JsonLimits limits;
  limits.max_bytes = std::size_t{16} << 20;
  return limits;
}

Scopes config_scopes(const nlohmann::json& parsed, const std::string& origin) {
  const nlohmann::json* inner = &parsed;
  std::string inner_where = origin;
  const auto text_config = parsed.find("text_config");
  if (!parsed.contains("num_hidden_layers") && text_config != parsed.end() &&
      text_config->is_object()) {
    inner = &*text_config;
    inner_where += " (under 'text_config')";
  }
  return Scopes{ConfigFields(*inner, inner_where), ConfigFields(parsed, origin)};
}

Result<std::optional<DType>> read_dtype(const Scopes& scopes, bool allow_fp8) {
  for (const ConfigFields* scope : {&scopes.inner, &scopes.top}) {
    for (const char* field : {"torch_dtype", "dtype"}) {
      const nlohmann::json* value = scope->find(field);
      if (value == nullptr) continue;
      const char* expected = allow_fp8
                                 ? "\"bfloat16\", \"float16\", \"float32\" or \"float8_e4m3fn\""
                                 : "\"bfloat16\", \"float16\" or \"float32\"";
      if (!value->is_string()) return scope->bad(field, *value, expected);
      Result<DType> dtype = parse_dtype(value->get<std::string>());
      if (!dtype.ok() || (*dtype == DType::kFp8 && !allow_fp8)) {
        return scope->bad(field, *value, expected);
      }
      return std::optional<DType>(*dtype);
    }
  }
  return std::optional<DType>();
}

const nlohmann::json* ConfigFields::find(const char* field) const {
  if (!object_.is_object()) return nullptr;
  const auto found = object_.find(field);
  if (found == object_.end() || found->is_null()) return nullptr;
  return &*found;
}

Status ConfigFields::bad(const char* field, const nlohmann::json& value,
                         const std::string& expected) const {
  return Status::InvalidArgument(where_ + ": field '" + name(field) + "' is " + show(value) +
                                 ", expected " + expected);
}

Status ConfigFields::missing(const char* field, const std::string& why) const {
  return Status::InvalidArgument(where_ + ": field '" + name(field) + "' is missing (" + why + ")");
}

Result<std::optional<std::uint32_t>> ConfigFields::whole(const char* field, std::uint32_t minimum,
                                                         std::uint32_t maximum) const {
  const nlohmann::json* value = find(field);
  if (value == nullptr) return std::optional<std::uint32_t>();
  // nlohmann stores every non-negative integer as unsigned: a negative number, a fraction
  // and a string all fail here.
  if (value->is_number_unsigned()) {
    const auto number = value->get<std::uint64_t>();
    if (number >= minimum && number <= maximum) {
      return std::optional<std::uint32_t>(static_cast<std::uint32_t>(number));
    }
  }
  return bad(
      field, *value,
      "a whole number in [" + std::to_string(minimum) + ", " + std::to_string(maximum) + "]");
}

Result<std::uint32_t> ConfigFields::required_whole(const char* field, std::uint32_t minimum,
                                                   std::uint32_t maximum) const {
  KVVM_ASSIGN_OR_RETURN(std::optional<std::uint32_t> value, whole(field, minimum, maximum));
  if (!value.has_value()) {
    return missing(field, "a whole number in [" + std::to_string(minimum) + ", " +
                              std::to_string(maximum) + "]");
  }
  return *value;
}

Result<std::optional<double>> ConfigFields::positive(const char* field,
                                                     std::optional<double> below) const {
  const nlohmann::json* value = find(field);
  if (value == nullptr) return std::optional<double>();
  if (value->is_number()) {
    const double number = value->get<double>();
    if (std::isfinite(number) && number > 0 && (!below || number < *below)) {
      return std::optional<double>(number);
    }
  }
  std::string expected = "a number > 0";
  if (below) expected += " and < " + show(nlohmann::json(*below));
  return bad(field, *value, expected);
}

Result<std::optional<bool>> ConfigFields::boolean(const char* field) const {
  const nlohmann::json* value = find(field);
  if (value == nullptr) return std::optional<bool>();
  if (!value->is_boolean()) return bad(field, *value, "true or false");
  return std::optional<bool>(value->get<bool>());
}

Result<std::optional<std::string>> ConfigFields::string(const char* field) const {
  const nlohmann::json* value = find(field);
  if (value == nullptr) return std::optional<std::string>();
  if (!value->is_string()) return bad(field, *value, "a string");
  return std::optional<std::string>(value->get<std::string>());
}

Result<std::optional<std::vector<std::int32_t>>> ConfigFields::token_ids(
    const char* field, std::uint32_t vocab_size) const {
  const nlohmann::json* value = find(field);
  if (value == nullptr) return std::optional<std::vector<std::int32_t>>();
  const std::string expected = "a token id or a list of token ids, each in [0, " +
                               std::to_string(vocab_size) + ") (the vocabulary)";
  const auto is_id = [&](const nlohmann::json& id) {
    return id.is_number_integer() && id.get<std::int64_t>() >= 0 &&
           id.get<std::int64_t>() < static_cast<std::int64_t>(vocab_size);
  };
  std::vector<std::int32_t> ids;
  if (value->is_array()) {
    for (const nlohmann::json& id : *value) {
      if (!is_id(id)) return bad(field, *value, expected);
      ids.push_back(static_cast<std::int32_t>(id.get<std::int64_t>()));
    }
  } else if (is_id(*value)) {
    ids.push_back(static_cast<std::int32_t>(value->get<std::int64_t>()));
  } else {
    return bad(field, *value, expected);
  }
  return std::optional<std::vector<std::int32_t>>(std::move(ids));
}

}  // namespace kvvm::model::detail
