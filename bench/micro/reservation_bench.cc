// Commit and release of one granule: kvvm's transaction (pooled handle) beside the raw driver
// calls it is made of, on every backend this machine has. Ratios, not absolute times, are
// what to compare (docs/PERFORMANCE.md).
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <memory>

#include "kvvm/vmm/cuda_driver.h"
#include "kvvm/vmm/handle_pool.h"
#include "kvvm/vmm/host_driver.h"
#include "kvvm/vmm/reservation.h"

namespace kvvm {
namespace {

std::unique_ptr<Driver> make_driver(int backend) {
  auto driver = backend == 0 ? make_host_driver({.granule = 2u << 20}) : make_cuda_driver();
  return driver.ok() ? std::move(driver).value() : nullptr;
}

void fail(benchmark::State& state, const Status& status) {
  state.SkipWithError(status.to_string().c_str());
}

// Raw: map + set_access + unmap of one pre-created granule handle.
void BM_RawMapSetAccessUnmap(benchmark::State& state) {
  auto driver = make_driver(static_cast<int>(state.range(0)));
  if (!driver) return state.SkipWithError("backend unavailable");
  const std::size_t g = driver->granule();
  auto base = driver->reserve(g);
  auto handle = driver->create(g);
  if (!base.ok() || !handle.ok()) return fail(state, base.ok() ? handle.status() : base.status());
  for (auto _ : state) {
    Status status = driver->map(*base, g, *handle, 0);
    if (status.ok()) status = driver->set_access(*base, g, Access::kReadWrite);
    if (status.ok()) status = driver->unmap(*base, g);
    if (!status.ok()) return fail(state, status);
  }
  (void)driver->release(*handle);
  (void)driver->free(*base, g);
}

// Ours: Reservation::commit + release of one granule with the handle coming from the pool.
void BM_PooledCommitRelease(benchmark::State& state) {
  auto driver = make_driver(static_cast<int>(state.range(0)));
  if (!driver) return state.SkipWithError("backend unavailable");
  const std::size_t g = driver->granule();
  HandlePool pool(*driver, PoolOptions{.max_pooled_bytes = 4 * g});
  auto reservation = Reservation::create(pool, g);
  if (!reservation.ok()) return fail(state, reservation.status());
  for (auto _ : state) {
    Status status = (*reservation)->commit(0, g, nullptr);
    if (status.ok()) status = (*reservation)->release(0, g);
    if (!status.ok()) return fail(state, status);
  }
}

BENCHMARK(BM_RawMapSetAccessUnmap)->ArgName("cuda")->Arg(0)->Arg(1)->UseRealTime();
BENCHMARK(BM_PooledCommitRelease)->ArgName("cuda")->Arg(0)->Arg(1)->UseRealTime();

}  // namespace
}  // namespace kvvm

BENCHMARK_MAIN();
