"""PPO with a critic in the trainer. Unmarked: one ``train_step`` on fake one-process engines
(a bigram policy, a value-per-token critic): GAE advantages and returns from the critic's
values, the critic's update, ``critic_warmup``, config rules. ``integration``: real DeepSpeed
on CPU (two gloo ranks, tiny Llama policy and critic): critic metrics, a SIGUSR1 stop and
resume equal to an uninterrupted run, ``global_step_N/critic/`` converted by ``rft-convert`` to
a value model that transformers loads with the trained values."""

from __future__ import annotations

import json
import subprocess
from types import SimpleNamespace

import pytest
import torch

from rft.buffer.experience import Experience
from tests.helpers.fake_engine import BigramLM, SGDEngine, step_on_one_rank
from tests.helpers.runs import REPO
from tests.helpers.trainer_runs import (
    PY,
    STEPS,
    metrics,
    run_interrupted,
    run_ok,
    torchrun_cmd,
    write_config,
    write_segments,
)

VOCAB = 5


class TokenValues(torch.nn.Module):
    """A critic whose value at position t is a learned number per token t: ``logits [B, T, 1]``
    as a token-classification model returns them."""

    def __init__(self) -> None:
        super().__init__()
        self.value = torch.nn.Parameter(torch.tensor([0.0, 0.1, 0.2, 0.3, 0.4]))

    def forward(self, input_ids, attention_mask, use_cache):
        return SimpleNamespace(logits=self.value[input_ids].unsqueeze(-1))  # [B, T, 1]


def ppo_cfg(**trainer_config):
    from rft.config.load import config_from_dict

    return config_from_dict(
        {
            "model": {"model_path": "/m"},
            "algorithm": {
                "algorithm_type": "ppo",
                "repeat_times": 1,
                "advantage_fn_args": {"gamma": 1.0, "lam": 1.0},
                # the critic alone: no reference model (Trinity's ppo preset adds a k2 KL loss)
                "kl_loss_fn": "none",
            },
            "buffer": {"batch_size": 2, "explorer_input": {"taskset": {"path": "/d"}}},
            "trainer": {
                "precision": "fp32",
                "use_dynamic_bsz": False,
                "micro_batch_size_per_gpu": 2,
                "trainer_config": trainer_config,
            },
        }
    )


def one_step(monkeypatch, cfg, step: int = 1):
    from rft.trainer import engine

    monkeypatch.setattr(
        engine, "all_reduce_max", lambda value: value
    )  # one process: no collectives
    monkeypatch.setattr(engine, "all_gather_objects", lambda obj: [obj])
    # prompt [1, 2], response [3, 4]: values read at positions 1, 2 -> tokens 2, 3 -> 0.2, 0.3
    # prompt [4], response [1, 2, 0]: positions 0, 1, 2 -> tokens 4, 1, 2 -> 0.4, 0.1, 0.2
    exps = [
        Experience("a", "a", [1, 2], [3, 4], logprobs=[-1.0, -1.0], reward=1.0),
        Experience("b", "b", [4], [1, 2, 0], logprobs=[-1.0] * 3, reward=0.0),
    ]
    policy, critic = BigramLM(), TokenValues()
    out = step_on_one_rank(SGDEngine(policy), exps, cfg, critic=SGDEngine(critic), step=step)
    return out, policy, critic


def test_gae_advantages_come_from_the_critics_values_and_the_critic_learns(monkeypatch):
    """gamma = lam = 1: each token's return is the response's reward, A_t = R - V_t. Tokens:
    a: V (0.2, 0.3), R 1 -> A (0.8, 0.7); b: V (0.4, 0.1, 0.2), R 0 -> A (-0.4, -0.1, -0.2)."""
    out, policy, critic = one_step(monkeypatch, ppo_cfg(critic={"cliprange_value": 10.0}))
    raw = torch.tensor([0.8, 0.7, -0.4, -0.1, -0.2])
    assert out["advantage_raw_mean"] == pytest.approx(float(raw.mean()), abs=1e-6)
    assert out["return_mean"] == pytest.approx(2 / 5, abs=1e-6)
    assert out["value_mean"] == pytest.approx(1.2 / 5, abs=1e-6)
    # explained variance of the old values: 1 - Var(R - V) / Var(R), population variances
    returns, values = torch.tensor([1.0, 1, 0, 0, 0]), torch.tensor([0.2, 0.3, 0.4, 0.1, 0.2])
    expected = 1 - float(
        ((returns - values) - (returns - values).mean()).square().mean()
        / (returns - returns.mean()).square().mean()
    )
    assert out["critic/explained_variance"] == pytest.approx(expected, abs=1e-6)
    # value loss at the old values: 0.5 * mean (V - R)^2 (no clipping before the update)
    assert out["critic/value_loss"] == pytest.approx(0.5 * float(raw.square().mean()), abs=1e-6)
    assert out["critic/value_clip_frac"] == 0.0
    # one SGD step (lr 0.1) on 0.5 * mean (V - R)^2: dL/dv_k = sum over tokens read at k of (V - R) / 5
    grad = torch.tensor([0.0, 0.1, -0.8 + 0.2, -0.7, 0.4]) / 5  # v2 is read by a (R 1) and b (R 0)
    assert torch.allclose(
        critic.value.detach(), torch.tensor([0.0, 0.1, 0.2, 0.3, 0.4]) - 0.1 * grad, atol=1e-6
    )
    assert out["updates"] == 1 and not torch.equal(policy.table.detach(), BigramLM().table.detach())


def test_the_value_clip_bounds_the_critics_move(monkeypatch):
    """The loss is evaluated at the old values (new = old before the update), so the clip fraction
    is 0 and the gradient is the unclipped one whatever the range; the range is a bound for
    later epochs. With two epochs and a tiny range, the second epoch's values are clipped."""
    out, _policy, _critic = one_step(monkeypatch, ppo_cfg(critic={"cliprange_value": 1e-4}))
    assert out["critic/value_clip_frac"] == 0.0
    cfg = ppo_cfg(critic={"cliprange_value": 1e-4})
    cfg.trainer.ppo_epochs = 2
    out, _policy, _critic = one_step(monkeypatch, cfg)
    # epoch 2: the values moved toward their returns by more than 1e-4, except v2 on b's token
    # (v2 rose for a's sake, away from b's return 0): 4 of 5 tokens clipped; epochs weigh 1/2
    assert out["critic/value_clip_frac"] == pytest.approx(0.4)
    assert out["updates"] == 2


def test_critic_warmup_trains_only_the_critic(monkeypatch):
    cfg = ppo_cfg(trainer={"critic_warmup": 2})
    for step, updated in ((2, False), (3, True)):
        out, policy, critic = one_step(monkeypatch, cfg, step=step)
        assert torch.equal(policy.table.detach(), BigramLM().table.detach()) != updated, step
        assert not torch.equal(critic.value.detach(), TokenValues().value.detach())
        assert out["updates"] == (1 if updated else 0) and out.get("critic_warmup", 0) == (
            0 if updated else 1
        )


def test_config_rules_for_the_critic(caplog):
    from rft.config.load import config_from_dict
    from rft.errors import ConfigError

    base = {
        "model": {"model_path": "/m"},
        "buffer": {"batch_size": 2, "explorer_input": {"taskset": {"path": "/d"}}},
    }
    cfg = config_from_dict({**base, "algorithm": {"algorithm_type": "ppo"}})
    assert (cfg.algorithm.advantage_fn, cfg.model.critic_model_path) == (
        "ppo",
        "/m",
    )  # Trinity's defaults
    cfg = config_from_dict(
        {
            **base,
            "algorithm": {"algorithm_type": "ppo"},
            "trainer": {"trainer_config": {"critic": {"model": {"path": "/c"}}}},
        }
    )
    assert cfg.model.critic_model_path == "/c"
    with pytest.raises(
        ConfigError, match="critic.model.path='/c' contradicts model.critic_model_path"
    ):
        config_from_dict(
            {
                **base,
                "model": {"model_path": "/m", "critic_model_path": "/d"},
                "trainer": {"trainer_config": {"critic": {"model": {"path": "/c"}}}},
            }
        )
    with pytest.raises(ConfigError, match="critic_warmup=3 needs a critic"):
        config_from_dict(
            {
                **base,
                "algorithm": {"algorithm_type": "grpo", "repeat_times": 2},
                "trainer": {"trainer_config": {"trainer": {"critic_warmup": 3}}},
            }
        )
    with caplog.at_level("WARNING", logger="rft.config"):
        config_from_dict(
            {
                **base,
                "algorithm": {"algorithm_type": "grpo", "repeat_times": 2},
                "model": {"model_path": "/m", "critic_model_path": "/c"},
            }
        )
    assert "model.critic_model_path: no effect, advantage_fn 'grpo' trains no critic" in caplog.text
    with pytest.raises(ConfigError, match="advantage_fn_args.lam: got 2"):
        from rft.trainer.algorithm import build_loss_fns

        build_loss_fns(
            config_from_dict(
                {**base, "algorithm": {"algorithm_type": "ppo", "advantage_fn_args": {"lam": 2}}}
            ).algorithm
        )


# ----------------------------------------------------------------------------- DeepSpeed runs

PPO = {
    "algorithm": {
        "algorithm_type": "ppo",
        "repeat_times": 2,
        "optimizer": {"lr": 1e-3},
        "advantage_fn_args": {"gamma": 1.0, "lam": 0.95},
        "kl_loss_fn": "none",  # the critic alone (the ppo preset's k2 KL loss needs a reference)
    },
    "trainer": {
        "zero_stage": 2,
        "precision": "fp32",
        "save_interval": 0,
        "use_dynamic_bsz": True,
        "max_token_len_per_gpu": 40,
        "save_hf_checkpoint": "never",
        "trainer_config": {
            "critic": {"optim": {"lr": 2e-3}, "ppo_micro_batch_size_per_gpu": 2},
            "trainer": {"critic_warmup": 1},
        },
    },
}


@pytest.fixture(scope="module")
def ppo_runs(tmp_path_factory, tiny_model_dir):
    """An uninterrupted PPO run (the same batch each step) and a stopped-and-resumed one."""
    root = tmp_path_factory.mktemp("ppo")
    full, stopped = (
        write_config(root, name, tiny_model_dir, **PPO) for name in ("full", "stopped")
    )
    full_dir, stopped_dir = root / "t" / "full", root / "t" / "stopped"
    write_segments(full_dir, range(1, STEPS + 1))
    run_ok(torchrun_cmd(full), root / "full.log")
    run_interrupted(stopped, stopped_dir, root / "stopped.log")
    return {"full": full_dir, "stopped": stopped_dir, "model": tiny_model_dir}


@pytest.mark.integration
def test_the_critic_learns_and_warms_up_first(ppo_runs):
    rows = metrics(ppo_runs["full"])
    assert rows[1]["updates"] == 0 and rows[1]["critic_warmup"] == 1 and "pg_loss" not in rows[1]
    assert all(rows[s]["updates"] == 1 and "pg_loss" in rows[s] for s in range(2, STEPS + 1))
    losses = [rows[s]["critic/value_loss"] for s in range(1, STEPS + 1)]
    assert losses[-1] < 0.5 * losses[0], losses  # the same batch every step: the values fit
    assert rows[STEPS]["critic/explained_variance"] > rows[1]["critic/explained_variance"]
    for key in ("critic/grad_norm", "critic/lr", "critic/value_clip_frac", "critic/values_mean"):
        assert key in rows[STEPS], key


@pytest.mark.integration
def test_a_ppo_run_resumes_exactly(ppo_runs):
    full, stopped = metrics(ppo_runs["full"]), metrics(ppo_runs["stopped"])
    assert sorted(stopped) == list(range(1, STEPS + 1))
    for step in range(1, STEPS + 1):
        for key in (
            "critic/value_loss",
            "critic/grad_norm",
            "critic/explained_variance",
            "pg_loss",
        ):
            if key in full[step]:
                assert stopped[step][key] == pytest.approx(full[step][key], abs=1e-5), (step, key)
    meta = json.loads((ppo_runs["stopped"] / "trainer_meta.json").read_text())
    assert meta["critic"] is True
    assert (
        ppo_runs["stopped"] / f"global_step_{STEPS}" / "critic" / "huggingface" / "config.json"
    ).is_file()


@pytest.mark.integration
def test_rft_convert_writes_the_critic_as_a_value_model(ppo_runs, tmp_path):
    """A step folder converts to the policy and the critic; the critic loads as a one-label
    AutoModelForTokenClassification whose value head is the trained one."""
    from transformers import AutoModelForTokenClassification

    step_dir = ppo_runs["full"] / f"global_step_{STEPS}"
    proc = subprocess.run(
        [PY, str(REPO / "bin" / "rft-convert"), "--checkpoint-dir", str(step_dir)],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "global_step_4/critic" in proc.stdout and "2 converted" in proc.stdout
    critic = AutoModelForTokenClassification.from_pretrained(
        step_dir / "critic" / "huggingface"
    ).eval()
    assert critic.config.num_labels == 1 and critic.config.architectures[0].endswith(
        "ForTokenClassification"
    )
    from rft.convert.readers import open_checkpoint

    contents = open_checkpoint(step_dir / "critic")
    try:
        score = {t.name: t for t in contents.tensors}["score.weight"].load()
    finally:
        contents.close()
    assert torch.equal(critic.score.weight.detach(), score.float())
    assert not torch.equal(critic.score.weight.detach(), torch.zeros_like(score))
