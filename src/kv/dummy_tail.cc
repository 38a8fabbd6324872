// DummyTail: see dummy_tail.h.
#include "kv/dummy_tail.h"

#include <cstdint>
#include <vector>

namespace kvvm {

Result<std::unique_ptr<DummyTail>> DummyTail::create(HandlePool& pool, Governor& governor,
                                                     TierId tier, std::chrono::milliseconds wait) {
  const std::size_t granule = pool.granule();
  auto home = Reservation::create(pool, granule);
  if (!home.ok()) return home.status().with_context("dummy tail page");
  Result<Grant> grant = governor.prepare(tier, granule, wait);
  if (!grant.ok()) return grant.status().with_context("dummy tail page");
  Status made = (*home)->commit(0, granule, &*grant);
  grant->commit_charged();
  const std::vector<std::uint8_t> zeros(granule, 0);
  if (made.ok()) made = pool.driver().write((*home)->base(), zeros.data(), zeros.size());
  if (made.ok()) made = (*home)->set_access(0, granule, Access::kReadOnly);
  if (!made.ok()) return made.with_context("dummy tail page");
  const auto blocks = (*home)->blocks();
  Result<HandleInfo> page = pool.describe(blocks.front().handle);
  if (!page.ok()) return page.status().with_context("dummy tail page");
  return std::unique_ptr<DummyTail>(new DummyTail(std::move(home).value(), *page));
}

Status DummyTail::map(Reservation& target, const std::vector<Range>& ranges) const {
  const std::size_t granule = home_->granule();
  std::vector<std::size_t> mapped;
  for (const Range& range : ranges) {
    for (std::size_t at = range.offset; at < range.offset + range.len; at += granule) {
      Status status = target.map_shared(at, page_, Access::kReadOnly);
      if (!status.ok()) {
        for (std::size_t offset : mapped) (void)target.release(offset, granule);  // poisons
        return status;
      }
      mapped.push_back(at);
    }
  }
  return Status::Ok();
}

}  // namespace kvvm
