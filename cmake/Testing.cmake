# cortado_gtest(<name> SOURCES ... LIBS ... [LABELS ...] [TIMEOUT s] [SERIAL])
# One GoogleTest executable, its cases discovered by ctest. SERIAL: its cases
# never run beside other tests (multi-process jobs that load both cores).
include(GoogleTest)
function(cortado_gtest name)
  cmake_parse_arguments(T "SERIAL" "TIMEOUT" "SOURCES;LIBS;LABELS" ${ARGN})
  add_executable(${name} ${T_SOURCES})
  target_link_libraries(${name} PRIVATE ${T_LIBS} GTest::gtest GTest::gtest_main GTest::gmock)
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT 300)
  endif()
  set(serial FALSE)
  if(T_SERIAL)
    set(serial TRUE)
  endif()
  gtest_discover_tests(${name}
    DISCOVERY_TIMEOUT 60
    PROPERTIES TIMEOUT ${T_TIMEOUT} LABELS "${T_LABELS}" RUN_SERIAL ${serial}
    WORKING_DIRECTORY ${PROJECT_BINARY_DIR})
endfunction()
