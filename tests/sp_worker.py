"""One rank of the Ulysses sequence-parallel check (``tests/test_sequence_parallel.py``), under
torchrun with gloo: the same micro-batch of a tiny Llama scored whole on each rank, then split
across a sequence group of all ranks. Rank 0 writes what the test compares.

    torchrun --nproc_per_node 2 tests/sp_worker.py MODEL_DIR OUT_JSON

OUT_JSON: the largest differences between the two ways of the log-probs, entropies and loss
(every rank must get the whole micro-batch's), and of the gradients (the group's summed
gradients over its size, what DeepSpeed's average gives, against the whole pass's).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from rft.buffer.experience import Experience  # noqa: E402
from rft.trainer import engine, sequence_parallel  # noqa: E402
from rft.trainer.batching import collate, rows_from_experiences  # noqa: E402


def micro_batch():
    """Three rows of different lengths (odd ones: the last position of a rank's part predicts
    the first token of the next part), one multi-turn response with a masked tool token."""
    exps = [
        Experience("t0", "g0", [5, 6, 7], [8, 9, 10, 11, 2], reward=1.0),
        Experience("t1", "g0", [5, 6], [12, 13], reward=0.0),
        Experience(
            "t2", "g1", [20, 21, 22, 23], [30, 31, 32, 33, 34, 35], action_mask=[1, 1, 0, 1, 1, 1]
        ),
    ]
    rows = rows_from_experiences(exps)
    n, r = rows.response_mask.shape
    adv = torch.linspace(-1.0, 1.0, n * r).reshape(n, r)
    return collate(rows, list(range(n)), adv, torch.zeros(n, r), pad_id=0)


def loss_and_grads(model, micro):
    model.zero_grad()
    logprob, entropy = engine.forward_logprobs(model, micro, with_entropy=True)  # [B, R]
    mask = micro.response_mask
    loss = (
        -(logprob * micro.advantages * mask).sum() / mask.sum()
        - 0.01 * (entropy * mask).sum() / mask.sum()
    )
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
    return logprob.detach(), entropy.detach(), float(loss), grads


def main() -> None:
    from transformers import AutoModelForCausalLM

    model_dir, out = sys.argv[1], Path(sys.argv[2])
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.config.use_cache = False
    micro = micro_batch()
    whole = loss_and_grads(model, micro)
    sequence_parallel.setup(world, rank, world)
    split = loss_and_grads(model, micro)
    diffs = {
        "logprob": float((whole[0] - split[0]).abs().max()),
        "entropy": float((whole[1] - split[1]).abs().max()),
        "loss": abs(whole[2] - split[2]),
    }
    grad_diff = 0.0
    for name, g in split[3].items():
        total = g.clone()
        dist.all_reduce(total)
        grad_diff = max(grad_diff, float((total / world - whole[3][name]).abs().max()))
    diffs["grad"] = grad_diff
    diffs["grad_scale"] = max(float(g.abs().max()) for g in whole[3].values())
    if rank == 0:
        out.write_text(json.dumps(diffs))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
