"""data/arithmetic/generate.py: the quick start's taskset generator."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest

from rft.data import load_split
from rft.workflow.rewards import extract_ground_truth

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "data" / "arithmetic" / "generate.py"
_spec = importlib.util.spec_from_file_location("arithmetic_generate", SCRIPT)
gen = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gen)

NUMBERS = re.compile(r"\d+")


def solve(question: str) -> int:
    """The answer a question asks for, computed from its own words."""
    a, b = map(int, NUMBERS.findall(question))
    subtract = "-" in question or any(w in question for w in ("gives away", "lost"))
    return a - b if subtract else a + b


def test_rows_are_gsm8k_form_correct_and_mixed():
    train, test = gen.generate(seed=3, train=200, test=50, max_operand=20)
    assert len(train) == 200 and len(test) == 50
    for row in train + test:
        assert set(row) == {"question", "answer"}
        truth = int(extract_ground_truth(row["answer"]))
        assert truth == solve(row["question"]) and truth >= 0
        assert all(1 <= int(n) <= 20 for n in NUMBERS.findall(row["question"]))
    words = sum(not row["question"].startswith("What is") for row in train)
    assert words == 100  # alternating plain and word problems


def test_train_and_test_share_no_question_and_the_seed_fixes_the_rows():
    train, test = gen.generate(seed=3, train=200, test=50, max_operand=20)
    assert not {r["question"] for r in train} & {r["question"] for r in test}
    assert len({r["question"] for r in train}) == 200
    assert gen.generate(3, 200, 50, 20) == (train, test)
    assert gen.generate(4, 200, 50, 20) != (train, test)


def test_too_many_rows_for_the_range_is_a_clear_error():
    with pytest.raises(ValueError, match="distinct questions"):
        gen.generate(seed=1, train=2000, test=100, max_operand=2)


def test_the_script_writes_a_split_rft_loads(tmp_path):
    assert gen.main(["--out", str(tmp_path), "--train", "20", "--test", "6", "--seed", "5"]) == 0
    rows = load_split(str(tmp_path), "test", "quickstart", "quickstart", {"prompt_key": "question"})
    assert len(rows) == 6 and rows[0]["question"]
    first = (tmp_path / "quickstart" / "train.jsonl").read_text()
    gen.main(["--out", str(tmp_path), "--train", "20", "--test", "6", "--seed", "5"])
    assert (tmp_path / "quickstart" / "train.jsonl").read_text() == first
    assert json.loads(first.splitlines()[0])["answer"].endswith(
        f"#### {solve(json.loads(first.splitlines()[0])['question'])}"
    )


def test_the_committed_quickstart_split_is_the_scripts_output(tmp_path):
    gen.main(["--out", str(tmp_path)])
    for split in ("train", "test"):
        committed = REPO / "data" / "arithmetic" / "quickstart" / f"{split}.jsonl"
        assert committed.read_text() == (tmp_path / "quickstart" / f"{split}.jsonl").read_text()


def test_the_script_refuses_bad_sizes_with_a_message_not_a_traceback(tmp_path, capsys):
    for args in (["--train", "0"], ["--max-operand", "2", "--train", "500"]):
        with pytest.raises(SystemExit) as stop:
            gen.main(["--out", str(tmp_path), *args])
        assert stop.value.code == 2
    err = capsys.readouterr().err
    assert "--train and --test must be at least 1" in err and "distinct questions" in err
    assert not (tmp_path / "quickstart").exists()  # nothing written
