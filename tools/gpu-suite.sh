#!/usr/bin/env bash
# The whole GPU job for a machine with a GPU, in one call:
#
#   tools/gpu-suite.sh build      configure (CUDA on, sm_90 only) and build what the run needs
#   tools/gpu-suite.sh run        every GPU checker, the benchmarks (collectives, train step in
#                                 fp32 and bf16 with PyTorch eager beside it, DDP 4 ranks on one
#                                 GPU), the PyTorch cross-check, NVTX ranges seen by Nsight Compute
#   tools/gpu-suite.sh [all]      both
#   tools/gpu-suite.sh --dry-run  print what `all` would run, and check that the build configures
#
# Every step has a time limit and the whole job a deadline (DTP_GPU_DEADLINE,
# seconds from the start, default 560): a step that would pass it is skipped
# and the summary says so, so `all` fits one 10-minute device call. On an
# H200 (16 cores, 2026-11-27) the build took about 2 minutes and the run
# about 2. The build folder (default build-gpu, ignored by git) survives
# between calls on the same machine. Checkers run with DTP_REQUIRE_GPU=1 (none may skip) and
# without the puzzle stubs (label `puzzles`), which fail by design until a
# student solves them; the references and the runtime are what a GPU run
# checks. Everything the run writes is packed into one archive,
# gpu-results-<gpu>-<date>.tar.gz, and the short table is written beside it
# as gpu-summary.txt and printed last: two files, in $OUT when set (the device
# machine brings that folder back), else in bench/results/.
#
# From this workplace's `device` tool, one call (CLI11's headers carried, see below):
#   run(command="bash tools/gpu-suite.sh all", timeout_s=600, carry=["build-deps"])
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

phase=all dry_run=0
for arg in "$@"; do
  case "$arg" in
    build | run | all) phase=$arg ;;
    --dry-run) dry_run=1 ;;
    -h | --help) sed -n '2,22p' "$0"; exit 0 ;;
    *) echo "gpu-suite: unknown argument '$arg' (expected build, run, all or --dry-run)" >&2; exit 2 ;;
  esac
done

build=${DTP_BUILD_DIR:-build-gpu}
out=${OUT:-bench/results}
work=$build/gpu-results          # the files that go into the archive
stamp=$(date -u +%Y%m%d)
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 | tr ' ' '-')
gpu=${gpu:-no-gpu}
export DTP_REQUIRE_GPU=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

deadline=${DTP_GPU_DEADLINE:-560}
started=$SECONDS
skipped=()  # steps the deadline left out

# step NAME LOG LIMIT COMMAND...: runs COMMAND for at most LIMIT seconds, and
# never past the deadline, with its output in $work/LOG (or, in a dry run,
# prints it); returns its exit status (124: cut off at the limit; 125: not
# run, no time left).
step() {
  local name=$1 log=$2 limit=$3
  shift 3
  if ((dry_run)); then
    printf '  %-26s (%4ss) %s  > %s\n' "$name" "$limit" "$*" "$work/$log"
    return 0
  fi
  local left=$((deadline - (SECONDS - started) - 5))
  ((left < limit)) && limit=$left
  if ((limit < 10)); then
    echo "gpu-suite: $name: skipped, the deadline (${deadline} s) is near" >&2
    skipped+=("$name")
    echo "skipped: the deadline (${deadline} s) was near" > "$work/$log"
    return 125
  fi
  echo "gpu-suite: $name (at most ${limit} s)" >&2
  timeout -k 5 "$limit" "$@" > "$work/$log" 2>&1
}

configure_args=(-S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DDTP_ENABLE_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90
                -DDTP_BUILD_DOCS=OFF)
# CLI11 is header-only; a machine without libcli11-dev (the lent GPU machine)
# gets the headers carried in: mkdir -p build-deps/cli11 && cp -r
# /usr/include/CLI build-deps/cli11/, then run with carry=["build-deps"].
if [[ ! -f /usr/include/CLI/CLI.hpp && -f build-deps/cli11/CLI/CLI.hpp ]]; then
  configure_args+=(-DDTP_CLI11_INCLUDE_DIR="$PWD/build-deps/cli11")
fi

preflight() {
  local missing=()
  command -v nvcc > /dev/null || [[ -x /usr/local/cuda/bin/nvcc ]] || missing+=("nvcc (the CUDA toolkit)")
  command -v cmake > /dev/null || missing+=("cmake")
  if [[ ! -f /usr/include/gtest/gtest.h && ! -f /usr/local/include/gtest/gtest.h && -z "${GTest_DIR:-}" ]]; then
    missing+=("GoogleTest (apt-get install libgtest-dev, or set GTest_DIR)")
  fi
  if [[ ! -f /usr/include/CLI/CLI.hpp && ! -f build-deps/cli11/CLI/CLI.hpp ]]; then
    missing+=("CLI11 (apt-get install libcli11-dev, or carry its headers in build-deps/cli11/CLI)")
  fi
  if ((${#missing[@]})); then
    printf 'gpu-suite: this machine lacks %s\n' "${missing[@]}" >&2
    return 1
  fi
}

# What the run needs: the GPU checkers' binaries and the programs it runs.
targets=(gpu_tests drivers_tests ch01_reference_tests ch02_reference_tests ch03_reference_tests ch04_reference_tests ch05_reference_tests ch06_reference_tests ch07_reference_tests ch08_reference_tests dtp-export-step dtp-train dtp-train-reference dtp-bench-train-step
         dtp-bench-collectives dtp-bench-ddp-step)

do_build() {
  step configure configure.log 120 cmake "${configure_args[@]}" || { tail -30 "$work/configure.log"; return 1; }
  step build build.log 400 cmake --build "$build" -j"$(nproc)" --target "${targets[@]}" ||
    { tail -40 "$work/build.log"; return 1; }
}

do_run() {
  # Every GPU checker but the puzzle stubs: runtime, thread/cuda (worlds on one GPU), nccl.
  step "GPU checkers" ctest.log 200 ctest --test-dir "$build" -L gpu -LE puzzles --output-on-failure -j4 --timeout 120
  ctest_status=$?
  # NVTX: Nsight Compute profiles only kernels inside DTP's
  # "head forward" trace span, so a profiled kernel shows the spans reach a
  # profiler as NVTX ranges (Nsight Systems, which draws the timeline, is
  # not on the lent machines).
  if ((dry_run)) || command -v ncu > /dev/null; then
    step "nvtx under ncu" nvtx-ncu.txt 90 ncu --nvtx --nvtx-include "head forward/" -c 1 \
      "$build/bin/dtp-train" --device cuda --steps 1 --batch 2 --seq 16
  fi
  local bench=$build/bin/dtp-bench-collectives
  if ((dry_run)) || [[ -x "$bench" ]]; then
    # thread/cuda, 8 ranks on one GPU, up to 64 MiB per rank; then NCCL on the GPUs there are.
    # sendrecv times one bare Comm::send/recv per rank: the chapter-01 algorithms' building block.
    step "collectives thread" bench-thread-cuda.txt 60 env DTP_DEVICE=cuda "$bench" -g 8 -b 1M -e 64M -f 4 \
      --collective all_reduce,sendrecv \
      --json "$work/collectives-thread-cuda-$gpu-$stamp.jsonl"
    step "collectives nccl" bench-nccl.txt 30 env DTP_BACKEND=nccl DTP_DEVICE=cuda "$bench" \
      -g "$(nvidia-smi -L 2>/dev/null | wc -l)" -b 1M -e 64M -f 4 --collective all_reduce \
      --json "$work/collectives-nccl-$gpu-$stamp.jsonl"
  fi
  for mode in cpu cuda-naive cuda-flash; do
    local args=(--device cpu)
    [[ $mode == cuda-naive ]] && args=(--device cuda --attention naive)
    [[ $mode == cuda-flash ]] && args=(--device cuda --attention flash)
    step "torch cross-check $mode" "torch-crosscheck-$mode.txt" 60 python3 tools/torch_crosscheck.py \
      --exporter "$build/bin/dtp-export-step" "${args[@]}"
    local status=$?
    ((dry_run)) || echo "exit $status" >> "$work/torch-crosscheck-$mode.txt"
  done
  if ((dry_run)) || [[ -x "$build/bin/dtp-bench-train-step" ]]; then
    # HBM bandwidth for the per-op roofline: the H200's is 4.8 TB/s, the H100 SXM's 3.35 (the default).
    local bandwidth=()
    [[ $gpu == *H200* ]] && bandwidth=(--bandwidth-tbs 4.8)
    step "train step" bench-train-step.txt 90 "$build/bin/dtp-bench-train-step" "${bandwidth[@]}" \
      --json "$work/train-step-$gpu-$stamp.jsonl"
    # bf16 with f32 master weights (chapter 07's step), the peer of PyTorch's bf16 autocast below.
    step "train step bf16" bench-train-step-bf16.txt 90 "$build/bin/dtp-bench-train-step" "${bandwidth[@]}" --precision bf16 \
      --json "$work/train-step-$gpu-$stamp.jsonl"
    # Its peer in the same run: PyTorch eager, the same model and shapes, TF32 (what DTP runs) and bf16.
    for precision in tf32 bf16; do
      step "torch train step $precision" "bench-torch-train-step-$precision.txt" 60 python3 bench/torch_train_step.py \
        --precision "$precision" --json "$work/train-step-$gpu-$stamp.jsonl"
    done
  fi
  # DDP with 4 rank threads sharing the GPU, against 4x the single-rank step (the table's first row).
  if ((dry_run)) || [[ -x "$build/bin/dtp-bench-ddp-step" ]]; then
    step "ddp 4 ranks, one GPU" bench-ddp-step.txt 60 "$build/bin/dtp-bench-ddp-step" --device cuda --world 4 \
      --json "$work/ddp-step-cuda-$gpu-$stamp.jsonl"
  fi
}

summary() {
  echo "== GPU checkers (ctest -L gpu -LE puzzles, DTP_REQUIRE_GPU=1): exit $ctest_status"
  grep -E "tests passed|tests failed" "$work/ctest.log" | tail -1
  grep -E "\(Failed\)|\(Timeout\)|\(Not Run\)" "$work/ctest.log" | head -20
  # Which chapters' checkers ran on which substrate: passed/all per flavour.
  python3 - "$work/ctest.log" <<'PY' 2>/dev/null
import re, sys, collections
runs = collections.defaultdict(lambda: [0, 0])
for line in open(sys.argv[1]):
    m = re.search(r"Test +#\d+: ([a-z0-9-]+)\.reference\.(ch\d\d)\.\S+ \.+\**\s*(\w+)", line)
    if m:
        runs[(m.group(2), m.group(1))][1] += 1
        runs[(m.group(2), m.group(1))][0] += m.group(3) == "Passed"
if runs:
    print("== chapters by substrate (reference checkers passed / run)")
    for chapter in sorted({c for c, _ in runs}):
        cells = [f"{flavour} {p}/{n}" for (c, flavour), (p, n) in sorted(runs.items()) if c == chapter]
        print(f"   {chapter}: " + ", ".join(cells))
PY
  if [[ -f "$work/nvtx-ncu.txt" ]]; then
    if grep -q "No kernels were profiled" "$work/nvtx-ncu.txt"; then
      echo "== NVTX: no kernel inside the 'head forward' span was profiled: ranges not seen"
    elif grep -q "==PROF== Profiling" "$work/nvtx-ncu.txt"; then
      echo "== NVTX: Nsight Compute profiled $(grep -c "==PROF== Profiling" "$work/nvtx-ncu.txt") kernel(s) inside the 'head forward' span"
    else
      echo "== NVTX: inconclusive, see nvtx-ncu.txt: $(tail -1 "$work/nvtx-ncu.txt")"
    fi
  fi
  ((${#skipped[@]})) && echo "== skipped at the deadline (${deadline} s): ${skipped[*]}"
  echo "== PyTorch cross-check"
  for f in "$work"/torch-crosscheck-*.txt; do
    [[ -f "$f" ]] && echo "$(basename "$f" .txt): $(grep -E "max|skipped" "$f" | tail -1) ($(tail -1 "$f"))"
  done
  # DTP's tokens/s against PyTorch eager's, from the same run.
  python3 - "$work/train-step-$gpu-$stamp.jsonl" <<'PY' 2>/dev/null
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
dtp = [r for r in rows if r.get("what") == "train_step"]
# Each DTP precision against PyTorch's: fp32 (TF32 matmuls) with tf32, bf16 with bf16 autocast.
peer_of = {"fp32": "tf32", "bf16": "bf16"}
for peer in (r for r in rows if r.get("what") == "torch_train_step"):
    for mine in (r for r in dtp if peer_of.get(r.get("precision", "fp32")) == peer["precision"]):
        print(f"== train step: DTP {mine.get('precision', 'fp32')} {mine.get('attention', '')} "
              f"{mine['tokens_per_s']:,.0f} tokens/s vs PyTorch eager {peer['precision']} "
              f"{peer['tokens_per_s']:,.0f}: DTP at {mine['tokens_per_s'] / peer['tokens_per_s']:.2f}x")
PY
  for table in "$work"/bench-*.txt; do
    [[ -f "$table" ]] || continue
    echo "== $(basename "$table" .txt)"
    # The train step's op table is the point of its run: all of it (about 35 lines).
    if [[ $table == *train-step* ]]; then cat "$table"; else tail -12 "$table"; fi
  done
}

if ((dry_run)); then
  echo "gpu-suite --dry-run: build folder $build, results packed into $out"
  preflight || echo "gpu-suite: (a GPU machine would stop here; the dry run goes on)"
  echo "build:"
  do_build
  echo "run (DTP_REQUIRE_GPU=1):"
  do_run
  # The one real step: the build configures with CUDA on (a scratch folder).
  scratch=$(mktemp -d)
  if cmake "${configure_args[@]/#$build/$scratch}" > "$scratch.log" 2>&1; then
    echo "gpu-suite --dry-run: the CUDA build configures ($scratch.log)"
    # What `ctest -L gpu -LE puzzles` would run there. A GPU flavour of a
    # chapter whose checkers make CPU tensors could never pass: none may be
    # registered (tests/CMakeLists.txt, DTP_GPU_CHAPTERS: 01-08),
    # nor one of a suite that touches no device (7.1's casts).
    ctest --test-dir "$scratch" -N -L gpu -LE puzzles > "$scratch.tests" 2>&1
    echo "gpu-suite --dry-run: $(grep -c 'Test *#' "$scratch.tests") GPU tests registered" \
         "($(grep -c 'Test *#.* nccl\.' "$scratch.tests") on nccl)"
    cpu_only=$(grep -E 'Test *#.* (gpu|mpi-gpu|nccl|mpi-nccl)\.[a-z]+\.(ch07\.Puzzle7_1_)' "$scratch.tests")
    rm -rf "$scratch" "$scratch.tests"
    if [[ -n $cpu_only ]]; then
      echo "gpu-suite --dry-run: GPU flavours registered for chapters whose checkers train on the CPU:" >&2
      echo "$cpu_only" | head >&2
      exit 1
    fi
    exit 0
  fi
  tail -20 "$scratch.log"
  echo "gpu-suite --dry-run: the CUDA build does not configure (log: $scratch.log)" >&2
  exit 1
fi

preflight || exit 1
mkdir -p "$work" "$out"
ctest_status=0
if [[ $phase == build || $phase == all ]]; then
  do_build || exit 1
  [[ $phase == build ]] && { echo "gpu-suite: built into $build"; exit 0; }
fi
[[ -d "$build" ]] || { echo "gpu-suite: no build in $build: run 'tools/gpu-suite.sh build' first" >&2; exit 1; }
# A run starts clean: the benchmarks append to their JSON files, and a second
# run on the same machine (and day) would otherwise count every row twice.
find "$work" -maxdepth 1 -type f ! -name configure.log ! -name build.log -delete
do_run
summary > "$work/summary.txt"
archive="$out/gpu-results-$gpu-$stamp.tar.gz"
tar -czf "$archive" -C "$work" .
cp "$work/summary.txt" "$out/gpu-summary.txt"
cat "$work/summary.txt"
echo "gpu-suite: everything in $archive"
exit "$ctest_status"
