"""An explorer process for the weight-broadcast protocol tests, without vLLM: the real
:class:`~rft.sync.receiver.BroadcastReceiver` and the real worker methods
(:class:`~rft.explorer.vllm_worker.WeightSyncExtension`) around a small torch module in place of
vLLM's model runner.

    python tests/broadcast_worker.py RUN_DIR NAME SECONDS [--die-in-version V]

Heartbeat ``explorers/NAME.json``; polls the trainer's events for SECONDS and prints one JSON
line per version received and loaded, as soon as it is: ``{"version", "sum"}`` (``sum``: the sum of all weights, which the
test's trainer sets to a known value per version). ``--die-in-version V``: SIGKILL itself after
the first bucket of version V arrived, in the middle of the broadcast.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from rft.explorer.vllm_worker import WeightSyncExtension  # noqa: E402
from rft.sync import broadcast as B  # noqa: E402
from rft.sync.heartbeat import Heartbeat  # noqa: E402
from rft.sync.receiver import BroadcastReceiver  # noqa: E402


def make_module() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 8))


class ModuleWorker(WeightSyncExtension):
    """vLLM's worker as far as the extension sees it: a rank, a model runner, reload_weights."""

    rank = 0

    def __init__(self, module: torch.nn.Module):
        self.module = module
        self.model_runner = SimpleNamespace(get_model=lambda: module)

    def reload_weights(self, weights_iterator):
        state = {name: tensor.clone() for name, tensor in weights_iterator}
        self.module.load_state_dict(state, strict=True)


class ModuleEngine:
    """The :class:`rft.explorer.engine.Engine` methods the receiver calls, on one worker."""

    def __init__(self, module: torch.nn.Module, die_in_version: int | None = None):
        self.worker = ModuleWorker(module)
        self.die_in_version = die_in_version

    def join_group(self, *args):
        self.worker.rft_join_group(*args)

    def receive(self, layout, version):
        if version == self.die_in_version:
            first = B.buckets_from_json(layout)[0]
            B.broadcast(
                self.worker._rft_group, torch.empty(first.numel, dtype=getattr(torch, first.dtype))
            )
            os.kill(os.getpid(), signal.SIGKILL)
        why = self.worker.rft_receive(layout, False)
        if not why:  # loaded: report now (one poll may go on to the next version and die there)
            total = sum(float(p.sum()) for p in self.worker.module.parameters())
            print(json.dumps({"version": version, "sum": total}), flush=True)
        return why

    def confirm(self, ok):
        return self.worker.rft_confirm(ok)

    def leave_group(self):
        self.worker.rft_leave_group()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("run_dir")
    parser.add_argument("name")
    parser.add_argument("seconds", type=float)
    parser.add_argument("--die-in-version", type=int)
    args = parser.parse_args()
    module = make_module()
    engine = ModuleEngine(module, args.die_in_version)
    with Heartbeat(args.run_dir, args.name, interval_s=0.5):
        receiver = BroadcastReceiver(args.run_dir, args.name, engine, tp=1, timeout_s=30)
        deadline = time.monotonic() + args.seconds
        while time.monotonic() < deadline:
            receiver.poll(0.2)
        receiver.close()


if __name__ == "__main__":
    main()
