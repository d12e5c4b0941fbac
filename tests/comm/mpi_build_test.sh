#!/bin/sh
# Usage: mpi_build_test.sh MPIEXEC PROGRAM
#
# Two MPI ranks of which the second states another build (LOCKSTEP_TEST_BUILD,
# read by mpi_rank_main.cpp): the group must be refused in connect_mpi,
# non-zero, with a message naming both builds (Note [One build per group]): the fake
# one and the first rank's own (lockstep::build_id(), "VERSION+...").
set -u
mpiexec=$1 program=$2
own="[0-9][0-9.]*\\+[0-9a-f]{12}"
out=$("$mpiexec" -np 1 --oversubscribe "$program" --gtest_filter=None : \
      -np 1 --oversubscribe env LOCKSTEP_TEST_BUILD=0.0.9+feedfacecafe "$program" --gtest_filter=None 2>&1)
rc=$?
printf '%s\n' "$out"
fail() { echo "mpi_build_test.sh: FAILED: $1"; exit 1; }
[ "$rc" -ne 0 ] || fail "mpirun exited 0"
# Both ranks refuse, but the first to exit non-zero makes mpirun end the job,
# which may kill the other before it prints: at least one message, then,
# naming both builds.
printf '%s\n' "$out" | grep -Eq \
  "lockstep_mpi_tests: rank (0: rank 1 \(on .*\) runs build 0\.0\.9\+feedfacecafe but this rank runs build $own|1: rank 0 \(on .*\) runs build $own but this rank runs build 0\.0\.9\+feedfacecafe);" ||
  fail "no rank refused naming both builds"
echo "mpi_build_test.sh: passed"
