"""Open a training checkpoint folder, whatever wrote it: DeepSpeed ZeRO 0-3 or FSDP.

:func:`detect_format` looks at the file names and :func:`open_checkpoint` hands the folder to
:mod:`rft.convert.ds_reader` or :mod:`rft.convert.fsdp_reader`, which return a
:class:`CheckpointContents`. Nothing is hard-coded about architectures or parameter names.
Megatron checkpoints are recognised and refused with the command that converts them
(:func:`refuse_megatron`).
"""

from __future__ import annotations

import re
from pathlib import Path

from rft.convert.ds_reader import read_deepspeed
from rft.convert.fsdp_reader import FSDP_FILE_RE, read_fsdp
from rft.convert.types import CheckpointContents, SourceTensor
from rft.errors import CheckpointError

__all__ = [
    "CheckpointContents",
    "SourceTensor",
    "detect_format",
    "open_checkpoint",
    "refuse_megatron",
]

# Megatron folders: veRL's and Trinity's ``actor/dist_ckpt/`` (torch_dist: ``__R_S.distcp``,
# ``.metadata``, ``common.pt``, ``metadata.json``), Megatron-LM's ``iter_NNNNNNN/`` and the legacy
# per-rank ``mp_rank_TT[_PPP[_EEE]]/model_optim_rng.pt``. (``latest_checkpointed_iteration.txt``
# alone proves nothing: rft and Trinity write it at the run root too; DeepSpeed's
# ``mp_rank_00_model_states.pt`` is a file, not a folder.)
_MEGATRON_DIR_RE = re.compile(r"^(?:dist_ckpt|iter_\d{7}|mp_rank_\d{2}(?:_\d{3}){0,2})$")
_MEGATRON_FILES = ("*.distcp", "model_optim_rng.pt")


def megatron_marker(folder: Path) -> Path | None:
    """A file or folder in ``folder`` that only a Megatron checkpoint has, or None."""
    if not folder.is_dir():
        return None
    for child in sorted(folder.iterdir()):
        if child.is_dir() and _MEGATRON_DIR_RE.match(child.name):
            return child
    return next((p for pattern in _MEGATRON_FILES for p in sorted(folder.glob(pattern))), None)


def refuse_megatron(folder: Path) -> None:
    """CheckpointError naming Megatron and the way out when ``folder`` holds a Megatron checkpoint."""
    marker = megatron_marker(folder)
    if marker is not None:
        raise CheckpointError(
            f"{folder} is a Megatron checkpoint ({marker.name}); rft-convert reads the DeepSpeed "
            "checkpoints rft writes and FSDP ones, not Megatron's. Convert it to a Hugging Face "
            "folder with the tools of the framework that wrote it (Trinity-RFT: trinity convert "
            "--checkpoint-dir <run or global_step_N>; veRL: python -m verl.model_merger merge "
            "--backend megatron --local_dir <global_step_N/actor> --target_dir <out>), then point "
            "model.model_path at that folder"
        )


def detect_format(folder: Path) -> tuple[str, Path]:
    """Return ("deepspeed" | "fsdp", folder holding the shard files) or raise CheckpointError
    (also for a Megatron checkpoint: :func:`refuse_megatron`)."""
    refuse_megatron(folder)
    if any(FSDP_FILE_RE.match(p.name) for p in folder.glob("model_world_size_*_rank_*.pt")):
        return "fsdp", folder
    latest = folder / "latest"
    if latest.is_file():
        tag = latest.read_text().strip()
        if not (folder / tag).is_dir():
            raise CheckpointError(
                f"{latest} names tag {tag!r} but {folder / tag} does not exist; "
                "the checkpoint is incomplete or was moved"
            )
        return "deepspeed", folder / tag
    if list(folder.glob("*model_states.pt")):
        return "deepspeed", folder
    tagged = sorted({p.parent for p in folder.glob("*/*model_states.pt")})
    if len(tagged) == 1:
        return "deepspeed", tagged[0]
    if tagged:
        raise CheckpointError(
            f"{folder} holds several DeepSpeed tags ({', '.join(p.name for p in tagged)}) "
            "and no 'latest' file; pass the tag folder you want"
        )
    raise CheckpointError(
        f"{folder} is not a checkpoint: expected DeepSpeed files (latest, *_model_states.pt, "
        "*_optim_states.pt) or FSDP files (model_world_size_W_rank_R.pt)"
    )


def open_checkpoint(folder: Path) -> CheckpointContents:
    """Open the checkpoint in ``folder`` (DeepSpeed or FSDP, detected from its files)."""
    kind, shard_dir = detect_format(folder)
    return read_fsdp(shard_dir) if kind == "fsdp" else read_deepspeed(shard_dir)
