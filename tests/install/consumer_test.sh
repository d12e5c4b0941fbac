#!/usr/bin/env bash
# install.consumer: installs the build under test into a fresh prefix, builds
# examples/custom_loop.cpp as a separate CMake project that only knows that
# prefix (find_package(lockstep)), and runs it: 2 replicas, 30 steps, the
# example's own checks (identical replicas, loss down).
# Then a second program, tests/install/backends.cpp, links the process-group
# factory and checks the package has the backends this build has.
# Usage: consumer_test.sh BUILD_DIR SOURCE_DIR WORK_DIR HAVE_GLOO HAVE_MPI
set -euo pipefail
build="$1" source="$2" work="$3" gloo="$4" mpi="$5"
rm -rf "$work"
mkdir -p "$work"
cmake --install "$build" --prefix "$work/prefix" > "$work/install.log"
# Nothing of the source tree may leak into the package (lib/ or lib64/).
package="$(find "$work/prefix" -type d -path '*/cmake/lockstep' | head -n 1)"
if [ -z "$package" ]; then
  echo "no cmake/lockstep package under $work/prefix" >&2
  exit 1
fi
if grep -rq -- "$source/include\|$source/src" "$package"; then
  echo "the installed package refers to the source tree:" >&2
  grep -rn -- "$source" "$package" >&2
  exit 1
fi
# -O0: the consumer's own code is the example's loop and checks; the library
# it links was built with the project's flags. (-O3 took 18.4-19.6 s of this
# test, -O1 13.2-14.5 s; on 2026-12-08, -O1 9.3 and 9.7 s, -O0 8.6 and 8.7 s.)
cmake -S "$source/tests/install" -B "$work/consumer" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_FLAGS_RELEASE=-O0 \
  -DCMAKE_PREFIX_PATH="$work/prefix" -DLOCKSTEP_EXAMPLE_SOURCE="$source/examples/custom_loop.cpp" \
  > "$work/configure.log"
cmake --build "$work/consumer" > "$work/build.log"
"$work/consumer/custom_loop" --replicas 2 --steps 30
"$work/consumer/backends" "gloo=$gloo" "mpi=$mpi"
