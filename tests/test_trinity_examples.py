"""Trinity-RFT's own example configs (``tests/fixtures/trinity_examples/``, copied unchanged from
its repository, with the veRL files their ``trainer_config_path`` names under ``examples/``) dry-run
in rft with only their paths set: each loads, its loss functions build and its workflows resolve,
or it is refused by name for what rft lacks, never with a guess at a similar name. ``EXPECTED``
says which; when a feature lands, change its row to ``LOADS``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from rft.config.gpus import split_gpus
from rft.config.load import config_from_dict, read_raw
from rft.config.teacher import teacher_in_trainer
from rft.errors import ConfigError, NotSupportedError
from rft.explorer.tasksets import taskset_workflow
from rft.launch.cli import run_main
from rft.trainer.algorithm import build_loss_fns
from tests.helpers.trinity_examples import LOADS, Refused, Typo
from tests.helpers.trinity_examples import dry_run as example_dry_run

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = REPO / "tests" / "fixtures" / "trinity_examples"
ARITHMETIC = REPO / "data" / "arithmetic"
FIXTURES = sorted(p.name for p in EXAMPLES.glob("*.yaml"))


# fixture -> what rft does with it today.
EXPECTED: dict[str, Refused | Typo | None] = {
    "agentscope_react_gsm8k.yaml": LOADS,  # sequence parallel (rft.trainer.sequence_parallel)
    "asymre_gsm8k.yaml": LOADS,
    "async_gsm8k_explorer.yaml": LOADS,
    "async_gsm8k_trainer.yaml": LOADS,
    "cispo_gsm8k.yaml": LOADS,
    # Its data_processor operators act and use_base renders the plain-text prompt
    # (test_dapo_example_loads_as_written).
    "dapo_math.yaml": LOADS,
    "dpo_humanlike.yaml": LOADS,
    "grpo_alfworld.yaml": LOADS,  # rft.workflow.envs.alfworld (test_env_alfworld.py)
    "grpo_frozen_lake.yaml": LOADS,
    "grpo_gsm8k.yaml": LOADS,
    "grpo_lora_gsm8k.yaml": LOADS,
    "grpo_sciworld.yaml": LOADS,  # needs scienceworld and java (test_env_sciworld.py)
    "grpo_toolcall.yaml": LOADS,  # sequence parallel
    "grpo_vlm.yaml": Refused("buffer.explorer_input.taskset.format.image_key"),
    "gspo_gsm8k.yaml": LOADS,
    "m2po_explorer.yaml": LOADS,
    "m2po_trainer.yaml": LOADS,
    "mix_chord.yaml": LOADS,  # sequence parallel, its reference's size the actor's
    # Its one shared teacher engine runs in the trainer (test_distillation_example_...).
    "opd_gsm8k.yaml": LOADS,
    "opd_gsm8k_jsd.yaml": LOADS,
    "opmd_gsm8k.yaml": LOADS,
    "ppo_countdown.yaml": LOADS,  # modelscope 049b898 fixed a20efa4's model.max_repsonse_tokens
    "rec_gsm8k.yaml": Typo("algorithm.optiimzer"),
    "reinforceplusplus_gsm8k.yaml": LOADS,
    "rloo_gsm8k.yaml": LOADS,
    "sapo_gsm8k.yaml": LOADS,
    "sft_mot.yaml": LOADS,
    "sppo_gsm8k.yaml": LOADS,
    "topr_gsm8k.yaml": LOADS,
}


@pytest.fixture
def trinity_env(monkeypatch, tmp_path):
    """The environment variables the examples read, pointing at local paths."""
    for var in ("MODEL_PATH", "TASKSET_PATH", "EVAL_TASKSET_PATH", "SFT_DATASET_PATH"):
        monkeypatch.setenv(f"TRINITY_{var}", f"/data/{var.lower()}")
    monkeypatch.setenv("TRINITY_CHECKPOINT_ROOT_DIR", str(tmp_path))


def dry_run(raw_or_name: dict | str, tmp_path: Path):
    """``dry_run`` of a fixture in ``EXAMPLES`` by file name, or of a raw config mapping."""
    return example_dry_run(
        EXAMPLES / raw_or_name if isinstance(raw_or_name, str) else raw_or_name, tmp_path
    )


def test_every_example_has_an_expected_outcome_and_its_source():
    assert sorted(EXPECTED) == FIXTURES
    assert len(FIXTURES) >= 20
    for name in FIXTURES:
        first = (EXAMPLES / name).read_text().splitlines()[0]
        assert "Trinity-RFT examples/" in first and " at " in first, name
    for verl in EXAMPLES.glob("examples/*/*.yaml"):  # the veRL files of trainer_config_path
        first = verl.read_text().splitlines()[0]
        assert f"Trinity-RFT {verl.relative_to(EXAMPLES)} at " in first, verl


@pytest.mark.parametrize("name", FIXTURES)
def test_example_loads_or_is_refused_by_name(name, tmp_path, trinity_env):
    expected = EXPECTED[name]
    if expected is LOADS:
        cfg = dry_run(name, tmp_path)
        assert cfg.run_dir.is_relative_to(tmp_path)
        return
    with pytest.raises(ConfigError) as e:
        dry_run(name, tmp_path)
    message = str(e.value)
    if isinstance(expected, Typo):
        assert f"unknown config key '{expected.key}'. Did you mean" in message
        return
    assert isinstance(e.value, NotSupportedError), message
    assert f"Trinity's `{expected.name}` is not supported by rft: " in message
    assert "Did you mean" not in message


def test_examples_keys_reach_rft_settings(tmp_path, trinity_env):
    """The veRL and older spellings the examples use set the rft keys they name."""
    lora = dry_run("grpo_lora_gsm8k.yaml", tmp_path)
    assert lora.algorithm.optimizer.lr == 1e-5  # actor.optim.lr
    assert (lora.trainer.padding_free, lora.trainer.max_token_len_per_gpu) == (True, 16384)
    assert lora.trainer.trainer_config.actor_rollout_ref.actor.checkpoint.save_contents == ["model"]
    opmd = dry_run("opmd_gsm8k.yaml", tmp_path)
    assert opmd.trainer.max_token_len_per_gpu == 16384  # trainer.ppo_max_token_len_per_gpu
    assert opmd.algorithm.optimizer.betas == [0.0, 0.95]
    sft = dry_run("sft_mot.yaml", tmp_path)  # trainer_config_path: examples/sft_mot/train_sft.yaml
    assert (sft.trainer.max_token_len_per_gpu, sft.trainer.micro_batch_size_per_gpu) == (22000, 4)
    assert sft.trainer.padding_free is True and sft.trainer.log_prob_micro_batch_size_per_gpu == 4
    dpo = dry_run("dpo_humanlike.yaml", tmp_path)  # veRL's older optim.beta1/beta2
    assert (dpo.algorithm.optimizer.lr, dpo.algorithm.optimizer.betas) == (5e-7, [0.9, 0.95])
    assert dpo.trainer.padding_free is False and dpo.trainer.use_dynamic_bsz is False
    raw = read_raw(EXAMPLES / "grpo_frozen_lake.yaml", [f"checkpoint_root_dir={tmp_path}"])
    frozen = config_from_dict(raw)
    assert frozen.explorer.rollout_model.enable_chunked_prefill is True
    assert (frozen.trainer.param_offload, frozen.trainer.optimizer_offload) == (True, True)
    assert frozen.trainer.ref_offload is True and frozen.trainer.zero_stage == 3


def test_dry_run_of_an_example(tmp_path, monkeypatch, smollm2_dir, capsys):
    """``bin/rft-run --config grpo_gsm8k.yaml --dry-run`` with a local model and taskset."""
    monkeypatch.setenv("TRINITY_TASKSET_PATH", str(ARITHMETIC))
    monkeypatch.setenv("TRINITY_CHECKPOINT_ROOT_DIR", str(tmp_path))
    config = str(EXAMPLES / "grpo_gsm8k.yaml")
    code = run_main(["--config", config, "--dry-run", f"model.model_path={smollm2_dir}"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "dry run: config and inputs are valid" in out


@pytest.mark.parametrize(
    "name,lambda_coef", [("opd_gsm8k.yaml", None), ("opd_gsm8k_jsd.yaml", 0.5)]
)
def test_distillation_example_puts_its_teacher_in_the_trainer(
    name, lambda_coef, tmp_path, trinity_env
):
    """As written: the teacher's vLLM engine keys are read (dtype acts, the others have no
    effect on a forward pass), and its one engine shared by four explorers puts it in the
    trainer, which holds it on its own GPUs; with one teacher per explorer task it runs there,
    with GPUs of its own. The distillation preset and the math recipe either way."""
    cfg = dry_run(name, tmp_path)
    teacher = cfg.explorer.auxiliary_models[0]
    assert teacher.dtype == "bfloat16" and teacher.enforce_eager and teacher.seed == 42
    assert teacher_in_trainer(cfg)
    split = split_gpus(cfg)  # Trinity: 4 rollout + 2 teacher + 2 trainer GPUs
    assert (split.explorer, split.trainer) == (4, 4)
    raw = read_raw(EXAMPLES / name, [f"checkpoint_root_dir={tmp_path}"])
    raw["explorer"]["rollout_model"]["engine_num"] = 2
    raw["explorer"]["auxiliary_models"][0]["engine_num"] = 2
    per_explorer = dry_run(raw, tmp_path)
    assert not teacher_in_trainer(per_explorer)
    split = split_gpus(per_explorer)
    assert (split.explorer, split.trainer) == (6, 2)  # 2 x (1 + the teacher's 2)
    algo = cfg.algorithm
    assert (algo.advantage_fn, algo.policy_loss_fn, algo.kl_loss_fn) == (
        name_type(name),
        "ppo",
        "none",
    )
    assert algo.advantage_fn_args.get("lambda_coef") == lambda_coef
    assert build_loss_fns(algo).advantage_by_teacher
    recipe = taskset_workflow(cfg, cfg.buffer.explorer_input.taskset, "taskset", is_eval=False)
    assert recipe.name == "on_policy_distill_math_workflow"
    question = recipe.build_messages({"question": "1+1?"}, cfg.buffer.explorer_input.taskset.format)
    assert question[-1]["content"].endswith("put your final answer within \\boxed{}.")


def test_dry_run_of_the_distillation_example(tmp_path, monkeypatch, smollm2_dir, capsys):
    """``bin/rft-run --config opd_gsm8k.yaml --dry-run`` with local paths only: it passes and
    says that the teacher runs in the trainer."""
    monkeypatch.setenv("TRINITY_MODEL_PATH", str(smollm2_dir))  # the student and the teacher
    monkeypatch.setenv("TRINITY_TASKSET_PATH", str(ARITHMETIC))
    monkeypatch.setenv("TRINITY_CHECKPOINT_ROOT_DIR", str(tmp_path))
    code = run_main(["--config", str(EXAMPLES / "opd_gsm8k.yaml"), "--dry-run"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "dry run: config and inputs are valid" in out
    [line] = [x for x in out.splitlines() if "teacher" in x and "in the trainer" in x]
    assert "explorer.auxiliary_models[0].engine_num=1 differs from" in line


def name_type(name: str) -> str:
    return "jsd" if "jsd" in name else "on_policy_distill"


def test_dapo_example_loads_as_written(tmp_path, trinity_env):
    """The DAPO example: its experience operators typed (rft.trainer.experience_ops), the
    clip-higher PPO loss, the overlong reward, and use_base's plain-text prompt."""
    from rft.config.schema import DynamicSamplingArgs
    from rft.explorer import tasksets as T
    from rft.trainer.experience_ops import ExperiencePipeline

    raw = read_raw(EXAMPLES / "dapo_math.yaml", [f"checkpoint_root_dir={tmp_path}"])
    cfg = dry_run(raw, tmp_path)
    ts = cfg.buffer.explorer_input.taskset
    assert T.taskset_workflow(cfg, ts, "taskset", is_eval=False).base_prompt
    ops = cfg.data_processor.experience_pipeline.operators
    assert [op.name for op in ops] == ["mask_response_truncated", "dapo_dynamic_sampling"]
    assert ops[1].typed_args() == DynamicSamplingArgs(metric_key="accuracy", correct_threshold=0.0)
    assert (
        len(ExperiencePipeline.from_config(cfg.data_processor.experience_pipeline).operators) == 2
    )
    algo = cfg.algorithm
    assert (algo.advantage_fn, algo.policy_loss_fn, algo.kl_loss_fn) == ("grpo", "ppo", "none")
    assert algo.policy_loss_fn_args["clip_range_high"] == 0.28
    assert cfg.buffer.explorer_input.default_reward_fn_type == "math_dapo_reward"
