"""The agentic workload of ``python -m benchmarks.async_bench --taskset slow-env``: the quick start's
arithmetic in two model turns with an environment step between them whose time has a long tail,
as a sandboxed program, a web page or a simulator has (most steps ``FAST_S``, one episode in
``SLOW_EVERY`` takes ``SLOW_S``). The time is seeded by the task and run, so every mode waits the
same; the environment only waits (it holds no core), as a remote one would. Reward: the last
number of the second reply against the answer (the quick start's accuracy).
"""

from __future__ import annotations

import random
import time

from rft.workflow import MultiTurnWorkflow, register_workflow
from rft.workflow.rewards import answers_match, last_number

FAST_S = 0.2  # most environment steps
SLOW_S = 30.0  # the tail: longer than a trainer step of the quick start on 2 cores
SLOW_EVERY = 8  # one episode in this many is slow
SEED = 34


def environment_seconds(task_id: str, run: int) -> float:
    """The environment step's time for one run of one task (seeded: the same in every mode)."""
    draw = random.Random(f"{SEED}:{task_id}:{run}").random()
    return SLOW_S if draw < 1 / SLOW_EVERY else FAST_S


@register_workflow("slow_env_workflow")
class SlowEnvWorkflow(MultiTurnWorkflow):
    can_repeat = False  # each run its own episode, waiting on its own environment

    def run(self):
        system = self.task.format_args.system_prompt or "Solve the problem."
        messages = [
            {"role": "system", "content": system},
            {"role": "user", "content": self.task.task_desc or ""},
        ]
        first = self.model.chat(messages)[0]
        messages.append({"role": "assistant", "content": first.response_text})
        time.sleep(environment_seconds(str(self.task.task_id), self.run_id_base))
        messages.append({"role": "user", "content": "Check it. End with the final number."})
        second = self.model.chat(messages)[0]
        messages.append({"role": "assistant", "content": second.response_text})
        correct = answers_match(
            last_number(second.response_text or "") or "", self.task.truth or ""
        )
        return [self.process_messages_to_experience(messages, float(correct))]
