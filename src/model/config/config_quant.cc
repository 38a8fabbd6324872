// config.json's quantization_config read into ModelConfig::weight_quant: the two FP8 formats
// this runtime runs, Hugging Face's block-scaled "fp8" and compressed-tensors' FP8-dynamic.
//
// Why so strict: a quantized checkpoint read with the wrong scheme (another block size, static
// activation scales, a projection left in 16 bits) computes different numbers without failing,
// so every field that decides how the projections are stored or computed must say what this
// runtime implements, and anything else is refused naming the field and its value. Fields that
// change nothing here (transformers' `dequantize` load option, bookkeeping such as `version`)
// are not read.
#include <algorithm>
#include <cctype>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kvvm/model/config.h"
#include "model/config/config_fields.h"

namespace kvvm::model {

std::string_view to_string(WeightQuant quant) {
  switch (quant) {
    case WeightQuant::kNone:
      return "none";
    case WeightQuant::kFp8Block:
      return "fp8-block128";
    case WeightQuant::kFp8Channel:
      return "fp8-channel";
  }
  return "unknown";
}

namespace detail {
namespace {

// The modules kvvm keeps quantized in every layer: a list that leaves one of them in 16 bits
// is refused (the embedding, lm_head and the norms are never quantized, so naming them is fine).
constexpr const char* kProjections[] = {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                                        "self_attn.o_proj", "mlp.gate_proj",    "mlp.up_proj",
                                        "mlp.down_proj"};

// How a list entry names modules.
enum class ListRules {
  // transformers' should_convert_module: the entry as a regular expression matching at the
  // start of the module's name, or the name ending with the entry.
  kTransformers,
  // compressed-tensors' is_match: "re:" then a regular expression matching at the start, else
  // the module's exact name or a class it is an instance of (a projection is a Linear, a Module).
  kCompressedTensors,
};

// Bounds on a list: real ones name a few hundred modules of a few dozen characters.
constexpr std::size_t kMaxListEntries = 4096;
constexpr std::size_t kMaxEntryChars = 256;

// The regular expressions module lists use, matched without backtracking (so a hostile
// pattern cannot take exponential time): characters, '.', escapes (\. \d \w \s), classes
// ([0-9], [^a]), each optionally followed by '*', '+' or '?', and '^' / '$' at the ends.
// Groups, alternation and counted repetition are refused.
class ModulePattern {
 public:
  // InvalidArgument saying what is not read.
  static Result<ModulePattern> parse(std::string_view text) {
    ModulePattern pattern;
    std::size_t i = text.starts_with('^') ? 1 : 0;
    while (i < text.size()) {
      const char c = text[i];
      if (c == '$' && i + 1 == text.size()) {
        pattern.to_end_ = true;
        break;
      }
      Atom atom;
      if (c == '.') {
        atom.any = true;
      } else if (c == '\\') {
        if (++i == text.size()) return Status::InvalidArgument("it ends in a lone '\\'");
        atom = escaped(text[i]);
      } else if (c == '[') {
        const std::size_t end = text.find(']', i + 2);
        if (end == std::string_view::npos) return Status::InvalidArgument("a '[' is not closed");
        std::string_view body = text.substr(i + 1, end - i - 1);
        if (body.starts_with('^')) {
          atom.negated = true;
          body.remove_prefix(1);
        }
        for (std::size_t k = 0; k < body.size(); ++k) {
          const bool range = k + 2 < body.size() && body[k + 1] == '-';
          atom.ranges.emplace_back(body[k], range ? body[k + 2] : body[k]);
          if (range) k += 2;
        }
        i = end;
      } else if (std::string_view("()|{}*+?^$").find(c) != std::string_view::npos) {
        return Status::InvalidArgument(std::string("its '") + c +
                                       "': groups, alternation and counted repetition are not "
                                       "read");
      } else {
        atom.ranges.emplace_back(c, c);
      }
      ++i;
      const char quantifier = i < text.size() ? text[i] : '\0';
      if (quantifier == '*' || quantifier == '?') {
        atom.repeat = quantifier == '*';
        atom.optional = true;
        ++i;
      } else if (quantifier == '+') {
        pattern.atoms_.push_back(atom);  // one, then any more
        atom.repeat = atom.optional = true;
        ++i;
      }
      pattern.atoms_.push_back(std::move(atom));
    }
    return pattern;
  }

  // Whether the pattern matches at the start of `name` (to its end with a final '$').
  bool matches(std::string_view name) const {
    const std::size_t n = name.size();
    // reached[j]: the atoms so far can consume exactly name[0, j).
    std::vector<char> reached(n + 1, 0), next(n + 1, 0);
    reached[0] = 1;
    for (const Atom& atom : atoms_) {
      for (std::size_t j = 0; j <= n; ++j) next[j] = atom.optional && reached[j];
      // In increasing j, so a repeated atom's next[j] already holds its earlier repeats.
      for (std::size_t j = 0; j < n; ++j) {
        if ((reached[j] || (atom.repeat && next[j])) && atom.takes(name[j])) next[j + 1] = 1;
      }
      reached.swap(next);
    }
    if (to_end_) return reached[n] != 0;
    return std::find(reached.begin(), reached.end(), 1) != reached.end();
  }

 private:
  struct Atom {
    bool any = false;
    bool negated = false;
    std::vector<std::pair<char, char>> ranges;
    bool optional = false;  // '?' or '*'
    bool repeat = false;    // '*'
    bool takes(char c) const {
      if (any) return true;
      bool in = false;
      for (const auto& [low, high] : ranges) in = in || (c >= low && c <= high);
      return in != negated;
    }
  };

  static Atom escaped(char c) {
    Atom atom;
    if (c == 'd') {
      atom.ranges = {{'0', '9'}};
    } else if (c == 'w') {
      atom.ranges = {{'a', 'z'}, {'A', 'Z'}, {'0', '9'}, {'_', '_'}};
    } else if (c == 's') {
      atom.ranges = {{' ', ' '}, {'\t', '\r'}};
    } else {
      atom.ranges = {{c, c}};
    }
    return atom;
  }

  std::vector<Atom> atoms_;
  bool to_end_ = false;
};

// Layer `l`'s quantized projections, after "model.layers.L.": the attention's, then the dense
// MLP's, or in a mixture's sparse layer every expert's (as the checkpoint names them; its router
// and shared-expert gate are never quantized, so listing them is fine).
std::vector<std::string> quantized_projections(const ModelConfig& config, std::uint32_t l) {
  std::vector<std::string> out(std::begin(kProjections), std::begin(kProjections) + 4);
  const MoeConfig& moe = config.moe;
  if (!moe.enabled() || !moe.sparse_layer(l)) {
    out.insert(out.end(), std::begin(kProjections) + 4, std::end(kProjections));
    return out;
  }
  static constexpr const char* kQwenExpert[] = {"gate_proj", "up_proj", "down_proj"};
  static constexpr const char* kMixtralExpert[] = {"w1", "w3", "w2"};
  const bool mixtral = moe.naming == ExpertNaming::kMixtral;
  for (std::uint32_t e = 0; e < moe.experts; ++e) {
    const std::string expert =
        (mixtral ? "block_sparse_moe.experts." : "mlp.experts.") + std::to_string(e) + ".";
    for (const char* projection : mixtral ? kMixtralExpert : kQwenExpert) {
      out.push_back(expert + projection);
    }
  }
  if (moe.shared_intermediate > 0) {
    for (const char* projection : kQwenExpert) {
      out.push_back(std::string("mlp.shared_expert.") + projection);
    }
  }
  return out;
}

// The first projection module of `config`'s layers that `entry` names, or empty.
Result<std::string> projection_named(const std::string& entry, ListRules rules,
                                     const ModelConfig& config) {
  std::string_view pattern;
  bool literal = false;
  if (rules == ListRules::kCompressedTensors) {
    if (entry == "Linear" || entry == "Module") return std::string("every Linear module");
    literal = !entry.starts_with("re:");
    if (!literal) pattern = std::string_view(entry).substr(3);
  } else {
    pattern = entry;
  }
  KVVM_ASSIGN_OR_RETURN(ModulePattern expression, ModulePattern::parse(literal ? "" : pattern));
  for (std::uint32_t l = 0; l < config.layers; ++l) {
    for (const std::string& projection : quantized_projections(config, l)) {
      const std::string name = "model.layers." + std::to_string(l) + "." + projection;
      const bool named = literal ? name == entry
                                 : expression.matches(name) ||
                                       (rules == ListRules::kTransformers && name.ends_with(entry));
      if (named) return name;
    }
  }
  return std::string();
}

// A list of modules left unquantized (`field` of `fields`), absent or naming none of the
// projections.
Status check_unquantized(const ConfigFields& fields, const char* field, ListRules rules,
                         const ModelConfig& config) {
  const nlohmann::json* list = fields.find(field);
  if (list == nullptr) return Status::Ok();
  if (!list->is_array() || list->size() > kMaxListEntries) {
    return fields.bad(field, *list,
                      "a list of at most " + std::to_string(kMaxListEntries) + " module names");
  }
  for (std::size_t i = 0; i < list->size(); ++i) {
    const nlohmann::json& entry = (*list)[i];
    const std::string at = std::string(field) + "[" + std::to_string(i) + "]";
    if (!entry.is_string() || entry.get_ref<const std::string&>().size() > kMaxEntryChars) {
      return fields.bad(
          at.c_str(), entry,
          "a module name of at most " + std::to_string(kMaxEntryChars) + " characters");
    }
    Result<std::string> named = projection_named(entry.get<std::string>(), rules, config);
    if (!named.ok()) {
      return fields.bad(at.c_str(), entry,
                        "a module name or a regular expression this runtime reads (" +
                            named.status().message() + ")");
    }
    if (!named->empty()) {
      return Status::InvalidArgument(
          fields.where() + ": field '" + fields.name(at.c_str()) + "' is " + show(entry) +
          ", which leaves " + *named +
          " unquantized; this runtime reads every layer's q, k, v, o, gate, up and down "
          "projections quantized (lm_head and the embedding may be listed)");
    }
  }
  return Status::Ok();
}

// `field` a string equal (ignoring case when `any_case`) to `want`, or absent when `optional`.
Status expect_string(const ConfigFields& fields, const char* field, std::string_view want,
                     bool optional, const std::string& why, bool any_case = false) {
  const nlohmann::json* value = fields.find(field);
  const std::string expected = "\"" + std::string(want) + "\"" + why;
  if (value == nullptr) {
    return optional ? Status::Ok() : fields.missing(field, "expected " + expected);
  }
  if (!value->is_string()) return fields.bad(field, *value, expected);
  std::string text = value->get<std::string>();
  if (any_case) {
    for (char& c : text) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  }
  if (text != want) return fields.bad(field, *value, expected);
  return Status::Ok();
}

// `field` absent, null or equal to `want` (a boolean or a number).
Status expect_value(const ConfigFields& fields, const char* field, const nlohmann::json& want,
                    bool optional, const std::string& why) {
  const nlohmann::json* value = fields.find(field);
  const std::string expected = show(want) + why;
  if (value == nullptr) {
    return optional ? Status::Ok() : fields.missing(field, "expected " + expected);
  }
  if (*value != want) return fields.bad(field, *value, expected);
  return Status::Ok();
}

// `field` absent or null.
Status expect_absent(const ConfigFields& fields, const char* field, const std::string& why) {
  const nlohmann::json* value = fields.find(field);
  if (value != nullptr) return fields.bad(field, *value, "null" + why);
  return Status::Ok();
}

Status read_fp8_block(const ConfigFields& q, const ModelConfig& config) {
  // transformers' defaults stand for absent fields: dynamic activations, 128 x 128 blocks.
  KVVM_RETURN_IF_ERROR(
      expect_string(q, "activation_scheme", "dynamic", true,
                    " (activations quantized per token and group of 128 as each GEMM runs; static "
                    "activation scales are not implemented by this runtime)",
                    /*any_case=*/true));
  // An explicit null means one scale for the whole matrix, not the default.
  const auto block = q.object().find("weight_block_size");
  if (block != q.object().end()) {
    if (*block != nlohmann::json::array({kFp8WeightBlock, kFp8WeightBlock})) {
      return q.bad("weight_block_size", *block,
                   "[128, 128] (the block this runtime's FP8 GEMMs scale by)");
    }
  }
  KVVM_RETURN_IF_ERROR(expect_string(
      q, "scale_fmt", "float", true,
      " (float32 or bfloat16 scales; power-of-two ue8m0 scales are not implemented)"));
  KVVM_RETURN_IF_ERROR(
      check_unquantized(q, "modules_to_not_convert", ListRules::kTransformers, config));
  return check_unquantized(q, "ignored_layers", ListRules::kTransformers, config);
}

// One side of a compressed-tensors scheme (`weights`, `input_activations`): 8-bit symmetric
// float with `strategy` and `dynamic`.
Status read_fp8_args(const ConfigFields& group, const char* field, const char* strategy,
                     bool dynamic, const std::string& what) {
  const nlohmann::json* args = group.find(field);
  if (args == nullptr) {
    return group.missing(field, what + ": num_bits 8, type \"float\", strategy \"" + strategy +
                                    "\", dynamic " + (dynamic ? "true" : "false"));
  }
  if (!args->is_object()) return group.bad(field, *args, "an object (" + what + ")");
  const ConfigFields fields(*args, group.where(), group.name(field) + ".");
  KVVM_RETURN_IF_ERROR(expect_value(fields, "num_bits", 8, false, " (FP8 e4m3)"));
  KVVM_RETURN_IF_ERROR(expect_string(fields, "type", "float", false, " (FP8 e4m3)"));
  // Before the strategy: a static scheme is named as such, whatever its granularity.
  KVVM_RETURN_IF_ERROR(expect_value(
      fields, "dynamic", dynamic, !dynamic,
      dynamic ? " (scales computed per token as each GEMM runs; static input scales are not "
                "implemented by this runtime)"
              : " (scales stored in the checkpoint)"));
  KVVM_RETURN_IF_ERROR(
      expect_string(fields, "strategy", strategy, false, std::string(" (") + what + ")"));
  KVVM_RETURN_IF_ERROR(expect_value(fields, "symmetric", true, true, " (no zero point)"));
  KVVM_RETURN_IF_ERROR(expect_absent(fields, "group_size", std::string(" (") + what + ")"));
  return expect_absent(fields, "block_structure", std::string(" (") + what + ")");
}

Status read_fp8_channel(const ConfigFields& q, const ModelConfig& config) {
  KVVM_RETURN_IF_ERROR(expect_string(q, "format", "float-quantized", true,
                                     " (FP8 weights stored as e4m3 with their scales)"));
  KVVM_RETURN_IF_ERROR(expect_string(q, "quantization_status", "compressed", true,
                                     " (the projections stored quantized)"));
  const nlohmann::json* groups = q.find("config_groups");
  if (groups == nullptr) {
    return q.missing("config_groups", "one scheme: FP8-dynamic for the Linear modules");
  }
  if (!groups->is_object() || groups->empty()) {
    return q.bad("config_groups", *groups, "an object of schemes, such as {\"group_0\": {...}}");
  }
  for (const auto& [key, scheme] : groups->items()) {
    const std::string name = "config_groups." + key;
    if (!scheme.is_object()) return q.bad(name.c_str(), scheme, "an object (a scheme)");
    const ConfigFields group(scheme, q.where(), q.name(name.c_str()) + ".");
    KVVM_RETURN_IF_ERROR(
        read_fp8_args(group, "weights", "channel", false, "one float scale per output channel"));
    KVVM_RETURN_IF_ERROR(read_fp8_args(group, "input_activations", "token", true,
                                       "activations quantized per token"));
    KVVM_RETURN_IF_ERROR(
        expect_absent(group, "output_activations", " (output quantization is not implemented)"));
    KVVM_RETURN_IF_ERROR(expect_string(group, "format", "float-quantized", true,
                                       " (FP8 weights stored as e4m3 with their scales)"));
    const nlohmann::json* targets = group.find("targets");
    if (targets != nullptr && !targets->is_array()) {
      return group.bad("targets", *targets, "a list of module names or classes");
    }
  }
  // Sparse storage and rotations change what the tensors hold.
  if (const nlohmann::json* sparsity = q.find("sparsity_config")) {
    const ConfigFields fields(*sparsity, q.where(), q.name("sparsity_config") + ".");
    if (!sparsity->is_object()) return q.bad("sparsity_config", *sparsity, "null");
    if (!sparsity->empty()) {
      KVVM_RETURN_IF_ERROR(
          expect_string(fields, "format", "dense", false, " (sparse storage is not implemented)"));
    }
  }
  KVVM_RETURN_IF_ERROR(
      expect_absent(q, "transform_config", " (weight transforms are not implemented)"));
  return check_unquantized(q, "ignore", ListRules::kCompressedTensors, config);
}

}  // namespace

Result<WeightQuant> parse_quantization(const Scopes& scopes, const ModelConfig& config) {
  const ConfigFields& scope = scopes.holding("quantization_config");
  const nlohmann::json* object = scope.find("quantization_config");
  if (object == nullptr) return WeightQuant::kNone;
  if (!object->is_object()) {
    return scope.bad("quantization_config", *object, "an object such as {\"quant_method\": ...}");
  }
  const ConfigFields q(*object, scope.where(), "quantization_config.");
  const nlohmann::json* method = q.find("quant_method");
  const std::string expected =
      "\"fp8\" (Hugging Face's 128 x 128 block FP8) or \"compressed-tensors\" (FP8-dynamic)";
  if (method == nullptr) return q.missing("quant_method", "expected " + expected);
  if (*method == "fp8") {
    KVVM_RETURN_IF_ERROR(read_fp8_block(q, config));
    return WeightQuant::kFp8Block;
  }
  if (*method == "compressed-tensors") {
    KVVM_RETURN_IF_ERROR(read_fp8_channel(q, config));
    return WeightQuant::kFp8Channel;
  }
  return q.bad("quant_method", *method, expected);
}

}  // namespace detail
}  // namespace kvvm::model
