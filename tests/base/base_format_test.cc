// The one formatter of numbers for messages and the tool's output (base/format.h): counts,
// fixed decimals, three significant digits, durations and rates with their units.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>

#include "base/format.h"

namespace kvvm {
namespace {

TEST(Format, CountsAndFixedDecimals) {
  EXPECT_EQ(str(0), "0");
  EXPECT_EQ(str(std::uint64_t{18446744073709551615u}), "18446744073709551615");
  EXPECT_EQ(fixed(2.0 / 3.0, 2), "0.67");
  EXPECT_EQ(fixed(1234.5, 0), "1234");  // round half to even, as printf does
  EXPECT_EQ(fixed(std::nan(""), 2), "n/a");
}

TEST(Format, ThreeSignificantDigitsNeverAnExponent) {
  EXPECT_EQ(significant(0), "0");
  EXPECT_EQ(significant(0.00123456), "0.00123");
  EXPECT_EQ(significant(1.23456), "1.23");
  EXPECT_EQ(significant(12.3456), "12.3");
  EXPECT_EQ(significant(123.456), "123");
  EXPECT_EQ(significant(1234567.891234), "1234568");  // whole numbers from 1000 up
  EXPECT_EQ(significant(9.996), "10.0");
  EXPECT_EQ(significant(-2.5), "-2.50");
  EXPECT_EQ(significant(std::nan("")), "n/a");
  EXPECT_EQ(significant(std::numeric_limits<double>::infinity()), "n/a");
}

TEST(Format, NumbersAsOptionsAreWritten) {
  EXPECT_EQ(number(0.5), "0.5");
  EXPECT_EQ(number(2), "2");
  EXPECT_EQ(number(-1), "-1");
  EXPECT_EQ(number(0.1 + 0.2), "0.3");
}

TEST(Format, DurationsInTheUnitThatReadsBest) {
  EXPECT_EQ(format_duration(0), "0 s");
  EXPECT_EQ(format_duration(850e-9), "850 ns");
  EXPECT_EQ(format_duration(12.3456e-6), "12.3 µs");
  EXPECT_EQ(format_duration(1234.567891234e-6), "1.23 ms");
  EXPECT_EQ(format_duration(0.0227192), "22.7 ms");
  EXPECT_EQ(format_duration(0.999), "999 ms");
  EXPECT_EQ(format_duration(0.9996), "1.00 s");
  EXPECT_EQ(format_duration(1.25), "1.25 s");
  EXPECT_EQ(format_duration(59.4), "59.4 s");
  EXPECT_EQ(format_duration(65), "1 min 05 s");
  EXPECT_EQ(format_duration(3725), "1 h 02 min");
  EXPECT_EQ(format_duration(-1), "n/a");
  EXPECT_EQ(format_duration(std::nan("")), "n/a");
}

TEST(Format, RatesWithTheirUnit) {
  EXPECT_EQ(format_rate(367.144, "tokens"), "367 tokens/s");
  EXPECT_EQ(format_rate(12345.678, "tokens"), "12346 tokens/s");
  EXPECT_EQ(format_rate(0.5, "req"), "0.500 req/s");
  EXPECT_EQ(format_byte_rate(1.5 * (1 << 30)), "1.50 GiB/s");
  EXPECT_EQ(format_byte_rate(2.0 * (1 << 20)), "2 MiB/s");
  EXPECT_EQ(format_byte_rate(std::nan("")), "n/a");
}

}  // namespace
}  // namespace kvvm
