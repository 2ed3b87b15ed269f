"""Learning-rate multiplier per optimizer step: linear warm-up, then constant or cosine.

Data in: ``algorithm.optimizer`` settings and the total number of optimizer steps. Data out: a
function ``step -> multiplier of the peak lr`` for ``torch.optim.lr_scheduler.LambdaLR`` (its
state is the step count alone, so it is saved and restored with the checkpoint).
"""

from __future__ import annotations

import math
from typing import Callable

from rft.errors import ConfigError


def warmup_steps(
    lr_warmup_steps: int, lr_warmup_steps_ratio: float, total_steps: int | None
) -> int:
    """``lr_warmup_steps`` if >= 0, else ``lr_warmup_steps_ratio`` of ``total_steps``."""
    if lr_warmup_steps >= 0:
        return lr_warmup_steps
    if lr_warmup_steps_ratio == 0:
        return 0
    if total_steps is None:
        raise ConfigError(
            "algorithm.optimizer.lr_warmup_steps_ratio needs a known number of steps: "
            "set buffer.total_steps, or give lr_warmup_steps instead"
        )
    return int(lr_warmup_steps_ratio * total_steps)


def lr_multiplier(
    style: str, warmup: int, total_steps: int | None, min_lr_ratio: float
) -> Callable[[int], float]:
    """``step -> factor``: (step + 1) / warmup during warm-up, then 1 (constant) or a cosine
    from 1 down to ``min_lr_ratio`` at ``total_steps``."""
    if style == "cosine" and total_steps is None:
        raise ConfigError(
            "algorithm.optimizer.warmup_style 'cosine' needs a known number of steps: "
            "set buffer.total_steps (or use warmup_style: constant)"
        )

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        if style == "constant":
            return 1.0
        assert total_steps is not None
        progress = min(1.0, (step - warmup) / max(1, total_steps - warmup))
        return min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))

    return factor
