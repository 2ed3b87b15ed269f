"""Explorer throughput: generated tokens/s through rft's explorer loop vs bare ``LLM.generate``.

One vLLM engine, one process. Each round runs ``--steps`` explorer steps (``run_explorer``:
prompt rendering, generation with logprobs, reward scoring, a sealed buffer segment, cursor,
heartbeat and metrics per step), then calls the engine's ``LLM.generate`` directly on the same
prompt token ids with the same ``SamplingParams``, one call per step. Rounds alternate so both
see the same machine state; a warm-up step runs first. Prints a table and the ratio
(loop tokens/s over bare tokens/s; target >= 95%). Usage::

    python -m benchmarks.explorer_bench --rounds 3 --steps 2
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import REPO, print_table, run_recorded

os.environ.setdefault("OMP_NUM_THREADS", str(len(os.sched_getaffinity(0))))

from rft.buffer.experience import Experience
from rft.config.load import config_from_dict
from rft.devtools import materialize_smollm2
from rft.explorer.loop import run_explorer


def make_cfg(root: Path, model: Path, args: argparse.Namespace):
    return config_from_dict(
        {
            "project": "bench",
            "name": "explorer",
            "checkpoint_root_dir": str(root),
            "mode": "explore",
            "algorithm": {"repeat_times": args.repeat},
            "model": {
                "model_path": str(model),
                "max_response_tokens": args.tokens,
                "max_model_len": 512,
                "temperature": 1.0,
            },
            "cluster": {"gpu_per_node": 0},
            "buffer": {
                "batch_size": args.batch,
                "explorer_input": {
                    "taskset": {
                        "name": "arithmetic",
                        "path": str(REPO / "data" / "arithmetic"),
                        "subset_name": "main",
                        "split": "train",
                        "format": {"prompt_key": "question", "response_key": "answer"},
                    },
                    "default_workflow_type": "math_workflow",
                },
            },
            "explorer": {
                "eval_on_startup": False,
                "eval_interval": 0,
                "rollout_model": {"dtype": args.dtype},
            },
            "monitor": {"monitor_type": "console"},
        }
    )


def step_prompts(run_dir: Path, step: int) -> list[list[int]]:
    seg = run_dir / "buffer" / "explorer-0" / f"seg-{step:06d}.jsonl"
    records = [Experience.from_dict(json.loads(line)) for line in seg.read_text().splitlines()[1:]]
    return list({r.group_id: r.prompt_ids for r in records}.values())  # one per group


def bare_generate(engine, prompts: list[list[int]], sampling) -> tuple[int, float]:
    """Tokens and seconds of one direct LLM.generate call (the engine's own SamplingParams)."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    from rft.explorer.engine import _params

    params = _params(SamplingParams, sampling, n=sampling.n)
    start = time.monotonic()
    outputs = engine.llm.generate(
        [TokensPrompt(prompt_token_ids=p) for p in prompts], [params] * len(prompts), use_tqdm=False
    )
    seconds = time.monotonic() - start
    return sum(len(c.token_ids) for o in outputs for c in o.outputs), seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=2, help="explorer steps per round")
    parser.add_argument("--batch", type=int, default=16, help="tasks per step")
    parser.add_argument("--repeat", type=int, default=8, help="samples per task")
    parser.add_argument("--tokens", type=int, default=64, help="max response tokens")
    parser.add_argument(
        "--dtype",
        default="float32",
        help="engine dtype (bfloat16 is ~6x slower on CPUs without AVX512-BF16)",
    )
    parser.add_argument(
        "--model", default=str(REPO / ".cache" / "models" / "SmolLM2-135M-Instruct")
    )
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    model = materialize_smollm2(args.model)
    root = Path(tempfile.mkdtemp(prefix="rft-explorer-bench-"))
    try:
        cfg = make_cfg(root, model, args)
        from rft.explorer.engine import Engine
        from rft.explorer.tasksets import sampling_args

        engine = Engine(cfg)
        sampling = sampling_args(cfg, cfg.training_tasksets()[0])
        run_explorer(cfg, engine, max_steps=1)  # warm-up (also loads the taskset once)
        loop_tokens = loop_s = gen_s = bare_tokens = bare_s = 0.0
        for _ in range(args.rounds):
            result = run_explorer(cfg, engine, max_steps=args.steps)
            for step, m in zip(result.steps, result.metrics):
                loop_tokens += m["generated_tokens"]
                loop_s += m["step_time_s"]
                gen_s += m["generate_time_s"]
                tokens, seconds = bare_generate(engine, step_prompts(cfg.run_dir, step), sampling)
                bare_tokens += tokens
                bare_s += seconds
        print_results(args, loop_tokens, loop_s, gen_s, bare_tokens, bare_s)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def print_results(args, loop_tokens, loop_s, gen_s, bare_tokens, bare_s) -> None:
    loop_rate, bare_rate = loop_tokens / loop_s, bare_tokens / bare_s
    print(
        f"\nSmolLM2-135M-Instruct {args.dtype}, {args.rounds} rounds x {args.steps} steps of {args.batch} tasks x {args.repeat} "
        f"samples x <= {args.tokens} tokens, OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS')}"
    )
    print_table(
        ["path", "generated tokens", "seconds", "tokens/s"],
        [
            ["bare LLM.generate", f"{bare_tokens:.0f}", f"{bare_s:.1f}", f"{bare_rate:.0f}"],
            [
                "explorer loop (whole step)",
                f"{loop_tokens:.0f}",
                f"{loop_s:.1f}",
                f"{loop_rate:.0f}",
            ],
            [
                "explorer loop (generate only)",
                f"{loop_tokens:.0f}",
                f"{gen_s:.1f}",
                f"{loop_tokens / gen_s:.0f}",
            ],
        ],
    )
    print(
        f"\nratio loop/bare: {loop_rate / bare_rate:.1%} (target >= 95%); loop overhead outside "
        f"generate: {(loop_s - gen_s) / loop_s:.1%} of step time"
    )


if __name__ == "__main__":
    sys.exit(run_recorded("explorer_bench", main))
