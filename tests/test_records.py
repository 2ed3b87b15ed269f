"""Record rules the buffer enforces at write and read: a prompt token to score from, log-probs
that are log-probabilities, and each sample once in its group (issue 36, item 5)."""

from __future__ import annotations

import json
import logging

import pytest

from rft.algo.advantages import grpo_advantages
from rft.buffer.experience import (
    LOGPROB_TOLERANCE,
    Experience,
    decode_line,
    encode_record,
)
from rft.buffer.segments import open_buffer_reader, open_buffer_writer
from rft.errors import DataError


def record(group: str = "g", reward: float = 0.0, **kw) -> Experience:
    fields = {"prompt_ids": [1, 2], "response_ids": [3, 4], "logprobs": [-0.5, -1.5]}
    fields.update(kw)
    return Experience(task_id="t", group_id=group, reward=reward, **fields)


def line_of(fields: dict) -> bytes:
    return json.dumps({"task_id": "t", "group_id": "g", **fields}).encode()


# ----------------------------------------------------------------------------- one record


def test_an_empty_prompt_is_refused_at_write_and_at_read():
    with pytest.raises(DataError, match="prompt_ids is empty; a record needs at least one"):
        encode_record(record(prompt_ids=[]))
    with pytest.raises(DataError, match="prompt_ids is empty"):
        record(prompt_ids=[]).validate()
    for prompt in ([], "i32:"):  # a plain list and the packed form of no values
        with pytest.raises(DataError, match="prompt_ids is empty"):
            decode_line(line_of({"prompt_ids": prompt, "response_ids": [3], "logprobs": [-1.0]}))


@pytest.mark.parametrize("value", [0.5, 1.0, 2e-4, 3.0e38])
def test_a_positive_logprob_is_refused_at_write_and_at_read(value):
    bad = record(logprobs=[-0.5, value])
    with pytest.raises(DataError, match=r"logprobs\[1\] is .* > 0; a log-probability is <= 0"):
        encode_record(bad)
    with pytest.raises(DataError, match=r"logprobs\[1\]"):
        bad.validate()
    with pytest.raises(DataError, match=r"logprobs\[1\]"):  # a line another tool wrote
        decode_line(line_of({"prompt_ids": [1], "response_ids": [3, 4], "logprobs": [-1, value]}))


@pytest.mark.parametrize("value", [0.0, -0.0, 1e-7, LOGPROB_TOLERANCE, -80.0])
def test_logprobs_up_to_the_tolerance_are_kept(value):
    exp = decode_line(encode_record(record(logprobs=[value, -1.0])))
    assert exp.logprobs[0] == pytest.approx(value, abs=1e-9)


def test_packed_logprobs_above_the_tolerance_are_refused_on_read():
    import base64
    import struct

    raw = base64.b64encode(struct.pack("<2f", -0.5, 0.01)).decode()
    line = line_of({"prompt_ids": [1], "response_ids": [3, 4], "logprobs": f"f32:{raw}"})
    with pytest.raises(DataError, match=r"logprobs\[1\] is 0.01 > 0"):
        decode_line(line)


# ----------------------------------------------------------------------------- groups


def written_and_read(tmp_path, batch: list[Experience]) -> list[Experience]:
    writer = open_buffer_writer(tmp_path, "explorer-0")
    writer.write(batch)
    return open_buffer_reader(tmp_path).read()


def test_a_record_repeated_in_its_group_is_trained_once(tmp_path, caplog):
    """A workflow that returns one sample twice: today 5 rows reach the trainer and the group's
    mean and std count that sample twice. The copy is dropped (it holds nothing new)."""
    rewards = [1.0, 0.0, 0.0, 0.0]
    group = [record(reward=r, experience_id=f"e{i}") for i, r in enumerate(rewards)]
    with caplog.at_level(logging.WARNING):
        read = written_and_read(tmp_path, group + [group[0]])
    assert [e.experience_id for e in read] == ["e0", "e1", "e2", "e3"]
    assert "dropped a copy of experience e0 (group g)" in caplog.text
    # GRPO over the 4 distinct samples: mean 0.25, std (unbiased) 0.5 -> +1.5 for the winner;
    # with the copy it would be mean 0.4, std 0.5477 -> +1.095.
    scores = grpo_advantages_of([e.reward for e in read])
    assert scores[0] == pytest.approx(1.5, abs=1e-4)


def grpo_advantages_of(rewards: list[float]) -> list[float]:
    import torch

    advantages, _metrics = grpo_advantages(
        torch.tensor(rewards), ["g"] * len(rewards), torch.ones(len(rewards), 1)
    )  # [B, 1]
    return advantages[:, 0].tolist()


def test_two_different_records_under_one_id_are_refused_before_sealing(tmp_path):
    a = record(reward=1.0, experience_id="same")
    b = record(reward=0.0, experience_id="same", response_ids=[5, 6])
    writer = open_buffer_writer(tmp_path, "explorer-0")
    with pytest.raises(DataError, match="two different records share experience_id same"):
        writer.write([a, b, record(experience_id="other")])
    assert open_buffer_reader(tmp_path).read() == []  # nothing sealed


def test_a_segment_from_another_writer_with_repeats_is_read_without_them(tmp_path, caplog):
    """Lines written by an older rft or another tool: the copy goes; a group with two different
    records under one id is dropped whole (which is the sample cannot be told) and counted."""
    folder = tmp_path / "buffer" / "explorer-0"
    folder.mkdir(parents=True)
    lines = [
        encode_record(record("g1", 1.0, experience_id="a")),
        encode_record(record("g1", 0.0, experience_id="b")),
        encode_record(record("g1", 1.0, experience_id="a")),  # a copy
        encode_record(record("g2", 1.0, experience_id="c")),
        encode_record(record("g2", 0.0, experience_id="c", response_ids=[7, 8])),  # a clash
        encode_record(record("g3", 0.0, experience_id="d")),
    ]
    header = json.dumps({"format": 1, "writer": "explorer-0", "seq": 0, "num_records": 6})
    (folder / "seg-000000.jsonl").write_bytes(header.encode() + b"\n" + b"\n".join(lines) + b"\n")
    reader = open_buffer_reader(tmp_path)
    with caplog.at_level(logging.WARNING):
        read = reader.read()
    assert [(e.group_id, e.experience_id) for e in read] == [("g1", "a"), ("g1", "b"), ("g3", "d")]
    assert reader.stats.incomplete_groups == 1
    assert "two different records share experience_id c" in caplog.text
