#include "support/backends.h"

#include "kvvm/vmm/cuda_driver.h"
#include "kvvm/vmm/host_driver.h"

namespace kvvm::testing {

std::unique_ptr<Driver> HostPageBackend::make() {
  auto driver = make_host_driver();
  return driver.ok() ? std::move(driver).value() : nullptr;
}

std::unique_ptr<Driver> Host2MiBBackend::make() {
  auto driver = make_host_driver({.granule = 2u << 20});
  return driver.ok() ? std::move(driver).value() : nullptr;
}

std::unique_ptr<Driver> CudaBackend::make() {
  auto driver = make_cuda_driver();
  return driver.ok() ? std::move(driver).value() : nullptr;
}

std::string CudaBackend::unavailable_reason() {
  auto driver = make_cuda_driver();
  return driver.ok() ? "available" : driver.status().to_string();
}

}  // namespace kvvm::testing
