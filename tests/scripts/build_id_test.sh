#!/bin/sh
# Usage: build_id_test.sh SOURCE_DIR
#
# cmake/build_id.cmake on copies of the sources (no git in them, so the
# commit is "unknown", as in a tarball): the build changes with the sources
# and with nothing else, a run that changes nothing rewrites no header, and
# an editor's dangling lock link (.#file) or a build directory inside the
# tree changes nothing either.
set -eu
src=$1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "build_id_test.sh: FAILED: $1"; exit 1; }
copy() { mkdir -p "$1"; cp -r "$src/CMakeLists.txt" "$src/src" "$src/include" "$src/cli" "$1/"; }
run() {  # run TREE OUTDIR: the script on TREE, its headers into OUTDIR (not in a subshell: fail exits)
  cmake -DSOURCE_DIR="$1" -DBINARY_DIR="$1/build" -DVERSION=9.9.9 -DOUT_ID="$2/id.h" \
        -DOUT_COMMIT="$2/commit.h" -P "$src/cmake/build_id.cmake" || fail "the script failed on $1"
}
id() { sed -n 's/^#define LOCKSTEP_BUILD_ID "\(.*\)"$/\1/p' "$1/id.h"; }  # id OUTDIR
copy "$work/a"
copy "$work/b"
run "$work/a" "$work/out-a"
run "$work/b" "$work/out-b"
a=$(id "$work/out-a") b=$(id "$work/out-b")
echo "$a" | grep -Eq '^9\.9\.9\+[0-9a-f]{12}$' || fail "malformed build '$a'"
[ "$a" = "$b" ] || fail "two copies of the same sources gave $a and $b"
grep -q '#define LOCKSTEP_COMMIT "unknown"' "$work/out-a/commit.h" || fail "no git, yet a commit: $(cat "$work/out-a/commit.h")"

# Nothing changed: the headers are not rewritten (nothing recompiles).
touch -d '2000-01-01' "$work/out-a/id.h" "$work/out-a/commit.h"
run "$work/a" "$work/out-a"
[ -z "$(find "$work/out-a" -type f -newermt '2001-01-01')" ] || fail "a run that changed nothing rewrote a header"

# What is not a source: docs, tests, a dot file, a dangling editor lock link, a build directory.
mkdir -p "$work/a/docs" "$work/a/tests" "$work/a/build/src"
echo "notes" > "$work/a/docs/x.md"
echo "// a test" > "$work/a/tests/x.cpp"
ln -s "nobody@host.1234:1" "$work/a/src/.#version.cpp"
echo "// generated" > "$work/a/build/src/generated.h"
run "$work/a" "$work/out-a"
[ "$(id "$work/out-a")" = "$a" ] || fail "docs, tests, a lock link or a build directory changed the build"

# A source: one byte of it.
echo " " >> "$work/a/src/version.cpp"
run "$work/a" "$work/out-a"
[ "$(id "$work/out-a")" != "$a" ] || fail "an edited source kept the build"
echo "build_id_test.sh: passed"
