"""Agentic workflows on a real engine: the scripted plugin folder, one explorer step read back
from the buffer, the trainer's log-probs checked against vLLM's, and the overrides of a short
agent run through the endpoint."""

from __future__ import annotations

from pathlib import Path

import torch

from rft.trainer.batching import rows_from_experiences
from tests.helpers.runs import read_segments

PLUGINS = Path(__file__).resolve().parent.parent / "fixtures" / "plugins"


def explore(engine, cfg):
    from rft.explorer.loop import run_explorer

    result = run_explorer(cfg, engine)
    [records] = read_segments(cfg.run_dir)[f"{cfg.explorer.name}-0"].values()
    return result.metrics[0], records


def assert_trainer_scores_as_vllm(records, model_dir) -> None:
    """The trainer's forward gives the model tokens of ``records`` the log-probs vLLM recorded
    (the single-turn tolerance, 2e-3)."""
    from transformers import AutoModelForCausalLM

    from rft.trainer import engine as trainer_engine
    from rft.trainer.batching import collate

    rows = rows_from_experiences(records)
    micro = collate(
        rows, list(range(len(records))), torch.zeros_like(rows.response_mask), rows.rollout_logprobs
    )
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    counted = micro.response_mask > 0
    with torch.no_grad():
        scored = trainer_engine.forward_logprobs(model, micro, with_entropy=False)[0]
    torch.testing.assert_close(scored[counted], micro.old_logprobs[counted], rtol=0, atol=2e-3)


AGENT_RUN = (
    "buffer.total_steps=2",
    "buffer.batch_size=2",
    "algorithm.repeat_times=2",
    "explorer.eval_on_startup=false",
    "explorer.eval_interval=0",
    "model.max_response_tokens=6",
)
