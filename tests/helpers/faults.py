"""The seed of a fault-injection round: random, printed, and replayable with RFT_FAULT_SEED."""

from __future__ import annotations

import os
import random

SEED_ENV = "RFT_FAULT_SEED"


def fault_seed(name: str) -> int:
    """``$RFT_FAULT_SEED`` if set, else a fresh random seed; printed either way (``pytest -s``
    shows it, and pytest prints captured output of a failing test)."""
    seed = int(os.environ.get(SEED_ENV, random.SystemRandom().randrange(10**6)))
    print(f"[faults] {name}: seed {seed} (replay with {SEED_ENV}={seed})")
    return seed
