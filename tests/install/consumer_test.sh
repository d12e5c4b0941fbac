#!/usr/bin/env bash
# install.consumer: installs the build under test into a fresh prefix, builds
# examples/custom_loop.cpp as a separate CMake project that only knows that
# prefix (find_package(lockstep)), and runs it: 2 replicas, 30 steps, the
# example's own checks (identical replicas, loss down).
# Usage: consumer_test.sh BUILD_DIR SOURCE_DIR WORK_DIR
set -euo pipefail
build="$1" source="$2" work="$3"
rm -rf "$work"
mkdir -p "$work"
cmake --install "$build" --prefix "$work/prefix" > "$work/install.log"
# Nothing of the source tree may leak into the package.
if grep -rq -- "$source/include\|$source/src" "$work/prefix/lib/cmake/lockstep"; then
  echo "the installed package refers to the source tree:" >&2
  grep -rn -- "$source" "$work/prefix/lib/cmake/lockstep" >&2
  exit 1
fi
cmake -S "$source/tests/install" -B "$work/consumer" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$work/prefix" -DLOCKSTEP_EXAMPLE_SOURCE="$source/examples/custom_loop.cpp" \
  > "$work/configure.log"
cmake --build "$work/consumer" > "$work/build.log"
"$work/consumer/custom_loop" --replicas 2 --steps 30
