// The filters' shared parts: their signature, argument helpers, and the sequence filters
// (filters_sequence.cc) that filters.cc's table lists.
#pragma once

#include <string>
#include <string_view>

#include "jinja/render.h"

namespace kvvm::jinja::detail {

using FilterFn = Value (*)(Interpreter&, const Value&, CallArgs&);

// Jinja's soft_str: str() of any value, "" for undefined.
inline std::string soft_str(const Value& v) { return v.str(); }
// Argument `i` or `name`, as a truth value; `fallback` when absent.
bool bool_arg(const CallArgs& args, std::size_t i, std::string_view name, bool fallback);

Value f_join(Interpreter& in, const Value& v, CallArgs& args);
Value f_select(Interpreter& in, const Value& v, CallArgs& args);
Value f_reject(Interpreter& in, const Value& v, CallArgs& args);
Value f_selectattr(Interpreter& in, const Value& v, CallArgs& args);
Value f_rejectattr(Interpreter& in, const Value& v, CallArgs& args);
Value f_map(Interpreter& in, const Value& v, CallArgs& args);
Value f_items(Interpreter& in, const Value& v, CallArgs& args);
Value f_dictsort(Interpreter& in, const Value& v, CallArgs& args);
Value f_first(Interpreter& in, const Value& v, CallArgs& args);
Value f_last(Interpreter& in, const Value& v, CallArgs& args);
Value f_list(Interpreter& in, const Value& v, CallArgs& args);
Value f_unique(Interpreter& in, const Value& v, CallArgs& args);
Value f_sort(Interpreter& in, const Value& v, CallArgs& args);
Value f_reverse(Interpreter& in, const Value& v, CallArgs& args);
Value f_sum(Interpreter& in, const Value& v, CallArgs& args);
Value f_min(Interpreter& in, const Value& v, CallArgs& args);
Value f_max(Interpreter& in, const Value& v, CallArgs& args);
Value f_batch(Interpreter& in, const Value& v, CallArgs& args);

}  // namespace kvvm::jinja::detail
