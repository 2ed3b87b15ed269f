"""When an explorer stops on failing episodes: the rule, as a small state machine.

Data in: each sealed step's episode counts (runs, runs that failed or timed out) and its first
failed run's one-line error (the step's metrics, :func:`rft.explorer.episodes.episode_metrics`).
Data out: None, or the one-line reason to stop (the explorer records it and exits non-zero:
:mod:`rft.sync.failures`). Steps that ran no workflow class (single-turn recipes) are not
counted: a recipe that raises stops the explorer at once.

Two limits, both from ``explorer``: ``max_failed_steps`` steps in a row whose every run failed
(0: off), and more than ``max_failed_share`` of the runs of the last
``failed_share_window_steps`` steps (1.0: off; judged once that many steps ran).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Optional

from rft.config.schema import ExplorerConfig


@dataclass
class FailureGuard:
    max_failed_steps: int  # 0: never stop for failed steps in a row
    max_failed_share: float  # 1.0: never stop for the share
    window_steps: int
    streak: list[int] = field(default_factory=list)  # steps in a row whose every run failed
    streak_error: Optional[str] = None  # the first error of the streak's first step
    window: deque[tuple[int, int, Optional[str]]] = field(default_factory=deque)  # runs, failed

    @classmethod
    def from_config(cls, explorer: ExplorerConfig) -> "FailureGuard":
        return cls(
            explorer.max_failed_steps, explorer.max_failed_share, explorer.failed_share_window_steps
        )

    def observe(
        self, step: int, runs: int, failed: int, first_error: Optional[str]
    ) -> Optional[str]:
        """Count a sealed step's runs; the reason to stop now, or None."""
        if runs <= 0:
            return None
        if failed >= runs:
            if not self.streak:
                self.streak_error = first_error
            self.streak.append(step)
        else:
            self.streak, self.streak_error = [], None
        self.window.append((runs, failed, first_error))
        while len(self.window) > self.window_steps:
            self.window.popleft()
        if self.max_failed_steps and len(self.streak) >= self.max_failed_steps:
            steps = (
                f"steps {self.streak[0]}-{self.streak[-1]}"
                if len(self.streak) > 1
                else f"step {step}"
            )
            return (
                f"every episode of {len(self.streak)} step(s) in a row failed ({steps}; "
                f"explorer.max_failed_steps={self.max_failed_steps}); first error: "
                f"{self.streak_error or 'unknown'}"
            )
        return self._share_reason()

    def _share_reason(self) -> Optional[str]:
        if self.max_failed_share >= 1.0 or len(self.window) < self.window_steps:
            return None
        runs = sum(r for r, _, _ in self.window)
        failed = sum(f for _, f, _ in self.window)
        if failed / runs <= self.max_failed_share:
            return None
        first = next((e for _, f, e in self.window if f and e), "unknown")
        return (
            f"{failed} of {runs} episodes of the last {len(self.window)} steps failed "
            f"({failed / runs:.0%}, above explorer.max_failed_share={self.max_failed_share:g}); "
            f"first error: {first}"
        )
