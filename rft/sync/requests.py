"""``synchronizer.sync_style: explorer_driven``'s requests: an explorer asks for the trainer's
newest weights (``sync_requests/<writer>.json``, its step, written atomically at each of its sync
steps) and the trainer publishes after its next step when some explorer asked since it last
published (Trinity's explorer sets REQUIRE_SYNC; its trainer syncs at its next loop).

The trainer remembers, per writer, the newest step it answered (rank 0 only; the decision is
broadcast to the other ranks by the caller). An explorer never waits on its request: it loads
whatever is newest at its sync steps (rft.sync.schedule.takes_weights).
"""

from __future__ import annotations

import json
from pathlib import Path

from rft import atomic
from rft.rundir import SYNC_REQUESTS_DIR


def request_weights(run_dir: Path | str, writer: str, step: int) -> None:
    """Explorer ``writer`` asks for the trainer's newest weights before generating ``step``."""
    folder = Path(run_dir) / SYNC_REQUESTS_DIR
    folder.mkdir(parents=True, exist_ok=True)
    atomic.write_json(folder / f"{writer}.json", {"step": step})


class RequestWatcher:
    """The trainer's view of the requests: :meth:`pending` says whether an explorer asked
    since the last :meth:`answered`."""

    def __init__(self, run_dir: Path | str):
        self.folder = Path(run_dir) / SYNC_REQUESTS_DIR
        self.seen: dict[str, int] = {}
        self._latest: dict[str, int] = {}

    def pending(self) -> bool:
        self._latest = {}
        if self.folder.is_dir():
            for path in self.folder.glob("*.json"):
                try:
                    self._latest[path.stem] = int(json.loads(path.read_text())["step"])
                except (OSError, ValueError, KeyError, TypeError):
                    continue  # half-written by a crashed writer: its next request replaces it
        return any(step > self.seen.get(writer, -1) for writer, step in self._latest.items())

    def answered(self) -> None:
        """The requests :meth:`pending` saw are answered by the weights just published."""
        self.seen.update(self._latest)
