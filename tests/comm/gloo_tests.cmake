# The Gloo backend's tests, included from tests/comm/CMakeLists.txt when the
# optional lockstep_comm_gloo target exists. The ranks are processes of
# lockstep_gloo_rank (gloo_rank_main.cpp) that the tests spawn; every test
# carries the label "process" (ctest -LE process runs the quick set).
if(NOT TARGET lockstep_comm_gloo)
  return()
endif()

add_executable(lockstep_gloo_rank gloo_rank_main.cpp)
target_link_libraries(lockstep_gloo_rank PRIVATE lockstep_process_group)
target_compile_options(lockstep_gloo_rank PRIVATE ${LOCKSTEP_TEST_HOT_OPT})  # test code, as lockstep_test_flags HOT

add_executable(lockstep_gloo_tests gloo_collectives_test.cpp gloo_rendezvous_test.cpp gloo_failure_test.cpp
                                   gloo_secret_test.cpp gloo_sigpipe_test.cpp
                                   gloo_store_test.cpp)
target_link_libraries(lockstep_gloo_tests PRIVATE lockstep_comm_gloo GTest::gtest GTest::gtest_main Threads::Threads)
lockstep_test_flags(lockstep_gloo_tests HOT)
target_include_directories(lockstep_gloo_tests PRIVATE ${PROJECT_SOURCE_DIR}/tests ${PROJECT_SOURCE_DIR}/src)
target_compile_definitions(lockstep_gloo_tests PRIVATE LOCKSTEP_TEST_TMPDIR="${CMAKE_CURRENT_BINARY_DIR}"
                                                       LOCKSTEP_GLOO_RANK="$<TARGET_FILE:lockstep_gloo_rank>")
add_dependencies(lockstep_gloo_tests lockstep_gloo_rank)
gtest_discover_tests(lockstep_gloo_tests TEST_PREFIX "lockstep_gloo_tests." DISCOVERY_TIMEOUT 60
                     PROPERTIES LABELS process TIMEOUT 150)
