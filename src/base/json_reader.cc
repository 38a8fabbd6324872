#include "base/json_reader.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <set>
#include <system_error>
#include <vector>

namespace kvvm {
namespace {

std::string label(std::string_view name) {
  return name.empty() ? std::string() : std::string(name) + ": ";
}

// "byte 12 (line 2, column 5)": the offset counts from 0, line and column from 1; a text of one
// line (a trace record) gives the column only.
std::string where_in(std::string_view text, std::size_t offset) {
  std::size_t line = 1;
  std::size_t line_start = 0;
  const std::size_t end = offset < text.size() ? offset : text.size();
  for (std::size_t i = 0; i < end; ++i) {
    if (text[i] == '\n') {
      ++line;
      line_start = i + 1;
    }
  }
  std::string out = "byte " + std::to_string(offset);
  if (offset >= text.size()) out += ", the end of the input";
  const std::string column = "column " + std::to_string(offset - line_start + 1) + ")";
  if (text.find('\n') == std::string_view::npos) return out + " (" + column;
  return out + " (line " + std::to_string(line) + ", " + column;
}

std::string hex_byte(unsigned char byte) {
  char buffer[8];
  std::snprintf(buffer, sizeof buffer, "0x%02X", byte);
  return buffer;
}

// The length of the well-formed UTF-8 sequence starting at text[i] (RFC 3629: no overlong
// forms, no surrogates, nothing past U+10FFFF), or 0 when it is not one.
std::size_t utf8_sequence_length(std::string_view text, std::size_t i) {
  const auto byte = [&](std::size_t k) -> unsigned {
    return i + k < text.size() ? static_cast<unsigned char>(text[i + k]) : 0x100u;
  };
  const unsigned lead = byte(0);
  unsigned low = 0x80, high = 0xBF;  // the range of the second byte
  std::size_t length = 0;
  if (lead < 0x80) return 1;
  if (lead >= 0xC2 && lead <= 0xDF) {
    length = 2;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    length = 3;
    if (lead == 0xE0) low = 0xA0;   // overlong
    if (lead == 0xED) high = 0x9F;  // surrogates
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    length = 4;
    if (lead == 0xF0) low = 0x90;   // overlong
    if (lead == 0xF4) high = 0x8F;  // past U+10FFFF
  } else {
    return 0;
  }
  if (byte(1) < low || byte(1) > high) return 0;
  for (std::size_t k = 2; k < length; ++k) {
    if (byte(k) < 0x80 || byte(k) > 0xBF) return 0;
  }
  return length;
}

// One pass over the raw bytes: the UTF-8 check and the nesting depth, before any DOM exists.
std::optional<std::string> scan(std::string_view text, const JsonLimits& limits) {
  std::size_t depth = 0;
  bool in_string = false;
  bool escaped = false;
  for (std::size_t i = 0; i < text.size();) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c >= 0x80) {
      const std::size_t length = utf8_sequence_length(text, i);
      if (length == 0) {
        return "invalid UTF-8 at " + where_in(text, i) + ": byte " + hex_byte(c);
      }
      i += length;
      escaped = false;
      continue;
    }
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > limits.max_depth) {
        return "nested deeper than the limit of " + std::to_string(limits.max_depth) +
               " levels at " + where_in(text, i);
      }
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;  // a mismatched bracket is the parser's to report
    }
    ++i;
  }
  return std::nullopt;
}

// Thrown from the parser's callback to stop at a key seen twice in one object: `index` counts
// the keys of the whole document read so far, from 0, so the key can be found in the text.
struct DuplicateKey {
  std::string key;
  std::size_t index = 0;
};

// The byte offset of the `index`-th key (from 0) of a document the parser has read up to it:
// a key is a string followed, after blanks, by ':'.
std::size_t key_offset(std::string_view text, std::size_t index) {
  std::size_t keys = 0;
  for (std::size_t i = 0; i < text.size(); ++i) {
    if (text[i] != '"') continue;
    const std::size_t start = i;
    for (++i; i < text.size() && text[i] != '"'; ++i) {
      if (text[i] == '\\') ++i;
    }
    std::size_t next = i + 1;
    while (next < text.size() && std::string_view(" \t\r\n").find(text[next]) != text.npos) {
      ++next;
    }
    if (next < text.size() && text[next] == ':' && keys++ == index) return start;
  }
  return text.size();
}

// nlohmann's messages start "[json.exception.parse_error.101] parse error at line 1, column 5: ";
// the offset is reported by us, so only what follows is kept.
std::string reason(const std::string& what) {
  const auto column = what.find("column ");
  const auto colon = what.find(": ", column == std::string::npos ? 0 : column);
  if (colon != std::string::npos) return what.substr(colon + 2);
  const auto bracket = what.find("] ");
  return bracket == std::string::npos ? what : what.substr(bracket + 2);
}

}  // namespace

Status check_json_input(std::string_view text, const JsonLimits& limits, std::string_view name) {
  if (text.size() > limits.max_bytes) {
    return Status::InvalidArgument(label(name) + std::to_string(text.size()) +
                                   " bytes, over the limit of " + std::to_string(limits.max_bytes) +
                                   " bytes");
  }
  if (auto why = scan(text, limits)) return Status::InvalidArgument(label(name) + *why);
  return Status::Ok();
}

Status json_syntax_error(std::string_view text, std::string_view name, std::size_t byte,
                         const std::string& what) {
  // byte counts from 1 (0: unknown); past the end means the input stopped early.
  const std::size_t offset = byte == 0 ? 0 : byte - 1;
  return Status::InvalidArgument(label(name) + "not valid JSON at " + where_in(text, offset) +
                                 ": " + reason(what));
}

Status json_duplicate_key(std::string_view text, std::string_view name, const std::string& key,
                          std::size_t index) {
  const std::string quoted =
      nlohmann::json(key).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  return Status::InvalidArgument(label(name) + "duplicate key " + quoted + " at " +
                                 where_in(text, key_offset(text, index)) +
                                 ": a key may appear once in an object");
}

Result<nlohmann::json> read_json(std::string_view text, const JsonLimits& limits,
                                 std::string_view name) {
  KVVM_RETURN_IF_ERROR(check_json_input(text, limits, name));
  // nlohmann keeps the last of a key given twice; a file that says two things is refused
  // instead of read as one of them.
  std::vector<std::set<std::string>> open_objects;
  std::size_t keys = 0;
  const nlohmann::json::parser_callback_t refuse_duplicates =
      [&](int, nlohmann::json::parse_event_t event, nlohmann::json& parsed) {
        using Event = nlohmann::json::parse_event_t;
        if (event == Event::object_start) {
          open_objects.emplace_back();
        } else if (event == Event::object_end) {
          open_objects.pop_back();
        } else if (event == Event::key) {
          std::string key = parsed.get<std::string>();
          if (!open_objects.back().insert(key).second) throw DuplicateKey{std::move(key), keys};
          ++keys;
        }
        return true;
      };
  try {
    return nlohmann::json::parse(text.begin(), text.end(), refuse_duplicates);
  } catch (const DuplicateKey& duplicate) {
    return json_duplicate_key(text, name, duplicate.key, duplicate.index);
  } catch (const nlohmann::json::parse_error& error) {
    return json_syntax_error(text, name, error.byte, error.what());
  } catch (const nlohmann::json::exception& error) {
    return Status::InvalidArgument(label(name) + "not valid JSON: " + reason(error.what()));
  }
}

Result<nlohmann::json> read_json_file(const std::string& path, const JsonLimits& limits) {
  std::ifstream file(path, std::ios::binary);
  if (!file) {
    return Status::InvalidArgument("cannot open '" + path + "': " + std::strerror(errno));
  }
  // A regular file's size is known before reading it; a pipe's is found by reading at most
  // one byte past the limit.
  std::error_code error;
  const auto size = std::filesystem::file_size(path, error);
  if (!error && size > limits.max_bytes) {
    return Status::InvalidArgument("'" + path + "': " + std::to_string(size) +
                                   " bytes, over the limit of " + std::to_string(limits.max_bytes) +
                                   " bytes");
  }
  std::string text;
  char buffer[1 << 16];
  while (text.size() <= limits.max_bytes && file.read(buffer, sizeof buffer).gcount() > 0) {
    text.append(buffer, static_cast<std::size_t>(file.gcount()));
  }
  if (file.bad()) {
    return Status::InvalidArgument("cannot read '" + path + "': " + std::strerror(errno));
  }
  if (text.size() > limits.max_bytes) {
    return Status::InvalidArgument("'" + path + "': over the limit of " +
                                   std::to_string(limits.max_bytes) + " bytes");
  }
  return read_json(text, limits, "'" + path + "'");
}

}  // namespace kvvm
