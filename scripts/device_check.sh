#!/usr/bin/env bash
# The prepared check for a lent GPU node (the `device` tool of the tool library). The step time limits add up to
# 360 s (6 minutes), so a 15-minute loan can run it, and rerun it, start-up included.
#
#   bash scripts/device_check.sh [--dry-run] [OUTDIR]
#
# OUTDIR (default: $OUT, else /tmp/tspbench_device) receives everything: env.txt (device, driver, torch, the
# hardware profile the device names), commands.txt, and one log per step under OUTDIR/logs/, packed at the end into
# OUTDIR/device_check.tgz (the device tool returns at most 8 files) with the files to commit copied beside it:
# results.jsonl (the smoke runs' records), <profile>.calibration.json, <profile>.shapes.jsonl, gpu_time.jsonl,
# gpu_check.jsonl, summary.txt (env.txt, then each step's exit code, seconds and last lines).
# --dry-run: write commands.txt only (every step, the ≥ 2-GPU ones included) and run nothing
# (tests/unit/test_device_check.py runs this on CPU and checks each command and the step limits' sum).
#
# Prepare on the CPU box (the GPU image has torch, pandas, seaborn, nvidia-ml-py and pytest, not Hydra): the
# pure-Python packages it lacks, installed into a folder that travels with the tree:
#   pip install -q --no-deps --target .device_site hydra-core omegaconf antlr4-python3-runtime==4.9.3
#   echo /.device_site/ >> .git/info/exclude
# Run:   device.run(command="bash scripts/device_check.sh", carry=[".device_site"], timeout_s=420)
#
# The profile is the one whose device_names match torch.cuda.get_device_name() (gpu_check hardware=auto): an
# H100's timings are never filed as an H200's. What one GPU shows: the GPU-marked tests (the flash backward on the
# log-sum-exp slices TSP and ring attention pass, the zigzag chunks in bf16), rank 0's real allocator peak beside
# the estimate, rank 0's compute-only step times and kernel efficiencies, one single-GPU measured run. Never
# multi-GPU throughput. On >= 2 GPUs also: the NCCL parity tests (fp32 and bf16, decode at B = 2) and one short
# measured run of every scheme at degree 2.
set -uo pipefail
DRY=0
if [ "${1:-}" = "--dry-run" ]; then DRY=1; shift; fi
OUT=${1:-${OUT:-/tmp/tspbench_device}}
LOGS="$OUT/logs"
[ "$DRY" = 1 ] || mkdir -p "$LOGS"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD:$PWD/.device_site" TSPBENCH_LAUNCHER=device_check
PY=python3
NGPU=0
PROFILE=none
: > "$OUT/commands.txt"
# step TIMEOUT_S LOG_NAME [gpus>=N] COMMAND...: logged, then run (unless --dry-run) under a timeout; stdout to
# LOGS/NAME, stderr to LOGS/NAME.err, the exit code to summary.txt
step() {
  local t=$1 name=$2 need=1
  shift 2
  if [[ "$1" == gpus\>=* ]]; then need=${1#gpus>=}; shift; fi
  echo "# limit ${t}s, needs ${need} GPU(s), stdout logs/${name}" >> "$OUT/commands.txt"
  echo "$*" >> "$OUT/commands.txt"
  [ "$DRY" = 1 ] && return 0
  if [ "$NGPU" -lt "$need" ]; then
    echo "== $name: skipped ($NGPU GPU(s), needs $need)" >> "$LOGS/summary.txt"
    return 0
  fi
  local t0=$SECONDS
  timeout --kill-after=5 "$t" "$@" > "$LOGS/$name" 2> "$LOGS/$name.err"
  local rc=$?
  { echo "== $name: rc=$rc in $((SECONDS - t0)) s (limit $t s)"; tail -n 4 "$LOGS/$name" "$LOGS/$name.err"; } \
    >> "$LOGS/summary.txt"
}
if [ "$DRY" = 0 ]; then
  {
    nvidia-smi || rocm-smi
    $PY -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'hip', torch.version.hip)"
  } > "$OUT/env.txt" 2>&1
  NGPU=$($PY -c "import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)" 2>/dev/null)
  NGPU=${NGPU:-0}
  PROFILE=$($PY -c "
import torch
from tspbench.measure.flops import match_profile
e = match_profile(torch.cuda.get_device_name()) if torch.cuda.is_available() else None
print(e.profile if e else 'none')" 2>>"$OUT/env.txt")
  $PY -c "import torch; print('device', torch.cuda.get_device_name(), 'count', torch.cuda.device_count())" \
    >> "$OUT/env.txt" 2>&1
  echo "profile ${PROFILE:-none} (conf/hardware/<profile>.yaml whose device_names match the device)" >> "$OUT/env.txt"
fi
# one GPU (40 + 100 + 60 + 30 + 60 = 290 s; the first H100 run, results/measured/h100-2026-12-06: tests 16 s,
# shapes 19 s, the smoke run's first point 22 s; the memory and time checks then spent minutes drawing full
# weights on the CPU, which each rank's own-shard init on the device removes)
step 40 gpu_tests.txt $PY -m pytest -q -s -p no:cacheprovider -m gpu tests/gpu/test_lse_slices_gpu.py \
  tests/gpu/test_attention_gpu.py tests/gpu/test_gpu.py
step 100 gpu_check.jsonl $PY -m tspbench.gpu_check device=cuda
step 60 gpu_time.jsonl $PY -m tspbench.gpu_check device=cuda time=true hardware=auto "calibration_out=$LOGS"
step 30 gpu_shapes.jsonl $PY -m tspbench.gpu_check device=cuda shapes=true hardware=auto
step 60 smoke.txt $PY -m tspbench +exp=smoke device=cuda 'schemes=[single]' 'modes=[train,forward,decode]' \
  model=small dtype=bfloat16 'seq_lens=[4096]' "hydra.run.dir=$LOGS/run" report=false
# two GPUs or more (40 + 30 = 70 s): NCCL parity in fp32 and bf16 (TSP and ring attention at H >= 2, decode at
# B = 2), then one short measured run of every scheme at degree 2
step 40 nccl_parity.txt gpus\>=2 $PY -m pytest -q -p no:cacheprovider -m gpu tests/gpu/test_gpu.py \
  tests/gpu/test_nccl_bf16.py
step 30 nccl_smoke.txt gpus\>=2 $PY -m tspbench +exp=smoke device=cuda dtype=bfloat16 'degrees=[2]' \
  'modes=[train,decode]' 'batches=[2]' warmup_steps=1 measured_steps=2 "hydra.run.dir=$LOGS/nccl_run" report=false
[ "$DRY" = 1 ] && { cat "$OUT/commands.txt"; exit 0; }
cat "$LOGS"/run/results.jsonl "$LOGS"/nccl_run/results.jsonl > "$OUT/results.jsonl" 2>/dev/null
cp "$LOGS"/*.calibration.json "$OUT/" 2>/dev/null
[ -s "$LOGS/gpu_shapes.jsonl" ] && cp "$LOGS/gpu_shapes.jsonl" "$OUT/$PROFILE.shapes.jsonl"
cp "$LOGS/gpu_time.jsonl" "$LOGS/gpu_check.jsonl" "$OUT/" 2>/dev/null
cat "$OUT/env.txt" "$LOGS/summary.txt" > "$OUT/summary.txt"
mv "$OUT/env.txt" "$OUT/commands.txt" "$LOGS/"
tar czf "$OUT/device_check.tgz" -C "$OUT" logs
rm -rf "$LOGS"  # packed above: the tool returns at most 8 files, no deeper than two folders
cat "$OUT/summary.txt"
