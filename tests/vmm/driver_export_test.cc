// Handles shared between drivers (and so processes) through file descriptors: the host driver's
// memory files, the CUDA driver's POSIX shareable handles (skipped without a GPU), the fault
// driver's injection and the pool's rules for a handle another process may map.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <vector>

#include "kvvm/vmm/cuda_driver.h"
#include "kvvm/vmm/fault_driver.h"
#include "kvvm/vmm/handle_pool.h"
#include "kvvm/vmm/host_driver.h"

namespace kvvm::testing {
namespace {

std::unique_ptr<Driver> host(bool exportable) {
  auto made = make_host_driver(HostDriverOptions{.exportable_handles = exportable});
  EXPECT_TRUE(made.ok()) << made.status().to_string();
  return made.ok() ? std::move(made).value() : nullptr;
}

// Maps `handle` of `bytes` at a fresh reservation of `driver` with `access`; returns the address.
Address map_at(Driver& driver, Handle handle, std::size_t bytes, Access access) {
  auto base = driver.reserve(bytes);
  EXPECT_TRUE(base.ok()) << base.status().to_string();
  EXPECT_TRUE(driver.map(*base, bytes, handle, 0).ok());
  EXPECT_TRUE(driver.set_access(*base, bytes, access).ok());
  return *base;
}

void unmap_and_free(Driver& driver, Address base, std::size_t bytes) {
  EXPECT_TRUE(driver.unmap(base, bytes).ok());
  EXPECT_TRUE(driver.free(base, bytes).ok());
}

// The exporter's bytes, seen by the importer at its own address, stay there after the exporter
// released its handle: the file is closed there, never punched.
void expect_shared_and_outliving(Driver& exporter, Driver& importer) {
  const std::size_t g = exporter.granule();
  auto handle = exporter.create(g);
  ASSERT_TRUE(handle.ok()) << handle.status().to_string();
  const Address writable = map_at(exporter, *handle, g, Access::kReadWrite);
  std::vector<unsigned char> pattern(g);
  for (std::size_t i = 0; i < g; ++i) pattern[i] = static_cast<unsigned char>(i * 31 + 7);
  ASSERT_TRUE(exporter.write(writable, pattern.data(), g).ok());

  auto fd = exporter.export_handle(*handle);
  ASSERT_TRUE(fd.ok()) << fd.status().to_string();
  auto imported = importer.import_handle(*fd, g);
  ::close(*fd);
  ASSERT_TRUE(imported.ok()) << imported.status().to_string();
  const Address readable = map_at(importer, *imported, g, Access::kReadOnly);
  EXPECT_NE(readable, writable);
  std::vector<unsigned char> seen(g);
  ASSERT_TRUE(importer.read(seen.data(), readable, g).ok());
  EXPECT_EQ(seen, pattern);
  // One copy of the bytes: a write at the exporter shows at the importer.
  pattern[0] ^= 0xFF;
  ASSERT_TRUE(exporter.write(writable, pattern.data(), 1).ok());
  ASSERT_TRUE(importer.read(seen.data(), readable, g).ok());
  EXPECT_EQ(seen, pattern);

  unmap_and_free(exporter, writable, g);
  ASSERT_TRUE(exporter.release(*handle).ok());
  ASSERT_TRUE(importer.read(seen.data(), readable, g).ok());
  EXPECT_EQ(seen, pattern);
  unmap_and_free(importer, readable, g);
  EXPECT_TRUE(importer.release(*imported).ok());
  EXPECT_EQ(exporter.counts().of(DriverOp::kExport), 1u);
  EXPECT_EQ(importer.counts().of(DriverOp::kImport), 1u);
}

TEST(HostDriverExportTest, ImportedHandleSharesTheBytesAndOutlivesTheExporter) {
  auto exporter = host(true);
  auto importer = host(false);
  ASSERT_TRUE(exporter && importer);
  expect_shared_and_outliving(*exporter, *importer);
  EXPECT_EQ(host_driver_tables(*exporter).handles, 0u);
  EXPECT_EQ(host_driver_tables(*importer).handles, 0u);
  EXPECT_EQ(host_driver_tables(*importer).handle_files, 0u);
}

TEST(HostDriverExportTest, ChunkedHandlesAndForeignDescriptorsAreRefused) {
  auto chunked = host(false);
  ASSERT_TRUE(chunked);
  const std::size_t g = chunked->granule();
  auto handle = chunked->create(g);
  ASSERT_TRUE(handle.ok());
  auto fd = chunked->export_handle(*handle);
  ASSERT_FALSE(fd.ok());
  EXPECT_EQ(fd.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(fd.status().message().find("exportable_handles"), std::string::npos);
  EXPECT_EQ(chunked->counts().failed(DriverOp::kExport), 1u);
  EXPECT_TRUE(chunked->release(*handle).ok());

  int pipe_fds[2];
  ASSERT_EQ(::pipe(pipe_fds), 0);
  auto from_pipe = chunked->import_handle(pipe_fds[0], g);
  ::close(pipe_fds[0]);
  ::close(pipe_fds[1]);
  ASSERT_FALSE(from_pipe.ok());
  EXPECT_NE(from_pipe.status().message().find("not a memory file"), std::string::npos);

  auto exporter = host(true);
  ASSERT_TRUE(exporter);
  auto small = exporter->create(g);
  ASSERT_TRUE(small.ok());
  auto small_fd = exporter->export_handle(*small);
  ASSERT_TRUE(small_fd.ok());
  auto too_large = chunked->import_handle(*small_fd, 2 * g);
  ::close(*small_fd);
  ASSERT_FALSE(too_large.ok());
  EXPECT_NE(too_large.status().message().find("holds only"), std::string::npos);
  EXPECT_TRUE(exporter->release(*small).ok());
  EXPECT_EQ(host_driver_tables(*chunked).handles, 0u);
}

TEST(HostDriverExportTest, FaultDriverFailsExportAndImportByKind) {
  auto exporter = host(true);
  ASSERT_TRUE(exporter);
  FaultDriver fault(*exporter);
  const std::size_t g = fault.granule();
  auto handle = fault.create(g);
  ASSERT_TRUE(handle.ok());
  fault.fail_nth(DriverOp::kExport, 1);
  auto fd = fault.export_handle(*handle);
  ASSERT_FALSE(fd.ok());
  EXPECT_EQ(fd.status().driver_failure()->error_name, "KVVM_INJECTED_FAULT");
  fd = fault.export_handle(*handle);
  ASSERT_TRUE(fd.ok());
  fault.fail_nth(DriverOp::kImport, 1);
  EXPECT_FALSE(fault.import_handle(*fd, g).ok());
  EXPECT_EQ(host_driver_tables(*exporter).handles, 1u);  // the injected failure made nothing
  ::close(*fd);
  EXPECT_EQ(fault.counts().failed(DriverOp::kExport), 1u);
  EXPECT_EQ(fault.counts().failed(DriverOp::kImport), 1u);
  EXPECT_EQ(fault.injected(), 2u);
  EXPECT_TRUE(fault.release(*handle).ok());
}

TEST(HandlePoolExportTest, HandlesCrossingProcessesAreChargedAndNeverPooled) {
  auto exporter_driver = host(true);
  auto importer_driver = host(false);
  ASSERT_TRUE(exporter_driver && importer_driver);
  const std::size_t g = exporter_driver->granule();
  Governor governor;
  const TierId exporter_tier = governor.add_tier("exporter", 8 * g);
  const TierId importer_tier = governor.add_tier("importer", 8 * g);
  HandlePool exporter(*exporter_driver, PoolOptions{.max_pooled_bytes = 8 * g}, &governor,
                      exporter_tier);
  HandlePool importer(*importer_driver, PoolOptions{.max_pooled_bytes = 8 * g}, &governor,
                      importer_tier);
  auto grant = governor.prepare(exporter_tier, g);
  ASSERT_TRUE(grant.ok());
  auto handle = exporter.checkout(g, &*grant);
  ASSERT_TRUE(handle.ok());
  grant->commit_charged();
  auto fd = exporter.export_handle(*handle);
  ASSERT_TRUE(fd.ok()) << fd.status().to_string();
  EXPECT_TRUE(exporter.describe(*handle)->crosses_processes);

  auto import_grant = governor.prepare(importer_tier, g);
  ASSERT_TRUE(import_grant.ok());
  auto imported = importer.import_handle(*fd, g, &*import_grant);
  ::close(*fd);
  ASSERT_TRUE(imported.ok()) << imported.status().to_string();
  import_grant->commit_charged();
  // Each side's ledger counts what its pool holds.
  EXPECT_EQ(governor.stats(importer_tier).used, g);
  EXPECT_EQ(governor.stats(exporter_tier).used, g);
  EXPECT_TRUE(importer.describe(*imported)->crosses_processes);
  EXPECT_EQ(importer.describe(*imported)->state, HandleState::kInUse);

  // Given back unmapped: released at once on both sides (room in the pool notwithstanding).
  importer.give_back(*imported);
  exporter.give_back(*handle);
  EXPECT_EQ(importer.snapshot().pooled_bytes, 0u);
  EXPECT_EQ(exporter.snapshot().pooled_bytes, 0u);
  EXPECT_EQ(governor.stats(importer_tier).used, 0u);
  EXPECT_EQ(governor.stats(exporter_tier).used, 0u);
  EXPECT_EQ(host_driver_tables(*importer_driver).handles, 0u);
  EXPECT_EQ(host_driver_tables(*exporter_driver).handles, 0u);

  // Without a grant nothing is imported.
  EXPECT_EQ(importer.import_handle(0, g, nullptr).status().code(), StatusCode::kFailedPrecondition);
}

TEST(CudaDriverExportTest, ImportedHandleSharesTheBytesAndOutlivesTheExporter) {
  auto exporter = make_cuda_driver();
  if (!exporter.ok()) GTEST_SKIP() << "no CUDA device: " << exporter.status().to_string();
  auto importer = make_cuda_driver();
  ASSERT_TRUE(importer.ok()) << importer.status().to_string();
  expect_shared_and_outliving(**exporter, **importer);
}

}  // namespace
}  // namespace kvvm::testing
