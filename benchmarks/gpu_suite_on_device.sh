#!/usr/bin/env bash
# benchmarks/gpu_suite.py on a lent GPU machine (the device tool's `run`, carrying the wheels of
# benchmarks/gpu_wheels.sh): installs them beside the image's CUDA torch, says which attention
# packed rows use, runs the suite; the JSON and the log land in $OUT. Extra arguments go to it.
set -euo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .wheels-gpu/*.whl
export PYTHONPATH="/tmp/site:$PWD" PYTHONUNBUFFERED=1
out="${OUT:-/tmp}"
nvidia-smi -L
python3 -m rft.trainer.attention
python3 -m benchmarks.gpu_suite --out "$out/gpu_suite.json" "$@" 2>&1 | tee "$out/gpu_suite.log"
