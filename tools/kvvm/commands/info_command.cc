#include "commands/info_command.h"

#include <sys/resource.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <optional>
#include <ostream>
#include <string>
#include <utility>

#include "kit/text_table.h"
#include "kvvm/vmm/handle_pool.h"
#include "kvvm/vmm/host_driver.h"
#include "kvvm/vmm/reservation.h"

namespace kvvm::cli {
namespace {

// Names of the rows and ratios; also the keys scripts select on in --json output, so each
// name is unique across the table (kvvm's release is "pooled release", not "release").
constexpr const char* kCreate = "create";
constexpr const char* kMap = "map";
constexpr const char* kSetAccess = "set_access";
constexpr const char* kUnmap = "unmap";
constexpr const char* kRelease = "release";
constexpr const char* kRawMapSetAccess = "raw map+set_access";
constexpr const char* kRawCreateMapSetAccess = "raw create+map+set_access";
constexpr const char* kPooledCommit = "pooled commit";
constexpr const char* kFreshCommit = "fresh commit";
constexpr const char* kPooledRelease = "pooled release";

constexpr const char* kRawOursNote =
    "raw = the driver call alone; ours = kvvm's transaction incl. bookkeeping";

// "raw map, sample 3 of 64 (2097152-byte granule at offset 6291456)": what a failure was
// doing, so the message alone says which call of which series broke.
std::string sample_context(std::string_view what, std::size_t index, std::size_t samples,
                           std::size_t granule) {
  return std::string(what) + ", sample " + std::to_string(index + 1) + " of " +
         std::to_string(samples) + " (" + std::to_string(granule) + "-byte granule at offset " +
         std::to_string(index * granule) + ")";
}

struct RawSamples {
  std::vector<double> create, map, set_access, unmap, release;
};

// What the raw series holds at any moment. When a call fails midway the destructor gives it
// back (best effort, in reverse), so a failed measurement does not keep a GPU's memory for
// the rest of the process. On success everything is already given back and it does nothing.
class RawHoldings {
 public:
  RawHoldings(Driver& driver, std::size_t granule) : driver_(driver), granule_(granule) {}
  RawHoldings(const RawHoldings&) = delete;
  RawHoldings& operator=(const RawHoldings&) = delete;
  ~RawHoldings() {
    for (std::size_t i = mapped_.size(); i-- > 0;) {
      if (mapped_[i]) driver_.unmap(base_ + i * granule_, granule_).ignore();
    }
    for (Handle handle : handles_) {
      if (handle != kNoHandle) driver_.release(handle).ignore();
    }
    if (base_ != 0) driver_.free(base_, bytes_).ignore();
  }

  void reserved(Address base, std::size_t samples) {
    base_ = base;
    bytes_ = samples * granule_;
    handles_.assign(samples, kNoHandle);
    mapped_.assign(samples, false);
  }
  Address address(std::size_t index) const { return base_ + index * granule_; }
  Handle handle(std::size_t index) const { return handles_[index]; }
  void set_handle(std::size_t index, Handle handle) { handles_[index] = handle; }
  void set_mapped(std::size_t index, bool mapped) { mapped_[index] = mapped; }
  void freed() { base_ = 0; }

 private:
  Driver& driver_;
  const std::size_t granule_;
  Address base_ = 0;
  std::size_t bytes_ = 0;
  std::vector<Handle> handles_;
  std::vector<bool> mapped_;
};

// The raw calls over `samples` granules, each timed alone, in the pattern kvvm's operations
// make them: reserve; create every handle; per window map then set_access (as a commit of a
// pooled handle does); unmap every window (as a pooled release does); release every handle;
// free. Map and set_access are interleaved, not each in its own series, so the driver sees
// the same state under the raw calls as under a commit, and the ratio lines compare like
// with like.
Status measure_raw(Driver& driver, std::size_t samples, RawSamples& out) {
  const std::size_t granule = driver.granule();
  RawHoldings holdings(driver, granule);
  Result<Address> base = driver.reserve(samples * granule);
  if (!base.ok()) {
    return base.status().with_context("raw reserve of " + std::to_string(samples) + " x " +
                                      std::to_string(granule) + " bytes");
  }
  holdings.reserved(*base, samples);

  // Each series starts with no driver work outstanding (synchronize is outside the timing).
  const auto sync = [&driver](std::string_view before) -> Status {
    Status status = driver.synchronize();
    return status.ok() ? status : status.with_context("synchronize before " + std::string(before));
  };

  KVVM_RETURN_IF_ERROR(sync("raw create"));
  for (std::size_t i = 0; i < samples; ++i) {
    Result<Handle> handle = time_call(out.create, [&] { return driver.create(granule); });
    if (!handle.ok()) {
      return handle.status().with_context(sample_context("raw create", i, samples, granule));
    }
    holdings.set_handle(i, *handle);
  }
  KVVM_RETURN_IF_ERROR(sync("raw map and set_access"));
  for (std::size_t i = 0; i < samples; ++i) {
    Status status = time_call(
        out.map, [&] { return driver.map(holdings.address(i), granule, holdings.handle(i), 0); });
    if (!status.ok()) return status.with_context(sample_context("raw map", i, samples, granule));
    holdings.set_mapped(i, true);
    status = time_call(out.set_access, [&] {
      return driver.set_access(holdings.address(i), granule, Access::kReadWrite);
    });
    if (!status.ok()) {
      return status.with_context(sample_context("raw set_access", i, samples, granule));
    }
  }
  KVVM_RETURN_IF_ERROR(sync("raw unmap"));
  for (std::size_t i = 0; i < samples; ++i) {
    Status status =
        time_call(out.unmap, [&] { return driver.unmap(holdings.address(i), granule); });
    if (!status.ok()) return status.with_context(sample_context("raw unmap", i, samples, granule));
    holdings.set_mapped(i, false);
  }
  KVVM_RETURN_IF_ERROR(sync("raw release"));
  for (std::size_t i = 0; i < samples; ++i) {
    Status status = time_call(out.release, [&] { return driver.release(holdings.handle(i)); });
    if (!status.ok()) {
      return status.with_context(sample_context("raw release", i, samples, granule));
    }
    holdings.set_handle(i, kNoHandle);
  }
  const Address range = holdings.address(0);
  holdings.freed();  // one attempt only: a failed free is reported, not retried
  Status freed = driver.free(range, samples * granule);
  if (!freed.ok()) return freed.with_context("raw free of the timing range");
  return Status::Ok();
}

// Reservation::commit of one granule when the pool already holds a handle for it (so the
// commit costs a map and a set_access), then Reservation::release of one granule back into
// the pool. The pool is filled first by committing and releasing every window once.
Status measure_pooled(Driver& driver, std::size_t samples, std::vector<double>& commit_us,
                      std::vector<double>& release_us) {
  const std::size_t granule = driver.granule();
  const std::size_t bytes = samples * granule;
  // Exactly room for every window's handle: none is released when the windows go back.
  HandlePool pool(driver, PoolOptions{.max_pooled_bytes = bytes});
  // Declared after the pool so it is torn down first (its handles go back to the pool).
  Result<std::unique_ptr<Reservation>> created = Reservation::create(pool, bytes);
  if (!created.ok()) return created.status().with_context("pooled: reserving the timing range");
  Reservation& reservation = **created;

  for (std::size_t i = 0; i < samples; ++i) {
    Status status = reservation.commit(i * granule, granule, nullptr);
    if (!status.ok()) {
      return status.with_context(sample_context("filling the pool: commit", i, samples, granule));
    }
  }
  for (std::size_t i = 0; i < samples; ++i) {
    Status status = reservation.release(i * granule, granule);
    if (!status.ok()) {
      return status.with_context(sample_context("filling the pool: release", i, samples, granule));
    }
  }
  const PoolSnapshot filled = pool.snapshot();
  if (filled.handles_pooled != samples) {
    return Status::Internal("filling the pool left " + std::to_string(filled.handles_pooled) +
                            " handles pooled, expected " + std::to_string(samples) +
                            ": the pooled rows would not measure pooled commits");
  }

  KVVM_RETURN_IF_ERROR(driver.synchronize().with_context("synchronize before pooled commit"));
  for (std::size_t i = 0; i < samples; ++i) {
    Status status =
        time_call(commit_us, [&] { return reservation.commit(i * granule, granule, nullptr); });
    if (!status.ok()) {
      return status.with_context(sample_context("pooled commit", i, samples, granule));
    }
  }
  const PoolSnapshot committed = pool.snapshot();
  if (committed.creates != filled.creates) {
    return Status::Internal("pooled commits created " +
                            std::to_string(committed.creates - filled.creates) +
                            " handles instead of reusing pooled ones: the row would be wrong");
  }

  KVVM_RETURN_IF_ERROR(driver.synchronize().with_context("synchronize before pooled release"));
  for (std::size_t i = 0; i < samples; ++i) {
    Status status =
        time_call(release_us, [&] { return reservation.release(i * granule, granule); });
    if (!status.ok()) {
      return status.with_context(sample_context("pooled release", i, samples, granule));
    }
  }
  const PoolSnapshot released = pool.snapshot();
  if (released.releases != filled.releases) {
    return Status::Internal("pooled releases gave " +
                            std::to_string(released.releases - filled.releases) +
                            " handles back to the driver instead of the pool: the row would be "
                            "wrong");
  }
  return Status::Ok();
}

// Reservation::commit of one granule with a pool that keeps nothing, so every commit creates
// its handle: create + map + set_access plus kvvm's bookkeeping.
Status measure_fresh(Driver& driver, std::size_t samples, std::vector<double>& commit_us) {
  const std::size_t granule = driver.granule();
  const std::size_t bytes = samples * granule;
  HandlePool pool(driver, PoolOptions{.max_pooled_bytes = 0});
  Result<std::unique_ptr<Reservation>> created = Reservation::create(pool, bytes);
  if (!created.ok()) return created.status().with_context("fresh: reserving the timing range");
  Reservation& reservation = **created;
  const PoolSnapshot before = pool.snapshot();

  KVVM_RETURN_IF_ERROR(driver.synchronize().with_context("synchronize before fresh commit"));
  for (std::size_t i = 0; i < samples; ++i) {
    Status status =
        time_call(commit_us, [&] { return reservation.commit(i * granule, granule, nullptr); });
    if (!status.ok()) {
      return status.with_context(sample_context("fresh commit", i, samples, granule));
    }
  }
  const PoolSnapshot after = pool.snapshot();
  if (after.creates - before.creates != samples) {
    return Status::Internal("fresh commits created " +
                            std::to_string(after.creates - before.creates) + " handles, expected " +
                            std::to_string(samples) + ": the row would be wrong");
  }
  // Untimed; with max_pooled_bytes 0 the handles go back to the driver.
  Status status = reservation.release(0, bytes);
  if (!status.ok()) return status.with_context("fresh: releasing the timing range");
  return Status::Ok();
}

TimingRatio make_ratio(std::string name, double ours, double raw) {
  TimingRatio ratio;
  ratio.name = std::move(name);
  ratio.target = kRatioTarget;
  ratio.value = raw > 0 ? ours / raw : std::numeric_limits<double>::quiet_NaN();
  ratio.met = raw > 0 && ratio.value <= ratio.target;
  return ratio;
}

const TimingRow* find_row(const TimingReport& report, std::string_view name) {
  for (const TimingRow& row : report.rows) {
    if (row.name == name) return &row;
  }
  return nullptr;
}

// The first number in `path` (a /proc file), or nullopt when it cannot be read.
std::optional<std::uint64_t> read_number(const char* path, std::string_view after = {}) {
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    if (!line.starts_with(after)) continue;
    const std::size_t digit = line.find_first_of("0123456789");
    if (digit == std::string::npos) return std::nullopt;
    return std::strtoull(line.c_str() + digit, nullptr, 10);
  }
  return std::nullopt;
}

std::uint64_t count_lines(const char* path) {
  std::ifstream in(path);
  std::uint64_t lines = 0;
  for (std::string line; std::getline(in, line);) ++lines;
  return lines;
}

// The host driver's timing table holds every sample at once: their addresses, a mapping each
// (Linux does not merge them: each is mapped and protected apart) and the memory files they
// live in. Each is checked against what this process may have, so a count past a limit is
// refused before the first driver call, not at the sample where mmap starts failing.
Status check_host_limits(std::size_t samples, std::size_t granule) {
  const std::string asked = "--granules " + std::to_string(samples) + " (of " +
                            std::to_string(granule) + "-byte host granules) ";
  const std::uint64_t bytes = std::uint64_t{samples} * granule;
  constexpr std::uint64_t kSpareMappings = 64;  // the reservation's pieces, the pool's, malloc's
  const std::optional<std::uint64_t> max_maps = read_number("/proc/sys/vm/max_map_count");
  const std::uint64_t maps_in_use = count_lines("/proc/self/maps");
  if (max_maps && maps_in_use + samples + kSpareMappings > *max_maps) {
    const std::uint64_t room =
        *max_maps > maps_in_use + kSpareMappings ? *max_maps - maps_in_use - kSpareMappings : 0;
    return Status::InvalidArgument(
        asked + "needs " + std::to_string(samples) + " mappings at once, but vm.max_map_count is " +
        std::to_string(*max_maps) + " with " + std::to_string(maps_in_use) +
        " in use: the limit is --granules " + std::to_string(room) +
        " (or raise /proc/sys/vm/max_map_count)");
  }
  rlimit limit{};
  if (::getrlimit(RLIMIT_AS, &limit) == 0 && limit.rlim_cur != RLIM_INFINITY) {
    const std::uint64_t in_use = read_number("/proc/self/status", "VmSize:").value_or(0) * 1024;
    if (in_use + bytes > limit.rlim_cur) {
      return Status::InvalidArgument(
          asked + "reserves " + std::to_string(bytes) + " bytes of addresses, but RLIMIT_AS " +
          "(ulimit -v) is " + std::to_string(limit.rlim_cur) + " bytes with " +
          std::to_string(in_use) + " in use: the limit is --granules " +
          std::to_string(limit.rlim_cur > in_use ? (limit.rlim_cur - in_use) / granule : 0));
    }
  }
  // One memory file per chunk of handles (host_driver.h), not per handle.
  const std::uint64_t chunk = std::max<std::uint64_t>(kDefaultHostChunkBytes, granule);
  const std::uint64_t files = (bytes + chunk - 1) / chunk;
  std::error_code error;
  std::uint64_t open = 0;
  for (auto it = std::filesystem::directory_iterator("/proc/self/fd", error);
       !error && it != std::filesystem::directory_iterator(); it.increment(error)) {
    ++open;
  }
  if (::getrlimit(RLIMIT_NOFILE, &limit) == 0 && limit.rlim_cur != RLIM_INFINITY &&
      open + files > limit.rlim_cur) {
    return Status::InvalidArgument(
        asked + "needs " + std::to_string(files) + " memory files of " + format_bytes(chunk) +
        ", but RLIMIT_NOFILE (ulimit -n) is " + std::to_string(limit.rlim_cur) + " with " +
        std::to_string(open) + " open: the limit is --granules " +
        std::to_string(limit.rlim_cur > open ? (limit.rlim_cur - open) * chunk / granule : 0));
  }
  return Status::Ok();
}

// The request checks that make a bad command line exit 2 before anything is measured.
Status check_request(const InfoOptions& options, const DriverInfo& info,
                     const Granularity& granularity) {
  if (granularity.minimum == 0) {
    return Status::Internal("the " + info.backend + " driver reported a granule of 0 bytes");
  }
  if (!options.timing) return Status::Ok();
  if (options.granules == 0) {
    return Status::InvalidArgument("--granules must be at least 1, got 0");
  }
  const std::size_t granule = granularity.minimum;
  if (options.granules > std::numeric_limits<std::size_t>::max() / granule) {
    return Status::InvalidArgument("--granules " + std::to_string(options.granules) + " x " +
                                   std::to_string(granule) + "-byte granules overflows");
  }
  const std::uint64_t needed = std::uint64_t{options.granules} * granule;
  if (info.free_bytes > 0 && needed > info.free_bytes) {
    return Status::InvalidArgument("the timing table holds " + std::to_string(options.granules) +
                                   " granules of " + std::to_string(granule) + " bytes at once (" +
                                   std::to_string(needed) + " bytes) but the " + info.backend +
                                   " driver reports " + std::to_string(info.free_bytes) +
                                   " bytes free; lower --granules or use --no-timing");
  }
  if (info.backend == "host") return check_host_limits(options.granules, granule);
  return Status::Ok();
}

std::string bytes_and_human(std::uint64_t bytes) {
  return std::to_string(bytes) + " bytes (" + format_bytes(bytes) + ")";
}

}  // namespace

std::string_view to_string(RowKind kind) { return kind == RowKind::kRaw ? "raw" : "ours"; }

CLI::App* add_info_command(CLI::App& app, InfoOptions& options) {
  CLI::App* info = app.add_subcommand(
      "info",
      "Show the memory driver (device, granularity, free memory) and time one granule's "
      "commit and release: raw driver calls against kvvm's transactions, in the same run.");
  add_backend_options(*info, options.backend, options.device, options.host_granule,
                      "Host driver granule: a multiple of the page size, e.g. 4K, 2M, 1G "
                      "(host backend; default 0 = the page size)");
  info->add_option("--granules", options.granules,
                   "Samples per row of the timing table, one granule each (default 64)")
      ->transform(count_validator(1, kMaxTimingSamples));
  info->add_flag("--json", options.json, "Machine-readable output (JSON) on stdout");
  info->add_flag_callback(
      "--no-timing", [&options] { options.timing = false; }, "Skip the measured table");
  info->footer(std::string("Timing: median and p99 in microseconds over --granules samples; ") +
               kRawOursNote + ".");
  return info;
}

Result<TimingReport> measure_timing(Driver& driver, std::size_t samples) {
  if (samples == 0) return Status::InvalidArgument("timing needs at least 1 sample, got 0");
  const std::size_t granule = driver.granule();
  if (granule == 0) return Status::Internal("the driver reported a granule of 0 bytes");

  // One full untimed pass first, so one-time costs (lazy driver initialization, the driver's
  // own tables growing, clocks ramping up) land in no series. Why full size: after a
  // 1-granule warm-up, the first timed series (raw) on an H200 ran ~15 % slower than the same
  // series repeated later in the run, so kvvm looked faster than the raw calls it makes
  // (pooled commit / raw map+set_access 0.89); after a full pass, repeated series agreed
  // within ~4 % and the ratio read 1.04-1.06 (`kvvm info --backend cuda --json`, 5 runs).
  {
    RawSamples raw_warm_up;
    std::vector<double> commit_warm_up, release_warm_up, fresh_warm_up;
    KVVM_RETURN_IF_ERROR(measure_raw(driver, samples, raw_warm_up).with_context("warm-up"));
    KVVM_RETURN_IF_ERROR(
        measure_pooled(driver, samples, commit_warm_up, release_warm_up).with_context("warm-up"));
    KVVM_RETURN_IF_ERROR(measure_fresh(driver, samples, fresh_warm_up).with_context("warm-up"));
  }

  RawSamples raw;
  KVVM_RETURN_IF_ERROR(measure_raw(driver, samples, raw));
  std::vector<double> pooled_commit, pooled_release, fresh_commit;
  KVVM_RETURN_IF_ERROR(measure_pooled(driver, samples, pooled_commit, pooled_release));
  KVVM_RETURN_IF_ERROR(measure_fresh(driver, samples, fresh_commit));

  TimingReport report;
  report.samples = samples;
  report.granule_bytes = granule;
  const std::vector<double> map_set_access = add_samples(raw.map, raw.set_access);
  const std::vector<double> create_map_set_access = add_samples(raw.create, map_set_access);
  report.rows = {
      {kCreate, RowKind::kRaw, summarize(raw.create)},
      {kMap, RowKind::kRaw, summarize(raw.map)},
      {kSetAccess, RowKind::kRaw, summarize(raw.set_access)},
      {kUnmap, RowKind::kRaw, summarize(raw.unmap)},
      {kRelease, RowKind::kRaw, summarize(raw.release)},
      {kRawMapSetAccess, RowKind::kRaw, summarize(map_set_access)},
      {kRawCreateMapSetAccess, RowKind::kRaw, summarize(create_map_set_access)},
      {kPooledCommit, RowKind::kOurs, summarize(pooled_commit)},
      {kFreshCommit, RowKind::kOurs, summarize(fresh_commit)},
      {kPooledRelease, RowKind::kOurs, summarize(pooled_release)},
  };
  const auto median = [&report](const char* name) {
    return find_row(report, name)->summary.median_us;
  };
  report.ratios = {
      make_ratio(std::string(kPooledCommit) + " / " + kRawMapSetAccess, median(kPooledCommit),
                 median(kRawMapSetAccess)),
      make_ratio(std::string(kFreshCommit) + " / " + kRawCreateMapSetAccess, median(kFreshCommit),
                 median(kRawCreateMapSetAccess)),
  };
  return report;
}

Result<InfoReport> gather_info(Driver& driver, const InfoOptions& options) {
  InfoReport report;
  report.info = driver.info();
  report.granularity = driver.granularity();
  KVVM_RETURN_IF_ERROR(check_request(options, report.info, report.granularity));
  if (options.timing) {
    KVVM_ASSIGN_OR_RETURN(TimingReport timing, measure_timing(driver, options.granules));
    report.timing = std::move(timing);
  }
  return report;
}

nlohmann::ordered_json info_json(const InfoReport& report) {
  nlohmann::ordered_json json;
  json["backend"] = report.info.backend;
  json["device"] = {{"name", report.info.device_name},
                    {"ordinal", report.info.device_ordinal},
                    {"driver_version", report.info.driver_version},
                    {"vmm_supported", report.info.vmm_supported}};
  json["granularity"] = {{"minimum", report.granularity.minimum},
                         {"recommended", report.granularity.recommended}};
  json["memory"] = {{"free", report.info.free_bytes}, {"total", report.info.total_bytes}};
  if (report.timing) {
    nlohmann::ordered_json rows = nlohmann::ordered_json::array();
    for (const TimingRow& row : report.timing->rows) {
      rows.push_back({{"name", row.name},
                      {"kind", to_string(row.kind)},
                      {"median_us", row.summary.median_us},
                      {"p99_us", row.summary.p99_us}});
    }
    nlohmann::ordered_json ratios = nlohmann::ordered_json::array();
    for (const TimingRatio& ratio : report.timing->ratios) {
      // NaN (a raw median below the clock's resolution) is written as null.
      ratios.push_back({{"name", ratio.name},
                        {"value", ratio.value},
                        {"target", ratio.target},
                        {"met", ratio.met}});
    }
    json["timing"] = {{"samples", report.timing->samples},
                      {"granule", report.timing->granule_bytes},
                      {"rows", std::move(rows)},
                      {"ratios", std::move(ratios)}};
  }
  return json;
}

void print_info(const InfoReport& report, std::ostream& out) {
  const DriverInfo& info = report.info;
  constexpr std::size_t kLabel = 21;
  out << pad_right("backend", kLabel) << info.backend << "\n"
      << pad_right("device", kLabel) << info.device_name << "\n"
      << pad_right("ordinal", kLabel) << info.device_ordinal << "\n"
      << pad_right("driver version", kLabel) << info.driver_version << "\n"
      << pad_right("VMM support", kLabel) << (info.vmm_supported ? "yes" : "no") << "\n"
      << pad_right("granule minimum", kLabel) << bytes_and_human(report.granularity.minimum) << "\n"
      << pad_right("granule recommended", kLabel) << bytes_and_human(report.granularity.recommended)
      << "\n"
      << pad_right("memory free", kLabel) << bytes_and_human(info.free_bytes) << "\n"
      << pad_right("memory total", kLabel) << bytes_and_human(info.total_bytes) << "\n";
  if (!report.timing) return;

  const TimingReport& timing = *report.timing;
  std::size_t name_width = std::string_view("operation").size();
  for (const TimingRow& row : timing.rows) name_width = std::max(name_width, row.name.size());
  constexpr std::size_t kKind = 6;
  constexpr std::size_t kNumber = 13;
  out << "\ntiming: " << timing.samples << " samples per row, one "
      << format_bytes(timing.granule_bytes)
      << " granule each; microseconds (µs), steady_clock around each call\n";
  out << "  " << pad_right("kind", kKind) << pad_right("operation", name_width)
      << pad_left("median (µs)", kNumber) << pad_left("p99 (µs)", kNumber) << "\n";
  for (const TimingRow& row : timing.rows) {
    out << "  " << pad_right(to_string(row.kind), kKind) << pad_right(row.name, name_width)
        << pad_left(fixed(row.summary.median_us, 2), kNumber)
        << pad_left(fixed(row.summary.p99_us, 2), kNumber) << "\n";
  }

  std::size_t ratio_width = std::string_view("ratio of medians").size();
  for (const TimingRatio& ratio : timing.ratios) {
    ratio_width = std::max(ratio_width, ratio.name.size());
  }
  out << "\n  " << pad_right("ratio of medians", ratio_width) << pad_left("value", 8)
      << pad_left("target", 11) << "  met\n";
  for (const TimingRatio& ratio : timing.ratios) {
    out << "  " << pad_right(ratio.name, ratio_width) << pad_left(fixed(ratio.value, 2), 8)
        << pad_left("<= " + fixed(ratio.target, 2), 11) << "  " << (ratio.met ? "yes" : "NO")
        << "\n";
  }
  out << "\nnote: " << kRawOursNote << "\n";
}

int run_info(const InfoOptions& options, std::ostream& out, std::ostream& err) {
  const auto fail = [&err](const Status& status, int code) {
    err << "kvvm info: " << status.to_string() << "\n";
    return code;
  };
  Result<std::unique_ptr<Driver>> driver =
      open_driver(options.backend, options.device, options.host_granule, "kvvm info", err);
  if (!driver.ok()) {
    // Asking for a backend this machine lacks, or a granule it refuses, is a usage error.
    const StatusCode code = driver.status().code();
    const bool usage = code == StatusCode::kUnavailable || code == StatusCode::kInvalidArgument;
    return fail(driver.status(), usage ? kExitUsage : kExitFailure);
  }
  Driver& opened = **driver;
  Status request = check_request(options, opened.info(), opened.granularity());
  if (!request.ok()) {
    return fail(request,
                request.code() == StatusCode::kInvalidArgument ? kExitUsage : kExitFailure);
  }
  Result<InfoReport> report = gather_info(opened, options);
  if (!report.ok()) return fail(report.status(), kExitFailure);
  if (options.json) {
    out << dump_json(info_json(*report)) << "\n";
  } else {
    print_info(*report, out);
  }
  return kExitOk;
}

}  // namespace kvvm::cli
