# Read by CTest after the discovered tests are defined (tests/CMakeLists.txt says why).
set_tests_properties("ServerSoak.TimeAndMemoryStayFlatAsThePrefixCacheFillsAndReclaims"
  PROPERTIES RUN_SERIAL TRUE)
