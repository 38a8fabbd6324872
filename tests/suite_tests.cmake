# CTest reads this (through the include file tests/CMakeLists.txt generates) in the sanitizer
# builds: one CTest test per googletest suite of the test binary, instead of one per test.
#
# Why: a process of the sanitized binary costs about 0.5 s besides its test (AddressSanitizer's
# start, and LeakSanitizer scanning the ~150 MB of UBSan check data in .data at exit) where the
# release binary's costs 0.03 s; at one process per test that was about half of the
# AddressSanitizer suite's time on the 2-core machine. A suite shares one process (the release
# suite, one process per test, still proves each test alone).
#
# In: KVVM_TESTS_BINARY, KVVM_TEST_ENVIRONMENT (may be empty), KVVM_LONG_TESTS (tests/
# long_tests.txt: "seconds name" of the long tests, summed per suite into the COST CTest
# starts the longest first by; a clean build directory has no measured costs).
execute_process(COMMAND "${KVVM_TESTS_BINARY}" --gtest_list_tests
  OUTPUT_VARIABLE listing RESULT_VARIABLE listed TIMEOUT 120)
if(NOT listed EQUAL 0)
  # A test that fails and shows why, rather than a suite that silently has no tests.
  add_test(kvvm_tests.list "${KVVM_TESTS_BINARY}" --gtest_list_tests)
  return()
endif()

# Names are split into lines as a CMake list: characters that list syntax reads are replaced
# first (they appear only in the listing's "# GetParam() = ..." comments, never in a name).
string(REGEX REPLACE "[][;\\\\]" "_" listing "${listing}")
string(REPLACE "\n" ";" lines "${listing}")
set(suites)
foreach(line IN LISTS lines)
  if(line MATCHES "^([^ ]+)\\.( |$)")  # "Suite." or "Suite.  # TypeParam = ..."
    set(suite "${CMAKE_MATCH_1}")
    list(APPEND suites "${suite}")
    string(MAKE_C_IDENTIFIER "${suite}" id)
    set(tests_${id} 0)
    set(cost_${id} 0)
  elseif(line MATCHES "^  [^ ]" AND DEFINED suite)
    math(EXPR tests_${id} "${tests_${id}} + 1")
  endif()
endforeach()

if(EXISTS "${KVVM_LONG_TESTS}")
  file(STRINGS "${KVVM_LONG_TESTS}" long_lines REGEX "^[0-9]+ ")
  foreach(line IN LISTS long_lines)
    string(REGEX REPLACE "[][;\\\\]" "_" line "${line}")
    if(line MATCHES "^([0-9]+) [^<]*<([^<]+)\\.  #")  # a typed test: "Test.Case<Suite/type.  # ..."
      set(seconds ${CMAKE_MATCH_1})
      set(suite "${CMAKE_MATCH_2}")
    elseif(line MATCHES "^([0-9]+) ([^.]+)\\.")
      set(seconds ${CMAKE_MATCH_1})
      set(suite "${CMAKE_MATCH_2}")
    else()
      continue()
    endif()
    string(MAKE_C_IDENTIFIER "${suite}" id)
    if(DEFINED cost_${id})
      math(EXPR cost_${id} "${cost_${id}} + ${seconds}")
    endif()
  endforeach()
endif()

foreach(suite IN LISTS suites)
  string(MAKE_C_IDENTIFIER "${suite}" id)
  # Unmeasured tests count a second each under a sanitizer, about what a short one takes.
  math(EXPR cost "${cost_${id}} + ${tests_${id}}")
  add_test("${suite}.*" "${KVVM_TESTS_BINARY}" "--gtest_filter=${suite}.*")
  # A suite whose every test skipped (no device) is reported skipped, not passed.
  set_tests_properties("${suite}.*" PROPERTIES TIMEOUT 1800 COST ${cost}
    SKIP_REGULAR_EXPRESSION "\\[  PASSED  \\] 0 tests\\.")
  if(KVVM_TEST_ENVIRONMENT)
    set_tests_properties("${suite}.*" PROPERTIES ENVIRONMENT "${KVVM_TEST_ENVIRONMENT}")
  endif()
endforeach()
