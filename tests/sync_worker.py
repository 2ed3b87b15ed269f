"""A weights publisher for the sync tests (run as a script; the tests SIGKILL it mid-write).

    python tests/sync_worker.py RUN_DIR FIRST_VERSION COUNT SIZE_MB

Publishes versions FIRST_VERSION.. with a model.safetensors of SIZE_MB written slowly in
1 MiB chunks, so a kill at a random moment usually lands inside a write.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from rft.sync import WeightsPublisher  # noqa: E402

CHUNK = b"\x01" * (1 << 20)


def write_weights(folder: Path, size_mb: int) -> None:
    (folder / "config.json").write_text('{"model_type": "llama"}')
    with open(folder / "model.safetensors", "wb") as f:
        for _ in range(size_mb):
            f.write(CHUNK)
            time.sleep(0.005)


if __name__ == "__main__":
    run_dir, first, count, size_mb = sys.argv[1], *map(int, sys.argv[2:5])
    publisher = WeightsPublisher(run_dir, keep_versions=2)
    print("started", flush=True)  # the test's kill timer starts here, not at interpreter start
    for version in range(first, first + count):
        publisher.publish(version, lambda folder: write_weights(folder, size_mb))
