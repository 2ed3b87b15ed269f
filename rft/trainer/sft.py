"""SFT / expert data: a dataset on disk -> tokenised ``Experience`` records (``source: expert``).

Data in: an :class:`~rft.config.ExperienceBufferConfig` with ``storage_type: file`` (path,
subset, split, ``format``: the row shape :func:`rft.data.prompt_type` and its columns) and the
model's tokenizer. Data out: experiences whose ``prompt_ids`` are the chat-templated prompt
(with the generation prompt) and ``response_ids`` the assistant reply; the loss counts the
reply only (every assistant turn with ``enable_concatenated_multi_turn``). :class:`SftSource`
serves them ``batch_size`` at a time, epoch after epoch; its cursor ``{"row": n}`` resumes it.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Mapping

from rft.buffer.experience import Experience
from rft.config.schema import ExperienceBufferConfig, FormatConfig
from rft.data import Messages, chat_messages, expert_columns, load_split, row_tools
from rft.errors import DataError

log = logging.getLogger(__name__)


def load_rows(
    buf: ExperienceBufferConfig,
    columns: Callable[[FormatConfig, str], dict[str, str]] = expert_columns,
) -> list[dict[str, Any]]:
    """All rows of the configured split as dicts, checked for the ``columns`` its format needs."""
    label = f"buffer.trainer_input.{buf.name}"
    return list(load_split(buf.path, buf.split, buf.subset_name, label, columns(buf.format, label)))


def _ids(out: Any) -> list[int]:
    """apply_chat_template's token ids, whether it returned a list or a BatchEncoding."""
    if isinstance(out, dict) or hasattr(out, "keys"):
        out = out["input_ids"]
    return list(out)


def render(
    tokenizer: Any,
    messages: Messages,
    fmt: FormatConfig,
    *,
    generation_prompt: bool,
    tools: list[dict[str, Any]] | None = None,
) -> list[int]:
    """Token ids of ``messages`` under the chat template (``format.chat_template`` when set),
    with ``format.enable_thinking`` as the template's thinking switch when set."""
    kwargs: dict[str, Any] = {"tools": tools} if tools else {}
    if fmt.chat_template:
        kwargs["chat_template"] = fmt.chat_template
    if fmt.enable_thinking is not None:
        kwargs["enable_thinking"] = fmt.enable_thinking
    return _ids(
        tokenizer.apply_chat_template(
            messages, add_generation_prompt=generation_prompt, tokenize=True, **kwargs
        )
    )


def reply_ids(
    tokenizer: Any,
    prompt: Messages,
    reply: Messages,
    fmt: FormatConfig,
    tools: list[dict[str, Any]] | None = None,
) -> tuple[list[int], list[int]]:
    """(prompt ids with the generation prompt, the reply's ids): the templated conversation
    past the prompt, or, for a template that renders the prompt differently once a reply
    follows, the last reply message's text and EOS."""
    prompt_ids = render(tokenizer, prompt, fmt, generation_prompt=True, tools=tools)
    full = render(tokenizer, prompt + reply, fmt, generation_prompt=False, tools=tools)
    if full[: len(prompt_ids)] == prompt_ids and len(full) > len(prompt_ids):
        return prompt_ids, full[len(prompt_ids) :]
    response = list(tokenizer(reply[-1]["content"], add_special_tokens=False)["input_ids"])
    if tokenizer.eos_token_id is not None:
        response.append(tokenizer.eos_token_id)
    return prompt_ids, response


def fit_length(
    prompt: list[int], response: list[int], max_model_len: int | None
) -> tuple[list[int], list[int]]:
    """Cut a sequence to ``max_model_len``: the response's tail first (at least one token
    kept), then the prompt's head."""
    if max_model_len is None or len(prompt) + len(response) <= max_model_len:
        return prompt, response
    response = response[: max(1, max_model_len - len(prompt))]
    return prompt[-(max_model_len - len(response)) :], response


def _turn_mask(
    tokenizer: Any, messages: Messages, fmt: FormatConfig, tools: list[dict[str, Any]] | None
) -> tuple[list[int], list[int], list[int]]:
    """``enable_concatenated_multi_turn``: (prompt ids up to the first assistant turn, the rest
    of the conversation, a mask that is 1 on every assistant turn's tokens). Each turn's tokens
    are those the template adds past the conversation before it (with the generation prompt);
    DataError for a template that rewrites earlier turns."""
    first = next(i for i, m in enumerate(messages) if m["role"] == "assistant")
    prompt = render(tokenizer, messages[:first], fmt, generation_prompt=True, tools=tools)
    full = render(tokenizer, messages, fmt, generation_prompt=False, tools=tools)
    mask = [0] * (len(full) - len(prompt))
    for i in range(first, len(messages)):
        if messages[i]["role"] != "assistant":
            continue
        start = len(render(tokenizer, messages[:i], fmt, generation_prompt=True, tools=tools))
        upto = render(tokenizer, messages[: i + 1], fmt, generation_prompt=False, tools=tools)
        if full[: len(upto)] != upto or start < len(prompt):
            raise DataError(
                "format.enable_concatenated_multi_turn: the chat template renders earlier "
                "turns differently once later ones follow; train on the last reply only "
                "(enable_concatenated_multi_turn: false) or set format.chat_template"
            )
        mask[start - len(prompt) : len(upto) - len(prompt)] = [1] * (len(upto) - start)
    return prompt, full[len(prompt) :], mask


def _reply_start(messages: Messages) -> int:
    """Index of the trailing assistant reply (its messages after the last other message)."""
    start = len(messages)
    while start > 0 and messages[start - 1]["role"] == "assistant":
        start -= 1
    if start == 0:
        raise DataError("the row holds only assistant messages: there is no prompt")
    return start


def tokenize_row(
    tokenizer: Any,
    row: Mapping[str, Any],
    buf: ExperienceBufferConfig,
    index: int,
    max_model_len: int | None,
) -> Experience:
    """One dataset row -> an expert experience (prompt = all but the last assistant reply)."""
    fmt = buf.format
    try:
        messages = chat_messages(row, fmt, with_reply=True)
        tools = row_tools(row, fmt)
        if fmt.enable_concatenated_multi_turn:
            prompt, response, mask = _turn_mask(tokenizer, messages, fmt, tools)
        else:
            split = _reply_start(messages)
            prompt, response = reply_ids(tokenizer, messages[:split], messages[split:], fmt, tools)
            mask = []
    except DataError as e:
        raise DataError(f"{buf.path} row {index}: {e}") from e
    prompt, response = fit_length(prompt, response, max_model_len)
    return Experience(
        task_id=f"sft-{index}",
        group_id=f"sft-{index}",
        prompt_ids=prompt,
        response_ids=response,
        action_mask=mask[: len(response)],
        source="expert",
        writer="sft",
    )


class SftSource:
    """Expert experiences in dataset order, ``batch_size`` per step, wrapping across epochs;
    with ``epochs`` (CHORD's ``auxiliary_buffers.<name>.total_epochs``), no more than that many
    passes (then :meth:`exhausted`)."""

    def __init__(
        self,
        buf: ExperienceBufferConfig,
        tokenizer: Any,
        max_model_len: int | None,
        cursor: dict[str, Any] | None = None,
        epochs: int | None = None,
    ):
        self.rows = load_rows(buf)
        if not self.rows:
            raise DataError(f"{buf.path} (split {buf.split!r}) has no rows to train on")
        self.buf, self.tokenizer, self.max_model_len = buf, tokenizer, max_model_len
        self.epochs = epochs
        self.served = int((cursor or {}).get("row", 0))

    def __len__(self) -> int:
        return len(self.rows)

    def limit(self) -> int | None:
        """Rows it serves in all (``total_epochs`` passes), or None: no end."""
        return None if self.epochs is None else self.epochs * len(self.rows)

    def exhausted(self, batch_size: int) -> bool:
        """Whether fewer than ``batch_size`` rows are left of its ``total_epochs`` passes."""
        limit = self.limit()
        return limit is not None and self.served + batch_size > limit

    def next_batch(self, batch_size: int) -> list[Experience]:
        limit = self.limit()
        if limit is not None:
            batch_size = max(0, min(batch_size, limit - self.served))
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
