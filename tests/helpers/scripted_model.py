"""A model handle answered by a script, for running workflow classes in fast tests: each reply
is the next text of the script, tokenized with the real chat template (no engine)."""

from __future__ import annotations

import dataclasses
from concurrent.futures import Future
from typing import Any, Mapping, Optional, Sequence

from rft.workflow.conversation import ChatTemplate, Completion
from rft.workflow.model import ModelWrapper
from rft.workflow.task import GenerationConfig


class ScriptedService:
    """The explorer's side of the model handle: replies in script order, ``n`` per call; a text
    in ``cut`` ends at the length limit. ``calls`` keeps (prompt ids, sampling keywords) of each."""

    max_model_len: Optional[int] = None
    model_version = 0

    def __init__(self, template: ChatTemplate, script: Sequence[str], cut: Sequence[str] = ()):
        self.template, self.script, self.cut = template, list(script), set(cut)
        self.calls: list[tuple[list[int], dict[str, Any]]] = []

    def submit(self, prompt_ids, sampling, *_) -> Future:
        if not isinstance(sampling, Mapping):
            sampling = dataclasses.asdict(sampling)
        self.calls.append((list(prompt_ids), dict(sampling)))
        completions = []
        for _ in range(sampling.get("n", 1)):
            text = self.script.pop(0)
            ids = self.template.encode(text)
            finish = "length" if text in self.cut else "stop"
            completions.append(Completion(list(prompt_ids), ids, [-0.5] * len(ids), finish, text))
        future: Future = Future()
        future.set_result(completions)
        return future

    def parse_reasoning(self, text):
        return None

    def parse_tool_calls(self, text, tools):
        return text, []


def scripted_model(
    template: ChatTemplate, script: Sequence[str], cut: Sequence[str] = ()
) -> tuple[ModelWrapper, ScriptedService]:
    """A model handle answering with ``script`` (16-token replies by default), and its service."""
    service = ScriptedService(template, script, cut)
    return ModelWrapper(service, template, GenerationConfig(max_tokens=16)), service
