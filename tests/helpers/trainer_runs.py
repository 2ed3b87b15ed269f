"""The trainer as a process (``torchrun -m rft.trainer``, DeepSpeed on gloo): a config file, the
fixed batch written as buffer segments, the run itself (whole, or stopped by SIGUSR1 and
resumed) and the metrics it logged."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch

from rft.buffer.experience import Experience
from rft.errors import EXIT_REQUEUE
from rft.trainer.batching import rows_from_experiences
from tests.helpers.runs import REPO
from tests.helpers.synthetic import rollout_groups

PY = str(REPO / ".venv" / "bin" / "python") if (REPO / ".venv").is_dir() else sys.executable


def make_batch(step: int, groups: int = 4, repeat: int = 2) -> list[Experience]:
    """A fixed batch (same tokens every step): group g has prompt 5+g tokens, responses 3+k+g
    tokens with reward k (k = 0..repeat-1), rollout logprobs -1."""
    return rollout_groups(step, groups, repeat, seed=0, prompt_tokens=5)


STEPS = 4


def write_config(run_root: Path, name: str, model_dir: Path, **sections) -> Path:
    import yaml

    cfg = {
        "project": "t",
        "name": name,
        "mode": "both",
        "checkpoint_root_dir": str(run_root),
        "algorithm": {
            "algorithm_type": "grpo",
            "repeat_times": 2,
            "kl_loss_fn": "none",
            "optimizer": {"lr": 1e-3},
        },
        "model": {"model_path": str(model_dir)},
        "buffer": {
            "batch_size": 4,
            "total_steps": STEPS,
            "explorer_input": {"taskset": {"path": "unused-by-the-trainer"}},
        },
        "trainer": {
            "zero_stage": 2,
            "precision": "fp32",
            "save_interval": 0,
            "use_dynamic_bsz": True,
            "max_token_len_per_gpu": 40,
        },
        "synchronizer": {"sync_interval": 2, "sync_timeout": 120},
        "monitor": {"monitor_type": "console"},
    }
    for section, values in sections.items():
        cfg[section] = {**cfg.get(section, {}), **values} if isinstance(values, dict) else values
    path = run_root / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def write_segments(run_dir: Path, steps) -> None:
    from rft.buffer.segments import SegmentWriter

    writer = SegmentWriter(run_dir / "buffer", "explorer-0")
    for step in steps:
        writer.write(make_batch(step), seq=step)


def trainer_env() -> dict[str, str]:
    env = dict(
        os.environ,
        DS_ACCELERATOR="cpu",
        OMP_NUM_THREADS="1",
        TORCH_EXTENSIONS_DIR=str(REPO / ".cache" / "torch_extensions"),
    )
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def torchrun_cmd(config: Path, *overrides: str, ranks: int = 2) -> list[str]:
    return [
        PY,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={ranks}",
        "-m",
        "rft.trainer",
        "--config",
        str(config),
        *overrides,
    ]


def run_ok(cmd: list[str], log: Path, timeout: int = 240) -> None:
    with log.open("w") as out:
        proc = subprocess.run(
            cmd, stdout=out, stderr=subprocess.STDOUT, env=trainer_env(), cwd=REPO, timeout=timeout
        )
    assert proc.returncode == 0, log.read_text()[-4000:]


def children(pid: int) -> list[int]:
    kids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            kids.append(int(stat.parent.name))
    return kids


def metrics(run_dir: Path) -> dict[int, dict]:
    from rft.monitor import read_metrics

    return {row["step"]: row for row in read_metrics(run_dir, "trainer")}


def run_interrupted(config: Path, run_dir: Path, log: Path) -> None:
    """Steps 1-2 on the buffer, SIGUSR1 to the ranks while they wait for step 3, then resume."""
    write_segments(run_dir, [1, 2])
    with log.open("w") as out:
        proc = subprocess.Popen(
            torchrun_cmd(config), stdout=out, stderr=subprocess.STDOUT, env=trainer_env(), cwd=REPO
        )
        deadline = time.time() + 180
        while 2 not in metrics(run_dir) and time.time() < deadline and proc.poll() is None:
            time.sleep(0.5)
        assert 2 in metrics(run_dir), log.read_text()[-4000:]
        for pid in children(proc.pid):
            os.kill(pid, signal.SIGUSR1)
        proc.wait(timeout=120)
    assert f"exit code {EXIT_REQUEUE}" in log.read_text(), log.read_text()[-4000:]
    write_segments(run_dir, [3, 4])
    run_ok(torchrun_cmd(config), log.with_suffix(".resume.log"))


def objective(model: torch.nn.Module) -> float:
    """:func:`_objective` of a loaded model."""
    from rft.algo.logprobs import token_logprobs
    from rft.trainer.batching import collate

    exps = make_batch(1)
    rows = rows_from_experiences(exps)
    adv = torch.tensor([e.reward - 0.5 for e in exps]).unsqueeze(-1) * rows.response_mask
    micro = collate(rows, list(range(len(exps))), adv, adv)
    with torch.no_grad():
        logits = model(input_ids=micro.input_ids, attention_mask=micro.attention_mask).logits
    index = micro.logit_positions.unsqueeze(-1).expand(-1, -1, logits.shape[-1])
    lp = token_logprobs(logits.gather(1, index), micro.response_ids)
    return float((lp * micro.advantages).sum() / micro.response_mask.sum())
