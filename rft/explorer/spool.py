"""Finished groups of steps not yet sealed, kept on disk by the explorer loop.

``groups/<writer>/<seal step>-<group step>.<slot>.jsonl``, one file per group, written
atomically as the group completes and removed once its step's segment is sealed. A restarted
explorer takes the groups of the steps it regenerates from here instead of generating them again,
so a killed explorer loses only its unfinished groups; the trainer never reads this folder.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

from rft import atomic
from rft.buffer.experience import Experience, decode_line, encode_line
from rft.errors import DataError
from rft.lease import NO_FENCE, Fence
from rft.rundir import GROUPS_DIR

log = logging.getLogger(__name__)

_NAME = re.compile(r"^(\d{6})-(\d+\.\d+)\.jsonl$")  # <seal step>-<group step>.<slot>.jsonl


def group_key(step: int, slot: int) -> str:
    """A group's name among its seal step's: the step whose ids it carries, and its slot."""
    return f"{step}.{slot}"


class GroupSpool:
    """The finished, unsealed groups of one writer."""

    def __init__(self, run_dir: Path | str, writer: str, fence: Fence = NO_FENCE):
        self.folder = Path(run_dir) / GROUPS_DIR / writer
        self.fence = fence  # the writer's lease: a displaced instance spools nothing

    def put(self, seal_step: int, key: str, exps: list[Experience]) -> None:
        """Keep the experiences of group ``key`` of ``seal_step`` (atomic)."""
        self.fence.check(f"spooling group {key} of step {seal_step}")
        self.folder.mkdir(parents=True, exist_ok=True)
        text = "".join(encode_line(e) + "\n" for e in exps)
        atomic.write_text(self.folder / f"{seal_step:06d}-{key}.jsonl", text)

    def take(self, seal_step: int) -> dict[str, list[Experience]]:
        """The groups kept for ``seal_step``, by key; a file that does not decode is removed
        (logged): its group is generated again."""
        out = {}
        for path, step, key in self._files():
            if step != seal_step:
                continue
            try:
                out[key] = [decode_line(line) for line in path.read_text().splitlines()]
            except (OSError, UnicodeDecodeError, DataError) as e:
                log.warning("%s: unreadable spooled group (%s); it is generated again", path, e)
                path.unlink(missing_ok=True)
        return out

    def drop(self, through_step: int) -> None:
        """Remove the groups of every step <= ``through_step`` (their segments are sealed)."""
        self.fence.check(f"removing the spooled groups of steps <= {through_step}")
        for path, step, _ in self._files():
            if step <= through_step:
                path.unlink(missing_ok=True)

    def _files(self) -> list[tuple[Path, int, str]]:
        if not self.folder.is_dir():
            return []
        found = []
        for path in sorted(self.folder.iterdir()):
            match = _NAME.match(path.name)
            if match:  # atomic temporaries and strangers are not groups
                found.append((path, int(match.group(1)), match.group(2)))
        return found
