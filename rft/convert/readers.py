"""Open a training checkpoint folder, whatever wrote it: DeepSpeed ZeRO 0-3 or FSDP.

:func:`detect_format` looks at the file names (``latest`` and ``*_model_states.pt`` for
DeepSpeed, ``model_world_size_W_rank_R.pt`` for FSDP) and :func:`open_checkpoint` hands the
folder to :mod:`rft.convert.ds_reader` or :mod:`rft.convert.fsdp_reader`. Both return a
:class:`CheckpointContents` (:mod:`rft.convert.types`): full-size tensors in module order, each
assembled from the rank shards only when loaded, and tied aliases. Nothing is hard-coded about
architectures or parameter names; everything comes from the checkpoint's own metadata.
"""

from __future__ import annotations

from pathlib import Path

from rft.convert.ds_reader import read_deepspeed
from rft.convert.fsdp_reader import FSDP_FILE_RE, read_fsdp
from rft.convert.types import CheckpointContents, SourceTensor
from rft.errors import CheckpointError

__all__ = ["CheckpointContents", "SourceTensor", "detect_format", "open_checkpoint"]


def detect_format(folder: Path) -> tuple[str, Path]:
    """Return ("deepspeed" | "fsdp", folder holding the shard files) or raise CheckpointError."""
    if any(FSDP_FILE_RE.match(p.name) for p in folder.glob("model_world_size_*_rank_*.pt")):
        return "fsdp", folder
    latest = folder / "latest"
    if latest.is_file():
        tag = latest.read_text().strip()
        if not (folder / tag).is_dir():
            raise CheckpointError(f"{latest} names tag {tag!r} but {folder / tag} does not exist; "
                                  "the checkpoint is incomplete or was moved")
        return "deepspeed", folder / tag
    if list(folder.glob("*model_states.pt")):
        return "deepspeed", folder
    tagged = sorted({p.parent for p in folder.glob("*/*model_states.pt")})
    if len(tagged) == 1:
        return "deepspeed", tagged[0]
    if tagged:
        raise CheckpointError(f"{folder} holds several DeepSpeed tags ({', '.join(p.name for p in tagged)}) "
                              "and no 'latest' file; pass the tag folder you want")
    raise CheckpointError(
        f"{folder} is not a checkpoint: expected DeepSpeed files (latest, *_model_states.pt, "
        "*_optim_states.pt) or FSDP files (model_world_size_W_rank_R.pt)"
    )


def open_checkpoint(folder: Path) -> CheckpointContents:
    """Open the checkpoint in ``folder`` (DeepSpeed or FSDP, detected from its files)."""
    kind, shard_dir = detect_format(folder)
    return read_fsdp(shard_dir) if kind == "fsdp" else read_deepspeed(shard_dir)
