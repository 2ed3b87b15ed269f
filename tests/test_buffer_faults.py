"""The buffer under faults: invalid records, copied or moved segments, damaged files, seq gaps,
and what rft-status shows of them per writer."""

from __future__ import annotations

import array
import base64
import json
import logging
import shutil
from pathlib import Path

import pytest

from rft.buffer.experience import (
    Experience,
    ReaderStats,
    decode_line,
    encode_line,
    parse_writer_stat_key,
)
from rft.buffer.segments import SegmentReader, SegmentWriter
from rft.errors import DataError
from rft.monitor import metrics_path
from rft.rundir import BUFFER_DIR, CHECKPOINT_POINTER, TRAINER_META, step_dir
from rft.status import collect, format_status
from tests.helpers.synthetic import make_batch

NAN, INF = float("nan"), float("inf")


def ids(records: list[Experience]) -> list[str]:
    return [r.experience_id for r in records]


def packed(code: str, values: list) -> str:
    raw = array.array("i" if code == "i32" else "f", values).tobytes()
    return f"{code}:{base64.b64encode(raw).decode()}"


# field, bad value: each a defect the trainer met later as a traceback, NaN advantages or a
# sample silently taken for an eval one
BAD_FIELDS = [
    ("prompt_ids", ["1", 2]),
    ("prompt_ids", [1.0, 2]),
    ("prompt_ids", [[1], 2]),
    ("prompt_ids", [-1, 2]),
    ("response_ids", [3, True, 5]),
    ("response_ids", [3, 4, 2**31]),
    ("response_ids", packed("i32", [3, -4, 5])),
    ("response_ids", "3,4,5"),
    ("logprobs", ["-0.5", -0.25, -1.0]),
    ("logprobs", [-0.5, NAN, -1.0]),
    ("logprobs", [-0.5, -INF, -1.0]),
    ("logprobs", [-0.5, -1e39, -1.0]),
    ("logprobs", packed("f32", [-0.5, NAN, -1.0])),
    ("logprobs", [-0.5, None, -1.0]),
    ("reward", NAN),
    ("reward", INF),
    ("reward", "1.0"),
    ("reward", True),
    ("reward", 10**400),
    ("reward_parts", {"accuracy": "1"}),
    ("reward_parts", {"accuracy": NAN}),
    ("reward_parts", {"accuracy": True}),
    ("reward_parts", [1.0]),
    ("model_version", True),
    ("model_version", -1),
    ("model_version", "3"),
    ("model_version", 2.0),
    ("eval", "no"),
    ("eval", 0),
    ("truncated", "false"),
    ("truncated", None),
    ("task_id", 7),
    ("group_id", None),
    ("writer", 1),
    ("source", "human"),
    ("source", ["rollout"]),
    ("prompt_text", 5),
    ("info", "x"),
]


@pytest.mark.parametrize("name,value", BAD_FIELDS, ids=[f"{n}={v!r}"[:40] for n, v in BAD_FIELDS])
def test_invalid_records_are_refused_naming_field_and_experience(name, value, tmp_path):
    good = make_batch("a", 1, size=1)[0]
    line = encode_line(good)
    assert decode_line(line) == good
    d = {**json.loads(line), name: value}
    with pytest.raises(DataError, match=rf"experience a-0-0: .*{name}"):
        decode_line(json.dumps(d))  # json writes nan/inf as NaN/Infinity, which it reads back
    if isinstance(value, str) and value[:4] in ("i32:", "f32:"):
        return  # the packed form exists on disk only
    bad = Experience(**{**good.to_dict(), name: value})
    with pytest.raises(DataError, match=rf"experience a-0-0: .*{name}"):
        bad.validate()
    if isinstance(value, list) and True in map(type(True).__instancecheck__, value):
        return  # the writer packs a bool as 0/1 (test_sealed_files_are_...)
    if name == "writer":
        return  # the writer fills in its own name
    writer = SegmentWriter(tmp_path, "w")
    with pytest.raises(DataError, match=name):
        writer.write([bad])
    assert list((tmp_path / "w").iterdir()) == [] and writer.next_seq == 0  # nothing sealed


def test_valid_edge_values_pass():
    exp = Experience(
        task_id="t",
        group_id="g",
        prompt_ids=[0],
        response_ids=[2**31 - 1, 0],
        logprobs=[0.0, -(2.0**127)],
        reward=-5,
        reward_parts={"format": 0},
        model_version=0,
        truncated=True,
        eval=False,
    )
    exp.validate()
    assert decode_line(encode_line(exp)) == exp
    plain = {**exp.to_dict(), "logprobs": [0, -1]}  # ints in a hand-written plain list
    assert Experience.from_dict(plain).logprobs == [0, -1]


def test_an_invalid_record_on_disk_is_skipped_with_file_line_and_reason(tmp_path, caplog):
    SegmentWriter(tmp_path, "w").write(make_batch("a", 2))
    path = tmp_path / "w" / "seg-000000.jsonl"
    lines = path.read_text().splitlines()
    lines[6] = lines[6].replace('"model_version":0', '"model_version":true')
    path.write_text("\n".join(lines) + "\n")
    caplog.set_level(logging.WARNING)
    reader = SegmentReader(tmp_path)
    assert ids(reader.read()) == ids(make_batch("a", 2)[:4])  # a-1 lost a sample: dropped
    assert f"{path} line 7: experience a-1-1: model_version must be an int >= 0" in caplog.text
    assert reader.stats.by_writer == {"w": {"corrupt_records": 1, "incomplete_groups": 1}}


def test_a_copied_writer_folder_is_skipped_warned_once_and_never_deleted(tmp_path, caplog):
    writer = SegmentWriter(tmp_path, "explorer-0")
    for seq in range(3):
        writer.write(make_batch(f"s{seq}", 1))
    shutil.copytree(tmp_path / "explorer-0", tmp_path / "explorer-0.bak")  # a user's backup
    caplog.set_level(logging.WARNING)
    reader = SegmentReader(tmp_path)
    got = ids(reader.read())
    assert sorted(got) == sorted(ids([e for seq in range(3) for e in make_batch(f"s{seq}", 1)]))
    writer.write(make_batch("s3", 1))
    assert ids(reader.read()) == ids(make_batch("s3", 1))  # later passes: no re-read, no warning
    assert reader.stats.misplaced_segments == 3
    assert reader.stats.by_writer["explorer-0.bak"] == {"misplaced_segments": 3}
    warnings = [r.getMessage() for r in caplog.records if "explorer-0.bak" in r.getMessage()]
    assert len(warnings) == 1, warnings
    assert "written by 'explorer-0'" in warnings[0]
    assert "move copies out of the run directory" in warnings[0]
    assert "explorer-0.bak" not in reader.cursor()["segments"]
    reader.release(reader.cursor())
    assert len(list((tmp_path / "explorer-0.bak").iterdir())) == 3


def test_a_segment_moved_to_another_seq_is_skipped_and_kept_across_restarts(tmp_path):
    writer = SegmentWriter(tmp_path, "w")
    for seq in range(3):
        writer.write(make_batch(f"s{seq}", 1))
    shutil.copy(tmp_path / "w" / "seg-000001.jsonl", tmp_path / "w" / "seg-000003.jsonl")
    SegmentWriter(tmp_path, "w").write(make_batch("s4", 1))  # numbers on after the copy: seq 4
    reader = SegmentReader(tmp_path)
    assert [r.group_id for r in reader.read()][::4] == ["s0-0", "s1-0", "s2-0", "s4-0"]
    assert reader.stats.misplaced_segments == 1 and reader.stats.missing_segments == 0
    saved = reader.cursor()
    reader.release(saved)
    resumed = SegmentReader(tmp_path, cursor=saved)  # knows nothing of the copy: reads its header
    resumed.release(saved)
    left = sorted(p.name for p in (tmp_path / "w").iterdir())
    assert left == ["seg-000003.jsonl", "seg-000004.jsonl"]  # the copy and the newest


def test_read_step_skips_a_misplaced_segment(tmp_path):
    SegmentWriter(tmp_path, "explorer-1").write(make_batch("x", 1), seq=1)
    SegmentWriter(tmp_path, "explorer-0").write(make_batch("y", 1), seq=1)
    (tmp_path / "explorer-0" / "seg-000001.jsonl").unlink()  # a lost segment, "restored" from
    shutil.copy(tmp_path / "explorer-1" / "seg-000001.jsonl", tmp_path / "explorer-0")  # rank 1
    reader = SegmentReader(tmp_path)
    assert ids(reader.read_step(1, ["explorer-0", "explorer-1"])) == ids(make_batch("x", 1))
    assert reader.stats.by_writer == {"explorer-0": {"misplaced_segments": 1}}


def test_a_zero_byte_segment_is_reported_as_damage(tmp_path, caplog):
    (tmp_path / "w").mkdir()
    (tmp_path / "w" / "seg-000000.jsonl").write_bytes(b"")
    SegmentWriter(tmp_path, "w").write(make_batch("a", 1))
    caplog.set_level(logging.WARNING)
    reader = SegmentReader(tmp_path)
    assert ids(reader.read()) == ids(make_batch("a", 1))
    assert "seg-000000.jsonl is empty (0 bytes)" in caplog.text
    assert reader.stats.by_writer == {"w": {"corrupt_records": 1}}


def test_damage_at_a_group_boundary_drops_both_neighbours_once_across_a_resume(tmp_path, caplog):
    SegmentWriter(tmp_path, "w").write(make_batch("a", 5))
    path = tmp_path / "w" / "seg-000000.jsonl"
    lines = path.read_text().splitlines()
    lines[9] = lines[9][:40]  # the first record of a-2: a-1 or a-2 may have lost it
    lines[14] = "{}"  # inside a-3: only a-3 is incomplete
    path.write_text("\n".join(lines) + "\n")
    caplog.set_level(logging.WARNING)
    reader = SegmentReader(tmp_path)
    assert ids(reader.read(4)) == ids(make_batch("a", 5)[:4])
    saved = reader.cursor()
    assert saved["segments"]["w"] == {"seq": 0, "offset": 16}  # past the dropped groups
    assert reader.stats.incomplete_groups == 3 and reader.stats.corrupt_records == 2
    assert "a-1, a-2, a-3" in caplog.text and "lines [10, 15]" in caplog.text
    resumed = SegmentReader(tmp_path, cursor=saved)
    assert ids(resumed.read()) == ids(make_batch("a", 5)[16:])
    assert resumed.stats.incomplete_groups == 0 and resumed.stats.corrupt_records == 0


def test_a_seq_gap_is_reported_and_read_past(tmp_path, caplog):
    writer = SegmentWriter(tmp_path, "w")
    writer.write(make_batch("s1", 1), seq=1)  # explorers number from step 1: not a gap
    writer.write(make_batch("s2", 1))
    reader = SegmentReader(tmp_path)
    assert len(reader.read()) == 8 and reader.stats.missing_segments == 0
    writer.write(make_batch("s3", 1))
    writer.write(make_batch("s4", 1))
    (tmp_path / "w" / "seg-000003.jsonl").unlink()
    caplog.set_level(logging.WARNING)
    assert ids(reader.read()) == ids(make_batch("s4", 1))  # never blocks on the hole
    assert reader.stats.by_writer == {"w": {"missing_segments": 1}}
    assert "segment seqs 3 are missing" in caplog.text


def test_a_resume_from_a_cursor_whose_segments_were_released_is_reported(tmp_path, caplog):
    writer = SegmentWriter(tmp_path, "w")
    for seq in range(5):
        writer.write(make_batch(f"s{seq}", 1))
    newer = SegmentReader(tmp_path)
    newer.read(16)
    newer.release(newer.cursor())  # a newer checkpoint released seqs 0-3
    caplog.set_level(logging.WARNING)
    older = SegmentReader(tmp_path, cursor={"segments": {"w": {"seq": 1, "offset": 2}}})
    assert ids(older.read()) == ids(make_batch("s4", 1))
    assert older.stats.missing_segments == 3
    assert "(2 lines of seq 1 had been read)" in caplog.text


def test_reader_stats_per_writer_keys_round_trip():
    stats = ReaderStats()
    assert "writers/" not in " ".join(stats.as_dict())  # a healthy run logs no per-writer keys
    stats.count("explorer-0", "corrupt_records", 2)
    stats.count("writer.x", "missing_segments")
    flat = stats.as_dict()
    assert flat["corrupt_records"] == 2 and flat["missing_segments"] == 1
    parsed = {parse_writer_stat_key(f"buffer/{k}"): v for k, v in flat.items()}
    assert parsed[("explorer-0", "corrupt_records")] == 2
    assert parsed[("writer.x", "missing_segments")] == 1
    assert parse_writer_stat_key("buffer/corrupt_records") is None
    assert parse_writer_stat_key("buffer/writers/w/bogus") is None


def test_status_shows_each_writer_sealed_consumed_counters_and_gaps(tmp_path):
    run = tmp_path / "run"
    buffer_dir = run / BUFFER_DIR
    writer = SegmentWriter(buffer_dir, "explorer-0")
    for seq in (1, 2, 4, 5):
        writer.write(make_batch(f"s{seq}", 1), seq=seq)
    (buffer_dir / "explorer-0" / "seg-000000.jsonl").write_bytes(b"")  # damage the reader counts
    reader = SegmentReader(buffer_dir)
    reader.read(4)  # seg 0 (empty) and seg 1 of explorer-0
    cursor = reader.cursor()
    SegmentWriter(buffer_dir, "explorer-1").write(make_batch("t", 1), seq=1)
    step_dir(run, 3).mkdir(parents=True)
    (step_dir(run, 3) / TRAINER_META).write_text(json.dumps({"buffer_cursor": cursor}))
    (run / CHECKPOINT_POINTER).write_text("3\n")
    metrics_path(run, "trainer").parent.mkdir(parents=True)
    row = {"step": 3, **{f"buffer/{k}": v for k, v in reader.stats.as_dict().items()}}
    metrics_path(run, "trainer").write_text(json.dumps(row) + "\n")
    (buffer_dir / "explorer-0" / "seg-000000.jsonl").unlink()
    text = format_status(collect(run, live_threshold_s=60))
    e0 = next(line for line in text.splitlines() if line.startswith("writer explorer-0 "))
    assert "sealed 4 (newest seq 5)" in e0 and "MISSING seqs 3" in e0
    assert "corrupt_records=1" in e0 and "consumed seqs < 2" in e0, e0
    e1 = next(line for line in text.splitlines() if line.startswith("writer explorer-1 "))
    assert "sealed 1 (newest seq 1), consumed nothing" in e1 and "MISSING" not in e1, e1
    assert "buffer backlog  4 sealed segment(s)" in text
    cursor["segments"]["explorer-0"]["offset"] = 3
    (step_dir(run, 3) / TRAINER_META).write_text(json.dumps({"buffer_cursor": cursor}))
    assert "consumed seqs < 2 + 3 lines of seq 2" in format_status(collect(run, 60))


def test_status_of_a_cursor_behind_released_segments_shows_the_gap(tmp_path):
    run = tmp_path / "run"
    writer = SegmentWriter(run / BUFFER_DIR, "w")
    for seq in range(6):
        writer.write(make_batch(f"s{seq}", 1))
    for seq in range(4):
        (run / BUFFER_DIR / "w" / f"seg-{seq:06d}.jsonl").unlink()
    cursor = {"segments": {"w": {"seq": 2, "offset": 0}}}
    (run / TRAINER_META).write_text(json.dumps({"buffer_cursor": cursor}))
    (run / CHECKPOINT_POINTER).write_text("1\n")
    assert "MISSING seqs 2-3" in format_status(collect(run, 60))


def test_damaged_cursor_does_not_break_status(tmp_path):
    run = tmp_path / "run"
    SegmentWriter(run / BUFFER_DIR, "w").write(make_batch("a", 1))
    (run / TRAINER_META).write_text(json.dumps({"buffer_cursor": {"segments": "oops"}}))
    (run / CHECKPOINT_POINTER).write_text("1\n")
    assert "writer w" in format_status(collect(run, 60))


def test_sealed_files_are_exactly_what_the_reader_accepts(tmp_path):
    """encode_line and decode_line share one rule: whatever a writer seals, a reader reads."""
    exp = make_batch("a", 1, size=1)[0]
    exp.response_ids = [3, True, 5]  # a bool packs as 1: the sealed record is a valid one
    path = SegmentWriter(tmp_path, "w").write([exp])
    assert SegmentReader(tmp_path).read()[0].response_ids == [3, 1, 5]
    assert Path(path).exists()
