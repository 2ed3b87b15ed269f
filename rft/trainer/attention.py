"""Which attention kernels the trainer's models load with (``attn_implementation``).

Data in: the config's ``trainer.padding_free`` and ``trainer.precision`` and what this machine
has (CUDA, the ``flash_attn`` package). Data out: a transformers attention name, or None for
transformers' default (SDPA). ``python -m rft.trainer.attention`` prints the choice of this
machine for packed micro-batches (``env/setup.sh --gpu`` runs it). No torch import at load.
"""

from __future__ import annotations

import importlib.util

FLASH_ATTENTION_2 = "flash_attention_2"  # varlen kernels over packed rows (bf16/fp16 only)
FLEX_ATTENTION = "flex_attention"  # a block mask of the packed sequences, fused causal kernel


def packed_attention(cuda: bool, flash_attn_installed: bool, precision: str) -> str | None:
    """The kernels of packed micro-batches: FlashAttention-2 on a GPU with ``flash_attn`` and
    bf16 (its kernels take no float32); else flex_attention on a GPU (transformers builds its
    block mask from the restarting position ids: no dense ``[S, S]`` mask, the fused causal
    kernel kept); None (SDPA with a block-diagonal mask) on CPU, where flex_attention has no
    backward."""
    if not cuda:
        return None
    if flash_attn_installed and precision == "bf16":
        return FLASH_ATTENTION_2
    return FLEX_ATTENTION


def flash_attn_installed() -> bool:
    return importlib.util.find_spec("flash_attn") is not None


def main() -> None:
    import torch

    cuda = torch.cuda.is_available()
    choice = packed_attention(cuda, flash_attn_installed(), "bf16")
    where = "GPU" if cuda else "no GPU"
    print(
        f"trainer.padding_free ({where}, bf16) attends with "
        f"{choice or 'sdpa (block-diagonal mask)'}"
    )


if __name__ == "__main__":
    main()
