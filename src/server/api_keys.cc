#include "kvvm/server/api_keys.h"

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <system_error>

namespace kvvm::server {
namespace {

constexpr std::size_t kMinKeyChars = 8;
constexpr std::size_t kMaxKeyChars = 256;
constexpr std::size_t kMaxTenantChars = 128;
// A key file holds a few keys; anything far larger is the wrong file.
constexpr std::uintmax_t kMaxFileBytes = 16u << 20;

bool is_blank(char c) { return c == ' ' || c == '\t'; }
bool is_printable(char c) { return c > ' ' && c < 0x7f; }

// Why `field` is not 1..max printable ASCII characters without spaces; empty when it is. The
// message gives lengths and positions only: the field may be a key, a secret.
std::string field_problem(std::string_view what, std::string_view field, std::size_t min_chars,
                          std::size_t max_chars) {
  if (field.size() < min_chars || field.size() > max_chars) {
    return std::string(what) + " has " + std::to_string(field.size()) +
           " characters; it must have " + std::to_string(min_chars) + " to " +
           std::to_string(max_chars);
  }
  for (std::size_t i = 0; i < field.size(); ++i) {
    if (!is_printable(field[i])) {
      return std::string(what) + " has a character that is not printable ASCII at position " +
             std::to_string(i + 1);
    }
  }
  return {};
}

}  // namespace

Result<ApiKeys> ApiKeys::parse(std::string_view text, std::string_view origin) {
  ApiKeys keys;
  std::unordered_map<std::string, std::size_t> line_of;  // key -> its line, for duplicates
  std::unordered_map<std::string, std::uint64_t> tenant_ids;
  std::size_t line_number = 0;
  while (!text.empty()) {
    ++line_number;
    const std::size_t newline = text.find('\n');
    std::string_view line = text.substr(0, newline);
    text = newline == std::string_view::npos ? std::string_view() : text.substr(newline + 1);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);  // a file from Windows
    const auto fail = [&](const std::string& message) {
      return Status::InvalidArgument(std::string(origin) + ":" + std::to_string(line_number) +
                                     ": " + message);
    };

    std::vector<std::string_view> fields;
    std::size_t at = 0;
    while (at < line.size()) {
      while (at < line.size() && is_blank(line[at])) ++at;
      if (at == line.size()) break;
      const std::size_t start = at;
      while (at < line.size() && !is_blank(line[at])) ++at;
      fields.push_back(line.substr(start, at - start));
    }
    if (fields.empty() || fields.front().front() == '#') continue;
    if (fields.size() == 1) return fail("missing tenant: expected \"KEY TENANT\"");
    if (fields.size() > 2) {
      return fail(std::to_string(fields.size()) + " fields; expected \"KEY TENANT\"");
    }
    if (std::string problem = field_problem("the key", fields[0], kMinKeyChars, kMaxKeyChars);
        !problem.empty()) {
      return fail(problem);
    }
    if (std::string problem = field_problem("the tenant", fields[1], 1, kMaxTenantChars);
        !problem.empty()) {
      return fail(problem);
    }
    std::string key(fields[0]);
    if (const auto earlier = line_of.find(key); earlier != line_of.end()) {
      return fail("duplicate key (first on line " + std::to_string(earlier->second) + ")");
    }
    std::string tenant(fields[1]);
    auto [it, inserted] = tenant_ids.try_emplace(tenant, keys.tenant_names_.size() + 1);
    if (inserted) keys.tenant_names_.push_back(std::move(tenant));
    line_of.emplace(key, line_number);
    keys.tenant_of_.emplace(std::move(key), it->second);
  }
  // An empty key file most likely is a mistake; accepting it would serve without keys, which
  // is the opposite of what passing a key file asks for.
  if (keys.empty()) {
    return Status::InvalidArgument(std::string(origin) +
                                   ": no keys (expected lines \"KEY TENANT\")");
  }
  return keys;
}

Result<ApiKeys> ApiKeys::load(const std::string& path) {
  std::error_code error;
  if (!std::filesystem::exists(path, error)) {
    return Status::NotFound("API key file '" + path + "' does not exist");
  }
  if (std::filesystem::is_directory(path, error)) {
    return Status::InvalidArgument("API key file '" + path + "' is a directory");
  }
  std::ifstream file(path, std::ios::binary);
  if (!file) {
    return Status::InvalidArgument("cannot open API key file '" + path +
                                   "': " + std::strerror(errno));
  }
  std::string text;
  char buffer[1 << 14];
  while (text.size() <= kMaxFileBytes && file.read(buffer, sizeof buffer).gcount() > 0) {
    text.append(buffer, static_cast<std::size_t>(file.gcount()));
  }
  if (file.bad()) {
    return Status::InvalidArgument("cannot read API key file '" + path +
                                   "': " + std::strerror(errno));
  }
  if (text.size() > kMaxFileBytes) {
    return Status::InvalidArgument("API key file '" + path + "': over the limit of " +
                                   std::to_string(kMaxFileBytes) + " bytes");
  }
  return parse(text, path);
}

std::optional<std::uint64_t> ApiKeys::tenant(std::string_view key) const {
  const auto it = tenant_of_.find(std::string(key));
  if (it == tenant_of_.end()) return std::nullopt;
  return it->second;
}

}  // namespace kvvm::server
