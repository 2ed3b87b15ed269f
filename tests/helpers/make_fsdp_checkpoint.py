"""Save an FSDP checkpoint the way Trinity-RFT / veRL do, with torch's FSDP2 on CPU (gloo).

Run under torchrun. Shards the model with ``fully_shard`` over a 1-D CPU device mesh, trains
one step, and writes ``<step-dir>/actor/model_world_size_W_rank_R.pt`` (each rank's sharded
DTensor state dict), ``actor/huggingface/`` (config + tokenizer) and
``<step-dir>/reference_logits.pt`` (the sharded model's logits on a fixed batch).
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402
from torch.distributed.fsdp import fully_shard  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

EVAL_SEED = 1234


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model-dir", required=True)
    p.add_argument("--step-dir", required=True)
    args = p.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("fsdp",))
    model = AutoModelForCausalLM.from_pretrained(args.model_dir, dtype=torch.float32)
    for layer in model.model.layers if hasattr(model, "model") else []:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    vocab = model.config.vocab_size
    ids = torch.randint(0, vocab, (2, 16), generator=torch.Generator().manual_seed(100 + rank))
    model(input_ids=ids, labels=ids).loss.backward()
    opt.step()
    eval_ids = torch.randint(0, vocab, (2, 16), generator=torch.Generator().manual_seed(EVAL_SEED))
    with torch.no_grad():
        logits = model(input_ids=eval_ids).logits.float()
    actor = Path(args.step_dir) / "actor"
    actor.mkdir(parents=True, exist_ok=True)
    torch.save(model.state_dict(), actor / f"model_world_size_{world}_rank_{rank}.pt")
    if rank == 0:
        torch.save(
            {"input_ids": eval_ids, "logits": logits}, Path(args.step_dir) / "reference_logits.pt"
        )
        hf = actor / "huggingface"
        hf.mkdir(exist_ok=True)
        model.config.save_pretrained(hf)
        AutoTokenizer.from_pretrained(args.model_dir).save_pretrained(hf)
    dist.barrier()
    dist.destroy_process_group()
    os._exit(0)


if __name__ == "__main__":
    main()
