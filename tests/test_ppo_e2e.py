"""The seed's PPO example end to end (``configs/cpu/verl_ppo.yaml``, the CPU twin of
``configs/verl_ppo.yaml``): a tiny policy, its critic, and a tiny reward model with a score head.
Through ``rft-run`` (``integration``): critic metrics every step, the first step a critic-only
warm-up, rewards with the reward model's score as a part. Through the local SLURM cluster
(``slurm``): the heterogeneous job, requeued mid-run, resumes policy and critic from the
checkpoint and finishes every step once."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from rft.monitor import VALUE_LOSS, read_metrics
from tests.helpers.runs import rft_run
from tests.helpers.slurm_jobs import run_requeued, trainer_steps

REPO = Path(__file__).resolve().parent.parent
CONFIG = REPO / "configs" / "cpu" / "verl_ppo.yaml"
DATA = REPO / "data" / "arithmetic"
RUN = ("verl_example_cpu", "smollm2-135m_ppo_critic_rm")


def ppo_overrides(model: Path, reward_model: Path, root: Path, *extra: str) -> list[str]:
    return [
        f"model.model_path={model}",
        f"explorer.auxiliary_models.0.model_path={reward_model}",
        f"checkpoint_root_dir={root}",
        "model.max_response_tokens=8",
        "explorer.eval_interval=0",
        "trainer.precision=fp32",
        "trainer.zero_stage=2",
        *extra,
    ]


def check_rewards_come_from_the_reward_model(run_dir: Path) -> None:
    """Each explorer step's mean reward is the mean of its rule parts plus the model's score
    (weights 1.0), and the score is a part of its own."""
    rows = read_metrics(run_dir, "explorer_explorer")
    assert rows
    for row in rows:
        parts = [
            v
            for k, v in row.items()
            if k.startswith("reward/") and k.endswith("/mean") and k != "reward/mean"
        ]
        assert "reward/reward_model/mean" in row, sorted(row)
        assert row["reward/mean"] == pytest.approx(sum(parts), abs=1e-5)
        assert row["reward/reward_model/mean"] != 0.0  # a random score head: never exactly 0


@pytest.mark.integration
def test_the_ppo_example_runs_with_a_critic_and_a_reward_model(
    vllm_model_dir, tiny_reward_model_dir, tmp_path
):
    proc = rft_run(
        "--config",
        str(CONFIG),
        *ppo_overrides(vllm_model_dir, tiny_reward_model_dir, tmp_path, "buffer.total_steps=3"),
    )
    run_dir = tmp_path.joinpath(*RUN)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = {row["step"]: row for row in read_metrics(run_dir, "trainer")}
    assert sorted(rows) == [1, 2, 3]
    assert rows[1]["critic_warmup"] == 1 and rows[1]["updates"] == 0  # critic_warmup: 1
    assert all(rows[s]["updates"] == 1 and "pg_loss" in rows[s] for s in (2, 3))
    for row in rows.values():
        assert math.isfinite(row[VALUE_LOSS]) and "critic/explained_variance" in row
    assert "value_loss=" in proc.stdout  # the progress line shows the critic
    check_rewards_come_from_the_reward_model(run_dir)
    assert (run_dir / "global_step_2" / "critic").is_dir() and (
        run_dir / "global_step_3" / "critic"
    ).is_dir()


@pytest.mark.slurm
def test_the_ppo_example_resumes_policy_and_critic_after_a_requeue(
    slurm_cluster, vllm_model_dir, tiny_reward_model_dir, tmp_path
):
    out = tmp_path / "job.out"
    overrides = ppo_overrides(
        vllm_model_dir,
        tiny_reward_model_dir,
        tmp_path,
        "buffer.total_steps=4",
        "trainer.save_interval=1",
        "synchronizer.sync_method=checkpoint",
    )
    run_dir = tmp_path.joinpath(*RUN)
    run_requeued(slurm_cluster, CONFIG, overrides, run_dir, out)
    steps = trainer_steps(run_dir)
    assert steps[-1] == 4 and set(steps) == {1, 2, 3, 4}, steps
    rows = {row["step"]: row for row in read_metrics(run_dir, "trainer")}
    assert all(VALUE_LOSS in rows[s] for s in rows)
    log = out.read_text() + "".join(
        p.read_text(errors="replace") for p in (run_dir / "log").glob("*")
    )
    assert "with its critic" in log  # the requeued trainer restored the critic too
    meta = json.loads((run_dir / "trainer_meta.json").read_text())
    assert meta["step"] == 4 and meta["critic"] is True
    check_rewards_come_from_the_reward_model(run_dir)
