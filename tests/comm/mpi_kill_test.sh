#!/usr/bin/env bash
# Usage: mpi_kill_test.sh MPIRUN TEST_BINARY NP RANK
# Runs MpiKill.DISABLED_OneRankDiesDuringAllreduces under `mpirun -np NP`
# with rank RANK killing itself, and checks that the job ends (within the
# CTest timeout), that mpirun exits non-zero naming the dead rank, and that
# no rank outlives it.
set -uo pipefail
mpirun="$1" binary="$2" np="$3" rank="$4"
marker="lockstep-kill-test-$$"  # on every rank's command line, to find leftovers
out="$(mktemp)"
trap 'rm -f "$out"' EXIT
start=$(date +%s)
LOCKSTEP_TEST_KILL_RANK="$rank" "$mpirun" -np "$np" --oversubscribe "$binary" \
  --gtest_also_run_disabled_tests --gtest_filter='MpiKill.*' "--$marker" >"$out" 2>&1
status=$?
elapsed=$(( $(date +%s) - start ))
sleep 1
left=$(pgrep -f -- "--$marker" | wc -l)
echo "mpirun exit $status after ${elapsed} s; ranks left behind: $left"
fail=0
[ "$status" -ne 0 ] || { echo "FAIL: mpirun exited 0 although rank $rank was killed"; fail=1; }
grep -q "process rank $rank .*exited on signal 9" "$out" || { echo "FAIL: mpirun did not name rank $rank"; fail=1; }
[ "$left" -eq 0 ] || { echo "FAIL: $left rank(s) outlived mpirun"; kill -KILL $(pgrep -f -- "--$marker") 2>/dev/null; fail=1; }
[ "$fail" -eq 0 ] || sed 's/^/  | /' "$out"
exit "$fail"
