// Numbers in text for the library's messages and the tool's output: counts, fixed decimals,
// three significant digits, durations and rates with their units; addresses in hex, errno
// names. Byte counts: kvvm/base/bytes.h. One formatter, so a time or a rate reads the same wherever
// it is printed.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace kvvm {

// A count's decimal digits.
std::string str(std::uint64_t value);
// `value` with `decimals` digits after the point; "n/a" for NaN (a ratio over a zero).
std::string fixed(double value, int decimals);
// Three significant digits, never an exponent: "0.00123", "1.23", "12.3", "123", and whole
// numbers from 1000 up ("1235"); "n/a" for NaN and infinities. What a measured time or rate is
// worth: the digits past the third are noise.
std::string significant(double value);
// A value as an option would be written: up to six significant digits, no trailing zeros
// ("0.5", "2", "1e+07").
std::string number(double value);
// A duration in the unit that reads best, in three significant digits: "850 ns", "12.3 µs",
// "22.7 ms", "1.25 s"; from a minute "1 min 05 s", from an hour "1 h 02 min"; "n/a" for a
// negative or NaN duration.
std::string format_duration(double seconds);
// "367 tokens/s" for (367.144, "tokens"): significant digits, then the unit per second.
std::string format_rate(double per_second, std::string_view unit);
// Bytes per second in format_bytes' units: "1.50 GiB/s"; "n/a" for a negative or NaN rate.
std::string format_byte_rate(double bytes_per_second);

std::string hex(std::uintptr_t value);
// A byte range as a half-open interval: "[4096, 8192)" for (4096, 4096).
std::string byte_range(std::uint64_t offset, std::uint64_t len);
// "ENOMEM" for ENOMEM; "errno 123" when the name is not known.
std::string errno_name(int error);

}  // namespace kvvm
