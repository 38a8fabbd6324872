// Tokenizer::load / parse: tokenizer.json into the parts of Tokenizer::Impl, refusing by name
// what this implementation does not do rather than encoding differently from the reference.
#include <filesystem>
#include <system_error>

#include "base/json_reader.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/decoder.h"
#include "tokenizer/tokenizer_impl.h"

namespace kvvm::tokenizer {
namespace {

using detail::field_error;
using detail::find_member;
using detail::Json;

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
  Result<std::string> content = detail::string_member(entry, "content", where);
  if (!content.ok()) return content.status();
  token.content = std::move(*content);
  for (auto [key, field] : {std::pair{"special", &token.special},
                            {"single_word", &token.single_word},
                            {"lstrip", &token.lstrip},
                            {"rstrip", &token.rstrip},
                            {"normalized", &token.normalized}}) {
    // Hugging Face's default: a non-special token is normalised, a special one is not.
    const bool fallback = std::string_view(key) == "normalized" ? !token.special : false;
    Result<bool> value = detail::bool_member(entry, key, fallback, where);
    if (!value.ok()) return value.status();
    *field = *value;
  }
  return token;
}

// Records `text` as the spelling of `id` in the by-id tables, growing them as needed.
void record(detail::TokenizerParts& impl, TokenId id, const std::string& text, std::string bytes,
            bool special) {
  const auto index = static_cast<std::size_t>(id);
  if (index >= impl.spelling.size()) {
    impl.spelling.resize(index + 1);
    impl.bytes.resize(index + 1);
    impl.known.resize(index + 1, 0);
    impl.special.resize(index + 1, 0);
  }
  impl.spelling[index] = text;
  impl.bytes[index] = std::move(bytes);
  impl.known[index] = 1;
  impl.special[index] = special ? 1 : 0;
}

Status parse_added_tokens(const Json& document, detail::TokenizerParts& impl) {
  const Json* list = find_member(document, "added_tokens");
  if (list == nullptr) return Status::Ok();
  KVVM_RETURN_IF_ERROR(detail::expect_array(*list, "added_tokens"));
  for (std::size_t i = 0; i < list->size(); ++i) {
    const std::string where = detail::element_path("added_tokens", i);
    Result<detail::AddedToken> token = parse_added_token((*list)[i], where);
    if (!token.ok()) return token.status();
    const auto in_vocab = impl.model->vocab().find(token->content);
    if (in_vocab != impl.model->vocab().end() && in_vocab->second != token->id) {
      return field_error(where, "'" + token->content + "' has id " + std::to_string(token->id) +
                                    " but the vocab gives it id " +
                                    std::to_string(in_vocab->second));
    }
    const auto index = static_cast<std::size_t>(token->id);
    if (in_vocab == impl.model->vocab().end() && index < impl.known.size() &&
        impl.known[index] != 0 && impl.spelling[index] != token->content) {
      return field_error(where, "id " + std::to_string(token->id) + " of '" + token->content +
                                    "' is already the id of '" + impl.spelling[index] + "'");
    }
    record(impl, token->id, token->content, detail::byte_level_to_bytes(token->content),
           token->special);
    impl.added_ids.emplace(token->content, token->id);
    if (token->normalized && impl.normalizer) {
      impl.normalized_added.add(*token, impl.normalizer->normalize(token->content));
    } else if (token->normalized) {
      impl.normalized_added.add(*token, token->content);
    } else {
      impl.raw_added.add(*token, token->content);
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

Status parse_document(const Json& document, detail::TokenizerParts& impl) {
  KVVM_RETURN_IF_ERROR(detail::expect_object(document, "the document"));
  KVVM_RETURN_IF_ERROR(refuse_set(document, "truncation"));
  KVVM_RETURN_IF_ERROR(refuse_set(document, "padding"));

  const Json* model = find_member(document, "model");
  if (model == nullptr) return field_error("model", "missing");
  KVVM_RETURN_IF_ERROR(detail::expect_object(*model, "model"));
  // Files from before the "type" tag hold a BPE whenever they hold merges.
  const Json* type = find_member(*model, "type");
  if (type != nullptr && (!type->is_string() || type->get_ref<const std::string&>() != "BPE")) {
    return field_error("model.type", detail::json_kind(*type) +
                                         " is not implemented (BPE is: byte-level BPE only)");
  }
  Result<std::unique_ptr<detail::Bpe>> bpe = detail::Bpe::parse(*model, "model");
  if (!bpe.ok()) return bpe.status();
  impl.model = std::move(*bpe);
  for (const auto& [token, id] : impl.model->vocab()) {
    record(impl, id, token, detail::byte_level_to_bytes(token), false);
  }

  const Json null;
  const auto member = [&](std::string_view key) -> const Json& {
    const Json* value = find_member(document, key);
    return value == nullptr ? null : *value;
  };
  Result<std::unique_ptr<detail::Normalizer>> normalizer =
      detail::parse_normalizer(member("normalizer"), "normalizer");
  if (!normalizer.ok()) return normalizer.status();
  impl.normalizer = std::move(*normalizer);

  Result<std::unique_ptr<detail::PreTokenizer>> pre_tokenizer =
      detail::parse_pre_tokenizer(member("pre_tokenizer"), "pre_tokenizer");
  if (!pre_tokenizer.ok()) return pre_tokenizer.status();
  if (!*pre_tokenizer || !(*pre_tokenizer)->byte_level()) {
    return field_error("pre_tokenizer",
                       "has no ByteLevel step; only byte-level BPE is implemented");
  }
  impl.pre_tokenizer = std::move(*pre_tokenizer);

  KVVM_RETURN_IF_ERROR(detail::check_decoder(member("decoder"), "decoder"));
  KVVM_RETURN_IF_ERROR(parse_added_tokens(document, impl));

  Result<detail::PostProcessor> post =
      detail::parse_post_processor(member("post_processor"), "post_processor");
  if (!post.ok()) return post.status();
  for (const auto* side : {&post->prefix, &post->suffix}) {
    for (const TokenId id : *side) {
      if (static_cast<std::size_t>(id) >= impl.known.size() ||
          impl.known[static_cast<std::size_t>(id)] == 0) {
        return field_error("post_processor", "adds token id " + std::to_string(id) +
                                                 ", which neither the vocab nor the added "
                                                 "tokens hold");
      }
    }
  }
  impl.post_processor = std::move(*post);
  return Status::Ok();
}

}  // namespace

Result<std::unique_ptr<Tokenizer>> Tokenizer::parse(std::string_view json,
                                                    std::string_view origin) {
  Result<Json> document = read_json(json, {}, origin);
  if (!document.ok()) return document.status();
  auto impl = std::make_unique<Impl>();
  const Status status = parse_document(*document, *impl);
  if (!status.ok()) return origin.empty() ? status : status.with_context(origin);
  return std::unique_ptr<Tokenizer>(new Tokenizer(std::move(impl)));
}

Result<std::unique_ptr<Tokenizer>> Tokenizer::load(const std::string& path) {
  std::error_code error;
  if (!std::filesystem::exists(path, error)) {
    return detail::not_found("tokenizer file '" + path + "' does not exist");
  }
  Result<Json> document = read_json_file(path);
  if (!document.ok()) return document.status();
  auto impl = std::make_unique<Impl>();
  const Status status = parse_document(*document, *impl);
  if (!status.ok()) return status.with_context("'" + path + "'");
  return std::unique_ptr<Tokenizer>(new Tokenizer(std::move(impl)));
}

}  // namespace kvvm::tokenizer
