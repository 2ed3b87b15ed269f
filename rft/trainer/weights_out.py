"""The trainer's one door to weight sync: :class:`WeightsOut` ``.publish(version, actor)``.

Built once from the config on every rank; rank 0 holds the folder publisher
(:class:`~rft.sync.publisher.WeightsPublisher`: full or delta folders) and, with
``sync_method: nccl``, the broadcaster (:class:`~rft.sync.broadcaster.WeightBroadcaster`).
Behind ``publish``: an adapter, a streamed folder, or a broadcast with a folder when it is owed.
It drives the trainer engine's collectives, so it lives here, not in :mod:`rft.sync`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rft.config.schema import Config
from rft.lease import NO_FENCE, Fence
from rft.models import tokenizer_files
from rft.sync.local import StreamedFolder, delta_policy

if TYPE_CHECKING:
    import torch

    from rft.sync.broadcaster import WeightBroadcaster
    from rft.sync.publisher import WeightsPublisher
    from rft.trainer.engine import Actor, DistInfo


def needs_weights_folder(cfg: Config, step: int, last_step: int | None) -> bool:
    """Whether a published version also goes to ``weights/`` as a folder: always with
    ``sync_method: checkpoint``; with ``nccl`` at each full checkpoint and the last step (for
    late joiners, resume and conversion), besides the fallback when a broadcast fails."""
    save = cfg.trainer.save_interval
    return (
        cfg.synchronizer.sync_method == "checkpoint"
        or step == last_step
        or bool(save and step % save == 0)
    )


class WeightsOut:
    """Weights versions to the explorers: :meth:`publish` (collective), :meth:`close`."""

    def __init__(self, cfg: Config, info: DistInfo, last_step: int | None, fence: Fence = NO_FENCE):
        from rft.sync.broadcaster import WeightBroadcaster
        from rft.sync.publisher import WeightsPublisher

        sync = cfg.synchronizer
        self.cfg = cfg
        self.last_step = last_step  # the run's last step (None: until the data ends)
        self.rank = info.rank
        self.by_broadcast = sync.sync_method == "nccl"
        delta = delta_policy(cfg, last_step)
        self.publisher: WeightsPublisher | None = None
        self.broadcaster: WeightBroadcaster | None = None
        if self.rank == 0:
            self.publisher = WeightsPublisher(
                cfg.run_dir,
                sync.weights_versions_to_keep,
                heartbeat_live_s=cfg.explorer.heartbeat_timeout_s,
                delta=delta,
                fence=fence,
            )
            if self.by_broadcast:
                mib = cfg.explorer.rollout_model.weight_sync_buffer_size  # Trinity's, in MiB
                self.broadcaster = WeightBroadcaster(
                    cfg.run_dir,
                    info.device,
                    sync.sync_timeout,
                    cfg.explorer.heartbeat_timeout_s,
                    **({"bucket_bytes": mib << 20} if mib is not None else {}),
                )

    def publish(self, version: int, actor: Actor) -> dict[str, float]:
        """Weights ``version`` to the explorers; every rank calls it (every rank gathers).
        Returns the broadcast's metrics (rank 0 with ``nccl``), else {}."""
        from rft.trainer import engine

        folder = needs_weights_folder(self.cfg, version, self.last_step)
        if actor.lora:
            self._adapter(version, actor, folder)
        elif self.by_broadcast:
            self._broadcast(version, actor, folder)
        else:
            self._stream_folder(version, actor)
        engine.barrier()
        return dict(self.broadcaster.last) if self.broadcaster is not None else {}

    def _folder_owed(self, version: int, state: dict[str, torch.Tensor], folder: bool) -> bool:
        """Broadcast ``state`` (rank 0 with ``nccl``); whether rank 0 must also publish the
        folder: when ``folder`` says so, without a broadcast, or when it missed an explorer."""
        if self.publisher is None:
            return False
        sent = self.broadcaster is not None and self.broadcaster.broadcast(version, state)
        return folder or not sent

    def _adapter(self, version: int, actor: Actor, folder: bool) -> None:
        """A LoRA adapter: megabytes, gathered whole, no tokenizer (the base has it); by
        broadcast with ``nccl``, as a folder when owed or when the broadcast missed someone."""
        from rft.trainer import engine
        from rft.trainer.lora import save_adapter_folder, saved_state

        state = engine.gather_adapter(actor)
        if self._folder_owed(version, saved_state(state) if state else {}, folder):
            self.publisher.publish(
                version, lambda tmp: save_adapter_folder(actor.module, state, tmp)
            )

    def _stream_folder(self, version: int, actor: Actor) -> None:
        """A full folder, each tensor written as it is gathered (ranks > 0 only gather); with
        delta sync each is coded against the anchor as it is gathered instead (no full file)."""
        from rft.trainer import engine

        if self.publisher is None:
            engine.stream_hf_folder(actor, None)  # the gathers rank 0 writes from
            return
        self.publisher.publish(
            version,
            StreamedFolder(lambda tmp, write_file: engine.stream_hf_folder(actor, tmp, write_file)),
            extra_files=tokenizer_files(self.cfg.model.model_path),
        )

    def _broadcast(self, version: int, actor: Actor, folder: bool) -> None:
        """The whole state dict by broadcast; the folder too when owed or when it failed."""
        from rft.trainer import engine

        state = engine.gather_weights(actor)
        if self._folder_owed(version, state, folder):  # with delta sync: coded, no full file
            self.publisher.publish(
                version,
                StreamedFolder(lambda tmp, write: engine.save_hf_folder(actor, state, tmp, write)),
                extra_files=tokenizer_files(self.cfg.model.model_path),
            )

    def close(self) -> None:
        """End the broadcast group and its store (rank 0 with ``nccl``)."""
        if self.broadcaster is not None:
            self.broadcaster.close()
            self.broadcaster = None
