"""``rft-status`` sums each explorer's failed workflow runs (``episodes/*`` in its metrics.jsonl)
into one ``episodes:`` line with the most frequent error: hand-built rows, no engine."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from rft.monitor import (
    EPISODE_ERRORS,
    EPISODE_FAILED,
    EPISODE_FIRST_ERROR,
    EPISODE_TIMEOUTS,
    EPISODES,
    metrics_path,
)
from rft.rundir import explorer_role
from rft.status import EpisodeTotals, collect, episode_totals, format_episodes, format_status

NO_ANSWER = "MathWorkflow: ValueError: no answer in reply"
TIMEOUT = "MathWorkflow: ran past explorer.max_timeout"


def step(n: int, count: int, failed: int = 0, timeouts: int = 0, errors=None) -> dict:
    """An explorer metrics row of a step that ran workflow classes."""
    row = {"step": n, EPISODES: count, EPISODE_FAILED: failed, EPISODE_TIMEOUTS: timeouts}
    if errors:
        row[EPISODE_FIRST_ERROR] = f"{next(iter(errors))} on task train/{n}"
        row[EPISODE_ERRORS] = errors
    return row


def write_rows(run_dir: Path, role: str, rows: list[dict]) -> None:
    path = metrics_path(run_dir, role)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_rows_without_episode_keys_give_no_totals():
    assert episode_totals([]) is None
    assert episode_totals([{"step": 1, "reward/mean": 0.5}, {"step": 2}]) is None


def test_totals_sum_counts_and_errors_over_the_steps():
    rows = [
        {"step": 1, "reward/mean": 0.5},  # a single-turn step: no episode keys
        step(2, 16),
        step(3, 16, failed=5, timeouts=1, errors={NO_ANSWER: 5, TIMEOUT: 1}),
        step(4, 16, failed=4, errors={NO_ANSWER: 3, "MathWorkflow: KeyError: 'answer'": 1}),
        step(5, 16, failed=3, timeouts=1),  # written before episodes/errors existed
    ]
    totals = episode_totals(rows)
    assert totals == EpisodeTotals(
        episodes=64,
        failed=12,
        timeouts=2,
        errors=Counter({NO_ANSWER: 8, TIMEOUT: 1, "MathWorkflow: KeyError: 'answer'": 1}),
    )
    assert format_episodes(totals) == (
        f"episodes: 12 of 64 failed (18.8%), 2 timed out; most frequent error (8x): {NO_ANSWER}"
    )


def test_odd_values_count_as_nothing():
    rows = [
        step(1, 8, failed=2, errors={NO_ANSWER: 2, "junk": "x", "nan": float("nan")}),
        {"step": 2, EPISODES: float("nan"), EPISODE_FAILED: "2", EPISODE_ERRORS: ["not a dict"]},
    ]
    assert episode_totals(rows) == EpisodeTotals(8, 2, 0, Counter({NO_ANSWER: 2}))


def test_a_clean_run_says_none_failed():
    assert format_episodes(episode_totals([step(1, 16), step(2, 16)])) == (
        "episodes: 0 of 32 failed (0.0%)"
    )
    assert format_episodes(EpisodeTotals()) == "episodes: 0 of 0 failed"


def test_rft_status_prints_one_episodes_line_per_explorer_role(tmp_path):
    write_rows(
        tmp_path,
        explorer_role("explorer"),
        [
            step(1, 16, failed=2, errors={NO_ANSWER: 2}),
            step(2, 16, timeouts=1, errors={TIMEOUT: 1}),
        ],
    )
    write_rows(tmp_path, explorer_role("explorer", 1), [step(1, 8)])
    write_rows(tmp_path, explorer_role("other"), [{"step": 3, "reward/mean": 1.0}])
    st = collect(tmp_path, 60)
    assert set(st.episodes) == {"explorer_explorer", "explorer_explorer-1"}
    lines = format_status(st).splitlines()
    assert [line for line in lines if "episodes:" in line] == [
        "explorer_explorer episodes: 2 of 32 failed (6.2%), 1 timed out; "
        f"most frequent error (2x): {NO_ANSWER}",
        "explorer_explorer-1 episodes: 0 of 8 failed (0.0%)",
    ]
    # each under its explorer's step line; an explorer without workflow classes has none
    assert lines.index("explorer_explorer-1 explored step 1") + 1 == lines.index(
        "explorer_explorer-1 episodes: 0 of 8 failed (0.0%)"
    )
    assert "explorer_other  explored step 3" in lines
