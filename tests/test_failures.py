"""Failures are never silent (fast tier): the explorer's stop rule, the stop records readers
end on, the one-line errors of failed episodes, and the console lines that show them."""

from __future__ import annotations

import json

import pytest

from rft.errors import EpisodesFailedError
from rft.explorer.episodes import EpisodeJob, EpisodeResult, episode_metrics
from rft.explorer.failures import FailureGuard
from rft.lease import Lease
from rft.monitor import (
    EPISODE_ERRORS,
    EPISODE_FAILED,
    EPISODE_FIRST_ERROR,
    EPISODES,
    failed_episodes,
    format_metrics,
    metrics_path,
)
from rft.sync.failures import ExplorerFailure, clear_failure, read_failures, record_failure
from rft.workflow.task import Task


class Scripted:
    """A workflow class name for the results below."""


def result(task_id: str, error: str | None = None, timed_out: bool = False) -> EpisodeResult:
    out = EpisodeResult(EpisodeJob(0, Task(workflow=Scripted, task_id=task_id), 1))
    out.error, out.timed_out = error, timed_out
    return out


# ----------------------------------------------------------------------------- the stop rule


def test_steps_in_a_row_whose_every_episode_failed_stop_the_explorer_with_the_first_error():
    guard = FailureGuard(max_failed_steps=2, max_failed_share=1.0, window_steps=4)
    assert guard.observe(1, 4, 4, "W on task t/0: KeyError: 'a'") is None
    reason = guard.observe(2, 4, 4, "W on task t/3: KeyError: 'b'")
    assert reason is not None
    assert "2 step(s) in a row" in reason and "steps 1-2" in reason
    assert "explorer.max_failed_steps=2" in reason
    assert reason.endswith("first error: W on task t/0: KeyError: 'a'")  # the streak's first


def test_one_good_episode_breaks_the_streak_and_steps_without_episodes_do_not_count():
    guard = FailureGuard(max_failed_steps=2, max_failed_share=1.0, window_steps=4)
    assert guard.observe(1, 4, 4, "e1") is None
    assert guard.observe(2, 4, 3, "e2") is None  # one run ended well
    assert guard.observe(3, 0, 0, None) is None  # single-turn recipes only: not counted
    assert guard.observe(4, 4, 4, "e4") is None
    assert "first error: e4" in guard.observe(5, 2, 2, "e5")


def test_zero_turns_the_streak_check_off():
    guard = FailureGuard(max_failed_steps=0, max_failed_share=1.0, window_steps=2)
    assert all(guard.observe(s, 4, 4, "e") is None for s in range(1, 20))


def test_the_failure_share_over_the_window_is_judged_once_the_window_is_full():
    guard = FailureGuard(max_failed_steps=0, max_failed_share=0.5, window_steps=3)
    assert guard.observe(1, 4, 3, "first") is None  # 75%, but one step only
    assert guard.observe(2, 4, 2, "second") is None
    reason = guard.observe(3, 4, 2, "third")  # 7 of 12 = 58% > 50%
    assert reason is not None and reason.startswith("7 of 12 episodes of the last 3 steps failed")
    assert "explorer.max_failed_share=0.5" in reason and reason.endswith("first error: first")


def test_a_flaky_workflow_one_in_four_runs_failing_never_stops_the_explorer():
    guard = FailureGuard(max_failed_steps=2, max_failed_share=0.5, window_steps=4)
    assert all(guard.observe(s, 8, 2, "flaky") is None for s in range(1, 50))


def test_the_share_window_slides():
    guard = FailureGuard(max_failed_steps=0, max_failed_share=0.5, window_steps=2)
    assert guard.observe(1, 4, 4, "old") is None  # not full yet
    assert guard.observe(2, 4, 0, None) is None  # 4 of 8: not above 0.5
    assert guard.observe(3, 4, 0, None) is None  # step 1 left the window: 0 of 8
    assert guard.observe(4, 4, 4, "new") is None  # 4 of 8 again
    assert guard.observe(5, 4, 4, "x").endswith("first error: new")  # 8 of 8


# ----------------------------------------------------------------------------- failed episodes


def test_a_failed_run_in_one_line_names_the_workflow_the_task_and_the_error():
    failed = result("train/7", "ValueError: no answer\nTraceback (most recent call last): ...")
    assert failed.error_line == "Scripted: ValueError: no answer"
    assert failed.failure == "Scripted on task train/7: ValueError: no answer"
    assert result("train/1").failure is None
    long = result("train/2", "RuntimeError: " + "x" * 1000)
    assert len(long.error_line) <= len("Scripted: ") + 300 and long.error_line.endswith("...")
    assert "max_timeout" in result("train/3", timed_out=True).failure


def test_step_metrics_carry_the_first_error_and_each_errors_count():
    results = [
        result("train/0"),
        result("train/1", "KeyError: 'answer'"),
        result("train/2", "KeyError: 'answer'"),
        result("train/3", "TypeError: bad"),
    ]
    metrics = episode_metrics(results)
    assert metrics[EPISODES] == 4 and metrics[EPISODE_FAILED] == 3
    assert metrics[EPISODE_FIRST_ERROR] == "Scripted on task train/1: KeyError: 'answer'"
    assert metrics[EPISODE_ERRORS] == {
        "Scripted: KeyError: 'answer'": 2,
        "Scripted: TypeError: bad": 1,
    }
    json.dumps(metrics)  # a metrics.jsonl line
    assert EPISODE_FIRST_ERROR not in episode_metrics([result("train/0")])


def test_the_console_says_which_episodes_failed_and_leaves_dicts_to_the_jsonl():
    row = {EPISODES: 16, EPISODE_FAILED: 3, EPISODE_FIRST_ERROR: "W on task t/1: E: x"}
    assert failed_episodes(row) == "episodes 3/16 failed: W on task t/1: E: x"
    assert failed_episodes({EPISODES: 16, EPISODE_FAILED: 0}) is None
    assert format_metrics({"a": 1.5, EPISODE_ERRORS: {"E": 3}}) == "a=1.5"


def test_rft_runs_line_shows_a_skipped_trainer_step_and_the_explorers_failures(tmp_path, capsys):
    from rft.launch.local import ProgressPrinter

    def write(role: str, rows: list[dict]) -> None:
        path = metrics_path(tmp_path, role)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))

    write(
        "explorer_e",
        [
            {"step": 1, EPISODES: 4, EPISODE_FAILED: 4, EPISODE_FIRST_ERROR: "W on task t/0: E: x"},
            {"step": 2, EPISODES: 4, EPISODE_FAILED: 1, EPISODE_FIRST_ERROR: "W on task t/5: E: y"},
        ],
    )
    printer = ProgressPrinter(tmp_path, "trainer", "explorer_e", 2)
    write("trainer", [{"step": 1, "skipped_no_experiences": 1}, {"step": 2, "pg_loss": 0.5}])
    printer.poll()
    first, second = capsys.readouterr().out.strip().splitlines()
    assert first == (
        "[rft] trainer step 1/2 skipped: no experiences to train on "
        "| episodes 4/4 failed: W on task t/0: E: x"
    )
    assert second.startswith("[rft] trainer step 2/2 pg_loss=0.5")
    assert second.endswith("| episodes 1/4 failed: W on task t/5: E: y")


# ----------------------------------------------------------------------------- stop records


def test_a_stop_record_holds_until_a_new_instance_of_its_writer_claims_the_lease(tmp_path):
    lease = Lease.acquire(tmp_path, "explorer-0", 1.0, 30.0)
    record_failure(
        tmp_path, ExplorerFailure("explorer-0", 2, "explorer explorer-0 stopped", lease.gen)
    )
    [stop] = read_failures(tmp_path)
    assert (stop.writer, stop.step, stop.message) == (
        "explorer-0",
        2,
        "explorer explorer-0 stopped",
    )
    assert read_failures(tmp_path, ["explorer-1"]) == []
    lease.release()
    again = Lease.acquire(tmp_path, "explorer-0", 1.0, 30.0)  # relaunched: the stop is past
    assert read_failures(tmp_path) == []
    clear_failure(tmp_path, "explorer-0")
    assert not (tmp_path / "failures" / "explorer-0.json").exists()
    again.release()


def test_a_damaged_stop_record_is_still_a_stop(tmp_path):
    folder = tmp_path / "failures"
    folder.mkdir()
    (folder / "explorer-0.json").write_text('{"writer": "explorer-0", "st')
    [stop] = read_failures(tmp_path)
    assert stop.writer == "explorer-0" and "stopped on failures" in stop.message


def test_a_trainer_waiting_for_a_stopped_explorers_step_ends_with_its_error(tmp_path):
    """mode both: the segments of a stopped explorer never come; the trainer says why at once
    instead of waiting out synchronizer.sync_timeout."""
    from rft.config.load import config_from_dict
    from rft.trainer.inputs import BufferSource

    cfg = config_from_dict(
        {
            "mode": "both",
            "checkpoint_root_dir": str(tmp_path),
            "model": {"model_path": str(tmp_path / "model")},
            "buffer": {"batch_size": 2, "explorer_input": {"taskset": {"path": "unused"}}},
            "synchronizer": {"sync_timeout": 3600},
        }
    )
    lease = Lease.acquire(cfg.run_dir, "explorer-0", 1.0, 30.0)
    message = "explorer explorer-0 stopped at step 1: every episode failed; first error: W: E"
    record_failure(cfg.run_dir, ExplorerFailure("explorer-0", 1, message, lease.gen))
    source = BufferSource(cfg, cfg.run_dir, None)
    with pytest.raises(EpisodesFailedError, match="the trainer stops before step 1: explorer"):
        source.next_batch(1, 0)
    lease.release()
