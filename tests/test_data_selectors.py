"""Trinity-RFT's task selection (``taskset.data_selector``; ``task_selector`` its old name).

The specification is agentscope-ai/Trinity-RFT: trinity/common/config.py ``DataSelectorConfig``
(at 1d7fae4a63f5), trinity/buffer/selector/selector.py (as in pan-x-c/Trinity-RFT@35722db36c92)
and the orders its tests/buffer/task_scheduler_test.py expects (two tasksets of 5 and 7 rows,
seed 42). Fast: no model, tiny in-memory datasets.
"""

from __future__ import annotations

import datasets
import numpy as np
import pytest

from rft.config.load import config_from_dict
from rft.config.schema import DataSelectorConfig, TasksetConfig
from rft.errors import ConfigError, DataError
from rft.explorer import cursor as C
from rft.explorer import selectors as S
from rft.explorer.tasksets import Taskset, TaskStream, required_columns


def rows_of(selector: S.TaskSelector, count: int) -> list[int]:
    return [selector.row(p)[0] for p in range(count)]


def taskset(num_rows: int, label: str = "taskset", **selector) -> Taskset:
    table = datasets.Dataset.from_list(
        [{"question": f"q{i}", "answer": str(i), "level": (i * 7) % 5} for i in range(num_rows)]
    )
    config = TasksetConfig(path="/d", data_selector=DataSelectorConfig(**selector))
    return Taskset(label, "t", config, table, None, None, None)  # type: ignore[arg-type]


def stream(num_rows: int, batch_size: int, **selector) -> TaskStream:
    return TaskStream([taskset(num_rows, **selector)], batch_size, 3, None)


# ----------------------------------------------------------------------------- orders


def test_sequential_reads_rows_in_order_every_epoch():
    # selector.py SequentialSelector.get_indices: range(current_index % size, ...) wrapping.
    assert rows_of(S.TaskSelector("sequential", 42, 5), 12) == [0, 1, 2, 3, 4] * 2 + [0, 1]


def test_shuffle_matches_trinitys_expected_orders():
    # selector.py ShuffleSelector._get_orders: default_rng(seed + current_index // size)
    # .permutation(size); task_scheduler_test.py's shuffle case (seed 42) reads subset_1 (5 rows)
    # as 4,2,3,1,0 | 4,1,2,0,3 and subset_2 (7 rows) as 3,2,6,4,1,5,0 | 2,6,5,1,4,0,3.
    assert rows_of(S.TaskSelector("shuffle", 42, 5), 10) == [4, 2, 3, 1, 0, 4, 1, 2, 0, 3]
    assert rows_of(S.TaskSelector("shuffle", 42, 7), 14) == [3, 2, 6, 4, 1, 5, 0] + [
        2,
        6,
        5,
        1,
        4,
        0,
        3,
    ]
    epochs = [S.TaskSelector("shuffle", 7, 10).row(p) for p in range(20)]
    assert [e for _, e in epochs] == [0] * 10 + [1] * 10
    assert rows_of(S.TaskSelector("shuffle", 7, 10), 10) != rows_of(
        S.TaskSelector("shuffle", 8, 10), 10
    )


def test_random_draws_a_step_without_replacement_seeded_by_position():
    # selector.py RandomSelector.get_indices: default_rng(seed + current_index)
    # .choice(size, batch_size, replace=False), current_index += batch_size. One taskset: each
    # step asks for buffer.batch_size rows.
    one = stream(7, 2, selector_type="random")
    cursor = one.new_cursor()
    steps = [[t.index for t in one.next_batch(cursor)] for _ in range(3)]
    assert steps == [[0, 5], [4, 0], [6, 3]]  # default_rng(42 | 44 | 46).choice(7, 2, False)
    for start in (0, 2, 4):
        want = np.random.default_rng(42 + start).choice(7, 2, replace=False).tolist()
        assert steps[start // 2] == want
    # task_scheduler_test.py's random case: subset_1's first two reads take one row each, 0 then 2
    assert rows_of(S.TaskSelector("random", 42, 5, draw_size=1), 2) == [0, 2]
    with pytest.raises(ConfigError, match="random draws 8 distinct rows"):
        stream(5, 8, selector_type="random")


def test_offline_easy2hard_sorts_by_features_highest_first():
    # selector.py OfflineEasy2HardSelector: sorted([*features, index])[::-1], read in order and
    # wrapped each epoch; ties go to the higher row index.
    one = S.TaskSelector("offline_easy2hard", 0, 4, features=[(0.5,), (0.9,), (0.1,), (0.9,)])
    assert rows_of(one, 8) == [3, 1, 0, 2] * 2
    two = S.TaskSelector("offline_easy2hard", 0, 3, features=[(1, 0.2), (1, 0.7), (2, 0.0)])
    assert rows_of(two, 3) == [2, 1, 0]
    levels = stream(5, 5, selector_type="offline_easy2hard", feature_keys=["level"])
    batch = levels.next_batch(levels.new_cursor())  # level (i*7)%5: 0, 2, 4, 1, 3
    assert [t.index for t in batch] == [2, 4, 1, 3, 0]


def test_feature_columns_are_required_numbers():
    ts = TasksetConfig(path="/d", data_selector=DataSelectorConfig("offline_easy2hard", 0, ["lvl"]))
    assert (
        required_columns(ts, None, "buffer.explorer_input.taskset")[
            "buffer.explorer_input.taskset.data_selector.feature_keys[0]"
        ]
        == "lvl"
    )
    with pytest.raises(DataError, match="column 'question' must hold numbers"):
        stream(3, 1, selector_type="offline_easy2hard", feature_keys=["question"])


# ----------------------------------------------------------------------------- resume


@pytest.mark.parametrize(
    "selector",
    [
        {"selector_type": "shuffle", "seed": 3},
        {"selector_type": "random", "seed": 5},
        {"selector_type": "offline_easy2hard", "feature_keys": ["level"]},
    ],
    ids=lambda s: s["selector_type"],
)
def test_order_survives_a_restart(tmp_path, selector):
    whole = stream(5, 3, **selector)
    cursor = whole.new_cursor()
    expected = [whole.next_batch(cursor) for _ in range(4)]  # crosses epochs

    first = stream(5, 3, **selector)
    plan = C.resume(tmp_path, "explorer", 0, 1, first)
    got = [first.next_batch(plan.cursor) for _ in range(2)]
    C.save_cursor(tmp_path, "explorer", 0, plan.layout, plan.cursor)  # explorer_meta.json

    again = stream(5, 3, **selector)  # a restarted process: new selectors, cold caches
    plan = C.resume(tmp_path, "explorer", 0, 1, again)
    assert plan.cursor.step == 2
    got += [again.next_batch(plan.cursor) for _ in range(2)]
    assert got == expected


# ----------------------------------------------------------------------------- config


def test_trinity_config_with_data_selector_loads():
    cfg = config_from_dict(
        {
            "model": {"model_path": "/models/m"},
            "algorithm": {"algorithm_type": "grpo", "repeat_times": 4},
            "cluster": {"node_num": 1, "gpu_per_node": 2},
            "buffer": {
                "batch_size": 2,
                "explorer_input": {
                    "taskset": {
                        "path": "/data/t",
                        "data_selector": {"selector_type": "shuffle", "seed": 7},
                    }
                },
            },
        }
    )
    ts = cfg.buffer.explorer_input.taskset
    assert ts.data_selector == DataSelectorConfig("shuffle", 7, [], {})
    assert ts.task_selector is None


def test_defaults_and_the_deprecated_name():
    # config.py DataSelectorConfig: selector_type "sequential", seed 42, feature_keys [], kwargs {}
    assert TasksetConfig().data_selector == DataSelectorConfig("sequential", 42, [], {})
    old = TasksetConfig(task_selector=DataSelectorConfig("random", 3))
    assert old.data_selector == DataSelectorConfig("random", 3) and old.task_selector is None
    with pytest.raises(ConfigError, match="both set; keep data_selector only"):
        TasksetConfig(
            data_selector=DataSelectorConfig("shuffle"), task_selector=DataSelectorConfig()
        )


def test_selector_config_errors():
    with pytest.raises(ConfigError) as bad:
        config_from_dict(
            {
                "model": {"model_path": "/m"},
                "buffer": {
                    "explorer_input": {
                        "taskset": {"path": "/d", "data_selector": {"selector_type": "shufle"}}
                    }
                },
            }
        )
    for name in ("sequential", "shuffle", "random", "offline_easy2hard", "difficulty_based"):
        assert repr(name) in str(bad.value)
    assert "data_selector.selector_type" in str(bad.value)
    with pytest.raises(ConfigError, match="shuffle reads no features"):
        DataSelectorConfig("shuffle", feature_keys=["level"])
    with pytest.raises(ConfigError, match="name at least one numeric column"):
        DataSelectorConfig("offline_easy2hard")
    with pytest.raises(ConfigError, match="kwargs: random takes none"):
        DataSelectorConfig("random", kwargs={"tau": 1.0})
