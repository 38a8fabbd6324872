// RoPE settings of a config.json, in the form transformers v5 writes (`rope_parameters`) and
// the form earlier releases wrote (`rope_theta` beside `rope_scaling`). When a file carries
// both, what the older form states must agree with the newer one: two forms that disagree
// leave the frequencies to a guess.
#include <cmath>
#include <string>

#include "model/config/config_fields.h"

namespace kvvm::model::detail {
namespace {

constexpr double kDefaultTheta = 10000.0;
constexpr std::uint32_t kMaxOriginalPositions = 1u << 24;

const char* scaling_name(RopeScaling scaling) {
  switch (scaling) {
    case RopeScaling::kNone:
      return "default";
    case RopeScaling::kLinear:
      return "linear";
    case RopeScaling::kLlama3:
      return "llama3";
  }
  return "unknown";
}

// Reads a required positive number of `fields` into `out`.
Status required_positive(const ConfigFields& fields, const char* field, const char* why,
                         double& out) {
  KVVM_ASSIGN_OR_RETURN(std::optional<double> value, fields.positive(field));
  if (!value.has_value()) return fields.missing(field, why);
  out = *value;
  return Status::Ok();
}

// The scaling named by `type` with its parameters, read from `fields` (the rope_scaling or
// rope_parameters object).
Status read_scaling(const ConfigFields& fields, const char* type_field, const std::string& type,
                    RopeConfig& rope) {
  if (type == "default") {
    rope.scaling = RopeScaling::kNone;
    return Status::Ok();
  }
  if (type == "linear") {
    rope.scaling = RopeScaling::kLinear;
    return required_positive(fields, "factor", "linear RoPE scaling divides positions by it",
                             rope.factor);
  }
  if (type == "llama3") {
    rope.scaling = RopeScaling::kLlama3;
    const char* why =
        "llama3 RoPE scaling needs factor, low_freq_factor, high_freq_factor and "
        "original_max_position_embeddings";
    KVVM_RETURN_IF_ERROR(required_positive(fields, "factor", why, rope.factor));
    KVVM_RETURN_IF_ERROR(required_positive(fields, "low_freq_factor", why, rope.low_freq_factor));
    KVVM_RETURN_IF_ERROR(required_positive(fields, "high_freq_factor", why, rope.high_freq_factor));
    // The smoothing between the two bands divides by their difference.
    if (rope.high_freq_factor <= rope.low_freq_factor) {
      return fields.bad(
          "high_freq_factor", *fields.find("high_freq_factor"),
          "a number above low_freq_factor " + show(nlohmann::json(rope.low_freq_factor)));
    }
    KVVM_ASSIGN_OR_RETURN(
        std::uint32_t original,
        fields.required_whole("original_max_position_embeddings", 1, kMaxOriginalPositions));
    rope.original_max_position = original;
    return Status::Ok();
  }
  return Status::InvalidArgument(
      fields.where() + ": RoPE scaling '" + fields.name(type_field) + "' is \"" + type +
      "\", which this runtime does not implement (supported: default, linear, llama3); "
      "ignoring it would change the model's outputs");
}

// The type of a rope_scaling / rope_parameters object: "rope_type", or the older "type".
Result<std::string> scaling_type(const ConfigFields& fields, const char*& type_field) {
  for (const char* field : {"rope_type", "type"}) {
    KVVM_ASSIGN_OR_RETURN(std::optional<std::string> type, fields.string(field));
    if (type.has_value()) {
      type_field = field;
      return *type;
    }
  }
  return fields.missing("rope_type", "the kind of RoPE scaling: default, linear or llama3");
}

// The older form: rope_theta and rope_scaling at the config's top level.
Result<RopeConfig> parse_legacy(const ConfigFields& fields) {
  RopeConfig rope;
  KVVM_ASSIGN_OR_RETURN(std::optional<double> theta, fields.positive("rope_theta"));
  rope.theta = theta.value_or(kDefaultTheta);
  const nlohmann::json* scaling = fields.find("rope_scaling");
  if (scaling == nullptr) return rope;
  if (!scaling->is_object()) {
    return fields.bad("rope_scaling", *scaling,
                      "an object such as {\"rope_type\": \"llama3\", ...}");
  }
  const ConfigFields scaling_fields(*scaling, fields.where(), "rope_scaling.");
  const char* type_field = "rope_type";
  KVVM_ASSIGN_OR_RETURN(std::string type, scaling_type(scaling_fields, type_field));
  KVVM_RETURN_IF_ERROR(read_scaling(scaling_fields, type_field, type, rope));
  return rope;
}

// transformers v5: rope_parameters {rope_type, rope_theta, factor, ...}.
Result<RopeConfig> parse_parameters(const ConfigFields& fields, const nlohmann::json& parameters) {
  if (!parameters.is_object()) {
    return fields.bad("rope_parameters", parameters,
                      "an object such as {\"rope_type\": \"default\", \"rope_theta\": 10000.0}");
  }
  const ConfigFields parameter_fields(parameters, fields.where(), "rope_parameters.");
  // Models with several attention kinds keep one set per kind ({"full_attention": {...}});
  // the families run here have one.
  for (const auto& [key, value] : parameters.items()) {
    if (value.is_object()) {
      return Status::InvalidArgument(
          fields.where() + ": field 'rope_parameters." + key +
          "' is an object: RoPE parameters per attention kind are not supported by this "
          "runtime (Llama, Qwen2 and Mistral have one set)");
    }
  }
  RopeConfig rope;
  KVVM_ASSIGN_OR_RETURN(std::optional<double> theta, parameter_fields.positive("rope_theta"));
  if (theta.has_value()) {
    rope.theta = *theta;
  } else {
    KVVM_ASSIGN_OR_RETURN(std::optional<double> top_theta, fields.positive("rope_theta"));
    rope.theta = top_theta.value_or(kDefaultTheta);
  }
  const char* type_field = "rope_type";
  KVVM_ASSIGN_OR_RETURN(std::optional<std::string> type, parameter_fields.string("rope_type"));
  std::string type_name = type.value_or("default");
  if (!type.has_value()) {
    KVVM_ASSIGN_OR_RETURN(std::optional<std::string> old_type, parameter_fields.string("type"));
    if (old_type.has_value()) {
      type_field = "type";
      type_name = *old_type;
    }
  }
  KVVM_RETURN_IF_ERROR(read_scaling(parameter_fields, type_field, type_name, rope));
  return rope;
}

bool same(double a, double b) { return std::fabs(a - b) <= 1e-9 * std::fmax(1.0, std::fabs(a)); }

std::string describe(const RopeConfig& rope) {
  std::string text =
      "theta " + show(nlohmann::json(rope.theta)) + ", " + scaling_name(rope.scaling);
  if (rope.scaling != RopeScaling::kNone) text += " factor " + show(nlohmann::json(rope.factor));
  if (rope.scaling == RopeScaling::kLlama3) {
    text += " low_freq_factor " + show(nlohmann::json(rope.low_freq_factor)) +
            " high_freq_factor " + show(nlohmann::json(rope.high_freq_factor)) +
            " original_max_position_embeddings " + std::to_string(rope.original_max_position);
  }
  return text;
}

}  // namespace

Result<RopeConfig> parse_rope(const ConfigFields& fields) {
  const nlohmann::json* parameters = fields.find("rope_parameters");
  if (parameters == nullptr) return parse_legacy(fields);
  KVVM_ASSIGN_OR_RETURN(RopeConfig rope, parse_parameters(fields, *parameters));
  if (!fields.has("rope_theta") && !fields.has("rope_scaling")) return rope;

  KVVM_ASSIGN_OR_RETURN(RopeConfig legacy, parse_legacy(fields));
  bool agree = !fields.has("rope_theta") || same(legacy.theta, rope.theta);
  if (fields.has("rope_scaling")) {
    agree = agree && legacy.scaling == rope.scaling;
    if (agree && rope.scaling != RopeScaling::kNone) agree = same(legacy.factor, rope.factor);
    if (agree && rope.scaling == RopeScaling::kLlama3) {
      agree = same(legacy.low_freq_factor, rope.low_freq_factor) &&
              same(legacy.high_freq_factor, rope.high_freq_factor) &&
              legacy.original_max_position == rope.original_max_position;
    }
  }
  if (!agree) {
    return Status::InvalidArgument(fields.where() + ": 'rope_parameters' (" + describe(rope) +
                                   ") and 'rope_theta' / 'rope_scaling' (" + describe(legacy) +
                                   ") disagree");
  }
  return rope;
}

}  // namespace kvvm::model::detail
