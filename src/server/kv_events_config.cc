// parse_kv_events_config: vLLM's KVEventsConfig JSON read strictly, so a misspelt field is an
// error naming it rather than a default silently kept.
#include <nlohmann/json.hpp>
#include <string>

#include "base/json_reader.h"
#include "kvvm/server/kv_events.h"

namespace kvvm::server {
namespace {

Status bad(const std::string& field, const std::string& problem) {
  return Status::InvalidArgument("--kv-events-config: " + field + ": " + problem);
}

Result<std::string> string_field(const nlohmann::json& value, const std::string& field) {
  if (!value.is_string()) return bad(field, "expected a string, got " + value.dump());
  return value.get<std::string>();
}

Result<std::uint64_t> count_field(const nlohmann::json& value, const std::string& field,
                                  std::uint64_t least) {
  if (!value.is_number_integer() ||
      (!value.is_number_unsigned() && value.get<std::int64_t>() < 0) ||
      value.get<std::uint64_t>() < least) {
    return bad(field, "expected a whole number of at least " + std::to_string(least) + ", got " +
                          value.dump());
  }
  return value.get<std::uint64_t>();
}

}  // namespace

Result<KvEventsConfig> parse_kv_events_config(std::string_view json) {
  KVVM_ASSIGN_OR_RETURN(nlohmann::json doc, read_json(json, {}, "--kv-events-config"));
  if (!doc.is_object()) {
    return Status::InvalidArgument("--kv-events-config: expected a JSON object, got " + doc.dump());
  }
  KvEventsConfig config;
  for (const auto& [key, value] : doc.items()) {
    if (key == "enable_kv_cache_events") {
      if (!value.is_boolean()) return bad(key, "expected true or false, got " + value.dump());
      config.enable_kv_cache_events = value.get<bool>();
    } else if (key == "publisher") {
      if (value.is_null()) continue;
      KVVM_ASSIGN_OR_RETURN(config.publisher, string_field(value, key));
      if (config.publisher != "zmq" && config.publisher != "null") {
        return bad(key, "expected \"zmq\" or \"null\", got " + value.dump());
      }
    } else if (key == "endpoint") {
      KVVM_ASSIGN_OR_RETURN(config.endpoint, string_field(value, key));
      if (config.endpoint.empty()) return bad(key, "empty");
    } else if (key == "replay_endpoint") {
      if (value.is_null()) continue;
      KVVM_ASSIGN_OR_RETURN(std::string replay, string_field(value, key));
      if (replay.empty()) return bad(key, "empty (leave it out, or null, for no replay socket)");
      config.replay_endpoint = std::move(replay);
    } else if (key == "buffer_steps") {
      KVVM_ASSIGN_OR_RETURN(config.buffer_steps, count_field(value, key, 1));
    } else if (key == "hwm") {
      KVVM_ASSIGN_OR_RETURN(config.hwm, count_field(value, key, 0));
      if (config.hwm > 0x7fffffff) return bad(key, "at most 2147483647, got " + value.dump());
    } else if (key == "max_queue_size") {
      KVVM_ASSIGN_OR_RETURN(config.max_queue_size, count_field(value, key, 1));
    } else if (key == "topic") {
      KVVM_ASSIGN_OR_RETURN(config.topic, string_field(value, key));
    } else if (key == "encoding") {
      KVVM_ASSIGN_OR_RETURN(std::string encoding, string_field(value, key));
      if (encoding == "array") {
        config.encoding = KvEventEncoding::kArray;
      } else if (encoding == "map") {
        config.encoding = KvEventEncoding::kMap;
      } else {
        return bad(key, "expected \"array\" (vLLM up to 0.25) or \"map\" (vLLM 0.26 on), got " +
                            value.dump());
      }
    } else if (key == "block_size") {
      KVVM_ASSIGN_OR_RETURN(config.block_size, count_field(value, key, 1));
    } else {
      return bad(key,
                 "unknown field (known: enable_kv_cache_events, publisher, endpoint, "
                 "replay_endpoint, buffer_steps, hwm, max_queue_size, topic, and kvvm's "
                 "encoding, block_size)");
    }
  }
  if (config.publisher.empty()) config.publisher = config.enable_kv_cache_events ? "zmq" : "null";
  return config;
}

}  // namespace kvvm::server
