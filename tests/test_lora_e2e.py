"""LoRA end to end (``configs/cpu/lora_gsm8k.yaml``, the CPU twin of ``configs/lora_gsm8k.yaml``):
the trainer publishes adapter folders, the explorer's vLLM switches to each without reloading
the base. Through ``rft-run`` (``integration``) and the local SLURM cluster (``slurm``: the
heterogeneous job, requeued mid-run, resumes from the adapter checkpoint and finishes every
step once)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from rft.models import is_adapter_folder
from rft.monitor import read_metrics
from tests.helpers.runs import rft_run
from tests.helpers.slurm_jobs import run_requeued, trainer_steps

REPO = Path(__file__).resolve().parent.parent
CONFIG = REPO / "configs" / "cpu" / "lora_gsm8k.yaml"
RUN = ("lora_gsm8k_cpu", "smollm2-135m-lora16")


def lora_overrides(model: Path, root: Path, *extra: str) -> list[str]:
    return [
        f"model.model_path={model}",
        f"checkpoint_root_dir={root}",
        "model.max_response_tokens=8",
        "explorer.eval_interval=0",
        "trainer.precision=fp32",
        "trainer.zero_stage=2",
        *extra,
    ]


def check_adapters_reached_the_explorer(run_dir: Path, last: int) -> None:
    """Every published version is an adapter folder, and the explorer generated with them."""
    versions = sorted(p for p in (run_dir / "weights").iterdir() if p.name.startswith("v"))
    assert versions and all(
        is_adapter_folder(v) and not (v / "model.safetensors").exists() for v in versions
    )
    explorer = read_metrics(run_dir, "explorer_explorer")
    assert max(row["weights_version"] for row in explorer) == last - 1  # sync_interval 1, offset 0
    assert is_adapter_folder(run_dir / f"global_step_{last}" / "actor" / "huggingface")


@pytest.mark.integration
@pytest.mark.parametrize("sync_method", ["checkpoint", "nccl"])
def test_a_lora_run_syncs_adapters_only(vllm_model_dir, tmp_path, sync_method):
    """By folder (every version an adapter folder) and by broadcast (the adapter's tensors,
    written to a local folder by the explorer; folders only at the last step)."""
    proc = rft_run(
        "--config",
        str(CONFIG),
        *lora_overrides(
            vllm_model_dir,
            tmp_path,
            "buffer.total_steps=3",
            f"synchronizer.sync_method={sync_method}",
        ),
    )
    run_dir = tmp_path.joinpath(*RUN)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = {row["step"]: row for row in read_metrics(run_dir, "trainer")}
    assert sorted(rows) == [1, 2, 3]
    assert rows[1]["kl_loss"] == pytest.approx(0.0, abs=1e-9)  # step 1: the base, adapter B = 0
    check_adapters_reached_the_explorer(run_dir, 3)
    explorer_log = (run_dir / "log" / "explorer-0.log").read_text()
    if sync_method == "nccl":
        assert [rows[s]["sync/broadcast_ok"] for s in (1, 2)] == [1.0, 1.0], rows
        assert "received adapter version 2 by broadcast" in explorer_log
        folders = re.findall(r"by broadcast in \S+ into (\S+)", explorer_log)
        assert folders and not any(Path(f).exists() for f in folders)  # none left in /tmp
    else:
        assert "reloaded adapter from" in explorer_log


@pytest.mark.slurm
def test_a_lora_run_resumes_after_a_requeue(slurm_cluster, vllm_model_dir, tmp_path):
    out = tmp_path / "job.out"
    overrides = lora_overrides(
        vllm_model_dir, tmp_path, "buffer.total_steps=4", "trainer.save_interval=1"
    )
    run_dir = tmp_path.joinpath(*RUN)
    run_requeued(slurm_cluster, CONFIG, overrides, run_dir, out)
    steps = trainer_steps(run_dir)
    assert steps[-1] == 4 and set(steps) == {1, 2, 3, 4}, steps
    log = out.read_text() + "".join(
        p.read_text(errors="replace") for p in (run_dir / "log").glob("*")
    )
    assert "resumed from global_step_" in log
    meta = json.loads((run_dir / "trainer_meta.json").read_text())
    assert meta["step"] == 4
    check_adapters_reached_the_explorer(run_dir, 4)
