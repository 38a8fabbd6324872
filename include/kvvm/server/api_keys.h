// API keys: `Authorization: Bearer KEY` names a tenant, and the tenant is the prefix cache's
// salt, so two tenants never share KV (docs/ARCHITECTURE.md "Server", Tenants).
//
// The key file (`kvvm serve --api-keys FILE`): one key per line, "KEY TENANT" separated by
// spaces or tabs; blank lines and lines starting with '#' are skipped. Several keys may name
// one tenant (they share its cache). A key is 8 to 256 printable ASCII characters without
// spaces; a tenant name 1 to 128 of them. A duplicate key, a missing tenant or a malformed line
// is an error naming FILE:LINE (the key itself is never printed: it is a secret).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "kvvm/base/status.h"

namespace kvvm::server {

class ApiKeys {
 public:
  ApiKeys() = default;  // no keys: every request is tenant 0 and none needs a key

  // InvalidArgument "ORIGIN:LINE: ..." for a malformed line; NotFound for an absent file.
  static Result<ApiKeys> parse(std::string_view text, std::string_view origin);
  static Result<ApiKeys> load(const std::string& path);

  bool empty() const { return tenant_of_.empty(); }
  std::size_t size() const { return tenant_of_.size(); }
  // The tenant of `key` (1-based, in order of first appearance in the file); nullopt for an
  // unknown key.
  std::optional<std::uint64_t> tenant(std::string_view key) const;
  // Tenant names, index = tenant - 1 (for metrics labels and logs).
  const std::vector<std::string>& tenant_names() const { return tenant_names_; }

 private:
  std::unordered_map<std::string, std::uint64_t> tenant_of_;
  std::vector<std::string> tenant_names_;
};

}  // namespace kvvm::server
