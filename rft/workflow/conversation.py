"""Token-faithful conversations: the engine's own tokens for every model turn, the chat
template's token delta for everything between turns, and a loss mask over model tokens only.

Data in: the messages of each model call and what the engine returned (:class:`Completion`).
Data out: :class:`Thread` samples (prompt ids, response ids, log-probs, action mask) ready to
train on. Earlier turns are never re-tokenized; a template that does not keep them as a prefix
(one that strips reasoning, say) starts a new sample and counts a prefix break.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Optional, Sequence

Messages = list[dict[str, Any]]

_SENTINEL = "\u2063rft-turn-end\u2063"  # assistant content whose rendering shows the turn's end


@dataclass(frozen=True)
class Completion:
    """One engine reply to one prompt (token ids in, token ids and log-probs out)."""

    prompt_ids: list[int]
    response_ids: list[int]
    logprobs: list[float]  # one per response token
    finish_reason: str  # "stop", "length", ...
    text: str
    model_version: int = 0  # weights version that generated it (its first token's)
    # per response token, the weights version that generated it, when the engine labels them
    # (a streaming explorer loads weights while requests run); empty: all ``model_version``
    versions: list[int] = field(default_factory=list)


class ChatTemplate:
    """A tokenizer's chat template: renders messages and says what it adds around turns."""

    def __init__(
        self,
        tokenizer: Any,
        chat_template: Optional[str] = None,
        enable_thinking: Optional[bool] = None,
    ):
        self.tokenizer = tokenizer
        self.lock = threading.Lock()  # episodes run in threads; one tokenizer call at a time
        self.chat_template = chat_template
        self.extra = {} if enable_thinking is None else {"enable_thinking": enable_thinking}

    def render(
        self,
        messages: Messages,
        *,
        tools: Optional[list] = None,
        add_generation_prompt: bool = True,
        continue_final: bool = False,
    ) -> str:
        kwargs = dict(self.extra)
        if tools:
            kwargs["tools"] = tools
        # OpenAI's assistant message with tool calls has content null (or none): templates
        # that concatenate the content get "".
        messages = [m if m.get("content") is not None else {**m, "content": ""} for m in messages]
        with self.lock:
            return self.tokenizer.apply_chat_template(
                messages,
                tokenize=False,
                chat_template=self.chat_template,
                add_generation_prompt=add_generation_prompt and not continue_final,
                continue_final_message=continue_final,
                **kwargs,
            )

    def encode(self, text: str) -> list[int]:
        with self.lock:
            return list(self.tokenizer.encode(text, add_special_tokens=False))

    def decode(self, ids: Sequence[int]) -> str:
        with self.lock:
            return self.tokenizer.decode(list(ids), skip_special_tokens=False)

    @cached_property
    def end_of_turn(self) -> str:
        """Text the template writes right after an assistant message's content (ChatML:
        ``<|im_end|>\\n``)."""
        probe = self.render(
            [{"role": "user", "content": "hi"}, {"role": "assistant", "content": _SENTINEL}],
            add_generation_prompt=False,
        )
        at = probe.rfind(_SENTINEL)
        return "" if at < 0 else probe[at + len(_SENTINEL) :]

    def owed_after(self, response_ids: Sequence[int]) -> str:
        """Text the template still adds after a model turn that ended with ``response_ids``: the
        end of turn, less the stop token the engine already produced (ChatML: ``\\n``)."""
        end = self.end_of_turn
        if response_ids:
            last = self.decode(response_ids[-1:])
            if last and end.startswith(last):
                return end[len(last) :]
        return end


@dataclass
class Thread:
    """One token-faithful sample: a first prompt, then model turns and the tokens between."""

    messages: Messages  # the conversation, ending with the model's last reply
    tools: Optional[list]  # the tool schemas the conversation was rendered with
    prompt_ids: list[int]
    response_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)  # 0 where the mask is 0
    action_mask: list[int] = field(default_factory=list)  # 1: the model generated the token
    turns: int = 0  # model turns in the sample
    versions: tuple[int, ...] = ()  # weights versions of its turns
    response_versions: list[int] = field(default_factory=list)  # per response token
    finish_reason: str = ""  # of the last turn
    extended: bool = False  # a later thread continues this one (so this is not a sample)
    # The sample this conversation was in before a prefix break started this one (or None).
    predecessor: Optional["Thread"] = None
    # The thread this one continues (its parent call).
    extends: Optional["Thread"] = field(default=None, repr=False, compare=False)

    @property
    def tokens(self) -> list[int]:
        return self.prompt_ids + self.response_ids


def _same_message(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Same role and content; ids and tool calls compared where both messages carry them."""
    if a.get("role") != b.get("role") or a.get("content") != b.get("content"):
        return False
    return all(a[k] == b[k] for k in ("tool_calls", "tool_call_id", "name") if k in a and k in b)


class History:
    """The threads of one episode; each model call extends a thread or starts one."""

    def __init__(self, template: ChatTemplate):
        self.template = template
        self.threads: list[Thread] = []
        self.prefix_breaks = 0  # calls whose history the template re-rendered differently
        # Calls may come from several threads at once (the OpenAI endpoint's request handlers).
        self.lock = threading.RLock()

    def prompt_for(
        self, messages: Messages, tools: Optional[list] = None, continue_final: bool = False
    ) -> tuple[list[int], Optional[Thread]]:
        """Prompt ids for a call with ``messages`` and the thread it extends (None: a new one).
        Extending, the ids are the thread's own tokens, then the template's text between the
        model's last token and the next generation prompt, encoded alone."""
        with self.lock:
            return self._prompt_for(messages, tools, continue_final)

    def _prompt_for(
        self, messages: Messages, tools: Optional[list], continue_final: bool
    ) -> tuple[list[int], Optional[Thread]]:
        parent = self._extendable(messages, tools)
        if parent is not None and not continue_final:
            before = self.template.render(parent.messages, tools=tools, add_generation_prompt=False)
            after = self.template.render(messages, tools=tools)
            if after.startswith(before):
                added = self.template.owed_after(parent.response_ids) + after[len(before) :]
                return parent.tokens + self.template.encode(added), parent
            self.prefix_breaks += 1
        text = self.template.render(messages, tools=tools, continue_final=continue_final)
        return self.template.encode(text), None

    def _extendable(self, messages: Messages, tools: Optional[list]) -> Optional[Thread]:
        """The longest thread whose messages start ``messages``, with only non-model messages
        after them (a message the model did not write as its turn is never trained as one)."""
        best = None
        for thread in self.threads:
            k = len(thread.messages)
            if (
                k < len(messages)
                and thread.tools == tools
                and all(_same_message(a, b) for a, b in zip(thread.messages, messages))
                and all(m.get("role") != "assistant" for m in messages[k:])
                and (best is None or k > len(best.messages))
            ):
                best = thread
        return best

    def record(
        self,
        messages: Messages,
        tools: Optional[list],
        prompt_ids: list[int],
        parent: Optional[Thread],
        completion: Completion,
        reply: dict[str, Any],
    ) -> Thread:
        """The thread after the model answered ``messages`` with ``completion`` (``reply``: the
        assistant message as the workflow will append it)."""
        with self.lock:
            return self._record(messages, tools, prompt_ids, parent, completion, reply)

    def _record(
        self,
        messages: Messages,
        tools: Optional[list],
        prompt_ids: list[int],
        parent: Optional[Thread],
        completion: Completion,
        reply: dict[str, Any],
    ) -> Thread:
        if parent is None:
            # A conversation that could not be continued token for token goes on here.
            thread = Thread(
                list(messages) + [reply],
                tools,
                list(prompt_ids),
                predecessor=self._extendable(messages, tools),
            )
        else:
            added = prompt_ids[len(parent.tokens) :]
            thread = Thread(
                list(messages) + [reply],
                tools,
                list(parent.prompt_ids),
                parent.response_ids + added,
                parent.logprobs + [0.0] * len(added),
                parent.action_mask + [0] * len(added),
                parent.turns,
                parent.versions,
                # tokens between turns (not trained) carry the version of the turn before them
                parent.response_versions
                + (parent.response_versions[-1:] or [completion.model_version]) * len(added),
                extends=parent,
            )
            parent.extended = True
        thread.response_ids += completion.response_ids
        thread.logprobs += completion.logprobs
        thread.action_mask += [1] * len(completion.response_ids)
        thread.turns += 1
        thread.versions += (completion.model_version,)
        thread.response_versions += completion.versions or [completion.model_version] * len(
            completion.response_ids
        )
        thread.finish_reason = completion.finish_reason
        self.threads.append(thread)
        return thread

    def samples(self) -> list[Thread]:
        """Threads no later call continued: the episode's samples, in the order they began."""
        with self.lock:
            return [t for t in self.threads if not t.extended and t.response_ids]

    def retract(self, thread: Thread) -> None:
        """Forget a call whose answer never reached its caller (it is not trained on); the
        thread it continued is a sample again unless another call continues it."""
        with self.lock:
            self.threads = [t for t in self.threads if t is not thread]
            parent = thread.extends
            if parent is not None and not any(t.extends is parent for t in self.threads):
                parent.extended = False

    def find(self, messages: Messages) -> Optional[Thread]:
        """The sample covering ``messages`` up to their last assistant message, if any."""
        last = max((i for i, m in enumerate(messages) if m.get("role") == "assistant"), default=-1)
        wanted = messages[: last + 1]
        for thread in reversed(self.threads):
            if len(thread.messages) == len(wanted) and all(
                _same_message(a, b) for a, b in zip(thread.messages, wanted)
            ):
                return thread
        return None
