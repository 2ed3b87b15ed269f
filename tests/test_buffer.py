"""The experience buffer on real files and real processes: sealed segments, whole groups,
exactly-once cursors across SIGKILLed writers and readers, corrupt data, SQLite archive and
transport."""

from __future__ import annotations

import array
import base64
import json
import logging
import os
import random
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rft.buffer.experience import Experience, decode_line, encode_line
from rft.buffer.segment_file import unsealed_writers
from rft.buffer.segments import (
    SegmentReader,
    SegmentWriter,
    open_archive,
    open_buffer_reader,
    open_buffer_writer,
)
from rft.buffer.sqlite import check_sql_transport
from rft.errors import ConfigError, DataError, NotSupportedError, StorageError
from tests.helpers.synthetic import make_batch

sys.path.insert(0, str(Path(__file__).parent))
import buffer_worker  # noqa: E402

WORKER = str(Path(__file__).parent / "buffer_worker.py")
GROUP = buffer_worker.GROUP_SIZE


def ids(records: list[Experience]) -> list[str]:
    return [r.experience_id for r in records]


def assert_whole_groups(records: list[Experience], size: int = GROUP) -> None:
    counts: dict[str, int] = {}
    for r in records:
        counts[r.group_id] = counts.get(r.group_id, 0) + 1
    assert all(c == size for c in counts.values()), counts


def test_experience_roundtrip_both_forms():
    exp = make_batch("a", 1)[0]
    exp.info = {"note": "x"}
    assert decode_line(encode_line(exp)) == exp
    assert Experience.from_dict(json.loads(json.dumps(exp.to_dict()))) == exp
    with pytest.raises(DataError, match="logprobs"):
        Experience.from_dict({**exp.to_dict(), "logprobs": [-1.0]})
    expert = Experience(
        task_id="t", group_id="g", prompt_ids=[1], response_ids=[2, 3], source="expert"
    )
    assert decode_line(encode_line(expert)).logprobs == []
    exp.temperature = 0.7  # the sampling temperature travels with the record
    assert decode_line(encode_line(exp)).temperature == 0.7
    for bad in (-1.0, float("nan"), "hot", True):
        with pytest.raises(DataError, match="temperature must be a finite number >= 0 or null"):
            Experience.from_dict({**exp.to_dict(), "temperature": bad})


def test_packed_arrays_keep_their_on_disk_bytes(tmp_path):
    """Writers pack with struct and readers unpack through a memoryview; the bytes on disk stay
    what array.array wrote (little-endian int32/float32 in base64), so segments written before
    and after read the same. Logprobs come back as their float32 values, exactly."""
    exp = make_batch("a", 1)[0]
    exp.prompt_ids, exp.response_ids = [0, 2**31 - 1], [7, 150_000, 3]
    exp.logprobs = [-0.1, -2.5e-8, -(2.0**127)]  # -0.1 is not a float32: it is rounded once
    d = json.loads(encode_line(exp))
    for name, code, tag in (
        ("prompt_ids", "i", "i32"),
        ("response_ids", "i", "i32"),
        ("logprobs", "f", "f32"),
    ):
        arr = array.array(code, getattr(exp, name))
        if sys.byteorder == "big":
            arr.byteswap()
        assert d[name] == f"{tag}:{base64.b64encode(arr.tobytes()).decode()}"
    back = decode_line(encode_line(exp))
    assert back.logprobs == array.array("f", exp.logprobs).tolist() != exp.logprobs
    assert decode_line(encode_line(back)) == back  # float32 values round-trip exactly
    SegmentWriter(tmp_path, "w").write([exp])
    assert exp.writer == "" and SegmentReader(tmp_path).read()[0].writer == "w"  # not mutated


def test_a_read_record_keeps_its_arrays_packed_until_a_list_is_asked_for(tmp_path):
    """The trainer makes tensors straight from the packed bytes: a record read from a segment
    builds no list on the way (the saving of the read), and its tensors equal those of the
    record the explorer wrote (lists)."""
    from rft.trainer.batching import rows_from_experiences

    written = make_batch("a", 1)
    written[0].prompt_ids, written[0].response_ids = [5, 2**31 - 1], [7, 150_000, 3]
    written[0].logprobs = [-0.5, -2.25, -(2.0**100)]  # float32 values: exact both ways
    SegmentWriter(tmp_path, "w").write(written)
    read = SegmentReader(tmp_path).read()
    assert all(isinstance(r.__dict__["_response_ids"], bytes) for r in read)
    assert read[0].array_len("response_ids") == 3 and read[0].array_len("prompt_ids") == 2
    got, want = rows_from_experiences(read), rows_from_experiences(written)
    assert all(
        isinstance(r.__dict__[f"_{name}"], bytes)
        for r in read
        for name in ("prompt_ids", "response_ids", "logprobs")
    )  # still no list
    assert [ids.tolist() for ids in got.input_ids] == [ids.tolist() for ids in want.input_ids]
    assert got.input_ids[0].tolist() == [5, 2**31 - 1, 7, 150_000, 3]
    assert got.rollout_logprobs.equal(want.rollout_logprobs)
    assert got.response_mask.equal(want.response_mask) and got.prompt_lens == want.prompt_lens
    assert read[0].response_ids == [7, 150_000, 3]  # a list on first read, kept
    assert isinstance(read[0].__dict__["_response_ids"], list)
    read[0].response_ids.append(9)  # the list is the record's own, as before
    assert read[0].array_len("response_ids") == 4
    assert [r.to_dict() for r in read[1:]] == [{**w.to_dict(), "writer": "w"} for w in written[1:]]


def test_reader_returns_whole_groups_and_resumes_exactly_once(tmp_path):
    writer = SegmentWriter(tmp_path, "explorer-0")
    for seq in range(3):
        writer.write(make_batch(f"s{seq}", groups=3))
    reader = SegmentReader(tmp_path)
    first = reader.read(10)  # 10 is not a multiple of 4: two whole groups, never a cut one
    assert len(first) == 8
    assert_whole_groups(first)
    saved = json.loads(json.dumps(reader.cursor()))
    assert saved == {"segments": {"explorer-0": {"seq": 0, "offset": 8}}}
    lost = reader.read(4)  # consumed after the checkpoint: a resumed trainer reads it again
    resumed = SegmentReader(tmp_path, cursor=saved)
    rest = resumed.read()
    assert ids(rest)[:4] == ids(lost)
    assert sorted(ids(first) + ids(rest)) == sorted(
        ids(make_batch("s0", 3) + make_batch("s1", 3) + make_batch("s2", 3))
    )
    assert resumed.read() == []
    assert resumed.stats.experiences_read == 28 and resumed.stats.corrupt_records == 0


def test_backlog_gauge_counts_sealed_segments_not_yet_consumed(tmp_path):
    writer = SegmentWriter(tmp_path, "explorer-0")
    for seq in range(4):
        writer.write(make_batch(f"s{seq}", groups=3))
    reader = SegmentReader(tmp_path)
    assert reader.stats.backlog_segments == 0  # nothing listed yet
    reader.read(12)  # exactly segment 0
    assert reader.stats.backlog_segments == 3
    reader.read(24)
    assert reader.stats.backlog_segments == 1
    writer.write(make_batch("s4", groups=3))
    reader.read()  # lists again: the new segment joins, then everything is read
    assert reader.stats.backlog_segments == 0 and reader.stats.as_dict()["backlog_segments"] == 0


def test_group_larger_than_request_is_an_error(tmp_path):
    SegmentWriter(tmp_path, "w").write(make_batch("a", 1, size=8))
    with pytest.raises(DataError, match="repeat_times"):
        SegmentReader(tmp_path).read(4)


def test_writer_keeps_groups_contiguous_and_refuses_rewrites(tmp_path):
    writer = SegmentWriter(tmp_path, "w")
    mixed = make_batch("a", 2)
    mixed = [mixed[0], mixed[4], mixed[1], mixed[5], mixed[2], mixed[6], mixed[3], mixed[7]]
    writer.write(mixed, seq=5)
    assert writer.next_seq == 6
    with pytest.raises(DataError, match="below the next free seq"):
        writer.write(make_batch("b", 1), seq=5)
    got = SegmentReader(tmp_path).read(4)
    assert ids(got) == [f"a-0-{k}" for k in range(4)] and {r.writer for r in got} == {"w"}
    assert SegmentWriter(tmp_path, "w").next_seq == 6  # a restarted writer numbers on


def test_restarted_writer_clears_dead_temporaries_and_readers_ignore_them(tmp_path):
    SegmentWriter(tmp_path, "w").write(make_batch("a", 1))
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    torn = tmp_path / "w" / f"seg-000001.jsonl.tmp.{socket.gethostname()}.{dead.pid}"
    torn.write_text('{"format": 1}\n{"task_id": "half')
    foreign = tmp_path / "w" / "seg-000001.jsonl.tmp.other-host.1"
    foreign.write_text("")
    assert ids(SegmentReader(tmp_path).read()) == ids(make_batch("a", 1))
    writer = SegmentWriter(tmp_path, "w")
    assert not torn.exists() and foreign.exists()  # another host's writer may still be alive
    assert writer.next_seq == 1


def test_round_robin_and_new_writers_at_next_scan(tmp_path):
    a, b = SegmentWriter(tmp_path, "a"), SegmentWriter(tmp_path, "b")
    for seq in range(2):
        a.write(make_batch(f"a{seq}", 1))
        b.write(make_batch(f"b{seq}", 1))
    reader = SegmentReader(tmp_path)
    assert [r.group_id for r in reader.read(8)][::4] == ["a0-0", "b0-0"]
    SegmentWriter(tmp_path, "c").write(make_batch("c0", 1))  # an elastic explorer joins
    order = [r.group_id for r in reader.read()][::4]
    assert order == ["a1-0", "b1-0", "c0-0"]  # a1 was open; the pass lists c, round-robin
    assert reader.cursor()["segments"]["c"] == {"seq": 1, "offset": 0}


def test_a_joining_writer_is_not_starved_by_a_backlog(tmp_path):
    a = SegmentWriter(tmp_path, "a")
    for seq in range(20):  # a fast explorer with a long backlog
        a.write(make_batch(f"a{seq}", 1))
    reader = SegmentReader(tmp_path)
    assert [r.group_id for r in reader.read(GROUP)][::GROUP] == ["a0-0"]
    SegmentWriter(tmp_path, "b").write(make_batch("b0", 1))
    taken = [r.group_id for r in reader.read(GROUP)] + [r.group_id for r in reader.read(GROUP)]
    assert "b0-0" in taken[::GROUP]


def test_unsealed_writers_and_read_step(tmp_path):
    writers = ["explorer-0", "explorer-1"]
    w0, w1 = (SegmentWriter(tmp_path, w) for w in writers)
    w0.write(make_batch("r0s1", 2), seq=1)
    assert unsealed_writers(tmp_path, writers, 1) == ["explorer-1"]
    w1.write([], seq=1)  # an empty share still seals the step
    assert unsealed_writers(tmp_path, writers, 1) == []
    reader = SegmentReader(tmp_path)
    assert ids(reader.read_step(1, writers)) == ids(make_batch("r0s1", 2))
    assert reader.cursor()["segments"]["explorer-1"] == {"seq": 2, "offset": 0}
    assert reader.read_step(1, writers) == []  # a resumed trainer past step 1 reads nothing
    w0.write(make_batch("r0s2", 1), seq=2)
    w0.write(make_batch("r0s3", 1), seq=3)
    with pytest.raises(DataError, match="unread segments"):
        reader.read_step(3, writers)


def test_corrupt_and_truncated_lines_are_skipped_and_logged(tmp_path, caplog):
    SegmentWriter(tmp_path, "w").write(make_batch("a", 5))
    path = tmp_path / "w" / "seg-000000.jsonl"
    lines = path.read_text().splitlines()
    bad = json.loads(lines[2])
    bad["logprobs"] = [-1.0]  # one logprob for three tokens
    lines[2] = json.dumps(bad)
    lines[6] = lines[6][: len(lines[6]) // 2]  # a torn line
    lines = lines[:-2]  # and the file cut short: the header says 20 records
    path.write_text("\n".join(lines) + "\n")
    caplog.set_level(logging.WARNING)
    reader = SegmentReader(tmp_path)
    got = reader.read()
    assert ids(got) == ids(make_batch("a", 5)[8:16])  # groups a-0, a-1, a-4 lost a sample each
    assert reader.stats.corrupt_records == 4 and reader.stats.incomplete_groups == 3
    assert f"{path} line 3" in caplog.text and f"{path} line 7" in caplog.text
    assert "truncated" in caplog.text and "a-0, a-1, a-4" in caplog.text


def test_corrupt_header_is_skipped_with_the_first_group(tmp_path, caplog):
    SegmentWriter(tmp_path, "w").write(make_batch("a", 3))
    path = tmp_path / "w" / "seg-000000.jsonl"
    lines = path.read_text().splitlines()
    path.write_text("\n".join([lines[0][:10]] + lines[1:]) + "\n")  # a torn header
    caplog.set_level(logging.WARNING)
    reader = SegmentReader(tmp_path)
    assert ids(reader.read()) == ids(make_batch("a", 3)[GROUP:])  # a-0 may have lost a sample
    assert reader.stats.corrupt_records == 1 and reader.stats.incomplete_groups == 1
    assert f"corrupt header {path} line 1" in caplog.text


def test_a_segment_of_a_newer_format_is_refused(tmp_path):
    (tmp_path / "w").mkdir()
    (tmp_path / "w" / "seg-000000.jsonl").write_text('{"format": 2, "writer": "w"}\n')
    with pytest.raises(DataError, match="newer rft.*upgrade"):
        SegmentReader(tmp_path).read()


def test_foreign_files_and_bad_buffer_paths_name_the_path(tmp_path):
    SegmentWriter(tmp_path / "buf", "w").write(make_batch("a", 1))
    (tmp_path / "buf" / "w" / "notes.txt").write_text("hi")
    with pytest.raises(DataError, match=r"notes\.txt is not a buffer segment"):
        SegmentReader(tmp_path / "buf").read()
    (tmp_path / "buf" / "w" / "notes.txt").unlink()
    (tmp_path / "buf" / "stray.jsonl").write_text("{}")
    with pytest.raises(DataError, match=r"stray\.jsonl is not a writer folder"):
        SegmentReader(tmp_path / "buf").read()
    (tmp_path / "file").write_text("x")
    with pytest.raises(DataError, match="is not a folder"):
        SegmentReader(tmp_path / "file")
    with pytest.raises(StorageError, match=f"{tmp_path / 'file'} is a file, not a folder"):
        SegmentWriter(tmp_path / "file", "w")
    with pytest.raises(ConfigError, match="writer name"):
        SegmentWriter(tmp_path, "../escape")


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads any file")
def test_permission_denied_names_the_path(tmp_path):
    SegmentWriter(tmp_path, "w").write(make_batch("a", 1))
    (tmp_path / "w").chmod(0)
    try:
        with pytest.raises(DataError, match=rf"cannot list {tmp_path / 'w'}.*permission"):
            SegmentReader(tmp_path).read()
    finally:
        (tmp_path / "w").chmod(0o755)


def test_staleness_drop_or_keep_and_report(tmp_path):
    writer = SegmentWriter(tmp_path, "w")
    writer.write(make_batch("old", 1, version=1) + make_batch("new", 1, version=9))
    dropping = SegmentReader(tmp_path, max_staleness_versions=2)
    assert {r.group_id for r in dropping.read(current_version=10)} == {"new-0"}
    assert dropping.stats.stale_dropped == 4 and dropping.stats.max_staleness_seen == 1
    keeping = SegmentReader(tmp_path, max_staleness_versions=2, drop_stale=False)
    assert len(keeping.read(current_version=10)) == 8
    assert keeping.stats.stale_kept == 4 and keeping.stats.max_staleness_seen == 9


def test_release_deletes_consumed_segments_but_the_newest(tmp_path):
    writer = SegmentWriter(tmp_path, "w")
    for seq in range(4):
        writer.write(make_batch(f"s{seq}", 1))
    reader = SegmentReader(tmp_path)
    reader.read(12)
    saved = reader.cursor()  # seq 3 next: segments 0-2 consumed
    reader.read()
    removed = reader.release(saved)
    assert [p.name for p in removed] == [f"seg-00000{i}.jsonl" for i in range(3)]
    reader.release(reader.cursor())
    assert sorted(os.listdir(tmp_path / "w")) == ["seg-000003.jsonl"]  # the numbering anchor
    assert SegmentWriter(tmp_path, "w").next_seq == 4


def test_writers_and_reader_killed_at_random_consume_everything_exactly_once(tmp_path):
    """4 writer processes and 1 reader process, SIGKILLed and restarted at random moments."""
    buffer_dir, ckpt = tmp_path / "buffer", tmp_path / "trainer_ckpt.json"
    names, num_segments = [f"explorer-{i}" for i in range(4)], 30
    expected = buffer_worker.expected_ids(names, num_segments)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parent.parent)}
    commands = {
        n: [sys.executable, WORKER, "writer", str(buffer_dir), n, str(num_segments)] for n in names
    }
    commands["reader"] = [
        sys.executable,
        WORKER,
        "reader",
        str(buffer_dir),
        str(ckpt),
        str(len(expected)),
    ]
    procs = {n: subprocess.Popen(c, env=env) for n, c in commands.items()}
    rng, kills, start = random.Random(0), 0, time.monotonic()
    # At least 5 s of attacks and at least 10 kills (a fast machine finishes work between them).
    while time.monotonic() < start + 5.0 or (kills < 10 and time.monotonic() < start + 30.0):
        time.sleep(rng.uniform(0.05, 0.25))
        victim = rng.choice(sorted(procs))
        if procs[victim].poll() is None:
            procs[victim].send_signal(signal.SIGKILL)
            procs[victim].wait()
            kills += 1
        assert procs[victim].returncode in (0, -signal.SIGKILL), victim
        procs[victim] = subprocess.Popen(commands[victim], env=env)
    for name, proc in procs.items():
        assert proc.wait(timeout=40) == 0, name
    assert kills >= 10
    state = json.loads(ckpt.read_text())
    assert len(state["ids"]) == len(set(state["ids"])), "an experience was consumed twice"
    assert sorted(state["ids"]) == sorted(expected), "an experience was lost"
    leftovers = [p for p in buffer_dir.rglob("*") if ".tmp" in p.name]
    assert leftovers == [], "restarted writers must clear their dead predecessors' temporaries"
    assert SegmentReader(buffer_dir, cursor=state["cursor"]).read() == []


def test_factories_map_trinity_storage_types(tmp_path):
    assert isinstance(open_buffer_writer(tmp_path, "e0"), SegmentWriter)
    assert isinstance(open_buffer_reader(tmp_path, "jsonl"), SegmentReader)
    assert open_archive(tmp_path) is None
    with pytest.raises(NotSupportedError, match="'queue'"):
        open_buffer_reader(tmp_path, "redis")
    with pytest.raises(ConfigError, match="sqlite:///"):
        open_buffer_reader(tmp_path, "queue", "/some/dir")
    with pytest.raises(ConfigError, match="sqlite:///"):
        open_buffer_reader(tmp_path, "sql", "")


def test_sqlite_archive_records_consumed_experiences(tmp_path):
    SegmentWriter(tmp_path / "buffer", "e0").write(make_batch("a", 2))
    reader = open_buffer_reader(tmp_path, "queue", "sqlite:///archive/exp.db")
    with open_archive(tmp_path, "queue", "sqlite:///archive/exp.db", name="gsm8k") as archive:
        consumed = reader.read(4)
        archive.record(consumed, step=1)
        archive.record(consumed, step=1)  # re-recorded after a resume: still one row each
        archive.record(reader.read(4), step=2)
        assert archive.count() == 8
        assert archive.experiences(step=1) == consumed
    absolute = tmp_path / "abs.db"
    with open_archive(tmp_path, "queue", f"sqlite:///{absolute}") as archive:
        archive.record(consumed, step=3)
    assert absolute.exists() and (tmp_path / "archive" / "exp.db").exists()


def test_sql_transport_on_one_node(tmp_path, monkeypatch):
    for var in ("SLURM_JOB_NUM_NODES", "SLURM_NNODES"):
        monkeypatch.delenv(var, raising=False)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parent.parent)}
    db = tmp_path / "buffer.db"
    reader = open_buffer_reader(tmp_path, "sql", "sqlite:///buffer.db", num_nodes=1)
    procs = [
        subprocess.Popen([sys.executable, WORKER, "sqlwriter", str(db), f"e{i}", "6"], env=env)
        for i in range(2)
    ]
    expected = buffer_worker.expected_ids(["e0", "e1"], 6)
    got: list[Experience] = []
    saved = None
    deadline = time.monotonic() + 30
    while len(got) < len(expected) and time.monotonic() < deadline:
        batch = reader.read(10, timeout_s=0.2, poll_s=0.02)
        assert_whole_groups(batch)
        got.extend(batch)
        if saved is None and got:
            saved, at = reader.cursor(), len(got)
    assert all(p.wait(timeout=30) == 0 for p in procs)
    assert sorted(ids(got)) == sorted(expected)
    resumed = open_buffer_reader(tmp_path, "sql", "sqlite:///buffer.db", cursor=saved)
    assert sorted(ids(resumed.read())) == sorted(ids(got[at:]))
    assert resumed.release(resumed.cursor()) == len(expected)


def test_sql_transport_refused_on_several_nodes(tmp_path, monkeypatch):
    with pytest.raises(ConfigError, match="storage_type: queue") as err:
        check_sql_transport(num_nodes=2)
    assert "NFS" in str(err.value)
    monkeypatch.setenv("SLURM_JOB_NUM_NODES", "3")
    with pytest.raises(ConfigError, match="3 nodes.*queue"):
        open_buffer_writer(tmp_path, "e0", "sql", "sqlite:///b.db")
