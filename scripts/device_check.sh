#!/usr/bin/env bash
# The prepared check for a lent single GPU (the `device` tool of the tool library): about 6 minutes.
#
# Prepare on the CPU box (the GPU image has torch, pandas, seaborn, nvidia-ml-py and pytest, not Hydra):
#   pip download --no-deps -d .device_wheels hydra-core omegaconf antlr4-python3-runtime==4.9.3
#   echo /.device_wheels/ >> .git/info/exclude
# Run:   device.run(command="bash scripts/device_check.sh", carry=[".device_wheels"], timeout_s=540)
# Bring back: everything lands in $OUT (env.txt, gpu_tests.txt, gpu_check.jsonl, smoke.txt, results.jsonl).
#
# What a single GPU can and cannot show: (1) the GPU-marked tests (NCCL parity needs ≥ 2 GPUs and skips);
# (2) tspbench.predict.gpu_check: rank 0 of 8-way schemes at llama7b shapes, real CUDA allocations under the fake
# process group, beside the fake-tensor estimate and the cost model (memory only); (3) single-GPU runs
# through the runner (CUDA-event timing, allocator peaks, NVML energy, decode). Never multi-GPU throughput.
set -uo pipefail
OUT=${OUT:-/tmp/tspbench_device}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD" TSPBENCH_LAUNCHER=device_check
PY=python3
$PY -m pip install -q --no-index --find-links .device_wheels hydra-core omegaconf 2>&1 | tail -3
{ nvidia-smi; $PY -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name())"; } \
  > "$OUT/env.txt" 2>&1
timeout 90 $PY -m pytest -q -p no:cacheprovider -m gpu tests/test_gpu.py > "$OUT/gpu_tests.txt" 2>&1
echo "gpu tests rc=$?" >> "$OUT/gpu_tests.txt"
timeout 240 $PY -m tspbench.gpu_check --device cuda > "$OUT/gpu_check.jsonl" 2> "$OUT/gpu_check.err"
echo "gpu_check rc=$?" >> "$OUT/gpu_check.err"
timeout 150 $PY -m tspbench +exp=smoke device=cuda 'schemes=[single]' 'modes=[train,forward,decode]' \
  model=small dtype=bfloat16 seq_len=4096 hydra.run.dir="$OUT/run" report=false > "$OUT/smoke.txt" 2>&1
echo "smoke rc=$?" >> "$OUT/smoke.txt"
cp "$OUT/run/results.jsonl" "$OUT/results.jsonl" 2>/dev/null
rm -rf "$OUT/run"
tail -n 3 "$OUT"/*.txt "$OUT/gpu_check.err"
