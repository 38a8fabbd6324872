#include "kit/cli_common.h"

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <ostream>
#include <sstream>

#include "kit/byte_size.h"
#include "kvvm/vmm/cuda_driver.h"
#include "kvvm/vmm/host_driver.h"

namespace kvvm::cli {
namespace {

std::string shown(double value) {
  std::ostringstream text;
  text << value;
  return text.str();
}

}  // namespace

Result<std::unique_ptr<Driver>> open_driver(BackendChoice backend, int device,
                                            std::size_t host_granule, std::string_view command,
                                            std::ostream& err, bool populate) {
  if (backend != BackendChoice::kHost) {
    if (backend == BackendChoice::kCuda || cuda_available()) {
      Result<std::unique_ptr<Driver>> cuda = make_cuda_driver(CudaDriverOptions{.device = device});
      if (cuda.ok() || backend == BackendChoice::kCuda) {
        if (!cuda.ok()) return cuda.status().with_context("--backend cuda");
        return cuda;
      }
      // Asked for nothing in particular: a GPU that cannot be opened is worth a note, not a
      // failure, since the host driver answers the same questions.
      err << command << ": note: CUDA is present but could not be opened ("
          << cuda.status().to_string() << "); using the host driver\n";
    }
  }
  Result<std::unique_ptr<Driver>> host =
      make_host_driver(HostDriverOptions{.granule = host_granule, .populate = populate});
  if (!host.ok()) {
    return host.status().with_context("--host-granule " + std::to_string(host_granule));
  }
  return host;
}

void add_backend_options(CLI::App& command, BackendChoice& backend, int& device,
                         std::uint64_t& host_granule, const std::string& host_granule_help) {
  command
      .add_option_function<std::string>(
          "--backend",
          [&backend](const std::string& value) {
            backend = value == "cuda"   ? BackendChoice::kCuda
                      : value == "host" ? BackendChoice::kHost
                                        : BackendChoice::kAuto;
          },
          "cuda, host or auto (default auto: cuda when a GPU is usable, else host)")
      ->check(CLI::IsMember({"auto", "cuda", "host"}));
  command.add_option("--device", device, "CUDA device ordinal (cuda backend; default 0)")
      ->transform(count_validator(0, kMaxDeviceOrdinal));
  command.add_option("--host-granule", host_granule, host_granule_help)
      ->transform(host_granule_validator());
}

Result<std::uint64_t> parse_count(std::string_view text, std::uint64_t min, std::uint64_t max) {
  const std::string bounds = " (from " + std::to_string(min) + " to " + std::to_string(max) + ")";
  const std::string quoted = "'" + std::string(text) + "'";
  if (text.empty() || text.find_first_not_of("0123456789") != std::string_view::npos) {
    return Status::InvalidArgument("expected a whole number in decimal digits" + bounds + ", got " +
                                   quoted);
  }
  std::uint64_t value = 0;
  for (const char c : text) {
    const auto digit = static_cast<std::uint64_t>(c - '0');
    if (digit > max || value > (max - digit) / 10) {
      return Status::InvalidArgument(quoted + " is above the limit of " + std::to_string(max));
    }
    value = value * 10 + digit;
  }
  if (value < min) {
    return Status::InvalidArgument(quoted + " is below the minimum of " + std::to_string(min));
  }
  return value;
}

Result<double> parse_number(std::string_view text, double min, double max, bool min_exclusive) {
  const std::string bounds = std::string(min_exclusive ? " (above " : " (from ") + shown(min) +
                             (min_exclusive ? " up to " : " to ") + shown(max) + ")";
  const std::string quoted = "'" + std::string(text) + "'";
  // Digits, a point and an exponent only: strtod would also take hex, inf and nan.
  const bool plain = !text.empty() && text.find_first_not_of("0123456789.eE+-") == text.npos &&
                     text.find_first_of("0123456789") != text.npos;
  const std::string copy(text);
  char* end = nullptr;
  errno = 0;
  const double value = plain ? std::strtod(copy.c_str(), &end) : 0.0;
  if (!plain || end != copy.c_str() + copy.size()) {
    return Status::InvalidArgument("expected a decimal number" + bounds + ", got " + quoted);
  }
  if (errno == ERANGE && std::abs(value) > 1) {
    return Status::InvalidArgument(quoted + " is above the limit of " + shown(max));
  }
  if (!std::isfinite(value) || value > max) {
    return Status::InvalidArgument(quoted + " is above the limit of " + shown(max));
  }
  if (min_exclusive ? !(value > min) : !(value >= min)) {
    return Status::InvalidArgument(quoted + (min_exclusive ? " must be above " : " is below ") +
                                   (min_exclusive ? "" : "the minimum of ") + shown(min));
  }
  return value;
}

CLI::Validator count_validator(std::uint64_t min, std::uint64_t max) {
  return CLI::Validator(
      [min, max](std::string& value) -> std::string {
        Result<std::uint64_t> count = parse_count(value, min, max);
        if (!count.ok()) return count.status().message();
        value = std::to_string(*count);
        return {};
      },
      "UINT", "whole number");
}

CLI::Validator number_validator(double min, double max, bool min_exclusive) {
  return CLI::Validator(
      [min, max, min_exclusive](std::string& value) -> std::string {
        Result<double> number = parse_number(value, min, max, min_exclusive);
        if (!number.ok()) return number.status().message();
        return {};
      },
      "NUMBER", "number");
}

std::string dump_json(const nlohmann::ordered_json& json) {
  return json.dump(2, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
}

Status check_written(std::ostream& out, std::string_view name) {
  errno = 0;
  out.flush();
  if (!out) {
    return Status::Unavailable("writing " + std::string(name) + " failed" +
                               (errno != 0 ? std::string(": ") + std::strerror(errno) : ""));
  }
  return Status::Ok();
}

Status check_input_file(std::string_view option, const std::string& path) {
  const std::string named = std::string(option) + ": cannot open '" + path + "': ";
  std::error_code error;
  const std::filesystem::file_status status = std::filesystem::status(path, error);
  if (status.type() == std::filesystem::file_type::not_found) {
    return Status::InvalidArgument(named + "no such file");
  }
  if (error) return Status::InvalidArgument(named + error.message());
  // A directory opens like a file and fails on the first read, deep in the parser.
  if (status.type() == std::filesystem::file_type::directory) {
    return Status::InvalidArgument(named + "it is a directory, not a file");
  }
  errno = 0;
  if (!std::ifstream(path, std::ios::binary)) {
    return Status::InvalidArgument(named + (errno != 0 ? std::strerror(errno) : "not readable"));
  }
  return Status::Ok();
}

Status write_file(const std::string& path, std::string_view option,
                  const std::function<void(std::ostream&)>& write) {
  std::ofstream file(path);
  if (!file) {
    return Status::InvalidArgument(std::string(option) + ": cannot open '" + path +
                                   "' for writing");
  }
  write(file);
  errno = 0;
  file.flush();
  file.close();  // the last bytes reach the disk here: a full disk shows as a failed close
  if (!file) {
    return Status::Unavailable(std::string(option) + ": writing '" + path + "' failed" +
                               (errno != 0 ? std::string(": ") + std::strerror(errno) : ""));
  }
  return Status::Ok();
}

std::string unknown_subcommand(const CLI::App& app, const std::vector<std::string>& args) {
  const CLI::App* level = &app;
  for (const std::string& word : args) {
    if (word.empty() || word.front() == '-') break;
    const std::vector<const CLI::App*> children =
        level->get_subcommands([](const CLI::App*) { return true; });
    if (children.empty()) break;
    const CLI::App* match = nullptr;
    std::string names;
    for (const CLI::App* child : children) {
      if (child->check_name(word)) match = child;
      names += (names.empty() ? "" : ", ") + child->get_name();
    }
    if (match == nullptr) {
      return "unknown subcommand '" + word + "' of " + level->get_name() +
             "; expected one of: " + names;
    }
    level = match;
  }
  return {};
}

std::uint64_t usable_memory(const DriverInfo& info) {
  if (info.backend == "cuda") {
    const std::uint64_t headroom =
        std::max<std::uint64_t>(info.free_bytes / 16, std::uint64_t{512} << 20);
    return info.free_bytes > headroom ? info.free_bytes - headroom : 0;
  }
  return info.free_bytes / 2;
}

}  // namespace kvvm::cli
