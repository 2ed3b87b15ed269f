"""Failures are never silent, on the real engines (``integration``): a workflow whose every
episode fails stops its explorer at the second step with the first error (each of four ways a
Trinity user gets a workflow slightly wrong), and ``rft-run`` exits non-zero with that error as
its last line; a flaky workflow (one run in four failing) trains to the end and says so."""

from __future__ import annotations

from pathlib import Path

import pytest

from rft.errors import EpisodesFailedError
from rft.monitor import EPISODE_ERRORS, EPISODE_FAILED, EPISODES, read_metrics
from rft.sync.failures import read_failures
from rft.workflow import registry
from tests.helpers.runs import agent_cfg, read_segments, rft_run, rft_status, write_jsonl

pytestmark = pytest.mark.integration

PLUGINS = Path(__file__).resolve().parent / "fixtures" / "plugins_broken"
QUESTIONS = [{"question": f"What is {i} + 1?", "answer": str(i + 1)} for i in range(4)]


def explorer_cfg(root: Path, model_dir: Path, workflow: str, **explorer):
    """Four steps of one task (2 runs each), the first-task check off (the explorer is tested)."""
    data = write_jsonl(root / "data" / "train.jsonl", QUESTIONS)
    return agent_cfg(
        root, model_dir, data, workflow, total_steps=4, first_task_check=False, **explorer
    )


@pytest.fixture(scope="module")
def engine(vllm_model_dir, tmp_path_factory):
    from rft.explorer.engine import Engine

    return Engine(explorer_cfg(tmp_path_factory.mktemp("engine"), vllm_model_dir, "x"))


@pytest.fixture
def plugins(monkeypatch):
    monkeypatch.setenv(registry.PLUGIN_DIRS_ENV, str(PLUGINS))


@pytest.mark.parametrize(
    "workflow, first_error, endpoint",
    [
        (
            "broken_missing_reward",
            "MissingReward on task agent/0: TypeError: 'NoneType' object is not callable",
            False,
        ),
        (
            "broken_openai_client",
            "ClientWithoutEndpoint on task agent/0: WorkflowError: this model handle has no "
            "OpenAI-compatible endpoint: set explorer.rollout_model.enable_openai_api: true",
            False,
        ),
        (
            "broken_no_reward",
            "NoReward on task agent/0: WorkflowError: NoReward returned an experience without "
            "a reward: set experience.reward before returning it",
            False,
        ),
        (
            "never_rewarded",
            "NeverRewarded on task agent/0: WorkflowError: NeverRewarded: the run never called "
            "update_reward()",
            True,
        ),
    ],
)
def test_a_workflow_whose_every_episode_fails_stops_the_explorer_at_its_second_step(
    engine, vllm_model_dir, tmp_path, plugins, workflow, first_error, endpoint
):
    from rft.explorer.loop import run_explorer

    cfg = explorer_cfg(
        tmp_path, vllm_model_dir, workflow, rollout_model={"enable_openai_api": endpoint}
    )
    with pytest.raises(EpisodesFailedError) as caught:
        run_explorer(cfg, engine)
    message = str(caught.value)
    assert message.startswith(
        "explorer explorer-0 stopped at step 2: every episode of 2 step(s) in a row failed "
        "(steps 1-2; explorer.max_failed_steps=2); first error: "
    ), message
    assert f"first error: {first_error}" in message
    [stop] = read_failures(cfg.run_dir)
    assert (stop.writer, stop.step) == ("explorer-0", 2) and first_error in stop.message
    # step 1 sealed with nothing in it (the trainer skips it); step 2 not sealed (regenerated
    # by a relaunch); both steps' failures in the metrics
    assert {seq: len(r) for seq, r in read_segments(cfg.run_dir)["explorer-0"].items()} == {1: 0}
    rows = read_metrics(cfg.run_dir, "explorer_explorer")
    assert [r["step"] for r in rows] == [1, 2]
    assert all(r[EPISODE_FAILED] == r[EPISODES] > 0 for r in rows)
    assert sum(rows[0][EPISODE_ERRORS].values()) == rows[0][EPISODE_FAILED]


def test_rft_run_ends_non_zero_with_the_first_error_last_and_a_relaunch_starts_clean(
    vllm_model_dir, tmp_path
):
    """mode both: the trainer skips step 1 (nothing to train on), the explorer stops at step 2,
    rft-run's last line names the workflow, the task, the error and the explorer's log."""
    done = rft_run(*run_args(vllm_model_dir, tmp_path, "broken_no_reward"))
    assert done.returncode == 1, done.stdout[-2000:] + done.stderr[-3000:]
    run_dir = tmp_path / "agent" / "smollm2-135m-calculator"
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith(
        "[rft] explorer explorer-0 stopped at step 2: every episode of 2 step(s)"
    )
    assert "first error: NoReward on task calculator/" in last
    assert "WorkflowError: NoReward returned an experience without a reward" in last
    assert last.endswith(f"; tracebacks in {run_dir / 'log' / 'explorer-0.log'}")
    assert "[rft] trainer step 1/3 skipped: no experiences to train on | episodes 4/4 failed: " in (
        done.stdout
    )
    assert "trainer step 2" not in done.stdout  # the trainer never trained on nothing
    status = rft_status(run_dir)
    assert "episodes: 8 of 8 failed (100.0%)" in status, status
    assert "stopped         explorer explorer-0 stopped at step 2: every episode" in status


def test_a_flaky_workflow_trains_to_the_end_and_shows_its_failures(vllm_model_dir, tmp_path):
    done = rft_run(*run_args(vllm_model_dir, tmp_path, "one_in_four_fails"))
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    lines = [line for line in done.stdout.splitlines() if line.startswith("[rft] trainer step")]
    assert len(lines) == 3 and all(
        line.endswith(": ValueError: no answer in the reply") and "| episodes 1/4 failed: " in line
        for line in lines
    ), lines
    run_dir = tmp_path / "agent" / "smollm2-135m-calculator"
    status = rft_status(run_dir)
    assert "episodes: 3 of 12 failed (25.0%)" in status, status
    assert "(3x): OneInFourFails: ValueError: no answer in the reply" in status


def run_args(model_dir: Path, root: Path, workflow: str) -> list[str]:
    return [
        "--config",
        "configs/agent_calculator_cpu.yaml",
        "--plugin-dir",
        str(PLUGINS),
        f"model.model_path={model_dir}",
        f"checkpoint_root_dir={root}",
        "buffer.total_steps=3",
        "buffer.batch_size=1",
        "algorithm.repeat_times=4",
        f"buffer.explorer_input.default_workflow_type={workflow}",
        "explorer.eval_on_startup=false",
        "explorer.eval_interval=0",
        "explorer.first_task_check=false",
        "model.max_response_tokens=4",
        "trainer.precision=fp32",
    ]


def test_the_streaming_explorer_stops_the_same_way(engine, vllm_model_dir, tmp_path, plugins):
    """explorer.partial_rollout: steps sealed as their groups complete meet the same rule."""
    from rft.explorer.loop import run_explorer

    cfg = explorer_cfg(tmp_path, vllm_model_dir, "broken_no_reward", partial_rollout=True)
    with pytest.raises(EpisodesFailedError, match="stopped at step 2: every episode of 2 step"):
        run_explorer(cfg, engine)
    assert [stop.step for stop in read_failures(cfg.run_dir)] == [2]
