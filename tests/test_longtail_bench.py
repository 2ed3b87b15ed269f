"""benchmarks/make_longtail.py (the long-tail taskset of benchmarks/async_bench.py) and the
bench's reading of per-sample lengths from a run's buffer; the length spread itself is measured
with the real engine by ``make_longtail.py --check`` (docs/performance.md)."""

from __future__ import annotations

import json

from benchmarks import make_longtail as lt
from benchmarks.async_bench import group_lengths, step_records
from rft.buffer.experience import Experience
from rft.buffer.segments import SegmentWriter
from rft.config.load import load_config
from rft.data import load_split
from rft.workflow.rewards import extract_ground_truth


def test_the_seed_fixes_the_rows_and_one_task_in_eight_is_long():
    train, test = lt.generate(seed=5, train=400, test=48)
    assert (train, test) == lt.generate(5, 400, 48)
    assert train != lt.generate(6, 400, 48)[0]
    for rows in (train, test):
        longs = [r for r in rows if r["question"].startswith(("Count", "Write"))]
        assert len(longs) == round(lt.LONG_SHARE * len(rows))  # 50 of 400, 6 of 48
        for r in rows:
            truth = int(extract_ground_truth(r["answer"]))
            numbers = [
                int(w.strip("?,.")) for w in r["question"].split() if w.strip("?,.").isdigit()
            ]
            assert truth == (numbers[-1] if r in longs else sum(numbers))


def test_the_bench_overrides_load_the_written_taskset(tmp_path):
    lt.write(tmp_path, lt.SEED, 16, 8)
    first = (tmp_path / lt.SUBSET / "train.jsonl").read_bytes()
    lt.write(tmp_path, lt.SEED, 16, 8)
    assert (tmp_path / lt.SUBSET / "train.jsonl").read_bytes() == first  # same seed, same bytes
    cfg = load_config("configs/quickstart_cpu.yaml", lt.overrides(tmp_path))
    ts = cfg.buffer.explorer_input.taskset
    assert ts.format.system_prompt == lt.SYSTEM_PROMPT
    assert cfg.model.max_response_tokens == lt.MAX_RESPONSE_TOKENS
    rows = load_split(str(tmp_path), "train", lt.SUBSET, lt.SUBSET, {"prompt_key": "question"})
    assert len(rows) == 16


def test_length_summary_is_nearest_rank():
    summary = lt.length_summary([10] * 8 + [200, 256], limit=256)
    assert summary == {"samples": 10, "median": 10, "p90": 200, "max": 256, "at_limit": 0.1}


def test_the_bench_replays_each_steps_group_lengths_from_the_buffer(tmp_path):
    writer = SegmentWriter(tmp_path, "explorer-0")

    def exp(group: str, n: int, **kw) -> Experience:
        return Experience(
            task_id=group,
            group_id=group,
            prompt_ids=[1],
            response_ids=[2] * n,
            logprobs=[-1.0] * n,
            **kw,
        )

    writer.write([exp("a", 3), exp("a", 5), exp("b", 7), exp("b", 7)], seq=1)
    writer.write([exp("c", 1), exp("e", 9, eval=True)], seq=2)
    lengths = group_lengths(tmp_path / "explorer-0")
    assert lengths == {"1": [[3, 5], [7, 7]], "2": [[1]]}
    assert group_lengths(tmp_path / "explorer-0", known={"1": []}) == {"2": [[1]]}
    run = {
        "explorer": [
            {
                "step": 1,
                "generated_tokens": 22,
                "response_length/max": 7,
                "step_time_s": 2.0,
                "wait_time_s": 0.0,
                "reload_time_s": 0.0,
            }
        ],
        "trainer": [
            {
                "step": 1,
                "batch_tokens": 26,
                "time/step_s": 3.0,
                "time/read_s": 1.0,
                "time/publish_s": 0.5,
            }
        ],
        "group_lengths": json.loads(json.dumps(lengths)),  # as the results file keeps them
    }
    (record,) = step_records(run)
    assert record.group_lengths == ((3, 5), (7, 7)) and record.train_s == 1.5


def test_the_slow_environment_is_seeded_and_one_episode_in_eight_is_slow(monkeypatch):
    """benchmarks/plugins/slow_env.py (async_bench.py --taskset slow-env): the bench's overrides
    name the workflow the plugin dir registers, and every mode waits the same."""
    import sys

    from benchmarks.async_bench import PLUGINS, SLOW_ENV_OVERRIDES
    from rft.explorer.tasksets import taskset_workflow
    from rft.workflow import registry

    monkeypatch.setenv(registry.PLUGIN_DIRS_ENV, str(PLUGINS))
    cfg = load_config("configs/quickstart_cpu.yaml", SLOW_ENV_OVERRIDES)
    choice = taskset_workflow(cfg, cfg.buffer.explorer_input.taskset, "taskset", is_eval=False)
    assert choice.cls.__name__ == "SlowEnvWorkflow"
    env = sys.modules[choice.cls.__module__]
    runs = [(f"arithmetic/{i}", run) for i in range(400) for run in range(4)]
    draws = [env.environment_seconds(task, run) for task, run in runs]
    assert draws == [env.environment_seconds(task, run) for task, run in runs]
    assert set(draws) == {env.FAST_S, env.SLOW_S}
    assert abs(draws.count(env.SLOW_S) / len(draws) - 1 / env.SLOW_EVERY) < 0.03
