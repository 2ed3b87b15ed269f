"""Token-faithful conversations: the engine's own tokens for every model turn, the chat
template's token delta for everything between turns, and a loss mask over model tokens only.

Data in: the messages of each model call and what the engine returned (:class:`Completion`).
Data out: :class:`Thread` samples (prompt ids, response ids, log-probs, action mask) ready to
train on. Earlier turns are never re-tokenized; a template that does not keep them as a prefix
(one that strips reasoning, say) starts a new sample and counts a prefix break. A conversation
handed back whole (:meth:`History.sample_of`) keeps the recorded replies' tokens and re-tokenizes
only the assistant messages that are not the model's replies as recorded (as Trinity does).
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Optional, Sequence

Messages = list[dict[str, Any]]

_SENTINEL = "\u2063rft-turn-end\u2063"  # assistant content whose rendering shows the turn's end
UNSCORED = -1  # Thread.response_versions of re-tokenized tokens not yet scored by the engine


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
    # asked for (ModelWrapper.logprobs): log p(prompt token i | the tokens before it), i >= 1
    prompt_logprobs: list[float] = field(default_factory=list)


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

    @cached_property
    def renders_tools(self) -> bool:
        """Whether the template shows tool schemas to the model (many small models' do not:
        SmolLM2's renders the same text with and without them)."""
        probe = [{"role": "user", "content": "hi"}]
        tool = {"type": "function", "function": {"name": "rft_probe_tool", "parameters": {}}}
        return "rft_probe_tool" in self.render(probe, tools=[tool])

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
    # The chat completion id the OpenAI-compatible endpoint answered this call with (None for
    # calls through chat()): update_reward(sample_ids=...) names samples by it.
    call_id: Optional[str] = None
    # Assistant messages in it the model did not write as recorded (edited, or never its reply
    # in the episode), trained from the chat template's tokens (History.sample_of).
    retokenized_turns: int = 0

    @property
    def tokens(self) -> list[int]:
        return self.prompt_ids + self.response_ids

    @property
    def unscored(self) -> bool:
        """Re-tokenized tokens wait for their log-probs and version (:meth:`score`)."""
        return UNSCORED in self.response_versions

    def score(self, token_logprobs: Sequence[float], version: int) -> None:
        """The re-tokenized tokens' log-probs (``token_logprobs[i]``: of token i + 1 given the
        ones before, as ``ModelWrapper.logprobs`` gives them) where the model is trained (0
        elsewhere), and weights ``version`` (masked ones: the version of the token before)."""
        before = version
        for p, v in enumerate(self.response_versions):
            if v != UNSCORED:
                before = v
                continue
            if self.action_mask[p]:
                self.logprobs[p] = float(token_logprobs[len(self.prompt_ids) + p - 1])
                before = version
            self.response_versions[p] = before
        self.versions += (version,) * self.retokenized_turns

    def cut(self, n_tokens: int) -> None:
        """Keep the first ``n_tokens`` tokens (at least the prompt)."""
        keep = max(n_tokens - len(self.prompt_ids), 0)
        for values in (self.response_ids, self.logprobs, self.action_mask, self.response_versions):
            del values[keep:]


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

    # -- a conversation as the workflow hands it back (ModelWrapper.convert_messages_to_experience)

    def sample_of(self, messages: Messages, tools: Optional[list] = None) -> list[Thread]:
        """The sample of ``messages`` up to their last assistant message, in parts (oldest
        first; several where a template that re-renders history split it). The longest
        recorded thread that starts the conversation is its base: the model's replies in it keep
        the engine's tokens and log-probs. Every other assistant message (one the workflow
        edited, or never the model's reply in this episode: in a call's prompt, or after the
        base) is re-tokenized as Trinity does: the template's tokens, trained (mask 1), counted
        in :attr:`Thread.retokenized_turns`, log-probs left to :meth:`Thread.score`. ``tools``:
        the schemas to render with (None: the base's). Empty without an assistant message."""
        last = max((i for i, m in enumerate(messages) if m.get("role") == "assistant"), default=-1)
        wanted = [dict(m) for m in messages[: last + 1]]
        if not wanted:
            return []
        with self.lock:
            base = self._base(wanted, tools)
        if base is not None:
            tools = base.tools if tools is None else tools
            base = self._own_prompt(base)  # None: its prompt is not the template's rendering
        end = self._continued(base, wanted, tools)
        parts = [end]
        while parts[0].predecessor is not None:
            parts.insert(0, parts[0].predecessor)
        return parts

    def _base(self, wanted: Messages, tools: Optional[list]) -> Optional[Thread]:
        """The latest of the longest recorded threads whose messages start ``wanted``."""
        best = None
        for thread in reversed(self.threads):
            k = len(thread.messages)
            if (
                k <= len(wanted)
                and thread.response_ids
                and (tools is None or thread.tools == tools)
                and all(_same_message(a, b) for a, b in zip(thread.messages, wanted))
                and (best is None or k > len(best.messages))
            ):
                best = thread
        return best

    def _own_prompt(self, base: Thread) -> Optional[Thread]:
        """``base`` with the assistant messages of its first call's prompt re-tokenized
        (trained); ``base`` itself when there are none; None when the prompt's ids are not the
        template's rendering of those messages."""
        root = base
        while root.extends is not None:
            root = root.extends
        context = root.messages[:-1]
        spots = [j for j, m in enumerate(context) if m.get("role") == "assistant"]
        if not spots:
            return base
        final = context[-1].get("role") == "assistant"  # a prefilled reply the model continued
        text = self.template.render(context, tools=base.tools, continue_final=final)
        if self.template.encode(text) != root.prompt_ids:
            return None
        segments: list[tuple[str, int]] = []
        at = 0
        for j in spots:
            start = _common(self.template.render(context[:j], tools=base.tools), text)
            end = _common(
                self.template.render(
                    context[: j + 1], tools=base.tools, add_generation_prompt=False
                ),
                text,
            )
            if start >= at and end > start:
                segments += [(text[at:start], 0), (text[start:end], 1)]
                at = end
        ids, mask = self._marked(segments + [(text[at:], 0)])
        first = mask.index(1) if 1 in mask else len(ids)
        part = _copy(base, base.messages)
        part.prompt_ids = ids[:first]
        added = len(ids) - first
        part.response_ids[:0] = ids[first:]
        part.logprobs[:0] = [0.0] * added
        part.action_mask[:0] = mask[first:]
        part.response_versions[:0] = [UNSCORED] * added
        part.retokenized_turns += len(segments) // 2
        part.turns += len(segments) // 2
        return part

    def _continued(self, part: Optional[Thread], wanted: Messages, tools: Optional[list]) -> Thread:
        """``part`` (None: nothing) continued to the end of ``wanted``: each later assistant
        message re-tokenized, the template's text before it masked; a new part where the
        template does not render the conversation so far as a prefix."""
        upto = len(part.messages) if part is not None else 0
        done = (
            ""
            if part is None
            else self.template.render(part.messages, tools=tools, add_generation_prompt=False)
        )
        owed = "" if part is None else self.template.owed_after(part.response_ids)
        segments: list[tuple[str, int]] = []
        for j in range(upto, len(wanted)):
            if wanted[j].get("role") != "assistant":
                continue
            full = self.template.render(wanted[: j + 1], tools=tools, add_generation_prompt=False)
            if not full.startswith(done):  # history re-rendered: what came before is a part
                part = self._extended(part, wanted[:upto], tools, segments)
                part, done, owed, segments = Thread([], tools, [], predecessor=part), "", "", []
            k = max(_common(self.template.render(wanted[:j], tools=tools), full), len(done))
            segments += [(owed + full[len(done) : k], 0), (full[k:], 1)]
            done, owed, upto = full, "", j + 1
        return self._extended(part, wanted, tools, segments)

    def _extended(
        self,
        part: Optional[Thread],
        messages: Messages,
        tools: Optional[list],
        segments: list[tuple[str, int]],
    ) -> Thread:
        """A copy of ``part`` (None or one without tokens: a new sample, prompt first) with the
        tokens of ``segments`` ((text, trained) pairs) appended."""
        if not segments:
            assert part is not None, "a conversation's sample has an assistant message"
            return part
        ids, mask = self._marked(segments)
        if part is None or not part.prompt_ids:
            first = mask.index(1) if 1 in mask else len(ids)
            predecessor = None if part is None else part.predecessor
            part = Thread(list(messages), tools, ids[:first], predecessor=predecessor)
            ids, mask = ids[first:], mask[first:]
        else:
            part = _copy(part, messages)
        part.response_ids += ids
        part.logprobs += [0.0] * len(ids)
        part.action_mask += mask
        part.response_versions += [UNSCORED] * len(ids)
        turns = sum(trained for _, trained in segments)
        part.retokenized_turns += turns
        part.turns += turns
        part.finish_reason = "stop"
        return part

    def _marked(self, segments: list[tuple[str, int]]) -> tuple[list[int], list[int]]:
        """The ids of the segments' text encoded whole, and a mask with 1 on the tokens of the
        trained segments, located by encoding the text up to each end (Trinity's method: it
        assumes a prefix's tokens start the whole text's)."""
        text = "".join(piece for piece, _ in segments)
        ids = self.template.encode(text)
        mask = [0] * len(ids)
        at = 0
        for piece, trained in segments:
            start = len(self.template.encode(text[:at])) if at else 0
            at += len(piece)
            if trained and piece:
                end = len(self.template.encode(text[:at]))
                mask[start:end] = [1] * (end - start)
        return ids, mask


def _common(a: str, b: str) -> int:
    """Length of the longest common prefix of ``a`` and ``b``."""
    return len(os.path.commonprefix([a, b]))


def _copy(thread: Thread, messages: Messages) -> Thread:
    """A new sample with ``thread``'s tokens and ``messages`` (not a recorded call)."""
    return Thread(
        list(messages),
        thread.tools,
        list(thread.prompt_ids),
        list(thread.response_ids),
        list(thread.logprobs),
        list(thread.action_mask),
        thread.turns,
        thread.versions,
        list(thread.response_versions),
        thread.finish_reason,
        predecessor=thread.predecessor,
        retokenized_turns=thread.retokenized_turns,
    )
