// `kvvm serve --kv-events-config` end to end: tests/clients/kv_events_router.py, a router
// written apart from kvvm (python3-zmq, python3-msgpack, libxxhash through ctypes), subscribes
// to a real server's events and checks that every request's cached tokens equal the longest
// chain of its prompt's blocks that the events left in its index, across evictions, two
// tenants, both layouts and a restart (docs/ARCHITECTURE.md "KV events").
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "kvvm/server/kv_events.h"
#include "support/test_data.h"

namespace kvvm::cli {
namespace {

bool have_python_router() {
  return std::system(
             "/usr/bin/python3 -c 'import zmq, msgpack, ctypes; "
             "ctypes.CDLL(\"libxxhash.so.0\")' >/dev/null 2>&1") == 0;
}

TEST(CliKvEvents, AnIndependentRoutersMatchesAgreeWithKvvmsHits) {
#if !KVVM_KV_EVENTS
  GTEST_SKIP() << "built without ZeroMQ / msgpack-cxx";
#else
  if (!have_python_router()) GTEST_SKIP() << "python3-zmq, python3-msgpack or libxxhash missing";
  const std::string script = std::string(KVVM_TEST_DATA_DIR) + "/../clients/kv_events_router.py";
  const std::string command = "/usr/bin/python3 '" + script + "' '" KVVM_CLI_PATH "' '" +
                              test::model_fixture_dir("llama-tiny") + "' 2>&1";
  FILE* pipe = ::popen(command.c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  std::string output;
  char buffer[4096];
  while (std::fgets(buffer, sizeof buffer, pipe) != nullptr) output += buffer;
  const int status = ::pclose(pipe);
  EXPECT_EQ(status, 0) << output;
  EXPECT_NE(output.find("requests agreed"), std::string::npos) << output;
  std::printf("%s", output.c_str());
#endif
}

}  // namespace
}  // namespace kvvm::cli
