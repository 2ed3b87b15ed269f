"""Real DeepSpeed and FSDP checkpoints for rft-convert's tests: runs one of the scripts beside
this module (``make_ds_checkpoint.py``, ``make_fsdp_checkpoint.py``) under torchrun on CPU."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

HELPERS = Path(__file__).resolve().parent


def torchrun_script(script: str, nproc: int, *args: str) -> None:
    env = {**os.environ, "DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1"}
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={nproc}",
        str(HELPERS / script),
        *args,
    ]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
