"""Methods rft adds to each vLLM worker (``worker_extension_cls``), called by name through
``LLM.collective_rpc``: they run where the model lives, in the engine's process on CPU and in
each worker process on GPUs. Data in: RPC arguments and the weight-sync group's broadcasts
(:mod:`rft.sync.broadcast`); data out: the worker's model, changed in place. Must import neither
vLLM nor the explorer.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import torch

from rft.sync import broadcast as B


class WeightSyncExtension:
    """Mixed into vLLM's worker class; ``self`` is the worker (``rank``, ``model_runner``)."""

    _rft_group: Any = None

    def _rft_device(self) -> torch.device:
        return next(self.model_runner.get_model().parameters()).device  # type: ignore[attr-defined]

    def rft_refresh_tied_lm_head(self) -> None:
        """After an in-place reload of a model with tied input/output embeddings, re-derive the
        output layer (DESIGN.md: otherwise it keeps the old weights on CPU)."""
        model = self.model_runner.get_model()  # type: ignore[attr-defined]
        lm_head = getattr(model, "lm_head", None)
        method = getattr(lm_head, "quant_method", None)
        if method is not None and hasattr(method, "process_weights_after_loading"):
            method.process_weights_after_loading(lm_head)

    def rft_join_group(
        self,
        host: str,
        port: int,
        generation: int,
        first_rank: int,
        world_size: int,
        backend: str,
        timeout_s: float,
    ) -> int:
        """Join generation ``generation`` as rank ``first_rank`` + this worker's rank; blocks
        until every member joined (or the timeout). Returns the rank."""
        self.rft_leave_group()
        store = torch.distributed.TCPStore(host, port, None, False, timedelta(seconds=timeout_s))
        rank = first_rank + int(self.rank)  # type: ignore[attr-defined]
        self._rft_group = B.new_group(store, generation, rank, world_size, backend, timeout_s)
        self._rft_store = store
        return rank

    def rft_receive(
        self, layout: list[Any], tied_embeddings: bool, adapter_file: str | None = None
    ) -> str:
        """Receive one version's buckets, then load them in place, or with ``adapter_file``
        (a LoRA adapter's tensors) write them there (worker 0; the engine then adds the
        adapter). Returns "" when done, or why the receive failed (the model is then
        untouched). A failing load raises.

        Every bucket is taken in before the model is touched, so a broadcast that fails midway
        leaves the engine with its previous weights; the price is one copy of the weights in the
        worker's memory while it receives."""
        if self._rft_group is None:
            return "this worker is in no weight-sync group"
        device = self._rft_device()
        received = []
        try:
            for bucket in B.buckets_from_json(layout):
                flat = torch.empty(bucket.numel, dtype=getattr(torch, bucket.dtype), device=device)
                B.broadcast(self._rft_group, flat)
                received.append((bucket, flat))
        except RuntimeError as e:  # torch.distributed errors: a member left, a timeout
            return str(e) or type(e).__name__
        weights = (item for bucket, flat in received for item in B.unpack(bucket, flat))
        if adapter_file is not None:
            if int(self.rank) == 0:  # type: ignore[attr-defined]
                from safetensors.torch import save_file

                save_file({name: t.contiguous().cpu() for name, t in weights}, adapter_file)
            return ""
        self.reload_weights(weights_iterator=weights)  # type: ignore[attr-defined]
        if tied_embeddings:
            self.rft_refresh_tied_lm_head()
        return ""

    def rft_confirm(self, ok: bool) -> bool:
        """Tell the trainer this worker's load is done; True when every member's was."""
        return B.all_loaded(self._rft_group, ok, self._rft_device())

    def rft_leave_group(self) -> None:
        B.abort(self._rft_group)
        self._rft_group = None
