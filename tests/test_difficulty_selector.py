"""Trinity-RFT's ``difficulty_based`` selector (BOTS): the pass-rate beliefs, the draws, and
the pass rates explorer tasks share through the run directory.

The specification is Trinity-RFT's trinity/buffer/selector/selector.py
``DifficultyBasedSelector`` and difficulty_estimator.py ``InterpolationBetaPREstimator``
(yanxi-chen/Trinity-RFT at 9051d637); the expected values below are worked by hand from their
formulas. Fast: no model, tiny in-memory datasets.
"""

from __future__ import annotations

import datasets
import numpy as np
import pytest

from rft.config.load import config_from_dict
from rft.config.schema import DataSelectorConfig, DifficultyArgs, TasksetConfig
from rft.errors import ConfigError
from rft.explorer import cursor as C
from rft.explorer import difficulty as D
from rft.explorer import pass_rates
from rft.explorer.pass_rates import PassRateBoard, scores_of
from rft.explorer.tasksets import Taskset, TaskStream


@pytest.fixture(autouse=True)
def read_posts_at_once(monkeypatch):
    """The board reads an incomplete step's posts again at most every POLL_S; here at once."""
    monkeypatch.setattr(pass_rates, "POLL_S", 0.0)


FEATURES = np.array([[0.2, 0.6], [0.0, 1.0], [0.5, 0.5]])  # weaker, stronger reference


# ----------------------------------------------------------------------------- beliefs


def test_one_feedback_moves_the_beliefs_by_trinitys_formula():
    args = DifficultyArgs(m=4, lamb=0.5, rho=0.25)
    beliefs = D.update(D.PassRateBeliefs.initial(3, args), FEATURES, args, [0], [0.8])
    # capability: (0.8 - 0.2) / (0.6 - 0.2 + 1e-6); predictions 0.8 (observed), clip(1.5) = 1,
    # 0.5; alpha = 0.5 + 0.5 + 0.75 * s + 0.25 * p * 4 with s = 3.2, 0, 0; beta likewise with
    # f = 0.8, 0, 0 and 1 - p.
    assert beliefs.capability == pytest.approx(0.6 / 0.400001)
    np.testing.assert_allclose(beliefs.alphas, [4.2, 2.0, 1.5])
    np.testing.assert_allclose(beliefs.betas, [1.8, 1.0, 1.5])
    np.testing.assert_allclose(beliefs.mean(), [0.7, 2 / 3, 0.5])

    later = D.update(beliefs, FEATURES, args, [1], [0.0])
    # the new estimate (0 - 0) / (1 - 0) = 0 enters the running capability with weight 0.1
    assert later.capability == pytest.approx(0.9 * 0.6 / 0.400001)
    p0 = 0.2 + later.capability * 0.4  # row 0 is predicted from the capability now
    assert later.alphas[0] == pytest.approx(0.5 * 4.2 + 0.5 + 0.25 * p0 * 4)
    assert later.betas[1] == pytest.approx(0.5 * 1.0 + 0.5 + 0.75 * 4 + 0.25 * 4)


def test_adaptive_rho_halves_rho_when_the_prediction_misses():
    flat = np.array([[0.0, 0.0]])  # the prediction is 0 whatever the capability
    for adaptive, rho in ((False, 0.2), (True, 0.1)):
        args = DifficultyArgs(adaptive_rho=adaptive)
        got = D.update(D.PassRateBeliefs.initial(1, args), flat, args, [0], [1.0])
        assert got.rho == rho
        # alpha = 0.8 + 0.2 + (1 - rho) * 16 + rho * 1 * 16: the halved rho acts at once
        assert got.alphas[0] == pytest.approx(1.0 + 16)
        assert got.betas[0] == pytest.approx(1.0)


def test_draws_take_the_rows_nearest_the_target():
    args = DifficultyArgs(m=4, lamb=0.5, rho=0.25, target_reward=0.5, tau=0)
    beliefs = D.update(D.PassRateBeliefs.initial(3, args), FEATURES, args, [0], [0.8])
    # means 0.7, 0.667, 0.5: distances 0.2, 0.167, 0
    assert D.choose(beliefs, args, 42, 0, 2) == [2, 1]
    soft = DifficultyArgs(target_reward=0.5, tau=0.05)
    draws = [D.choose(beliefs, soft, 42, p, 2) for p in range(0, 400, 2)]
    assert all(len(set(d)) == 2 for d in draws)  # without replacement
    assert D.choose(beliefs, soft, 42, 8, 2) == draws[4]  # seeded by seed + position
    counts = np.bincount([r for d in draws for r in d], minlength=3)
    assert counts[2] == 200 and counts[1] > counts[0]  # softmax of -distance / tau
    sampled = DifficultyArgs(target_reward=0.5, tau=0, do_sample=True)
    picks = {tuple(D.choose(beliefs, sampled, 42, p, 1)) for p in range(50)}
    assert len(picks) > 1  # Beta samples, not the means, are scored


# ----------------------------------------------------------------------------- config


def test_config_takes_trinitys_kwargs_and_refuses_wrong_ones():
    bots = {"m": 16, "lamb": 0.1, "rho": 0.1, "target_reward": 0.5, "tau": 0, "do_sample": True}
    sel = DataSelectorConfig("difficulty_based", feature_keys=["weak", "strong"], kwargs=bots)
    assert sel.difficulty_args() == DifficultyArgs(16, 0.1, 0.1, 0.5, 0.0, True, False)
    assert DataSelectorConfig("difficulty_based", 1, ["a", "b"]).difficulty_args() == (
        DifficultyArgs()
    )
    with pytest.raises(ConfigError, match="exactly two feature_keys"):
        DataSelectorConfig("difficulty_based", feature_keys=["weak"])
    with pytest.raises(
        ConfigError, match="'data_selector.kwargs.tua'. Did you mean 'data_selector.kwargs.tau'"
    ):
        DataSelectorConfig("difficulty_based", feature_keys=["a", "b"], kwargs={"tua": 0})
    with pytest.raises(ConfigError, match="data_selector.kwargs.lamb: 2.0 is out of range"):
        DataSelectorConfig("difficulty_based", feature_keys=["a", "b"], kwargs={"lamb": 2})


# ----------------------------------------------------------------------------- streams


def taskset(rows: int, label: str = "taskset", **kwargs) -> Taskset:
    table = datasets.Dataset.from_list(
        [{"question": f"q{i}", "weak": 0.5, "strong": 0.5} for i in range(rows)]
    )
    selector = DataSelectorConfig("difficulty_based", 0, ["weak", "strong"], kwargs)
    config = TasksetConfig(path="/d", data_selector=selector)
    return Taskset(label, "t", config, table, None, None, None)  # type: ignore[arg-type]


def stream(tmp_path, interval: int = 1, rows: int = 4, **kwargs) -> TaskStream:
    board = PassRateBoard(tmp_path, "explorer", 2, interval)
    args = {"target_reward": 0.5, "tau": 0, **kwargs}
    return TaskStream([taskset(rows, **args)], 2, 3, None, board)


def post(tmp_path, step: int, rates: dict[int, float], interval: int = 1) -> None:
    """Two explorer tasks post slot 0 and slot 1 of ``step`` (rows in slot order)."""
    board = PassRateBoard(tmp_path, "explorer", 2, interval)
    for slot, (row, rate) in enumerate(rates.items()):
        board.post(f"explorer-{slot}", step, [slot], {(0, row): [rate, rate]})


def test_a_draw_follows_the_pass_rates_posted_before_it(tmp_path):
    one = stream(tmp_path / "a")
    cursor = one.new_cursor()
    assert [t.index for t in one.next_batch(cursor)] == [0, 1]  # all beliefs equal: first rows
    assert not one.ready(2)  # step 1's pass rates are not posted yet
    post(tmp_path / "a", 1, {0: 1.0})
    assert not one.ready(2)  # slot 1 is missing
    post(tmp_path / "a", 1, {0: 1.0, 1: 1.0})  # slot 0's first post stands
    assert one.ready(2)
    # rows 0 and 1 passed every time: their estimated pass rate left the target 0.5
    assert [t.index for t in one.next_batch(cursor)] == [2, 3]

    half = stream(tmp_path / "b")
    cursor = half.new_cursor()
    half.next_batch(cursor)
    post(tmp_path / "b", 1, {0: 0.5, 1: 0.5})
    assert [t.index for t in half.next_batch(cursor)] == [0, 1]  # at the target: kept


def test_feedback_comes_at_sync_points(tmp_path):
    two = stream(tmp_path, interval=2)
    cursor = two.new_cursor()
    two.next_batch(cursor)
    assert two.ready(2)  # step 2 follows nothing yet: the sync after step 2 feeds it
    assert [t.index for t in two.next_batch(cursor)] == [0, 1]
    post(tmp_path, 1, {0: 1.0, 1: 1.0}, interval=2)
    assert not two.ready(3)  # step 3 follows steps 1 and 2
    post(tmp_path, 2, {0: 1.0, 1: 1.0}, interval=2)
    assert [t.index for t in two.next_batch(cursor)] == [2, 3]


def test_every_task_and_a_restart_draw_the_same_rows(tmp_path):
    first = stream(tmp_path)
    cursor = first.new_cursor()
    batches = [first.next_batch(cursor)]
    post(tmp_path, 1, {0: 1.0, 1: 0.0})
    batches.append(first.next_batch(cursor))
    post(tmp_path, 2, {batches[1][0].index: 0.5, batches[1][1].index: 1.0})
    batches.append(first.next_batch(cursor))
    C.save_cursor(tmp_path, "explorer", 0, C.first_layout(1, first.new_cursor()), cursor)

    again = stream(tmp_path)  # a restarted task: fresh beliefs, replayed from the posts
    plan = C.resume(tmp_path, "explorer", 0, 1, again)
    assert plan.cursor.step == 3
    post(tmp_path, 3, {batches[2][0].index: 0.0, batches[2][1].index: 0.5})
    fourth = again.next_batch(plan.cursor)
    batches.append(first.next_batch(cursor))
    assert fourth == batches[3]
    other = stream(tmp_path)  # another task of the same explorer, from the start
    cursor = other.new_cursor()
    assert [other.next_batch(cursor) for _ in range(4)] == batches
    assert other.selectors[0].beliefs.alphas.tolist() == (
        again.selectors[0].beliefs.alphas.tolist()
    )
    assert len({tuple(t.index for t in b) for b in batches}) > 1  # the feedback moved the draws


def test_what_rft_refuses_around_it(tmp_path):
    selector = {"selector_type": "difficulty_based", "feature_keys": ["weak", "strong"]}
    two = {
        "model": {"model_path": "/m"},
        "buffer": {
            "explorer_input": {
                "tasksets": [{"path": "/a", "data_selector": selector}, {"path": "/b"}]
            }
        },
    }
    with pytest.raises(
        ConfigError, match=r"tasksets\[0\]\.data_selector: .*single training taskset.*has 2"
    ):
        config_from_dict(two)
    with pytest.raises(ConfigError, match="taskset.data_selector: difficulty_based draws 2.*has 1"):
        stream(tmp_path, rows=1)
    one = stream(tmp_path)
    C.save_cursor(tmp_path, "explorer", 0, C.first_layout(1, one.new_cursor()), one.new_cursor())
    with pytest.raises(ConfigError, match="ran 1 explorer tasks and this launch has 2"):
        C.resume(tmp_path, "explorer", 0, 2, one)


def test_scores_group_a_steps_rewards_by_row():
    class Exp:
        def __init__(self, task_id, reward):
            self.task_id, self.reward = task_id, reward

    ids = {"t/3": (0, 3), "t/5": (0, 5)}
    exps = [Exp("t/3", 1.0), Exp("t/3", 0.0), Exp("t/3", 1.0)]
    assert scores_of(ids, exps) == {(0, 3): [1.0, 0.0, 1.0], (0, 5): []}
