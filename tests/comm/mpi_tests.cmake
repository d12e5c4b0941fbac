# The MPI backend's tests, included from tests/comm/CMakeLists.txt when the
# optional lockstep_comm_mpi target exists. One GoogleTest program run by
# every rank of `mpirun -np N` (mpi_rank_main.cpp), for N = 2, 3, 4, 8.
if(NOT TARGET lockstep_comm_mpi)
  return()
endif()

add_executable(lockstep_mpi_tests mpi_rank_main.cpp mpi_collectives_test.cpp mpi_failure_test.cpp mpi_kill_test.cpp)
target_link_libraries(lockstep_mpi_tests PRIVATE lockstep_comm_mpi GTest::gtest Threads::Threads)
lockstep_test_flags(lockstep_mpi_tests HOT)
target_include_directories(lockstep_mpi_tests PRIVATE ${PROJECT_SOURCE_DIR}/tests ${PROJECT_SOURCE_DIR}/src)

# We run as root in containers: OpenMPI refuses that unless told. Shared
# memory (vader) between local ranks; more ranks than cores is expected.
set(LOCKSTEP_MPI_TEST_ENV
  OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  OMPI_MCA_btl=self,vader OMPI_MCA_rmaps_base_oversubscribe=1
  # OpenMPI keeps its allocations until exit: not ours to report.
  ASAN_OPTIONS=detect_leaks=0)
# Per N, the grid in two halves and the rest, so that each test stays well
# under a minute at N=8 on a loaded 2-core machine (also under ASan).
set(LOCKSTEP_MPI_TEST_PARTS
  "grid_a=*MpiAllreduceGrid*/ring_*:*MpiAllreduceGrid*/naive_*"
  "grid_b=*MpiAllreduceGrid*/halving_doubling_*:*MpiAllreduceGrid*/native_*:*MpiAllreduceGrid*/auto_*"
  "rest=-*MpiAllreduceGrid*")
foreach(n 2 3 4 8)
  foreach(part ${LOCKSTEP_MPI_TEST_PARTS})
    string(REPLACE "=" ";" part "${part}")
    list(GET part 0 name)
    list(GET part 1 filter)
    add_test(NAME lockstep_mpi_tests.np${n}.${name}
             COMMAND ${LOCKSTEP_MPIEXEC} -np ${n} --oversubscribe
                     $<TARGET_FILE:lockstep_mpi_tests> --gtest_filter=${filter})
    set_tests_properties(lockstep_mpi_tests.np${n}.${name} PROPERTIES
      LABELS process TIMEOUT 120 ENVIRONMENT "${LOCKSTEP_MPI_TEST_ENV}")
  endforeach()
endforeach()

# A rank killed in the middle of all-reduces (rank 0, and another): mpirun
# must end the job, non-zero, naming it, with no rank left behind.
foreach(victim 0 2)
  add_test(NAME lockstep_mpi_kill.np4_rank${victim}
           COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/mpi_kill_test.sh ${LOCKSTEP_MPIEXEC}
                   $<TARGET_FILE:lockstep_mpi_tests> 4 ${victim})
  set_tests_properties(lockstep_mpi_kill.np4_rank${victim} PROPERTIES
    LABELS process TIMEOUT 60 ENVIRONMENT "${LOCKSTEP_MPI_TEST_ENV}")
endforeach()
# A rank stopped (SIGSTOP) in the middle of all-reduces, or before the others
# connect: the others time out, print their error and exit without waiting
# for it in MPI_Finalize.
foreach(mode stop stop-connect)
  add_test(NAME lockstep_mpi_kill.np3_rank1_${mode}
           COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/mpi_kill_test.sh ${LOCKSTEP_MPIEXEC}
                   $<TARGET_FILE:lockstep_mpi_tests> 3 1 ${mode})
  set_tests_properties(lockstep_mpi_kill.np3_rank1_${mode} PROPERTIES
    LABELS process TIMEOUT 60 ENVIRONMENT "${LOCKSTEP_MPI_TEST_ENV}")
endforeach()

# Nodes from processor names, and the hierarchical all-reduce over MPI:
# 4 ranks as 2 nodes of 2, 6 ranks as 2 nodes of 3 (mpi_nodes_test.sh).
foreach(layout "4;2" "6;3")
  list(GET layout 0 n)
  list(GET layout 1 g)
  add_test(NAME lockstep_mpi_nodes.np${n}_${g}_per_node
           COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/mpi_nodes_test.sh ${LOCKSTEP_MPIEXEC}
                   $<TARGET_FILE:lockstep_mpi_tests> ${n} ${g})
  set_tests_properties(lockstep_mpi_nodes.np${n}_${g}_per_node PROPERTIES
    LABELS process TIMEOUT 120 SKIP_RETURN_CODE 77 ENVIRONMENT "${LOCKSTEP_MPI_TEST_ENV}")
endforeach()

# The tag mapping alone: a pure function, no MPI needed (the quick set).
lockstep_test(lockstep_mpi_tags_tests SOURCES mpi_tags_test.cpp LIBS lockstep_comm)

# Two ranks of different builds (MPMD: the second states a fake one): both
# refuse in connect, naming both builds (mpi_build_test.sh).
add_test(NAME lockstep_mpi_build.np2
         COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/mpi_build_test.sh ${LOCKSTEP_MPIEXEC} $<TARGET_FILE:lockstep_mpi_tests>)
set_tests_properties(lockstep_mpi_build.np2 PROPERTIES
  LABELS process TIMEOUT 60 ENVIRONMENT "${LOCKSTEP_MPI_TEST_ENV}")
