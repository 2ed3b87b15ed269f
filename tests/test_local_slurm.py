"""The local SLURM cluster the slurm tier runs on: heterogeneous jobs, --signal, requeue."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slurm


def wait_for_file(path: Path, needle: str, timeout_s: float = 60) -> str:
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if path.is_file() and needle in path.read_text():
            return path.read_text()
        time.sleep(0.5)
    raise AssertionError(
        f"{path} never contained {needle!r}: {path.read_text() if path.is_file() else 'missing'}"
    )


def sbatch(env: dict, script: Path) -> str:
    out = subprocess.run(
        ["sbatch", "--parsable", str(script)],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    return out.stdout.strip().split(";")[0]


def test_heterogeneous_job_runs_both_groups(slurm_cluster, tmp_path):
    out = tmp_path / "het.out"
    script = tmp_path / "het.sbatch"
    script.write_text(f"""#!/bin/bash
#SBATCH --output={out}
#SBATCH --nodes=1 --ntasks=1
#SBATCH hetjob
#SBATCH --nodes=2 --ntasks=2
set -euo pipefail
srun --het-group=0 bash -c 'echo "group0 rank=$SLURM_PROCID node=$SLURMD_NODENAME"' &
srun --het-group=1 bash -c 'echo "group1 rank=$SLURM_PROCID node=$SLURMD_NODENAME"' &
wait
echo done
""")
    sbatch(slurm_cluster, script)
    text = wait_for_file(out, "done")
    assert "group0 rank=0" in text
    assert "group1 rank=0" in text and "group1 rank=1" in text


def test_signal_reaches_the_batch_script(slurm_cluster, tmp_path):
    out = tmp_path / "sig.out"
    script = tmp_path / "sig.sbatch"
    script.write_text(f"""#!/bin/bash
#SBATCH --output={out}
#SBATCH --signal=B:USR1@1
trap 'echo got-usr1; exit 0' USR1
echo started
for i in $(seq 1 120); do sleep 0.5; done
""")
    job = sbatch(slurm_cluster, script)
    wait_for_file(out, "started")
    subprocess.run(["scancel", "--batch", "--signal=USR1", job], env=slurm_cluster, check=True)
    assert "got-usr1" in wait_for_file(out, "got-usr1")
