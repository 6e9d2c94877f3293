#!/usr/bin/env bash
# The whole GPU job in one command, for a machine with a GPU: build with CUDA,
# run every GPU checker with DTP_REQUIRE_GPU=1 (nothing may skip), run the GPU
# benchmarks, and print a short table last. Results (JSON lines, logs) go to
# $OUT when set (the device machine collects that folder), else bench/results/.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
build=${DTP_BUILD_DIR:-build-gpu}
results=${OUT:-bench/results}
mkdir -p "$results"
stamp=$(date -u +%Y%m%d)
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 | tr ' ' '-')
export DTP_REQUIRE_GPU=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DDTP_ENABLE_CUDA=ON -DDTP_BUILD_DOCS=OFF \
  > "$results/gpu-configure.log" 2>&1 || { tail -30 "$results/gpu-configure.log"; exit 1; }
cmake --build "$build" -j"$(nproc)" > "$results/gpu-build.log" 2>&1 || { tail -40 "$results/gpu-build.log"; exit 1; }

# Every GPU checker: runtime, thread/cuda (world sizes 1-8 on one GPU), nccl.
ctest --test-dir "$build" -L gpu --output-on-failure -j1 --timeout 300 > "$results/gpu-ctest.log" 2>&1
ctest_status=$?

bench=$build/bin/dtp-bench-collectives
if [[ -x "$bench" ]]; then
  # Target: thread/cuda, 8 ranks on one GPU, 64 MiB per rank.
  DTP_DEVICE=cuda "$bench" -g 8 -b 1M -e 64M -f 4 -o all_reduce \
    --json "$results/collectives-thread-cuda-$gpu-$stamp.jsonl" > "$results/bench-thread-cuda.txt" 2>&1
  # NCCL on the GPUs this machine has (world 1 on a single GPU).
  DTP_BACKEND=nccl DTP_DEVICE=cuda "$bench" -g "$(nvidia-smi -L | wc -l)" -b 1M -e 64M -f 4 -o all_reduce \
    --json "$results/collectives-nccl-$gpu-$stamp.jsonl" > "$results/bench-nccl.txt" 2>&1
fi

# The model: PyTorch cross-check (where torch is installed) and the GPT-2-small step.
for mode in "--device cpu" "--device cuda --attention naive" "--device cuda --attention flash"; do
  echo "== torch_crosscheck $mode" >> "$results/torch-crosscheck.txt"
  python3 tools/torch_crosscheck.py --exporter "$build/bin/dtp-export-step" $mode >> "$results/torch-crosscheck.txt" 2>&1
  echo "exit $?" >> "$results/torch-crosscheck.txt"
done
if [[ -x "$build/bin/dtp-bench-train-step" ]]; then
  "$build/bin/dtp-bench-train-step" --json "$results/train-step-$gpu-$stamp.jsonl" > "$results/bench-train-step.txt" 2>&1
fi

echo "== GPU checkers (ctest -L gpu, DTP_REQUIRE_GPU=1): exit $ctest_status"
grep -E "tests passed|tests failed" "$results/gpu-ctest.log" | tail -1
grep -E "\(Failed\)|\(Timeout\)" "$results/gpu-ctest.log" | head -20
echo "== PyTorch cross-check"
grep -E "^== |exit |max|skipped" "$results/torch-crosscheck.txt" | tail -12
for table in "$results"/bench-*.txt; do
  [[ -f "$table" ]] || continue
  echo "== $(basename "$table" .txt)"
  tail -12 "$table"
done
exit "$ctest_status"
