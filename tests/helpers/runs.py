"""Running rft as a user does, and reading back what a run wrote (for integration tests):
``bin/rft-run`` and ``bin/rft-status`` as subprocesses, an explorer config of one workflow
class, a JSONL taskset, the buffer's sealed segments by writer, a model folder no engine loads."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from rft.buffer.experience import Experience

REPO = Path(__file__).resolve().parent.parent.parent
DATA = REPO / "data" / "arithmetic"  # the arithmetic tasks the CPU configs train on


def rft_run(
    *args: str, timeout: int = 900, trainer_ranks: int = 1, **popen
) -> subprocess.CompletedProcess:
    """``bin/rft-run ARGS`` from the repository root, one trainer rank (``trainer_ranks``: as
    many DeepSpeed ranks on gloo), output captured."""
    env = dict(os.environ, OMP_NUM_THREADS="1", RFT_LOCAL_TRAINER_RANKS=str(trainer_ranks))
    return subprocess.run(
        [sys.executable, str(REPO / "bin" / "rft-run"), *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        **popen,
    )


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def read_segments(run_dir: Path) -> dict[str, dict[int, list[Experience]]]:
    """writer -> seq -> the records of each sealed segment of the run's buffer."""
    out: dict[str, dict[int, list[Experience]]] = {}
    for seg in sorted((run_dir / "buffer").glob("*/seg-*.jsonl")):
        lines = seg.read_text().splitlines()
        header = json.loads(lines[0])
        records = [Experience.from_dict(json.loads(line)) for line in lines[1:]]
        out.setdefault(header["writer"], {})[header["seq"]] = records
    return out


def rft_status(run_dir: Path) -> str:
    """What ``bin/rft-status RUN_DIR`` prints (it must succeed)."""
    done = subprocess.run(
        [sys.executable, str(REPO / "bin" / "rft-status"), str(run_dir)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def agent_cfg(
    root: Path,
    model_dir: Path,
    data: Path,
    workflow: str,
    batch_size: int = 1,
    total_steps: int = 1,
    **explorer,
):
    """mode explore on CPU: ``workflow`` (a workflow class) on the ``question``/``answer`` rows
    of ``data``, 2 runs per task, no evaluation; ``explorer``: more explorer keys
    (``workflow_args`` goes to the taskset, ``rollout_model`` keys join float32)."""
    from rft.config.load import config_from_dict

    return config_from_dict(
        {
            "project": "p",
            "name": workflow,
            "checkpoint_root_dir": str(root),
            "mode": "explore",
            "algorithm": {"repeat_times": 2},
            "model": {"model_path": str(model_dir), "max_response_tokens": 5, "max_model_len": 256},
            "cluster": {"gpu_per_node": 0},
            "buffer": {
                "batch_size": batch_size,
                "total_steps": total_steps,
                "explorer_input": {
                    "taskset": {
                        "name": "agent",
                        "path": str(data),
                        "split": "train",
                        "format": {"prompt_key": "question", "response_key": "answer"},
                        "default_workflow_type": workflow,
                        "workflow_args": explorer.pop("workflow_args", {}),
                    }
                },
            },
            "explorer": {
                "eval_on_startup": False,
                "eval_interval": 0,
                "heartbeat_interval_s": 1,
                **explorer,
                "rollout_model": {"dtype": "float32", **explorer.get("rollout_model", {})},
            },
            "monitor": {"monitor_type": "console"},
        }
    )


def broken_model(model_dir: Path, root: Path) -> Path:
    """A model folder the dry run accepts (a config, complete weights) that no engine loads: its
    config asks for a wider MLP than its weights hold."""
    broken = root / "broken-model"
    shutil.copytree(model_dir, broken)
    config = json.loads((broken / "config.json").read_text())
    config["intermediate_size"] *= 2
    (broken / "config.json").write_text(json.dumps(config))
    return broken
