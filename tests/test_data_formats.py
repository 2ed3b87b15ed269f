"""Trinity's SFT/DPO row shapes (``format.prompt_type``: messages, plaintext, chatpair) read as
Trinity-RFT reads them (trinity/buffer/schema/formatter.py), the columns each needs, and the
advice a dataset with other columns gets, at ``--dry-run`` too."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rft import data
from rft.config.load import config_from_dict
from rft.errors import ConfigError, DataError
from rft.launch.cli import dry_run
from rft.trainer.dpo import tokenize_pair
from rft.trainer.sft import tokenize_row

USER = {"role": "user", "content": "What is 2 + 2?"}
REPLY = {"role": "assistant", "content": "4"}


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


# ----------------------------------------------------------------------------- shapes


def test_prompt_type_defaults_follow_messages_key():
    assert data.prompt_type({}) == "plaintext"
    assert data.prompt_type({"messages_key": "chat"}) == "messages"
    assert data.prompt_type({"prompt_type": "chatpair", "messages_key": "chat"}) == "chatpair"
    # Trinity's default column for prompt_type: messages
    assert data.expert_columns({"prompt_type": "messages"}) == {"format.messages_key": "message"}


def test_sft_messages_plaintext_and_chatpair_give_the_same_chat():
    system = {"role": "system", "content": "Be brief."}
    messages = data.chat_messages(
        {"messages": [system, USER, REPLY]},
        {"prompt_type": "messages", "messages_key": "messages"},
        with_reply=True,
    )
    plaintext = data.chat_messages(
        {"q": USER["content"], "a": "4", "sys": "Be brief."},
        {
            "prompt_type": "plaintext",
            "prompt_key": "q",
            "response_key": "a",
            "system_prompt_key": "sys",
            "system_prompt": "ignored: the column wins",
        },
        with_reply=True,
    )
    chatpair = data.chat_messages(
        {"p": [system, USER], "r": [REPLY]},
        {"prompt_type": "chatpair", "prompt_key": "p", "response_key": "r"},
        with_reply=True,
    )
    assert messages == plaintext == chatpair == [system, USER, REPLY]


def test_messages_as_a_json_string_and_extra_null_keys():
    row = {"message": json.dumps([USER, {**REPLY, "tool_calls": None}])}
    got = data.chat_messages(row, {"prompt_type": "messages"}, with_reply=True)
    assert got == [USER, REPLY]  # a key the table gave every row (None here) is left out
    with pytest.raises(DataError, match="must end with an assistant reply"):
        data.chat_messages({"message": [USER]}, {"prompt_type": "messages"}, with_reply=True)


def test_chatpair_prompt_for_generation_drops_trailing_reply():
    row = {"prompt": [USER, REPLY], "response": "4"}
    assert data.chat_messages(row, {"prompt_type": "chatpair"}) == [USER]
    assert data.task_columns({"prompt_type": "chatpair"}) == {
        "format.prompt_key": "prompt",
        "format.response_key": "response",
    }


def test_preference_shapes():
    plain = data.preference_messages(
        {"prompt": USER["content"], "chosen": "4", "rejected": "5"}, {"prompt_type": "plaintext"}
    )
    msgs = data.preference_messages(
        {"conv": [USER], "good": [REPLY], "bad": {"role": "assistant", "content": "5"}},
        {
            "prompt_type": "messages",
            "messages_key": "conv",
            "chosen_key": "good",
            "rejected_key": "bad",
        },
    )
    pair = data.preference_messages(
        {"prompt": [USER], "chosen": [REPLY], "rejected": "5"}, {"prompt_type": "chatpair"}
    )
    rejected = {"role": "assistant", "content": "5"}
    assert plain == msgs == pair == ([USER], [REPLY], [rejected])
    with pytest.raises(DataError, match="'chosen' must end with an assistant reply"):
        data.preference_messages(
            {"prompt": "q", "chosen": [USER], "rejected": "5"}, {"prompt_type": "plaintext"}
        )


def test_pair_columns():
    fmt = {"prompt_type": "plaintext", "system_prompt_key": "sys"}
    assert data.pair_columns(fmt, "b") == {
        "b.format.prompt_key": "prompt",
        "b.format.system_prompt_key": "sys",
        "b.format.chosen_key": "chosen",
        "b.format.rejected_key": "rejected",
    }
    assert data.pair_columns({"prompt_type": "messages", "messages_key": "m"}) == {
        "format.messages_key": "m",
        "format.chosen_key": "chosen",
        "format.rejected_key": "rejected",
    }


# ----------------------------------------------------------------------------- column advice


def test_missing_columns_name_what_the_dataset_has_and_what_to_set():
    with pytest.raises(DataError) as e:
        data.check_columns(["messages", "id"], data.expert_columns({}, "buf"), "buf")
    assert "columns: messages, id" in str(e.value)
    assert (
        "the dataset has a `messages` column: set buf.format.prompt_type: messages and "
        "buf.format.messages_key: messages" in str(e.value)
    )
    with pytest.raises(DataError, match="set format.messages_key: conversations"):
        data.check_columns(["conversations"], data.expert_columns({"prompt_type": "messages"}), "x")
    with pytest.raises(DataError, match="set format.prompt_type: plaintext"):
        data.check_columns(
            ["prompt", "response"], data.expert_columns({"prompt_type": "messages"}), "x"
        )


def test_format_keys_are_typed():
    base = {
        "mode": "train",
        "model": {"model_path": "/m"},
        "algorithm": {"algorithm_type": "sft"},
        "buffer": {"trainer_input": {"experience_buffer": {"path": "/d", "format": {}}}},
    }
    fmt = base["buffer"]["trainer_input"]["experience_buffer"]["format"]
    fmt.update(prompt_type="chatpair", chosen_key="c", rejected_key="r", tools_key="t")
    got = config_from_dict(base).buffer.trainer_input.experience_buffer.format
    assert (got.prompt_type, got.chosen_key, got.rejected_key) == ("chatpair", "c", "r")
    fmt["prompt_type"] = "chat"
    with pytest.raises(ConfigError, match="prompt_type"):
        config_from_dict(base)


def dpo_config(tmp_path: Path, model: Path, dataset: Path, **fmt) -> dict:
    return {
        "mode": "train",
        "project": "p",
        "name": "dpo",
        "checkpoint_root_dir": str(tmp_path / "ck"),
        "model": {"model_path": str(model)},
        "cluster": {"gpu_per_node": 0},
        "algorithm": {"algorithm_type": "dpo"},
        "buffer": {
            "train_batch_size": 2,
            "total_steps": 1,
            "trainer_input": {
                "experience_buffer": {"storage_type": "file", "path": str(dataset), "format": fmt}
            },
        },
    }


def test_dry_run_checks_dpo_columns(tmp_path, tiny_model_dir):
    pairs = write_jsonl(
        tmp_path / "pairs.jsonl", [{"question": "q", "chosen": "a", "rejected": "b"}]
    )
    cfg = config_from_dict(dpo_config(tmp_path, tiny_model_dir, pairs, prompt_type="plaintext"))
    with pytest.raises(
        DataError, match=r"format.prompt_key='prompt' is not a column.*question, chosen"
    ):
        dry_run(cfg, "x")
    cfg = config_from_dict(
        dpo_config(tmp_path, tiny_model_dir, pairs, prompt_type="plaintext", prompt_key="question")
    )
    assert "dpo" in dry_run(cfg, "x")
    chats = write_jsonl(
        tmp_path / "chats.jsonl", [{"messages": [USER], "chosen": [REPLY], "rejected": "5"}]
    )
    cfg = config_from_dict(dpo_config(tmp_path, tiny_model_dir, chats))
    with pytest.raises(DataError, match="has a `messages` column: set .*prompt_type: messages"):
        dry_run(cfg, "x")


# ----------------------------------------------------------------------------- tokenising


def test_tokenized_shapes_agree(tiny_model_dir):
    from transformers import AutoTokenizer

    from rft.config.schema import ExperienceBufferConfig, FormatConfig

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    plain = ExperienceBufferConfig(path="d", format=FormatConfig(prompt_type="plaintext"))
    chat = ExperienceBufferConfig(path="d", format=FormatConfig(prompt_type="messages"))
    a = tokenize_row(tok, {"prompt": USER["content"], "response": "4"}, plain, 0, None)
    b = tokenize_row(tok, {"message": [USER, REPLY]}, chat, 0, None)
    assert (a.prompt_ids, a.response_ids) == (b.prompt_ids, b.response_ids)
    assert tok.decode(a.response_ids).startswith("4")
    chosen, rejected = tokenize_pair(
        tok, {"prompt": USER["content"], "chosen": "4", "rejected": "5"}, plain, 3, None
    )
    assert chosen.prompt_ids == rejected.prompt_ids == a.prompt_ids
    assert chosen.response_ids == a.response_ids and rejected.response_ids != a.response_ids
    assert chosen.group_id == rejected.group_id == "dpo-3"


def test_multi_turn_masks_every_assistant_turn(tiny_model_dir):
    from transformers import AutoTokenizer

    from rft.config.schema import ExperienceBufferConfig, FormatConfig

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    turns = [USER, REPLY, {"role": "user", "content": "And 3 + 3?"}, {**REPLY, "content": "6"}]
    buf = ExperienceBufferConfig(
        path="d", format=FormatConfig(prompt_type="messages", enable_concatenated_multi_turn=True)
    )
    exp = tokenize_row(tok, {"message": turns}, buf, 0, None)
    masked = [t for t, m in zip(exp.response_ids, exp.action_mask) if m]
    unmasked = [t for t, m in zip(exp.response_ids, exp.action_mask) if not m]
    assert "4" in tok.decode(masked) and "6" in tok.decode(masked)
    assert "And 3 + 3?" in tok.decode(unmasked) and "And 3" not in tok.decode(masked)
    # without it only the last reply trains, the earlier turns are prompt
    last = tokenize_row(
        tok,
        {"message": turns},
        ExperienceBufferConfig(path="d", format=FormatConfig(prompt_type="messages")),
        0,
        None,
    )
    assert "And 3 + 3?" in tok.decode(last.prompt_ids) and not last.action_mask


def test_format_enable_thinking_reaches_the_chat_template(tiny_model_dir):
    """Trinity's FormatConfig.enable_thinking (SFT/DPO rows): the template's switch; its
    default is model.enable_thinking (BufferConfigValidator)."""
    from transformers import AutoTokenizer

    from rft.config.load import config_from_dict
    from rft.config.schema import ExperienceBufferConfig, FormatConfig

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    template = (
        "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}assistant:{% if enable_thinking %} THINKING{% endif %}"
        "{% endif %}"
    )

    def prompt(thinking):
        fmt = FormatConfig(prompt_type="messages", chat_template=template, enable_thinking=thinking)
        exp = tokenize_row(
            tok, {"message": [USER, REPLY]}, ExperienceBufferConfig(format=fmt), 0, None
        )
        return tok.decode(exp.prompt_ids)

    assert "THINKING" in prompt(True) and "THINKING" not in prompt(False)
    cfg = config_from_dict(
        {
            "mode": "train",
            "model": {"model_path": "/m", "enable_thinking": True},
            "algorithm": {"algorithm_type": "sft"},
            "buffer": {
                "train_batch_size": 2,
                "trainer_input": {"experience_buffer": {"path": "/d", "storage_type": "file"}},
            },
            "cluster": {"node_num": 1, "gpu_per_node": 2},
        }
    )
    assert cfg.buffer.trainer_input.experience_buffer.format.enable_thinking is True
