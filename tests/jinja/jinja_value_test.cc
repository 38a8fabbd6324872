// Values print as Python prints them (str() and repr()), compare and test truthiness as Python
// does.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>

#include "jinja/value.h"

namespace kvvm::jinja::detail {
namespace {

TEST(JinjaValue, FloatsPrintAsPythonRepr) {
  EXPECT_EQ(format_float(1.0), "1.0");
  EXPECT_EQ(format_float(0.1), "0.1");
  EXPECT_EQ(format_float(0.1 + 0.2), "0.30000000000000004");
  EXPECT_EQ(format_float(1e-05), "1e-05");
  EXPECT_EQ(format_float(0.0001), "0.0001");
  EXPECT_EQ(format_float(1e16), "1e+16");
  EXPECT_EQ(format_float(1234567890123456.0), "1234567890123456.0");
  EXPECT_EQ(format_float(1.5e300), "1.5e+300");
  EXPECT_EQ(format_float(-2.5), "-2.5");
  EXPECT_EQ(format_float(-0.0), "-0.0");
  EXPECT_EQ(format_float(100.0), "100.0");
  EXPECT_EQ(format_float(std::numeric_limits<double>::infinity()), "inf");
  EXPECT_EQ(format_float(-std::numeric_limits<double>::infinity()), "-inf");
  EXPECT_EQ(format_float(std::nan("")), "nan");
}

TEST(JinjaValue, StrAndRepr) {
  EXPECT_EQ(Value::none().str(), "None");
  EXPECT_EQ(Value::boolean(true).str(), "True");
  EXPECT_EQ(Value::boolean(false).str(), "False");
  EXPECT_EQ(Value::integer(-42).str(), "-42");
  EXPECT_EQ(Value::undefined().str(), "");
  EXPECT_EQ(Value::string("it's").str(), "it's");
  EXPECT_EQ(Value::string("it's").repr(), "\"it's\"");
  EXPECT_EQ(Value::string("a\"b'c\n").repr(), "'a\"b\\'c\\n'");
  EXPECT_EQ(Value::string("\x01\xc2\xa0\xe6\x97\xa5").repr(), "'\\x01\\xa0\xe6\x97\xa5'");
  Value list =
      Value::list({Value::string("a"), Value::integer(1), Value::floating(2.0), Value::none(),
                   Value::list({}, true), Value::list({Value::boolean(true)}, true)});
  EXPECT_EQ(list.str(), "['a', 1, 2.0, None, (), (True,)]");
  Value dict =
      Value::dict({{Value::string("b"), Value::integer(1)}, {Value::string("a"), Value::list({})}});
  EXPECT_EQ(dict.str(), "{'b': 1, 'a': []}");  // insertion order, as Python keeps it
}

TEST(JinjaValue, TruthinessAndEquality) {
  EXPECT_FALSE(Value::undefined().truthy());
  EXPECT_FALSE(Value::none().truthy());
  EXPECT_FALSE(Value::integer(0).truthy());
  EXPECT_FALSE(Value::floating(0.0).truthy());
  EXPECT_FALSE(Value::string("").truthy());
  EXPECT_FALSE(Value::list({}).truthy());
  EXPECT_FALSE(Value::dict({}).truthy());
  EXPECT_TRUE(Value::string(" ").truthy());
  EXPECT_TRUE(Value::list({Value::none()}).truthy());

  EXPECT_TRUE(Value::integer(1).equals(Value::floating(1.0)));
  EXPECT_TRUE(Value::boolean(true).equals(Value::integer(1)));
  EXPECT_FALSE(Value::integer(1).equals(Value::string("1")));
  EXPECT_FALSE(Value::list({}).equals(Value::list({}, true)));  // [] != ()
  Value a = Value::dict(
      {{Value::string("x"), Value::integer(1)}, {Value::string("y"), Value::integer(2)}});
  Value b = Value::dict(
      {{Value::string("y"), Value::integer(2)}, {Value::string("x"), Value::floating(1.0)}});
  EXPECT_TRUE(a.equals(b));  // dict equality ignores order
  EXPECT_TRUE(Value::undefined().equals(Value::undefined()));
  EXPECT_FALSE(Value::undefined().equals(Value::none()));
}

TEST(JinjaValue, CopiesShareStorage) {
  List big(1000, Value::string(std::string(1000, 'x')));
  Value v = Value::list(std::move(big));
  Value copy = v;
  EXPECT_EQ(&v.as_list(), &copy.as_list());
}

TEST(JinjaValue, Utf8Length) {
  EXPECT_EQ(utf8_length(""), 0u);
  EXPECT_EQ(utf8_length("abc"), 3u);
  EXPECT_EQ(utf8_length("h\xc3\xa9llo"), 5u);
  EXPECT_EQ(utf8_length("\xe6\x97\xa5\xf0\x9f\x98\x80"), 2u);
}

}  // namespace
}  // namespace kvvm::jinja::detail
