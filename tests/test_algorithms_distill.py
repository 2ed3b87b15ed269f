"""On-policy distillation (``on_policy_distill``, ``jsd``): the advantages and the
importance-sampling loss on hand-computed values, their config checks, the teacher log-probs an
experience carries to the trainer, and the explorer's teacher pass on a tiny causal LM."""

from __future__ import annotations

import math

import pytest
import torch

from rft.algo import registry
from rft.algo.distill import jsd_per_token
from rft.buffer.experience import Experience, decode_line, encode_line
from rft.config.load import config_from_dict
from rft.errors import ConfigError, DataError
from rft.trainer.algorithm import build_loss_fns
from rft.trainer.batching import rows_from_experiences
from rft.trainer.distill import teacher_inputs

T = torch.tensor
LN = math.log


def _adv(name: str, old, teacher, mask, **args):
    fn = registry.get_advantage_fn(name, args)
    n = len(old)
    return fn(torch.zeros(n), [str(i) for i in range(n)], T(mask), old_logprobs=T(old), teacher_logprobs=T(teacher))  # fmt: skip


# ----------------------------------------------------------------------------- advantages


def test_on_policy_distill_advantage_is_the_teacher_gap():
    adv, metrics = _adv(
        "on_policy_distill", [[-1.0, -2.0, -0.5]], [[-0.5, -3.0, -9.0]], [[1.0, 1.0, 0.0]],
        kl_coef=2.0,
    )  # fmt: skip
    # 2 * (teacher - student): 2 * 0.5, 2 * (-1.0), masked
    assert adv.tolist() == [[1.0, -2.0, 0.0]]
    # the row's reverse-KL estimate sum(student - teacher) over the mask: -0.5 + 1.0
    assert metrics["distill_kl_mean"] == pytest.approx(0.5)


def test_jsd_of_one_token_by_hand():
    p_s, p_t = 0.5, 0.25
    m = 0.5 * p_t + 0.5 * p_s  # 0.375
    expected = 0.5 * p_t * LN(p_t / m) + 0.5 * p_s * LN(p_s / m)  # 0.0212375...
    assert expected == pytest.approx(0.021237, abs=1e-6)
    adv, metrics = _adv("jsd", [[LN(p_s)]], [[LN(p_t)]], [[1.0]], kl_coef=3.0)
    assert adv.item() == pytest.approx(-3.0 * expected, rel=1e-5)
    assert metrics["jsd_mean"] == pytest.approx(expected, rel=1e-5)


def test_jsd_lambda_weighs_the_teacher_side():
    # lambda 0.25: m = 0.25 p_t + 0.75 p_s = 0.4375
    m = 0.25 * 0.25 + 0.75 * 0.5
    expected = 0.25 * 0.25 * LN(0.25 / m) + 0.75 * 0.5 * LN(0.5 / m)  # 0.015098...
    got = jsd_per_token(T([[LN(0.5)]]), T([[LN(0.25)]]), 0.25)
    assert got.item() == pytest.approx(expected, rel=1e-5)
    assert expected == pytest.approx(0.015098, abs=1e-6)


def test_jsd_is_zero_where_teacher_agrees_and_at_the_lambda_ends():
    same = jsd_per_token(T([[-0.7, -2.0]]), T([[-0.7, -2.0]]), 0.5)
    assert same.abs().max().item() < 1e-7
    for lam in (0.0, 1.0):
        assert jsd_per_token(T([[-0.1]]), T([[-5.0]]), lam).tolist() == [[0.0]]


# ----------------------------------------------------------------------------- the loss


def test_importance_sampling_loss_is_unclipped():
    fn = registry.get_policy_loss_fn("importance_sampling")
    old = T([[-1.0, -1.0]])
    logprob = T([[-1.0 + LN(10.0), -1.0]], requires_grad=True)  # ratios 10 and 1
    loss, metrics = fn(logprob, old, T([[1.0, -3.0]]), T([[1.0, 1.0]]))
    # token-mean of -A * r: (-10 + 3) / 2; PPO would have clipped the first ratio at 1.2
    assert loss.item() == pytest.approx(-3.5, rel=1e-6)
    assert metrics["ratio_mean"] == pytest.approx(5.5, rel=1e-6)
    loss.backward()
    # d/d logprob of -A * exp(logprob - old) / 2 = -A * r / 2
    assert logprob.grad[0].tolist() == pytest.approx([-5.0, 1.5], rel=1e-6)


def test_importance_sampling_loss_honours_mask_and_agg_mode():
    fn = registry.get_policy_loss_fn("importance_sampling", {"loss_agg_mode": "seq-mean-token-sum"})
    zeros = torch.zeros(2, 2)
    loss, _ = fn(zeros, zeros, T([[1.0, 2.0], [4.0, 8.0]]), T([[1.0, 1.0], [1.0, 0.0]]))
    assert loss.item() == pytest.approx(-(3.0 + 4.0) / 2)  # row sums -3 and -4, their mean


def test_distill_args_are_checked():
    with pytest.raises(ConfigError, match="lambda_coef: got 2"):
        registry.get_advantage_fn("jsd", {"lambda_coef": 2})
    with pytest.raises(ConfigError, match="not an argument of advantage_fn 'on_policy_distill'"):
        registry.get_advantage_fn("on_policy_distill", {"lambda_coef": 0.5})
    with pytest.raises(ConfigError, match="not an argument"):  # supplied by the trainer only
        registry.get_advantage_fn("jsd", {"teacher_logprobs": 0})


def _distill_config(algorithm_type: str, **algorithm) -> dict:
    return {
        "model": {"model_path": "/models/student"},
        "algorithm": {"algorithm_type": algorithm_type, "repeat_times": 2, **algorithm},
        "buffer": {"batch_size": 2, "explorer_input": {"taskset": {"path": "/data/t"}}},
        "cluster": {"node_num": 1, "gpu_per_node": 3},
        "explorer": {"auxiliary_models": [{"model_path": "/models/teacher"}]},
    }


@pytest.mark.parametrize("algorithm_type", ["on_policy_distill", "jsd"])
def test_distill_types_resolve_to_teacher_advantages(algorithm_type):
    cfg = config_from_dict(_distill_config(algorithm_type))
    algo = cfg.algorithm
    assert (algo.advantage_fn, algo.policy_loss_fn) == (algorithm_type, "ppo")
    assert (algo.kl_loss_fn, algo.entropy_loss_fn) == ("none", "none")
    fns = build_loss_fns(algo)
    assert fns.advantage_by_teacher and not fns.needs_ref


def test_distill_with_importance_sampling_as_trinitys_comment_suggests():
    raw = _distill_config("on_policy_distill", policy_loss_fn="importance_sampling")
    assert build_loss_fns(config_from_dict(raw).algorithm).advantage_by_teacher


def test_trainer_only_run_needs_no_teacher_model():
    raw = _distill_config("jsd")
    raw.update(mode="train", explorer={})
    raw["buffer"]["trainer_input"] = {"experience_buffer": {"storage_type": "queue"}}
    raw["cluster"]["gpu_per_node"] = 1
    assert config_from_dict(raw).explorer.auxiliary_models == []


# ----------------------------------------------------------------------------- the record


def _exp(teacher: list[float] | None, **kw) -> Experience:
    exp = Experience(
        task_id="t/0", group_id="g", prompt_ids=[1, 2], response_ids=[3, 4],
        logprobs=[-0.5, -1.5], **kw,
    )  # fmt: skip
    if teacher is not None:
        exp.teacher_logprobs = teacher
    return exp


def test_teacher_logprobs_travel_in_the_record_and_reach_the_trainer():
    exp = decode_line(encode_line(_exp([-0.25, -2.0])))
    assert exp.teacher_logprobs == [-0.25, -2.0]
    rows = rows_from_experiences([exp, _exp([-1.0, -1.0])])
    inputs = teacher_inputs(rows, [0, 1], rows.rollout_logprobs)
    assert inputs["teacher_logprobs"].tolist() == [[-0.25, -2.0], [-1.0, -1.0]]
    assert inputs["old_logprobs"].tolist() == [[-0.5, -1.5], [-0.5, -1.5]]


def test_a_row_without_teacher_logprobs_is_a_data_error():
    rows = rows_from_experiences([_exp([-0.25, -2.0]), _exp(None)])
    with pytest.raises(DataError, match="1 of 2 rollout experiences carry no teacher_logprobs"):
        teacher_inputs(rows, [0, 1], rows.rollout_logprobs)


def test_teacher_logprobs_are_checked_like_logprobs():
    with pytest.raises(DataError, match="1 teacher_logprobs for 2 response tokens"):
        _exp([-0.25]).validate()
    with pytest.raises(DataError, match=r"teacher_logprobs\[0\] is 0.5 > 0"):
        _exp([0.5, -1.0]).validate()  # a positive log-probability


# ----------------------------------------------------------------------------- the teacher


def test_response_logprobs_read_the_logits_one_position_early():
    from rft.explorer.teacher import response_logprobs

    logits = T([[0.0, LN(3.0)], [0.0, 0.0], [5.0, -5.0]])  # [L=3, V=2]
    ids = T([0, 1, 0])  # prompt [0], response [1, 0]
    got = response_logprobs(logits, ids, prompt_len=1, length=2)
    assert got.tolist() == pytest.approx([LN(0.75), LN(0.5)], rel=1e-6)


def _teacher_cfg(student, teacher):
    raw = _distill_config("on_policy_distill")
    raw["model"]["model_path"] = str(student)
    raw["explorer"]["auxiliary_models"][0]["model_path"] = str(teacher)
    return config_from_dict(raw)


def test_teacher_pass_matches_a_plain_forward(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    from rft.explorer.teacher import TEACHER_TIME_S, add_teacher_logprobs

    cfg = _teacher_cfg(tiny_model_dir, tiny_model_dir)
    exps = [
        Experience(task_id="t/0", group_id="g", prompt_ids=[5, 6, 7], response_ids=[8, 9]),
        Experience(task_id="t/1", group_id="g", prompt_ids=[5], response_ids=[10, 11, 12, 13]),
    ]
    metrics = add_teacher_logprobs(cfg, exps)  # one padded batch: both rows at once
    assert metrics[TEACHER_TIME_S] > 0
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    for exp in exps:
        ids = list(exp.prompt_ids) + list(exp.response_ids)
        with torch.no_grad():
            lps = torch.log_softmax(model(input_ids=T([ids])).logits[0], dim=-1)  # [L, V]
        p = len(exp.prompt_ids)
        want = [lps[p - 1 + k, tok].item() for k, tok in enumerate(exp.response_ids)]
        assert exp.teacher_logprobs == pytest.approx(want, abs=1e-4)


def test_distillation_off_leaves_experiences_alone(tiny_model_dir):
    from rft.explorer.teacher import add_teacher_logprobs

    raw = _distill_config("grpo")
    raw["explorer"] = {}
    raw["cluster"]["gpu_per_node"] = 2
    exp = Experience(task_id="t/0", group_id="g", prompt_ids=[5], response_ids=[8])
    assert add_teacher_logprobs(config_from_dict(raw), [exp]) == {}
    assert exp.teacher_logprobs == []


def test_a_reward_model_is_no_teacher(tiny_model_dir, tiny_reward_model_dir):
    from rft.explorer.teacher import check_teacher_dir

    with pytest.raises(ConfigError, match="is a reward model .* point it at a causal LM"):
        check_teacher_dir(_teacher_cfg(tiny_model_dir, tiny_reward_model_dir))
    check_teacher_dir(_teacher_cfg(tiny_model_dir, tiny_model_dir))


def test_a_multi_turn_workflow_is_refused_with_a_teacher():
    """A multi-turn workflow with a teacher is refused at load, as with reward models (the
    rule lives in rft.config.teacher)."""
    from rft.explorer.tasksets import taskset_workflow

    raw = _distill_config("jsd")
    raw["buffer"]["explorer_input"]["default_workflow_type"] = "frozen_lake_workflow"
    cfg = config_from_dict(raw)
    with pytest.raises(
        ConfigError, match=r"auxiliary_models\[0\] is algorithm.advantage_fn jsd's teacher"
    ):
        taskset_workflow(cfg, cfg.buffer.explorer_input.taskset, "taskset", is_eval=False)


def test_the_trainer_step_feeds_the_teacher_to_the_advantage():
    """rft.trainer.step._advantages on a step's rows: the teacher gap of each rollout row."""
    from types import SimpleNamespace

    from rft.trainer.step import _advantages, old_pass_skippable

    cfg = config_from_dict(_distill_config("on_policy_distill", advantage_fn_args={"kl_coef": 2.0}))
    fns = build_loss_fns(cfg.algorithm)
    assert not old_pass_skippable(fns, updates=1)  # the advantage reads the old log-probs
    exps = [_exp([-0.25, -2.0]), _exp([-3.0, -1.5], source="expert")]
    rows = rows_from_experiences(exps)
    plan = SimpleNamespace(rows=rows, local_rows=[0, 1])
    adv, returns, _ = _advantages(plan, fns, None, rows.rollout_logprobs, info=None)
    # 2 * (teacher - old) on the rollout row; the expert row gets 0
    assert adv.tolist() == [[0.5, -1.0], [0.0, 0.0]] and returns is None
