#!/usr/bin/env bash
# Proves that the scoreboard grades each chapter on its own: with a compile
# error planted in chapter 01's puzzles, `grade.py --build` must show chapter
# 01's compiler error AND still grade chapter 02.
#
#   tools/check_grade_isolation.sh BUILD_DIR
#
# The error goes into a new file of its own (puzzles/01_collectives/
# zz_planted_error.cpp), never into a student's file, and the file is removed
# on every exit path. The CI job runs this after its tests.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD_DIR="${1:?usage: tools/check_grade_isolation.sh BUILD_DIR}"
planted="$ROOT/puzzles/01_collectives/zz_planted_error.cpp"
[[ ! -e "$planted" ]] || { echo "check_grade_isolation: $planted exists already" >&2; exit 1; }
python="/usr/bin/python3"; [[ -x "$python" ]] || python="$(command -v python3)"

cleanup() {
  rm -f "$planted"
  # Rebuild chapter 01 without the planted file so the build folder is whole again.
  cmake --build "$BUILD_DIR" --target ch01_puzzles_tests >/dev/null 2>&1 || true
}
trap cleanup EXIT
printf '// planted by tools/check_grade_isolation.sh\nint planted_error = ;\n' >"$planted"

out="$(mktemp)"
status=0
"$python" "$ROOT/tools/grade.py" --build --build-dir "$BUILD_DIR" >"$out" 2>&1 || status=$?
fail() { cat "$out" >&2; echo "check_grade_isolation: FAILED: $1" >&2; exit 1; }
[[ $status -eq 1 ]] || fail "expected exit status 1 for a chapter that does not compile, got $status"
grep -q "ch01: does not compile" "$out" || fail "no 'ch01: does not compile' line"
grep -q "zz_planted_error.cpp:2" "$out" || fail "the compiler's error (zz_planted_error.cpp:2) is not shown"
grep -Eq "^ch02: [0-9]+ of [0-9]+ puzzles solved" "$out" || fail "chapter 02 was not graded"
echo "check_grade_isolation: ok (chapter 01 shows its compile error, chapter 02 is still graded)"
rm -f "$out"
