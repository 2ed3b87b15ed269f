"""A small verifiers environment (verifiers >= 0.4, ``verifiers.v1``): products of two numbers,
with a calculator tool. Written as a verifiers user writes one, with nothing of rft in it; rft
trains on it with the ``verifiers_env`` workflow (``env_id: vf_products``, this folder on
``--plugin-dir``).

Each task asks for ``a * b`` (seeded, ``num_tasks`` of them). Rewards: ``correct`` (1 when the
last integer of the final reply is the product, weight 1) and ``concise`` (1 for a final reply of
at most ``max_reply_words`` words, weight 0.2); metric ``reply_words``. The ``Calculator``
toolset offers ``multiply``, which the model may call.
"""

from __future__ import annotations

import random
import re

import verifiers.v1 as vf

SYSTEM_PROMPT = "Answer with the number only. You may use the calculator."


class ProductData(vf.TaskData):
    answer: int


class ProductsConfig(vf.TasksetConfig):
    num_tasks: int = 64  # tasks in the taskset
    seed: int = 0  # the tasks' random numbers
    max_reply_words: int = 8  # the concise reward's limit


class Calculator(vf.Toolset):
    TOOL_PREFIX = None  # the model sees "multiply", not "calculator_multiply"

    @vf.tool
    async def multiply(self, a: int, b: int) -> int:
        """Multiply two integers."""
        return a * b


class ProductTask(vf.Task[ProductData, vf.State, vf.TaskConfig]):
    max_reply_words = ProductsConfig().max_reply_words

    @classmethod
    def toolsets(cls, config: vf.TaskConfig) -> list[vf.Toolset]:
        return [Calculator(vf.ToolsetConfig())]

    @vf.reward
    async def correct(self, task: ProductData, trace: vf.Trace) -> float:
        numbers = re.findall(r"-?\d+", trace.last_reply.replace(",", ""))
        return float(bool(numbers) and int(numbers[-1]) == task.answer)

    @vf.reward(weight=0.2)
    async def concise(self, trace: vf.Trace) -> float:
        return float(len(trace.last_reply.split()) <= self.max_reply_words)

    @vf.metric
    async def reply_words(self, trace: vf.Trace) -> float:
        return float(len(trace.last_reply.split()))


class ProductsTaskset(vf.Taskset[ProductTask, ProductsConfig]):
    def load(self):
        rng = random.Random(self.config.seed)
        for _ in range(self.config.num_tasks):
            a, b = rng.randint(2, 30), rng.randint(2, 30)
            data = ProductData(prompt=f"What is {a} * {b}?", system_prompt=SYSTEM_PROMPT, answer=a * b)  # fmt: skip
            yield ProductTask(data, self.config.task)


__all__ = ["ProductsTaskset"]
