"""SFT / expert data: a dataset on disk -> tokenised ``Experience`` records (``source: expert``).

Data in: an :class:`~rft.config.ExperienceBufferConfig` with ``storage_type: file`` (path,
subset, split, ``format.prompt_key``/``response_key`` or ``format.messages_key``) and the
model's tokenizer. Data out: experiences whose ``prompt_ids`` are the chat-templated prompt
(with the generation prompt) and ``response_ids`` the assistant reply; the loss counts the
response tokens only. :class:`SftSource` serves them ``batch_size`` at a time, epoch after
epoch, and its cursor (``{"row": n}``, rows served so far) resumes it exactly.
"""

from __future__ import annotations

import logging
from typing import Any

from rft.buffer.experience import Experience
from rft.config.schema import ExperienceBufferConfig
from rft.data import chat_messages, expert_columns, load_split
from rft.errors import DataError

log = logging.getLogger(__name__)


def load_rows(buf: ExperienceBufferConfig) -> list[dict[str, Any]]:
    """All rows of the configured split as dicts (checked for the configured columns)."""
    label = f"buffer.trainer_input.{buf.name}"
    return list(
        load_split(buf.path, buf.split, buf.subset_name, label, expert_columns(buf.format, label))
    )


def _ids(out: Any) -> list[int]:
    """apply_chat_template's token ids, whether it returned a list or a BatchEncoding."""
    if isinstance(out, dict) or hasattr(out, "keys"):
        out = out["input_ids"]
    return list(out)


def tokenize_row(
    tokenizer: Any,
    row: dict[str, Any],
    buf: ExperienceBufferConfig,
    index: int,
    max_model_len: int | None,
) -> Experience:
    """One dataset row -> an expert experience (prompt = all but the last assistant message)."""
    try:
        messages = chat_messages(row, buf.format, with_reply=True)
    except DataError as e:
        raise DataError(f"{buf.path} row {index}: {e}") from e
    prompt = _ids(
        tokenizer.apply_chat_template(messages[:-1], add_generation_prompt=True, tokenize=True)
    )
    full = _ids(tokenizer.apply_chat_template(messages, tokenize=True))
    if full[: len(prompt)] == prompt and len(full) > len(prompt):
        response = full[len(prompt) :]
    else:  # a template that renders the prompt differently once a reply follows
        response = list(tokenizer(messages[-1]["content"], add_special_tokens=False)["input_ids"])
        if tokenizer.eos_token_id is not None:
            response.append(tokenizer.eos_token_id)
    if max_model_len is not None and len(prompt) + len(response) > max_model_len:
        keep = max(1, max_model_len - len(prompt))
        response = response[:keep]
        prompt = prompt[-(max_model_len - len(response)) :]
    return Experience(
        task_id=f"sft-{index}",
        group_id=f"sft-{index}",
        prompt_ids=prompt,
        response_ids=response,
        source="expert",
        writer="sft",
    )


class SftSource:
    """Expert experiences in dataset order, ``batch_size`` per step, wrapping across epochs."""

    def __init__(
        self,
        buf: ExperienceBufferConfig,
        tokenizer: Any,
        max_model_len: int | None,
        cursor: dict[str, Any] | None = None,
    ):
        self.rows = load_rows(buf)
        if not self.rows:
            raise DataError(f"{buf.path} (split {buf.split!r}) has no rows to train on")
        self.buf, self.tokenizer, self.max_model_len = buf, tokenizer, max_model_len
        self.served = int((cursor or {}).get("row", 0))

    def __len__(self) -> int:
        return len(self.rows)

    def next_batch(self, batch_size: int) -> list[Experience]:
        out = []
        for _ in range(batch_size):
            index = self.served % len(self.rows)
            out.append(
                tokenize_row(self.tokenizer, self.rows[index], self.buf, index, self.max_model_len)
            )
            self.served += 1
        return out

    def cursor(self) -> dict[str, Any]:
        return {"row": self.served}
