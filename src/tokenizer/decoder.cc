#include "tokenizer/decoder.h"

namespace kvvm::tokenizer::detail {

Status check_decoder(const Json& json, std::string_view where) {
  if (json.is_null()) {
    return field_error(where, "null; a byte-level BPE needs the ByteLevel decoder");
  }
  KVVM_RETURN_IF_ERROR(expect_object(json, where));
  Result<std::string> type = type_member(json, where);
  if (!type.ok()) return type.status();
  if (*type == "ByteLevel") return Status::Ok();
  if (*type == "Sequence") {
    const std::string list_where = member_path(where, "decoders");
    const Json* list = find_member(json, "decoders");
    if (list == nullptr) return field_error(list_where, "missing");
    KVVM_RETURN_IF_ERROR(expect_array(*list, list_where));
    if (list->empty()) return field_error(list_where, "empty; ByteLevel expected");
    for (std::size_t i = 0; i < list->size(); ++i) {
      KVVM_RETURN_IF_ERROR(check_decoder((*list)[i], element_path(list_where, i)));
    }
    return Status::Ok();
  }
  return field_error(member_path(where, "type"),
                     "decoder '" + *type + "' is not implemented (ByteLevel is)");
}

}  // namespace kvvm::tokenizer::detail
