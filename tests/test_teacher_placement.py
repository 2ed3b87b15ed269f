"""Where on-policy distillation's teacher runs (rft.config.teacher): in each explorer task with
the rollout model's engine_num, else in the trainer (Trinity's one shared teacher engine), with
the GPU split counting it where it runs; the trainer's teacher pass on a fake model, checked
against hand-computed log-probs; the teacher's and reward models' vLLM engine keys (dtype acts,
the others have no effect)."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from rft.buffer.experience import Experience
from rft.config.auxiliary import auxiliary_tp, forward_dtype
from rft.config.gpus import split_gpus
from rft.config.load import config_from_dict
from rft.config.teacher import explorer_scorers, teacher_in_trainer
from rft.errors import ConfigError
from rft.models import REWARD_MODEL, check_shared_kinds
from tests.helpers.fake_engine import (
    BigramLM,
    FakeEngine,
    one_rank,
    step_on_one_rank,
    tempered_logprobs,
)

TRINITY_LAYOUT = {  # opd_gsm8k.yaml: 4 students x TP 1, one teacher engine x TP 2, 8 GPUs
    "model": {"model_path": "/models/student"},
    "algorithm": {"algorithm_type": "on_policy_distill", "repeat_times": 2},
    "buffer": {"batch_size": 2, "explorer_input": {"taskset": {"path": "/data/t"}}},
    "cluster": {"node_num": 1, "gpu_per_node": 8},
    "explorer": {
        "rollout_model": {"engine_num": 4, "tensor_parallel_size": 1},
        "auxiliary_models": [
            {"model_path": "/models/teacher", "engine_num": 1, "tensor_parallel_size": 2}
        ],
    },
}


def _cfg(algorithm_type: str = "on_policy_distill", rollout: dict = {}, teacher: dict = {}):
    raw = copy.deepcopy(TRINITY_LAYOUT)
    raw["algorithm"]["algorithm_type"] = algorithm_type
    raw["explorer"]["rollout_model"].update(rollout)
    raw["explorer"]["auxiliary_models"][0].update(teacher)
    return config_from_dict(raw)


def test_a_shared_teacher_runs_in_the_trainer_and_takes_no_explorer_gpus():
    cfg = _cfg()
    assert teacher_in_trainer(cfg)
    assert explorer_scorers(cfg) == [] and auxiliary_tp(cfg) == []
    split = split_gpus(cfg)
    # Trinity gives the teacher 2 GPUs of its own; rft's trainer holds it on its own 4
    assert (split.explorer, split.trainer, split.auxiliary) == (4, 4, 0)


def test_a_teacher_per_explorer_runs_in_each_explorer_task():
    cfg = _cfg(rollout={"engine_num": 2}, teacher={"engine_num": 2})
    assert not teacher_in_trainer(cfg)
    assert auxiliary_tp(cfg) == [2]
    split = split_gpus(cfg)
    assert (split.explorer, split.trainer, split.auxiliary) == (6, 2, 4)  # 2 x (1 + 2)


def test_reward_models_keep_the_per_explorer_rule():
    cfg = _cfg(algorithm_type="grpo")  # no teacher: another engine_num shares the model,
    with pytest.raises(ConfigError, match=r"auxiliary_models\[0\].engine_num=1 differs from "):
        check_shared_kinds(cfg, [REWARD_MODEL])  # which a reward model cannot be (dry run)


def test_the_teacher_in_the_trainer_counts_no_explorer_gpus_in_the_split_check():
    # as a teacher per explorer task: 4 x (1 + 2) = 12 GPUs > 8; in the trainer the run fits
    with pytest.raises(ConfigError, match="leaving none of"):
        _cfg(rollout={"engine_num": 4}, teacher={"engine_num": 4})
    assert split_gpus(_cfg(rollout={"engine_num": 7})).trainer == 1


@pytest.mark.parametrize(
    "requested,on_cpu,saved,want",
    [
        (None, True, "bfloat16", "float32"),  # unset: float32 on CPUs, bfloat16 on GPUs
        (None, False, "float32", "bfloat16"),
        ("float16", False, "bfloat16", "float16"),  # set: as set, anywhere
        ("bfloat16", True, "float32", "bfloat16"),
        ("auto", False, "float32", "float32"),  # auto: the checkpoint's
        ("auto", True, None, "float32"),  # a checkpoint without one: the unset rule
    ],
)
def test_forward_dtype(requested, on_cpu, saved, want):
    assert forward_dtype(requested, on_cpu, {"dtype": saved} if saved else {}) == want
    assert forward_dtype(requested, on_cpu, {"torch_dtype": saved} if saved else {}) == want


@pytest.mark.parametrize("algorithm_type", ["on_policy_distill", "grpo"])
def test_vllm_engine_keys_are_accepted_on_teachers_and_reward_models(algorithm_type):
    engine_keys = {"enable_prefix_caching": True, "enforce_eager": True, "seed": 7}
    cfg = _cfg(
        algorithm_type=algorithm_type,
        rollout={"engine_num": 1},
        teacher={"engine_num": 1, "dtype": "float16", **engine_keys},
    )
    model = cfg.explorer.auxiliary_models[0]
    assert model.dtype == "float16"
    assert (model.enable_prefix_caching, model.enforce_eager, model.seed) == (True, True, 7)


def test_the_explorer_skips_a_teacher_the_trainer_holds():
    from rft.explorer.teacher import add_teacher_logprobs

    exp = Experience(task_id="t/0", group_id="g", prompt_ids=[5], response_ids=[8])
    assert add_teacher_logprobs(_cfg(), [exp]) == {}  # /models/teacher is never loaded
    assert exp.teacher_logprobs == []


# ----------------------------------------------------------------------------- the trainer's pass


def test_the_trainer_scores_rows_without_teacher_logprobs_and_the_advantage_uses_them(
    monkeypatch,
):
    """One step with the teacher in the trainer (a fake bigram model): rows that arrive without
    teacher log-probs get the teacher's untempered ones, a row that brings its own keeps them,
    and the on_policy_distill advantage is kl_coef * (teacher - student old log-probs)."""
    from rft.trainer import distill, engine
    from rft.trainer.distill import TEACHER_ROWS, TrainerTeacher

    monkeypatch.setattr(engine, "all_reduce_max", lambda value: value)  # one process
    monkeypatch.setattr(engine, "all_gather_objects", lambda obj: [obj])
    student, teacher = BigramLM(), BigramLM()
    with torch.no_grad():
        teacher.table.mul_(-2.0)  # another model: it disagrees with the student on every token
    loads = []

    def load(cfg, info):
        loads.append(cfg.explorer.auxiliary_models[0].model_path)
        return TrainerTeacher(engine.Reference(teacher, False, info.device, None), None)

    monkeypatch.setattr(distill, "load_teacher", load)
    raw = copy.deepcopy(TRINITY_LAYOUT)
    raw["algorithm"].update(kl_loss_fn="none", advantage_fn_args={"kl_coef": 2.0})
    raw["trainer"] = {"precision": "fp32", "use_dynamic_bsz": False}
    cfg = config_from_dict(raw)
    temperature = 0.5  # the student's log-probs are tempered; the teacher's are not
    shapes = [("g0", [1, 2], [3, 4, 0]), ("g0", [1, 2], [2, 2]), ("g1", [4], [1, 3])]
    exps = [
        Experience(g, g, p, r, logprobs=tempered_logprobs(student, p, r), temperature=temperature)
        for g, p, r in shapes
    ]
    exps.append(Experience("g1", "g1", [4], [0, 1], logprobs=[-1.0, -1.0], temperature=0.5))
    exps[3].teacher_logprobs = [-0.25, -3.0]  # brought by the explorer: kept as they are

    def untempered(prompt, response):
        ids = prompt + response
        table = torch.log_softmax(teacher.table.detach(), dim=-1)  # [V, V]
        return [float(table[ids[len(prompt) - 1 + j], t]) for j, t in enumerate(response)]

    metrics = step_on_one_rank(FakeEngine(student), exps, cfg)
    assert loads == ["/models/teacher"] and metrics[TEACHER_ROWS] == 3
    old = [tempered_logprobs(student, exp.prompt_ids, exp.response_ids) for exp in exps]
    given = [untempered(exp.prompt_ids, exp.response_ids) for exp in exps[:3]] + [[-0.25, -3.0]]
    # distill_kl_mean: the mean over rows of sum(old - teacher); advantages_mean: the mean over
    # rows of the per-token mean of 2 * (teacher - old)
    kl = [sum(o - t for o, t in zip(a, b)) for a, b in zip(old, given)]
    assert metrics["distill_kl_mean"] == pytest.approx(sum(kl) / 4, abs=1e-5)
    per_row = [-2.0 * k / len(exp.response_ids) for k, exp in zip(kl, exps)]
    assert metrics["advantages_mean"] == pytest.approx(sum(per_row) / 4, abs=1e-5)
    assert not math.isclose(kl[0], 0.0, abs_tol=1e-3)  # the two models do disagree


def test_without_a_trainer_teacher_a_row_lacking_teacher_logprobs_is_still_refused(monkeypatch):
    from rft.errors import DataError
    from rft.trainer import engine
    from rft.trainer.distill import add_trainer_teacher_logprobs, teacher_inputs
    from rft.trainer.plan import plan_step

    monkeypatch.setattr(engine, "all_reduce_max", lambda value: value)
    cfg = _cfg(rollout={"engine_num": 2}, teacher={"engine_num": 2})  # explorers' teacher
    info = one_rank()
    exps = [Experience("g", "g", [1], [2, 3], logprobs=[-1.0, -1.0]) for _ in range(2)]
    plan = plan_step(exps, cfg, info)
    assert add_trainer_teacher_logprobs(cfg, plan, 0, info) == {}
    with pytest.raises(DataError, match="2 of 2 rollout experiences carry no teacher_logprobs"):
        teacher_inputs(plan.rows, [0, 1], plan.rows.rollout_logprobs)


@pytest.mark.integration
def test_the_trainers_teacher_over_two_zero3_ranks_gives_the_one_rank_step(
    tmp_path, tiny_model_dir, vllm_model_dir
):
    """The teacher in the trainer, partitioned by ZeRO-3 over two ranks (DeepSpeed on gloo):
    each rank scores its own rows and all share them, so the step's loss and gradient norm,
    which read the teacher's log-probs through the advantage, equal a one-rank run's."""
    from tests.helpers.trainer_runs import (
        metrics,
        run_ok,
        torchrun_cmd,
        write_config,
        write_segments,
    )

    extra = {
        "algorithm": {"algorithm_type": "on_policy_distill", "repeat_times": 2},
        "buffer": {
            "batch_size": 4,
            "total_steps": 1,
            "explorer_input": {"taskset": {"path": "unused-by-the-trainer"}},
        },
        "trainer": {"zero_stage": 3, "max_token_len_per_gpu": 64},
        "explorer": {  # not the rollout's engine_num: the trainer holds the teacher
            "auxiliary_models": [{"model_path": str(vllm_model_dir), "engine_num": 2}],
        },
    }
    rows = {}
    for ranks in (2, 1):
        config = write_config(tmp_path, f"ranks{ranks}", tiny_model_dir, **extra)
        write_segments(tmp_path / "t" / f"ranks{ranks}", [1])
        run_ok(torchrun_cmd(config, ranks=ranks), tmp_path / f"ranks{ranks}.log")
        rows[ranks] = metrics(tmp_path / "t" / f"ranks{ranks}")[1]
    assert rows[2]["teacher_trainer_rows"] == rows[1]["teacher_trainer_rows"] == 8
    assert abs(rows[1]["pg_loss"]) > 1e-3  # two random models: the advantages are far from 0
    # the advantage's metrics too: every rank's old log-probs reach the advantage
    for key in ("pg_loss", "grad_norm", "distill_kl_mean", "advantages_mean"):
        assert rows[2][key] == pytest.approx(rows[1][key], rel=1e-4, abs=1e-7), key
