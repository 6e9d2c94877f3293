#!/usr/bin/env bash
# The sanitizer jobs of CI: builds the runtime tests and the chapter reference
# checkers under ThreadSanitizer (build-tsan/) and under AddressSanitizer +
# UndefinedBehaviorSanitizer (build-asan/), CUDA and MPI off, and runs them
# (ctest labels runtime and reference, without mpi, gpu, sync and f32: the
# f32 flavour runs the same checker code, and the runtime tests sanitize the
# f32 kernels it calls). Any race, bad
# memory access or undefined behaviour stops the test that hit it and fails
# the job.
#
# usage: tools/sanitizers.sh [--build-only | --run-only] [thread] [address]
#   (default: both sanitizers, in turn, each built then run; CI times the
#   build and the run of each as phases of their own)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
JOBS="${JOBS:-$(nproc 2>/dev/null || echo 2)}"
LAUNCHER=()
if command -v ccache >/dev/null; then LAUNCHER=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache); fi

# halt_on_error: the first report ends the test (a failure, not a log line).
# second_deadlock_stack: lock-order reports show where both locks were taken.
# The suppressions file lists false positives only, each with its reason.
export TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 suppressions=$ROOT/tools/tsan.supp"
export ASAN_OPTIONS="halt_on_error=1 detect_leaks=1 abort_on_error=0"
export UBSAN_OPTIONS="halt_on_error=1 print_stacktrace=1"

# The checkers of every chapter that has them: chNN_reference_tests.
reference_targets() {
  local dir
  for dir in "$ROOT"/tests/[0-9][0-9]_*/; do
    compgen -G "$dir*_test.cpp" >/dev/null && echo "ch$(basename "$dir" | cut -c1-2)_reference_tests"
  done
}

build_dir() {
  case "$1" in
    thread) echo "$ROOT/build-tsan" ;;
    address) echo "$ROOT/build-asan" ;;
    *) echo "sanitizers.sh: unknown sanitizer '$1' (expected thread or address)" >&2; return 2 ;;
  esac
}

build_job() {
  local sanitizer=$1 dir start=$SECONDS
  dir="$(build_dir "$sanitizer")" || return 2
  echo "=== $sanitizer sanitizer: configure and build $dir"
  # Sanitized code runs several times slower: give a recv and a test longer.
  cmake -S "$ROOT" -B "$dir" -DCMAKE_BUILD_TYPE=Release -DDTP_SANITIZE="$sanitizer" \
    -DDTP_ENABLE_CUDA=OFF -DDTP_ENABLE_MPI=OFF -DDTP_EXPECT_STUBS_FAIL=OFF -DDTP_BUILD_DOCS=OFF \
    -DDTP_COMM_TIMEOUT_S=60 -DDTP_TEST_TIMEOUT_S=600 "${LAUNCHER[@]}" >/dev/null
  # shellcheck disable=SC2046
  cmake --build "$dir" -j "$JOBS" --target runtime_tests emulated_tests $(reference_targets)
  echo "=== $sanitizer sanitizer: built in $((SECONDS - start)) s"
}

run_tests() {
  local sanitizer=$1 dir start=$SECONDS
  dir="$(build_dir "$sanitizer")" || return 2
  echo "=== $sanitizer sanitizer: run"
  # ThreadSanitizer checks every memory access, which turns the LargeBuffer
  # checkers (a million elements on every world size, the same code paths as
  # the shorter lengths) into six minutes of their own.
  # Chapter 07's LossCurve checker is 480 single-threaded training steps: nothing
  # for a race detector, minutes under it (AddressSanitizer runs it).
  # CpuGemm.FastPathEqualsTheDefinitionBitwise compares every instruction
  # set's GEMM with the definition over 8 shapes x 4 transposes x 3 thread
  # counts, bit for bit: 16 s under ThreadSanitizer, whose question (do the
  # GEMM's threads race?) NnOps.Matmul* and every model test already ask of
  # the same threaded code (AddressSanitizer runs it whole).
  # The emulated flash kernels run in f16 and bf16 from one template: the
  # same barriers, indices and 2-byte accesses, so the sanitizer builds
  # compile and run the bf16 instances only (DTP_SANITIZER_BUILD in
  # tests/emulated/flash_attention_test.cpp; the plain run checks both). Of their shapes
  # they run the five that take every head-width instance (16, 32, 64, 128)
  # through its edges: several tiles of queries and keys (shared memory
  # refilled while the last tile may still be read), a partial last tile, a
  # head narrower than its instance, masked-out rows and no mask. The other
  # eight, at up to 20 s each under ThreadSanitizer, repeat those paths.
  local flash=() shape
  for shape in one_tile three_tiles head_128 later_queries no_mask one_key exact_tile odd_head_more_keys; do
    flash+=("*EmulatedFlashAttention*/*_${shape}_D*")
  done
  # The sync flavour (DTP_SEND=sync) repeats chapter 01 with sends that wait
  # for their recv: the same copies into the same mailbox, then one wait
  # (ThreadComm::send), which the runtime's own SyncSend.* tests check.
  # Each test binary runs as a few shards (tests/CMakeLists.txt,
  # dtp_add_gtest), which read what to leave out from GTEST_FILTER.
  local skip=("${flash[@]}")
  if [[ $sanitizer == thread ]]; then
    skip+=("*LargeBuffer*" "*LossCurve*" "CpuGemm.FastPathEqualsTheDefinitionBitwise")
  fi
  local IFS=:
  export GTEST_FILTER="-${skip[*]}"
  unset IFS
  local status=0
  ctest --test-dir "$dir" -L 'runtime|reference' -LE 'mpi|gpu|sync|f32' --output-on-failure -j "$JOBS" \
    --no-tests=error || status=$?
  echo "=== $sanitizer sanitizer: $([[ $status == 0 ]] && echo passed || echo FAILED) in $((SECONDS - start)) s"
  return "$status"
}

build=1
run=1
case "${1:-}" in
  --build-only) run=0; shift ;;
  --run-only) build=0; shift ;;
esac
sanitizers=("$@")
((${#sanitizers[@]})) || sanitizers=(thread address)
failed=()
for sanitizer in "${sanitizers[@]}"; do
  if ((build)) && ! build_job "$sanitizer"; then
    failed+=("$sanitizer")
    continue
  fi
  if ((run)); then run_tests "$sanitizer" || failed+=("$sanitizer"); fi
done
if ((${#failed[@]})); then
  echo "sanitizers.sh: failed under: ${failed[*]}" >&2
  exit 1
fi
