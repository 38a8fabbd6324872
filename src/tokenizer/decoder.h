// tokenizer.json's "decoder": ByteLevel (each token's characters back to bytes), alone or as
// the only kind of step in a Sequence. Byte-level decoding is per token, so a token's bytes are
// computed once at load and decode() concatenates them.
#pragma once

#include <string_view>

#include "kvvm/status.h"
#include "tokenizer/json_fields.h"

namespace kvvm::tokenizer::detail {

// OK for a ByteLevel decoder; InvalidArgument naming the type otherwise (null included: the
// vocabulary of a byte-level BPE is not text without it).
Status check_decoder(const Json& json, std::string_view where);

}  // namespace kvvm::tokenizer::detail
