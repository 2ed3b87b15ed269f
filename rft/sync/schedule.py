"""When weights move: the schedule the trainer and the explorers both import.

Pure rules on step numbers: :func:`publishes_weights` (the trainer's side),
:func:`required_version`, :func:`explorer_lead` (how far an explorer may run ahead) and
:func:`takes_weights` (at which steps it loads newer ones), for each of Trinity's
``synchronizer.sync_style`` values (trinity/common/constants.py SyncStyle; docs
tutorial/synchronizer.md):

- ``fixed``: the trainer publishes every ``sync_interval`` steps; in mode both the explorer's
  step waits for the version :func:`required_version` names (``sync_offset`` steps of lead).
- ``trainer_driven`` (older name ``dynamic_by_trainer``): the trainer publishes every
  ``sync_interval`` of its steps; the explorer never waits for a version and takes the newest
  published weights at each step.
- ``explorer_driven`` (older name ``dynamic_by_explorer``): every ``sync_interval`` of its own
  steps the explorer asks for the trainer's newest weights (rft.sync.requests) and takes the
  newest published, without waiting for a version; the trainer publishes after its next step
  when asked (Trinity's trainer syncs at its next loop iteration on the explorer's request).
  With ``sync_method: nccl`` the explorer takes a broadcast at any step (the trainer's
  broadcast waits for every explorer to receive it).

In the dynamic styles ``synchronizer.max_lead_steps`` (rft's key), when set, still bounds how
many steps an explorer runs ahead of the weights.
"""

from __future__ import annotations


def publishes_weights(
    step: int,
    sync_interval: int,
    last_step: int | None,
    sync_style: str = "fixed",
    requested: bool = False,
) -> bool:
    """Whether the trainer publishes weights version ``step`` after finishing that step: every
    ``sync_interval`` steps (when an explorer asked, with ``explorer_driven``), and after the
    run's last."""
    if sync_style == "explorer_driven":
        return requested or step == last_step
    return step % sync_interval == 0 or step == last_step


def required_version(step: int, sync_offset: int, sync_interval: int) -> int:
    """Weights version an explorer needs before generating ``step`` in mode both (0: the initial
    model): the newest version the trainer publishes after its step ``step - 1 - sync_offset``."""
    need = step - 1 - sync_offset
    return max(0, need // sync_interval * sync_interval)


def explorer_lead(
    mode: str, sync_offset: int, max_lead_steps: int | None, sync_style: str = "fixed"
) -> tuple[int | None, str]:
    """How many steps an explorer may run ahead of the weights, and the key that says so:
    ``mode: both``'s ``sync_offset`` with the fixed style; else ``max_lead_steps`` (None:
    unbounded, it never waits)."""
    if mode == "both" and sync_style == "fixed":
        return sync_offset, "synchronizer.sync_offset"
    return max_lead_steps, "synchronizer.max_lead_steps"


def syncs_at(step: int, sync_style: str, sync_interval: int) -> bool:
    """Whether ``step`` is an explorer_driven explorer's sync step (1, 1 + sync_interval, ...),
    where it asks for weights."""
    return sync_style == "explorer_driven" and (step - 1) % sync_interval == 0


def takes_weights(
    step: int, sync_style: str, sync_interval: int, sync_method: str = "checkpoint"
) -> bool:
    """Whether an explorer loads newer weights before generating ``step``: with
    ``explorer_driven`` only at its sync steps (a broadcast, which it asked for, at any step);
    otherwise at every step."""
    if sync_style == "explorer_driven" and sync_method != "nccl":
        return syncs_at(step, sync_style, sync_interval)
    return True
