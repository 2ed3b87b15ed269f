"""Records read back from the buffer, split into their groups (for tests' assertions)."""

from __future__ import annotations

from typing import Iterable

from rft.buffer.experience import Experience


def split_groups(records: Iterable[Experience]) -> list[list[Experience]]:
    """Consecutive records with one group_id form a group (writers keep groups contiguous)."""
    groups: list[list[Experience]] = []
    for exp in records:
        if groups and groups[-1][0].group_id == exp.group_id:
            groups[-1].append(exp)
        else:
            groups.append([exp])
    return groups
