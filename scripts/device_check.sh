#!/usr/bin/env bash
# The prepared check for a lent single GPU (the `device` tool of the tool library): about 7 minutes; the step
# time limits add up to 530 s (< 9 minutes).
#
#   bash scripts/device_check.sh [--dry-run] [OUTDIR]
#
# OUTDIR (default: $OUT, else /tmp/tspbench_device) receives everything: env.txt, gpu_tests.txt,
# gpu_check.jsonl (+ .err), smoke.txt, results.jsonl, commands.txt (the commands run, one a line).
# --dry-run: write commands.txt only and run nothing (tests/unit/test_device_check.py runs this on CPU and
# checks every python command in it: the module exists, its flags parse, the test paths exist).
#
# Prepare on the CPU box (the GPU image has torch, pandas, seaborn, nvidia-ml-py and pytest, not Hydra):
#   pip download --no-deps -d .device_wheels hydra-core omegaconf antlr4-python3-runtime==4.9.3
#   echo /.device_wheels/ >> .git/info/exclude
# Run:   device.run(command="bash scripts/device_check.sh", carry=[".device_wheels"], timeout_s=540)
#
# What a single GPU can and cannot show: (1) the GPU-marked tests (tests/gpu: the bf16 chunk-composition test
# of attention; NCCL parity needs ≥ 2 GPUs and skips); (2) memory: tspbench.predict.gpu_check, rank 0 of 8-way
# schemes at llama7b shapes, real CUDA allocations under the fake process group, beside the fake-tensor
# estimate and the cost model; (3) timing: single-GPU runs through the runner (CUDA-event step times, prefill,
# time to first token, decode p50/p99, allocator peaks, NVML energy). Never multi-GPU throughput.
# (4) compute-only time: `gpu_check time=true`, rank 0's forward and training step at paper shapes (collectives are
# no-ops) and the GEMM / attention efficiencies, written to $OUT/h200.calibration.json (commit it beside
# conf/hardware/h200.yaml for the time model to use it). (5) kernel shapes: `gpu_check shapes=true`, each distinct
# attention / GEMM call of the headline's layouts at 128K timed beside the kernel-shape model ($OUT/gpu_shapes.jsonl;
# commit it as conf/hardware/<profile>.shapes.jsonl, here h200, and the kernel-shape pricing uses the measured
# calls, costmodel/kernels.py).
set -uo pipefail
DRY=0
if [ "${1:-}" = "--dry-run" ]; then DRY=1; shift; fi
OUT=${1:-${OUT:-/tmp/tspbench_device}}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD" TSPBENCH_LAUNCHER=device_check
PY=python3
: > "$OUT/commands.txt"
# step TIMEOUT_S STDOUT_FILE STDERR_FILE COMMAND...: logged, then run (unless --dry-run) under a timeout
step() {
  local t=$1 o=$2 e=$3
  shift 3
  echo "$*" >> "$OUT/commands.txt"
  [ "$DRY" = 1 ] && return 0
  if [ "$o" = "$e" ]; then timeout "$t" "$@" > "$o" 2>&1; else timeout "$t" "$@" > "$o" 2> "$e"; fi
  echo "rc=$? ($*)" >> "$e"
}
if [ "$DRY" = 0 ]; then
  $PY -m pip install -q --no-index --find-links .device_wheels hydra-core omegaconf 2>&1 | tail -3
  { nvidia-smi; $PY -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name())"; } \
    > "$OUT/env.txt" 2>&1
fi
step 90 "$OUT/gpu_tests.txt" "$OUT/gpu_tests.txt" $PY -m pytest -q -p no:cacheprovider -m gpu tests/gpu
step 180 "$OUT/gpu_check.jsonl" "$OUT/gpu_check.err" $PY -m tspbench.gpu_check device=cuda
step 100 "$OUT/gpu_time.jsonl" "$OUT/gpu_time.err" $PY -m tspbench.gpu_check device=cuda time=true hardware=h200 \
  "calibration_out=$OUT"
step 60 "$OUT/gpu_shapes.jsonl" "$OUT/gpu_shapes.err" $PY -m tspbench.gpu_check device=cuda shapes=true hardware=h200
step 100 "$OUT/smoke.txt" "$OUT/smoke.err" $PY -m tspbench +exp=smoke device=cuda 'schemes=[single]' \
  'modes=[train,forward,decode]' model=small dtype=bfloat16 seq_len=4096 "hydra.run.dir=$OUT/run" report=false
[ "$DRY" = 1 ] && { cat "$OUT/commands.txt"; exit 0; }
cp "$OUT/run/results.jsonl" "$OUT/results.jsonl" 2>/dev/null
rm -rf "$OUT/run"
tail -n 3 "$OUT"/*.txt "$OUT"/*.err
