#!/usr/bin/env bash
# Wheels that benchmarks/gpu_suite.py needs beyond the lent GPU machines' image (it has CUDA
# torch, peft, accelerate, safetensors, pyarrow; not DeepSpeed, OmegaConf or transformers 5.19),
# saved in .wheels-gpu/ (git-ignored here) for the device tool to carry:
#   bash benchmarks/gpu_wheels.sh
#   run(carry=[".wheels-gpu"], command="bash benchmarks/gpu_suite_on_device.sh")
# Versions are the pins of requirements.txt and env/requirements-gpu.txt; Python 3.12, x86-64.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="$repo/.wheels-gpu"
python="${PYTHON:-$repo/.venv/bin/python}"
grep -qx '/.wheels-gpu/' "$repo/.git/info/exclude" 2>/dev/null || echo '/.wheels-gpu/' >>"$repo/.git/info/exclude"
mkdir -p "$out"
"$python" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 -d "$out" \
  transformers==5.19.0 omegaconf==2.4.0 hjson==3.1.0 pydantic==2.14.4 pydantic-core==2.50.5 \
  annotated-types typing-inspection==0.4.5
# DeepSpeed is a source package: built here into a pure-Python wheel (its ops compile on use).
DS_BUILD_OPS=0 "$python" -m pip wheel -q --no-deps --no-build-isolation -w "$out" deepspeed==0.19.8
du -sh "$out"
