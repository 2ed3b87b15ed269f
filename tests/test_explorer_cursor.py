"""Explorer cursors across a change of explorer count (rft/explorer/cursor.py): hand-computed
dealing, simulated runs through the real segment writer and cursor file (every (step, slot)
sealed exactly once, for count changes up and down, ranks left at different steps, late ranks,
a crash between sealing and saving, old explorer_meta.json files), and the real explorer loop
with a stand-in engine."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Iterator

import pytest

from rft.buffer.experience import Experience
from rft.buffer.segments import SegmentReader, SegmentWriter
from rft.explorer import cursor as C
from rft.explorer import tasksets as T
from rft.explorer.engine import Sample
from rft.rundir import BUFFER_DIR, EXPLORER_META, writer_name
from tests.helpers.explorer import arithmetic_rows, make_cfg, open_sets, taskset_dict
from tests.helpers.runs import write_jsonl
from tests.helpers.stand_in_engine import StandInEngine, StandInTokenizer

NAME = "explorer"
BATCH = 5  # slots per step: 5 does not divide among 2, 3 or 4 ranks evenly
STEPS = 10


@pytest.fixture(scope="module")
def tasksets(tmp_path_factory) -> list[T.Taskset]:
    root = tmp_path_factory.mktemp("tasks")
    rows = write_jsonl(root / "a.jsonl", arithmetic_rows(BATCH * STEPS))
    return open_sets(make_cfg(root, root, [taskset_dict(rows, "a")]))


def new_stream(tasksets: list[T.Taskset]) -> T.TaskStream:
    return T.TaskStream(tasksets, BATCH, 1, STEPS)  # what each explorer process builds


# ----------------------------------------------------------------------------- dealing


def test_two_to_three_deals_only_the_missing_slots_to_ranks_that_can_seal_them(tasksets):
    stream = new_stream(tasksets)
    first = C.first_layout(2, stream.new_cursor())
    assert [first.slots(4, r, BATCH) for r in range(2)] == [[0, 2, 4], [1, 3]]
    # rank 0 sealed steps 1-5, rank 1 steps 1-3 (the fault probe's run)
    saved = [C.advance(stream, stream.new_cursor(), 5), C.advance(stream, stream.new_cursor(), 3)]
    new = C.next_layout(first, [5, 3], saved, 3, (5, 3, 0), stream)
    assert (new.id, new.start, new.cursor.step, new.cursor.positions) == (1, 3, 3, [15])
    assert new.done == {4: {0, 2, 4}, 5: {0, 2, 4}}
    # steps 4, 5: slots 1, 3 are missing; rank 0 sealed both steps, ranks 1 and 2 take them
    assert new.able(4) == [1, 2] and new.able(6) == [0, 1, 2]
    assert [new.slots(4, r, BATCH) for r in range(3)] == [[], [1], [3]]
    assert [new.slots(6, r, BATCH) for r in range(3)] == [[0, 3], [1, 4], [2]]
    assert [new.slots(3, r, BATCH) for r in range(3)] == [[], [], []]


def test_three_to_two_folds_slots_no_writer_can_seal_into_the_first_free_segment(tasksets):
    stream = new_stream(tasksets)
    first = C.first_layout(3, stream.new_cursor())
    new = C.next_layout(first, [5, 5, 3], [], 2, (5, 5), stream)  # rank 2 of 3 lagged
    assert new.start == 3 and new.done == {4: {0, 1, 3, 4}, 5: {0, 1, 3, 4}}
    assert new.able(5) == [0, 1]  # neither writer can seal seq 4 or 5: both fold
    assert [new.slots(4, r, BATCH) for r in range(2)] == [[2], []]
    assert [new.slots(5, r, BATCH) for r in range(2)] == [[2], []]
    assert new.seal_seq(4, 0) == new.seal_seq(5, 0) == 6


def test_layout_round_trips_through_json(tasksets):
    stream = new_stream(tasksets)
    layout = C.next_layout(C.first_layout(2, stream.new_cursor()), [4, 2], [], 3, (4, 2, 0), stream)
    assert C.Layout.from_dict(json.loads(json.dumps(layout.to_dict()))) == layout


# ----------------------------------------------------------------------------- simulated runs


def record(writer: str, step: int, slot: int, task: T.Task) -> Experience:
    return Experience(
        task_id=f"a/{task.index}",
        group_id=f"{writer}:{step}:{slot}",
        prompt_ids=[1],
        response_ids=[2],
        logprobs=[-0.5],
        info={"step": step, "slot": slot},
    )


def rank_run(
    run_dir: Path, tasksets: list[T.Taskset], rank: int, count: int, save: bool = True
) -> Iterator[int]:
    """One explorer process as the loop runs it, started now (its plan resumed); the iterator
    seals one segment per step and yields the step."""
    writer = SegmentWriter(run_dir / BUFFER_DIR, writer_name(NAME, rank))
    stream = new_stream(tasksets)
    plan = C.resume(run_dir, NAME, rank, count, stream)

    def steps() -> Iterator[int]:
        while not plan.finished(stream):
            step = plan.cursor.step + 1
            carried, share = plan.take(step, stream.next_batch(plan.cursor))
            exps = [
                record(writer.writer, s, i, t) for s, pairs in carried.items() for i, t in pairs
            ]
            exps += [record(writer.writer, step, i, t) for i, t in share]
            writer.write(exps, seq=step)
            if save:
                C.save_cursor(run_dir, NAME, rank, plan.layout, plan.cursor)
            yield step

    return steps()


@dataclass
class Launch:
    """A launch of ``count`` ranks; ``stops[r]``: segments rank r seals before it is killed
    (None: to the end); ranks in ``late`` start once the others have stopped."""

    count: int
    stops: tuple[int | None, ...]
    late: tuple[int, ...] = ()


def simulate(run_dir: Path, tasksets: list[T.Taskset], launches: list[Launch]) -> None:
    """Run the launches in order; within one, the ranks start together (all resume before any
    seals) and then advance in turn, one step each."""
    for launch in launches:
        waves = [[r for r in range(launch.count) if r not in launch.late], list(launch.late)]
        for wave in waves:
            runs = {r: rank_run(run_dir, tasksets, r, launch.count) for r in wave}
            sealed = Counter()
            while runs:
                for r in list(runs):
                    if sealed[r] == launch.stops[r] or next(runs[r], None) is None:
                        del runs[r]
                    else:
                        sealed[r] += 1


def assert_each_slot_once(run_dir: Path, tasksets: list[T.Taskset]) -> None:
    exps = SegmentReader(run_dir / BUFFER_DIR).read()
    made = Counter((e.info["step"], e.info["slot"]) for e in exps)
    assert made == Counter({(s, i): 1 for s in range(1, STEPS + 1) for i in range(BATCH)})
    stream = new_stream(tasksets)
    cursor = stream.new_cursor()
    batches = {s: stream.next_batch(cursor) for s in range(1, STEPS + 1)}
    for e in exps:  # the task of each slot is the stream's, whoever generated it
        assert e.task_id == f"a/{batches[e.info['step']][e.info['slot']].index}"


COUNT_CHANGES = {
    "2->3 (ranks at 5 and 3)": [Launch(2, (5, 3)), Launch(3, (None,) * 3)],
    "2->3, rank 2 starts after the others saved": [
        Launch(2, (5, 3)),
        Launch(3, (None, None, None), late=(2,)),
    ],
    "3->2 (ranks at 5, 3, 4)": [Launch(3, (5, 3, 4)), Launch(2, (None, None))],
    "3->2, the dropped rank lagged (folded)": [Launch(3, (5, 5, 3)), Launch(2, (None, None))],
    "1->4 (rank at 5)": [Launch(1, (5,)), Launch(4, (None,) * 4)],
    "1->4, ranks 1-3 start late": [Launch(1, (5,)), Launch(4, (None,) * 4, late=(1, 2, 3))],
    "2->3->2->4, killed mid-way each time": [
        Launch(2, (6, 2)),
        Launch(3, (1, 2, 0)),
        Launch(2, (1, None)),
        Launch(4, (None,) * 4),
    ],
    "3->2 folded, killed before sealing the carried slots, then 3": [
        Launch(3, (5, 5, 3)),
        Launch(2, (0, 1)),
        Launch(3, (None,) * 3),
    ],
    "2->2 relaunch keeps each rank's own cursor": [Launch(2, (5, 3)), Launch(2, (None, None))],
}


@pytest.mark.parametrize("launches", COUNT_CHANGES.values(), ids=COUNT_CHANGES.keys())
def test_every_slot_is_generated_exactly_once_across_count_changes(tmp_path, tasksets, launches):
    simulate(tmp_path, tasksets, launches)
    assert_each_slot_once(tmp_path, tasksets)


def test_segments_sealed_but_not_saved_count_as_generated(tmp_path, tasksets):
    simulate(tmp_path, tasksets, [Launch(2, (3, 3))])
    crashed = rank_run(tmp_path, tasksets, 0, 2, save=False)  # seals step 4, dies before saving
    assert next(crashed) == 4
    # under the new count too: rank 1 seals step 4 (slots 1 and 3 of it), dies before saving
    assert next(rank_run(tmp_path, tasksets, 1, 3, save=False)) == 4
    simulate(tmp_path, tasksets, [Launch(3, (None,) * 3)])
    assert_each_slot_once(tmp_path, tasksets)


def test_a_rank_adopts_the_layout_another_rank_recorded_meanwhile(tmp_path, tasksets, monkeypatch):
    simulate(tmp_path, tasksets, [Launch(2, (5, 3))])
    real = C.next_layout
    theirs = []

    def racing(*args):  # another rank records its layout while this one computes
        mine = real(*args)
        theirs.append(replace(mine, floors=(7, 7, 7)))
        meta = json.loads((tmp_path / EXPLORER_META).read_text())
        meta[NAME]["layout"] = theirs[0].to_dict()
        (tmp_path / EXPLORER_META).write_text(json.dumps(meta))
        return mine

    monkeypatch.setattr(C, "next_layout", racing)
    layout, _ = C.current_layout(tmp_path, NAME, 3, new_stream(tasksets), lambda r: 0)
    assert layout == theirs[0]


def test_explorer_meta_written_by_the_old_code_is_read(tmp_path, tasksets):
    # explorer_meta.json as the code before layouts wrote it, ranks at 5 and 3 of 2
    stream = new_stream(tasksets)
    for rank, steps in ((0, 5), (1, 3)):
        writer = SegmentWriter(tmp_path / BUFFER_DIR, writer_name(NAME, rank))
        cursor = stream.new_cursor()
        for step in range(1, steps + 1):
            share = T.rank_share(stream.next_batch(cursor), rank, 2)
            writer.write([record(writer.writer, step, i, t) for i, t in share], seq=step)
    old = {
        NAME: {
            "ranks": {
                str(r): {"cursor": C.advance(stream, stream.new_cursor(), s).to_dict(), "count": 2}
                for r, s in ((0, 5), (1, 3))
            }
        }
    }
    (tmp_path / EXPLORER_META).write_text(json.dumps(old))
    layout, entries = C.current_layout(tmp_path, NAME, 2, stream, lambda r: 0)
    assert (layout.id, layout.count, sorted(entries)) == (0, 2, [0, 1])
    assert entries[1].step == 3
    simulate(tmp_path, tasksets, [Launch(3, (None,) * 3, late=(2,))])
    assert_each_slot_once(tmp_path, tasksets)
    meta = json.loads((tmp_path / EXPLORER_META).read_text())[NAME]
    assert meta["layout"]["count"] == 3 and meta["layout"]["start"] == 3
    assert {r["layout"] for r in meta["ranks"].values()} == {1}


# ----------------------------------------------------------------------------- the real loop


class AnswersOne(StandInEngine):
    """What the explorer loop asks of an engine: the answer "1" to every prompt."""

    tokenizer = StandInTokenizer()

    def reply(self, prompt_ids, args) -> list[Sample]:
        return [Sample(list(prompt_ids), [7], [-0.5], "stop", "#### 1") for _ in range(args.n)]


def test_the_explorer_loop_generates_each_task_once_when_the_count_changes(tmp_path):
    from rft.explorer.loop import run_explorer

    rows = write_jsonl(tmp_path / "a.jsonl", arithmetic_rows(BATCH * STEPS))

    def launch(count: int, rank: int, max_steps: int | None = None) -> None:
        cfg = make_cfg(
            tmp_path,
            tmp_path,
            [taskset_dict(rows, "a")],
            buffer={"batch_size": BATCH, "total_steps": STEPS},
            explorer={"rollout_model": {"engine_num": count}},
        )
        env = {"RFT_EXPLORER_RANK": str(rank), "RFT_EXPLORER_COUNT": str(count)}
        run_explorer(cfg, AnswersOne(), env=env, max_steps=max_steps)

    launch(2, 0, max_steps=5)
    launch(2, 1, max_steps=3)
    launch(3, 0)
    launch(3, 1)
    launch(3, 2)  # starts after ranks 0 and 1 saved their cursors under the new count
    run_dir = tmp_path / "p" / "run"
    exps = SegmentReader(run_dir / BUFFER_DIR).read()
    groups = Counter(  # group ids are <writer>:<step>:<slot>
        tuple(int(x) for x in e.group_id.split(":")[1:]) for e in exps
    )
    assert groups == Counter({(s, i): 2 for s in range(1, STEPS + 1) for i in range(BATCH)})
    tasks = Counter(e.task_id for e in exps)
    assert tasks == Counter({f"a/{i}": 2 for i in range(BATCH * STEPS)})  # 2 samples per task
