// Commits and releases one granule through the installed library on the host driver.
#include <kvvm/handle_pool.h>
#include <kvvm/host_driver.h>
#include <kvvm/reservation.h>

#include <cstdio>
#include <cstring>

int main() {
  auto driver = kvvm::make_host_driver();
  if (!driver.ok()) return std::printf("%s\n", driver.status().to_string().c_str()), 1;
  kvvm::HandlePool pool(**driver);
  const std::size_t granule = pool.granule();
  auto reservation = kvvm::Reservation::create(pool, 4 * granule);
  if (!reservation.ok()) return std::printf("%s\n", reservation.status().to_string().c_str()), 1;
  kvvm::Status status = (*reservation)->commit(granule, granule, nullptr);
  if (!status.ok()) return std::printf("%s\n", status.to_string().c_str()), 1;
  std::memset(reinterpret_cast<void*>((*reservation)->base() + granule), 0x5a, granule);
  status = (*reservation)->release(granule, granule);
  if (!status.ok()) return std::printf("%s\n", status.to_string().c_str()), 1;
  std::printf("consumer: committed and released one %zu-byte granule through kvvm::kvvm\n",
              granule);
  return 0;
}
