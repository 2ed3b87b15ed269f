"""Generation through the explorer's OpenAI-compatible endpoint vs the model handle's direct
calls, on the same prompts, the same engine, in one run.

All sides run the same episodes concurrently (``--concurrency`` in flight, their calls batched
by the explorer): "direct" calls ``model.chat``; the endpoint sides send the same messages to
the endpoint (HTTP on loopback, JSON, recording) as plain HTTP and through the OpenAI SDK (whose
client CPU time shares this machine's cores with the engine). Greedy decoding with a fixed
``max_tokens``, so all generate the same tokens; prints generated tokens/s for each, repeated
``--rounds`` times in alternation, and each median against direct's (target: >= 0.9).

    python -m benchmarks.endpoint_bench --tasks 64 --concurrency 32
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import urllib.request

from benchmarks.common import REPO, run_recorded

os.chdir(REPO)

from rft.config.load import load_config  # noqa: E402
from rft.explorer.calls import CALL_WAIT_S, EngineCalls  # noqa: E402
from rft.explorer.engine import Engine  # noqa: E402
from rft.explorer.episodes import EpisodeJob, EpisodePool  # noqa: E402
from rft.explorer.groups import agent_endpoint, episode_template  # noqa: E402
from rft.workflow import Workflow, WorkflowWithRecording  # noqa: E402
from rft.workflow.experience import Experience  # noqa: E402
from rft.workflow.task import GenerationConfig, Task  # noqa: E402


def _messages(task: Task) -> list[dict]:
    return [{"role": "user", "content": task.raw_task["question"]}]


class Direct(Workflow):
    def run(self) -> list[Experience]:
        replies = self.model.chat(_messages(self.task))
        for reply in replies:
            reply.reward = 0.0
        return replies


class ThroughEndpoint(WorkflowWithRecording):
    """An agent using the OpenAI SDK (its client's own CPU time counts: same process)."""

    async def run_async(self) -> dict:
        client = self.model.get_openai_client()
        client.chat.completions.create(model=self.model_name, messages=_messages(self.task))
        await self.update_reward(0.0)
        return {}


class ThroughEndpointHttp(WorkflowWithRecording):
    """The same request as plain HTTP (urllib): the endpoint's own cost."""

    async def run_async(self) -> dict:
        body = json.dumps({"model": self.model_name, "messages": _messages(self.task)})
        request = urllib.request.Request(
            self.base_url + "/chat/completions",
            data=body.encode(),
            headers={"Authorization": f"Bearer {self.api_key}"},
        )
        with urllib.request.urlopen(request, timeout=600) as answer:
            json.loads(answer.read())
        await self.update_reward(0.0)
        return {}


SIDES = {
    "direct (baseline)": Direct,
    "endpoint, plain HTTP": ThroughEndpointHttp,
    "endpoint, OpenAI SDK": ThroughEndpoint,
}


def measure(cfg, engine, workflow: type, tasks: int, concurrency: int, tokens: int) -> float:
    """Generated tokens per second over ``tasks`` one-call episodes."""
    args = GenerationConfig(temperature=0.0, max_tokens=tokens)
    jobs = [
        EpisodeJob(
            i,
            Task(workflow=workflow, rollout_args=args, raw_task={"question": f"What is {i} * 7?"}),
            1,
        )
        for i in range(tasks)
    ]
    start = time.monotonic()
    calls = EngineCalls(engine)  # the explorer's episode service, alone on the engine
    pool = EpisodePool(
        calls,
        episode_template(cfg),
        concurrency=concurrency,
        timeout_s=600,
        endpoint=agent_endpoint(cfg),
        model_path=cfg.model.model_path,
    )
    ids = pool.add(jobs)
    while not pool.idle:
        pool.poll()
        calls.serve_once(CALL_WAIT_S)
    results = [pool.pop(i) for i in ids]
    seconds = time.monotonic() - start
    failed = [r.error for r in results if not r.ok]
    if failed:
        raise SystemExit(f"{workflow.__name__}: {len(failed)} episodes failed: {failed[0]}")
    generated = sum(len(e.tokens) - e.prompt_length for r in results for e in r.experiences)
    return generated / seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/agent_openai_cpu.yaml")
    parser.add_argument("--tasks", type=int, default=64)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    cfg = load_config(args.config)
    cfg.explorer.rollout_model.enable_openai_api = True
    engine = Engine(cfg)
    for workflow in SIDES.values():  # warm-up: the first generates are slow
        measure(cfg, engine, workflow, 4, args.concurrency, args.max_tokens)
    rates: dict[str, list[float]] = {name: [] for name in SIDES}
    for _ in range(args.rounds):
        for name, workflow in SIDES.items():
            rates[name].append(
                measure(cfg, engine, workflow, args.tasks, args.concurrency, args.max_tokens)
            )
    base = statistics.median(rates["direct (baseline)"])
    print(f"{'calls':<24}{'tokens/s (median)':>18}{'vs direct':>10}   rounds")
    for name, values in rates.items():
        shown = ", ".join(f"{v:.1f}" for v in values)
        median = statistics.median(values)
        print(f"{name:<24}{median:>18.1f}{median / base:>9.2f}x   {shown}")
    print("target: the endpoint >= 0.9x direct")
    return 0


if __name__ == "__main__":
    sys.exit(run_recorded("endpoint_bench", main))
