"""When weights move: the schedule the trainer and the explorers both import.

Pure rules on step numbers: :func:`publishes_weights` (the trainer's side),
:func:`required_version` and :func:`explorer_lead` (how far an explorer may run ahead).
"""

from __future__ import annotations


def publishes_weights(step: int, sync_interval: int, last_step: int | None) -> bool:
    """Whether the trainer publishes weights version ``step`` after finishing that step: every
    ``sync_interval`` steps, and after the run's last step."""
    return step % sync_interval == 0 or step == last_step


def required_version(step: int, sync_offset: int, sync_interval: int) -> int:
    """Weights version an explorer needs before generating ``step`` in mode both (0: the initial
    model): the newest version the trainer publishes after its step ``step - 1 - sync_offset``."""
    need = step - 1 - sync_offset
    return max(0, need // sync_interval * sync_interval)


def explorer_lead(
    mode: str, sync_offset: int, max_lead_steps: int | None
) -> tuple[int | None, str]:
    """How many steps an explorer may run ahead of the weights, and the key that says so:
    ``mode: both``'s ``sync_offset``; an asynchronous explorer's ``max_lead_steps`` (None:
    unbounded, it never waits)."""
    if mode == "both":
        return sync_offset, "synchronizer.sync_offset"
    return max_lead_steps, "synchronizer.max_lead_steps"
