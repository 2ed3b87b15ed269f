"""A role instance frozen (SIGSTOP, by itself or by the test) at a chosen point of a write,
for the fencing tests (tests/test_fencing.py): the test takes the role's lease over meanwhile,
then resumes it (SIGCONT), and it must write nothing more and exit with the lease-lost line.

    python tests/fence_worker.py publish RUN_DIR STALE_S  # frozen while writing weights v4
    python tests/fence_worker.py finish RUN_DIR STALE_S   # frozen inside checkpoint 3's finish
    python tests/fence_worker.py before RUN_DIR STALE_S   # frozen just before checkpoint 3's finish
    python tests/fence_worker.py explorer RUN_DIR STALE_S # beating explorer-0 (the test freezes it)

Each prints ``frozen`` (or ``beating``) and flushes before the point; exit codes are the roles'
(:func:`rft.entry.run_command`: the message alone, code 2).
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from rft import atomic  # noqa: E402
from rft.entry import run_command  # noqa: E402
from rft.lease import Lease  # noqa: E402
from rft.rundir import ACTOR_DIR, TRAINER_LEASE  # noqa: E402
from rft.sync.heartbeat import Heartbeat  # noqa: E402
from rft.sync.publisher import WeightsPublisher  # noqa: E402
from rft.trainer.state import finish_checkpoint, staging_dir  # noqa: E402

BEAT_S = 0.1


def freeze() -> None:
    print("frozen", flush=True)
    os.kill(os.getpid(), signal.SIGSTOP)


def weights(version: int, then=None):
    def write(folder: Path) -> None:
        (folder / "config.json").write_text('{"model_type": "llama"}')
        (folder / "model.safetensors").write_bytes(f"weights {version}".encode())
        if then is not None:
            then()

    return write


def checkpoint(run_dir: Path, lease: Lease, step: int, before_finish=None) -> None:
    tmp = staging_dir(run_dir, step)
    (tmp / ACTOR_DIR / "shard.pt").write_bytes(f"step {step}".encode())
    if before_finish is not None:
        before_finish()
    finish_checkpoint(run_dir, tmp, step, {"lease_generation": lease.gen}, 2, lease)


def main(mode: str, run_dir: Path, stale_s: float) -> int:
    name = "explorer-0" if mode == "explorer" else TRAINER_LEASE
    lease = Lease.acquire(run_dir, name, BEAT_S, stale_s, env={}).start()
    if mode == "publish":
        publisher = WeightsPublisher(run_dir, 2, heartbeat_live_s=stale_s, fence=lease)
        for version in (1, 2, 3):
            publisher.publish(version, weights(version))
        publisher.publish(4, weights(4, then=freeze))
    elif mode in ("finish", "before"):
        for step in (1, 2):
            checkpoint(run_dir, lease, step)
        if mode == "finish":
            real = atomic.write_json

            def frozen_first(path, obj):  # the finish's first write: the staged metadata
                atomic.write_json = real
                freeze()
                real(path, obj)

            atomic.write_json = frozen_first
            checkpoint(run_dir, lease, 3)
        else:
            checkpoint(run_dir, lease, 3, before_finish=freeze)
    else:
        heartbeat = Heartbeat(run_dir, name, BEAT_S, lease).start()
        print("beating", flush=True)
        for seq in range(600):  # the explorer's main thread: a check before each seal
            time.sleep(BEAT_S)
            lease.check(f"sealing segment {seq}")
        heartbeat.stop()
    lease.release()
    return 0


if __name__ == "__main__":
    mode, run_dir, stale_s = sys.argv[1], Path(sys.argv[2]), float(sys.argv[3])
    sys.exit(run_command(lambda: main(mode, run_dir, stale_s)))
