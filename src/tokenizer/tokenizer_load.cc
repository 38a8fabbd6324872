// Tokenizer::load / parse: tokenizer.json (and the flags of the tokenizer_config.json beside
// it) into the parts of Tokenizer::Impl, refusing by name what this implementation does not do
// rather than encoding differently from the reference.
//
// Time: a 9 MB file (150,000 tokens and as many merges) is read into nlohmann's DOM by
// read_json, the vocabulary moved into a flat table and the merges' strings moved (not copied)
// out of the DOM; docs/PERFORMANCE.md ("Tokenizer load") has the figures and `kvvm bench
// tokenizer-load` shows where the time goes.
#include <chrono>
#include <filesystem>
#include <fstream>
#include <system_error>

#include "base/json_reader.h"
#include "tokenizer/load_profile.h"
#include "tokenizer/tokenizer_config.h"
#include "tokenizer/tokenizer_impl.h"
#include "tokenizer/tokenizer_json.h"

namespace kvvm::tokenizer {
namespace {

using detail::field_error;
using detail::find_member;
using detail::Json;

// The time since the last call (ms), for the profile.
class Stopwatch {
 public:
  double lap() {
    const auto now = std::chrono::steady_clock::now();
    const double ms = std::chrono::duration<double, std::milli>(now - last_).count();
    last_ = now;
    return ms;
  }

 private:
  std::chrono::steady_clock::time_point last_ = std::chrono::steady_clock::now();
};

Result<detail::AddedToken> parse_added_token(const Json& entry, const std::string& where) {
  KVVM_RETURN_IF_ERROR(detail::expect_object(entry, where));
  detail::AddedToken token;
  const Json* id = find_member(entry, "id");
  if (id == nullptr || !id->is_number_integer() || id->get<std::int64_t>() < 0 ||
      id->get<std::int64_t>() > detail::kMaxTokenId) {
    return field_error(detail::member_path(where, "id"),
                       (id == nullptr ? std::string("missing") : detail::json_kind(*id)) +
                           ", expected an integer in [0, " + std::to_string(detail::kMaxTokenId) +
                           "]");
  }
  token.id = static_cast<TokenId>(id->get<std::int64_t>());
  KVVM_ASSIGN_OR_RETURN(std::string content, detail::string_member(entry, "content", where));
  token.content = std::move(content);
  for (auto [key, field] : {std::pair{"special", &token.special},
                            {"single_word", &token.single_word},
                            {"lstrip", &token.lstrip},
                            {"rstrip", &token.rstrip},
                            {"normalized", &token.normalized}}) {
    // Hugging Face's default: a non-special token is normalised, a special one is not.
    const bool fallback = std::string_view(key) == "normalized" ? !token.special : false;
    KVVM_ASSIGN_OR_RETURN(bool value, detail::bool_member(entry, key, fallback, where));
    *field = value;
  }
  return token;
}

// Records `spelling` (which must outlive the tokenizer's tables) as the token of `id`.
void record(detail::TokenizerParts& impl, TokenId id, std::string_view spelling, bool special) {
  const auto index = static_cast<std::size_t>(id);
  if (index >= impl.tokens.size()) impl.tokens.resize(index + 1);
  detail::TokenInfo& token = impl.tokens[index];
  token.spelling = spelling;
  token.bytes_offset = static_cast<std::uint32_t>(impl.pool.size());
  impl.decoder.append_token_bytes(spelling, false, impl.pool);
  token.bytes_length = static_cast<std::uint32_t>(impl.pool.size() - token.bytes_offset);
  token.known = true;
  token.special = special;
}

Status parse_added_tokens(const Json& document, detail::TokenizerParts& impl) {
  const Json* list = find_member(document, "added_tokens");
  if (list == nullptr) return Status::Ok();
  KVVM_RETURN_IF_ERROR(detail::expect_array(*list, "added_tokens"));
  for (std::size_t i = 0; i < list->size(); ++i) {
    const std::string where = detail::element_path("added_tokens", i);
    KVVM_ASSIGN_OR_RETURN(detail::AddedToken token, parse_added_token((*list)[i], where));
    const TokenId in_vocab = impl.model->vocab().find(token.content);
    if (in_vocab >= 0 && in_vocab != token.id) {
      return field_error(where, "'" + token.content + "' has id " + std::to_string(token.id) +
                                    " but the vocab gives it id " + std::to_string(in_vocab));
    }
    const auto index = static_cast<std::size_t>(token.id);
    if (in_vocab < 0 && index < impl.tokens.size() && impl.tokens[index].known &&
        impl.tokens[index].spelling != token.content) {
      return field_error(where, "id " + std::to_string(token.id) + " of '" + token.content +
                                    "' is already the id of '" +
                                    std::string(impl.tokens[index].spelling) + "'");
    }
    record(impl, token.id, impl.added_contents.emplace_back(token.content), token.special);
    impl.added_ids.emplace(token.content, token.id);
    if (token.normalized && impl.normalizer) {
      impl.normalized_added.add(token, impl.normalizer->normalize(token.content));
    } else if (token.normalized) {
      impl.normalized_added.add(token, token.content);
    } else {
      impl.raw_added.add(token, token.content);
    }
  }
  return Status::Ok();
}

// Truncation and padding change what encode returns; a file that sets them is refused.
Status refuse_set(const Json& document, std::string_view key) {
  const Json* value = find_member(document, key);
  if (value == nullptr) return Status::Ok();
  return field_error(key, detail::json_kind(*value) + " is not implemented (null expected)");
}

Status parse_document(const Json& document, detail::BpeLists lists, detail::TokenizerParts& impl,
                      detail::LoadProfile& profile, Stopwatch& watch) {
  KVVM_RETURN_IF_ERROR(detail::expect_object(document, "the document"));
  KVVM_RETURN_IF_ERROR(refuse_set(document, "truncation"));
  KVVM_RETURN_IF_ERROR(refuse_set(document, "padding"));

  const Json* model = find_member(document, "model");
  if (model == nullptr) return field_error("model", "missing");
  KVVM_RETURN_IF_ERROR(detail::expect_object(*model, "model"));
  // Files from before the "type" tag hold a BPE whenever they hold merges.
  const Json* type = find_member(*model, "type");
  if (type != nullptr && (!type->is_string() || type->get_ref<const std::string&>() != "BPE")) {
    return field_error("model.type",
                       detail::json_kind(*type) + " is not implemented (BPE is: BPE models only)");
  }
  KVVM_ASSIGN_OR_RETURN(std::unique_ptr<detail::Bpe> bpe,
                        detail::Bpe::build(*model, std::move(lists), "model"));
  impl.model = std::move(bpe);
  profile.model_ms = watch.lap();

  const Json null;
  const auto member = [&](std::string_view key) -> const Json& {
    const Json* value = find_member(document, key);
    return value == nullptr ? null : *value;
  };
  KVVM_ASSIGN_OR_RETURN(std::unique_ptr<detail::Normalizer> normalizer,
                        detail::parse_normalizer(member("normalizer"), "normalizer"));
  impl.normalizer = std::move(normalizer);
  KVVM_ASSIGN_OR_RETURN(std::unique_ptr<detail::PreTokenizer> pre_tokenizer,
                        detail::parse_pre_tokenizer(member("pre_tokenizer"), "pre_tokenizer"));
  impl.pre_tokenizer = std::move(pre_tokenizer);
  KVVM_ASSIGN_OR_RETURN(detail::Decoder decoder,
                        detail::Decoder::parse(member("decoder"), "decoder"));
  impl.decoder = std::move(decoder);
  profile.components_ms = watch.lap();

  // Sized once: growing a 150,000-entry table or its pool copies it all again.
  const detail::TokenTable& vocab = impl.model->vocab();
  const Json* added = find_member(document, "added_tokens");
  const std::size_t added_count = added != nullptr && added->is_array() ? added->size() : 0;
  impl.tokens.reserve(vocab.size() + added_count);
  impl.pool.reserve(vocab.bytes() + vocab.size() + 64 * added_count);
  vocab.for_each([&](std::string_view token, TokenId id) { record(impl, id, token, false); });
  profile.tables_ms = watch.lap();

  KVVM_RETURN_IF_ERROR(parse_added_tokens(document, impl));
  KVVM_ASSIGN_OR_RETURN(detail::PostProcessor post,
                        detail::parse_post_processor(member("post_processor"), "post_processor"));
  for (const auto* side : {&post.prefix, &post.suffix}) {
    for (const TokenId id : *side) {
      if (static_cast<std::size_t>(id) >= impl.tokens.size() ||
          !impl.tokens[static_cast<std::size_t>(id)].known) {
        return field_error("post_processor", "adds token id " + std::to_string(id) +
                                                 ", which neither the vocab nor the added "
                                                 "tokens hold");
      }
    }
  }
  impl.post_processor = std::move(post);
  profile.added_ms = watch.lap();
  return Status::Ok();
}

// Fills `impl` from tokenizer.json's text; messages start with `origin` when not empty.
Status build(std::string_view text, std::string_view origin, detail::TokenizerParts& impl,
             detail::LoadProfile& profile, Stopwatch& watch) {
  const std::string label = origin.empty() ? std::string() : std::string(origin) + ": ";
  if (text.size() > kDefaultJsonMaxBytes) {
    return Status::InvalidArgument(label + std::to_string(text.size()) +
                                   " bytes, over the limit of " +
                                   std::to_string(kDefaultJsonMaxBytes) + " bytes");
  }
  Json document;
  detail::BpeLists lists;
  KVVM_RETURN_IF_ERROR(detail::read_tokenizer_json(text, origin, document, lists, &profile.vocab_ms,
                                                   &profile.merges_ms));
  profile.json_ms = watch.lap();
  const Status status = parse_document(document, std::move(lists), impl, profile, watch);
  return origin.empty() ? status : status.with_context(origin);
}

// Applies the flags of a tokenizer_config.json's text (empty: none), named `origin`.
Status apply_config(std::string_view config, std::string_view origin,
                    detail::TokenizerParts& impl) {
  if (config.empty()) return Status::Ok();
  KVVM_ASSIGN_OR_RETURN(Json document, read_json(config, {}, origin));
  return detail::apply_config_flags(document, origin, impl);
}

Result<std::string> read_file(const std::string& path) {
  std::error_code error;
  const auto size = std::filesystem::file_size(path, error);
  if (error) return Status::InvalidArgument("cannot read '" + path + "': " + error.message());
  if (size > kDefaultJsonMaxBytes) {
    return Status::InvalidArgument("'" + path + "': " + std::to_string(size) +
                                   " bytes, over the limit of " +
                                   std::to_string(kDefaultJsonMaxBytes) + " bytes");
  }
  std::string text(static_cast<std::size_t>(size), '\0');
  std::ifstream file(path, std::ios::binary);
  if (!file.read(text.data(), static_cast<std::streamsize>(text.size()))) {
    return Status::InvalidArgument("cannot read '" + path + "'");
  }
  return text;
}

}  // namespace

Result<std::unique_ptr<Tokenizer>> load_profiled(const std::string& path,
                                                 detail::LoadProfile* profile) {
  detail::LoadProfile unused;
  detail::LoadProfile& times = profile != nullptr ? *profile : unused;
  Stopwatch total;
  Stopwatch watch;
  std::error_code error;
  if (!std::filesystem::exists(path, error)) {
    return detail::not_found("tokenizer file '" + path + "' does not exist");
  }
  KVVM_ASSIGN_OR_RETURN(std::string text, read_file(path));
  times.file_bytes = text.size();
  // transformers reads the flags from the directory's tokenizer_config.json.
  const std::string config_path =
      (std::filesystem::path(path).parent_path() / "tokenizer_config.json").string();
  std::string config;
  if (std::filesystem::exists(config_path, error)) {
    KVVM_ASSIGN_OR_RETURN(std::string config_text, read_file(config_path));
    config = std::move(config_text);
  }
  times.read_ms = watch.lap();
  auto impl = std::make_unique<Tokenizer::Impl>();
  KVVM_RETURN_IF_ERROR(build(text, "'" + path + "'", *impl, times, watch));
  KVVM_RETURN_IF_ERROR(apply_config(config, "'" + config_path + "'", *impl));
  times.config_ms = watch.lap();
  text = std::string();
  times.release_ms = watch.lap();
  times.total_ms = total.lap();
  return std::unique_ptr<Tokenizer>(new Tokenizer(std::move(impl)));
}

Result<std::unique_ptr<Tokenizer>> Tokenizer::load(const std::string& path) {
  return load_profiled(path, nullptr);
}

Result<std::unique_ptr<Tokenizer>> Tokenizer::parse(std::string_view json, std::string_view origin,
                                                    std::string_view config) {
  detail::LoadProfile profile;
  Stopwatch watch;
  auto impl = std::make_unique<Impl>();
  KVVM_RETURN_IF_ERROR(build(json, origin, *impl, profile, watch));
  KVVM_RETURN_IF_ERROR(apply_config(config, "tokenizer_config.json", *impl));
  return std::unique_ptr<Tokenizer>(new Tokenizer(std::move(impl)));
}

}  // namespace kvvm::tokenizer
