#!/usr/bin/env bash
# The whole test suite, every tier (unit, integration with real engines on CPU, slurm), after
# the set-up it needs. Extra arguments go to pytest, e.g. `bash env/test.sh -m "not slurm"`.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
# --envs: the environment packages (verifiers, OpenEnv, AgentScope, ScienceWorld + Java) the
# environment tests run on, as slurm-wlm below is for the slurm tier.
bash env/setup.sh --envs
# The slurm tier needs Debian's slurm-wlm (a real local cluster); installing it needs root.
if [ "$(id -u)" = 0 ]; then
  bash env/local-slurm.sh install
elif ! command -v slurmctld >/dev/null; then
  echo "[rft test] slurm-wlm missing and not root: the slurm tier will be skipped" >&2
fi
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export TORCH_EXTENSIONS_DIR="${TORCH_EXTENSIONS_DIR:-$repo/.cache/torch_extensions}"
python="${RFT_VENV:-$repo/.venv}/bin/python"
# One style for the tree (pyproject.toml [tool.ruff]): `ruff format .` and
# `ruff check --select I --fix .` fix what these two report.
"$python" -m ruff format --check --quiet . || { echo "[rft test] run: $python -m ruff format ." >&2; exit 1; }
"$python" -m ruff check --quiet . || { echo "[rft test] run: $python -m ruff check --fix ." >&2; exit 1; }
# Two workers (pytest-xdist), one test file per worker at a time and the SLURM tier's files on
# one (tests/conftest.py schedules them): the engines' start-ups and waits overlap on the two cores.
# RFT_TEST_WORKERS=0 runs the suite in one process.
exec "$python" -m pytest -n "${RFT_TEST_WORKERS:-2}" --dist loadfile "$@"
