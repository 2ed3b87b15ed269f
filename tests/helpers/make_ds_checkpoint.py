"""Train a model a few steps with real DeepSpeed on CPU and save a checkpoint like rft's trainer.

Run under torchrun (1 or more ranks, gloo). Writes ``<step-dir>/actor/`` with DeepSpeed's files
(in a tag folder named by ``latest``, or with ``--flat`` directly in actor/), optionally the HF
side files in ``actor/huggingface/`` (config + tokenizer, no weights, as a trainer writes them),
and ``<step-dir>/reference_logits.pt``: the engine's logits on a fixed batch after training.

With ``--lora R`` the model is wrapped by PEFT (LoRA rank R on all linear layers, only the
adapter trainable) and saved like rft's LoRA trainer: ``exclude_frozen_parameters=True`` (the
shards hold the adapter only) and, with ``--hf-files``, ``actor/huggingface/`` as the PEFT
adapter folder (``save_pretrained``, base_model_name_or_path = ``--model-dir``).
"""

from __future__ import annotations

import argparse
import os
import shutil
from pathlib import Path

os.environ.setdefault("DS_ACCELERATOR", "cpu")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import deepspeed  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

EVAL_SEED = 1234


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("--model-dir", required=True)
    p.add_argument("--step-dir", required=True)
    p.add_argument("--stage", type=int, default=2)
    p.add_argument("--bf16", action="store_true")
    p.add_argument("--train-steps", type=int, default=2)
    p.add_argument("--flat", action="store_true", help="move DeepSpeed's files into actor/ itself")
    p.add_argument(
        "--hf-files", action="store_true", help="write config+tokenizer to actor/huggingface/"
    )
    p.add_argument("--freeze", default=None, help="freeze parameters whose name contains this")
    p.add_argument("--seq-len", type=int, default=16)
    p.add_argument(
        "--lr", type=float, default=1e-2, help="large by default so that weights visibly move"
    )
    p.add_argument(
        "--lora", type=int, default=0, help="train a LoRA adapter of this rank (0: full model)"
    )
    return p.parse_args()


def ds_config(stage: int, bf16: bool, world_size: int, lr: float) -> dict:
    return {
        "train_micro_batch_size_per_gpu": 2,
        "gradient_accumulation_steps": 1,
        "train_batch_size": 2 * world_size,
        "optimizer": {"type": "AdamW", "params": {"lr": lr, "torch_adam": True}},
        "zero_optimization": {"stage": stage},
        "bf16": {"enabled": bf16},
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }


def wrap_lora(model: torch.nn.Module, rank: int, base_dir: str) -> torch.nn.Module:
    """The model with a LoRA adapter on every linear layer (PEFT's init: B = 0), base frozen."""
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(
        r=rank, lora_alpha=2 * rank, target_modules="all-linear", task_type="CAUSAL_LM"
    )
    wrapped = get_peft_model(model, config)
    wrapped.peft_config["default"].base_model_name_or_path = base_dir
    return wrapped


def save_adapter(engine, folder: Path, rank: int) -> None:
    """The PEFT adapter folder of the engine's module (gathered first under ZeRO-3)."""
    trainable = [p for p in engine.module.parameters() if p.requires_grad]
    with deepspeed.zero.GatheredParameters(
        trainable, enabled=engine.zero_optimization_stage() == 3
    ):
        if rank == 0:
            engine.module.save_pretrained(str(folder))


def main() -> None:
    args = parse_args()
    deepspeed.init_distributed(dist_backend="gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(args.model_dir, dtype=torch.float32)
    if args.lora:
        model = wrap_lora(model, args.lora, args.model_dir)
    if args.freeze:
        for name, p in model.named_parameters():
            if args.freeze in name:
                p.requires_grad_(False)
    params = [p for p in model.parameters() if p.requires_grad]
    engine, *_ = deepspeed.initialize(
        model=model,
        model_parameters=params,
        config=ds_config(args.stage, args.bf16, world, args.lr),
    )
    vocab = model.config.vocab_size
    gen = torch.Generator().manual_seed(100 + rank)
    for _ in range(args.train_steps):
        ids = torch.randint(0, vocab, (2, args.seq_len), generator=gen)
        loss = engine(input_ids=ids, labels=ids).loss
        engine.backward(loss)
        engine.step()
    engine.eval()
    eval_ids = torch.randint(
        0, vocab, (2, args.seq_len), generator=torch.Generator().manual_seed(EVAL_SEED)
    )
    with torch.no_grad():
        logits = engine(input_ids=eval_ids).logits.float()
    step_dir = Path(args.step_dir)
    actor = step_dir / "actor"
    engine.save_checkpoint(
        str(actor), tag=f"global_step{args.train_steps}", exclude_frozen_parameters=bool(args.lora)
    )
    if args.lora and args.hf_files:
        save_adapter(engine, actor / "huggingface", rank)
    dist.barrier()
    if rank == 0:
        torch.save({"input_ids": eval_ids, "logits": logits}, step_dir / "reference_logits.pt")
        if args.flat:
            tag_dir = actor / f"global_step{args.train_steps}"
            for f in tag_dir.iterdir():
                shutil.move(str(f), actor / f.name)
            tag_dir.rmdir()
            (actor / "latest").unlink()
        if args.hf_files and not args.lora:
            hf = actor / "huggingface"
            hf.mkdir(exist_ok=True)
            model.config.save_pretrained(hf)
            AutoTokenizer.from_pretrained(args.model_dir).save_pretrained(hf)
    dist.barrier()
    dist.destroy_process_group()
    os._exit(0)  # avoids a race in gloo teardown at interpreter exit (see DESIGN.md)


if __name__ == "__main__":
    main()
