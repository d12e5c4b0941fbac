#!/bin/sh
# Usage: mpi_nodes_test.sh MPIEXEC PROGRAM N G
#
# Runs PROGRAM's MpiNodes tests on N MPI ranks as if on N/G machines: every
# rank runs in its own UTS namespace (`unshare --uts`, which needs root) under
# the host name lockstep-node-(rank / G), and MPI_Get_processor_name reports
# that name. Exit 77 (skipped) where UTS namespaces cannot be made.
set -eu
mpiexec=$1 program=$2 n=$3 g=$4
if ! command -v hostname >/dev/null || ! unshare --uts true 2>/dev/null; then
  echo "mpi_nodes_test.sh: skipped: needs unshare --uts (root) and hostname"
  exit 77
fi
LOCKSTEP_TEST_PER_NODE=$g
export LOCKSTEP_TEST_PER_NODE
exec "$mpiexec" -np "$n" --oversubscribe -x LOCKSTEP_TEST_PER_NODE \
  unshare --uts sh -c \
  'hostname "lockstep-node-$((OMPI_COMM_WORLD_RANK / LOCKSTEP_TEST_PER_NODE))" && exec "$0" --gtest_filter="MpiNodes.*"' \
  "$program"
