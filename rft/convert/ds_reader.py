"""Reader for DeepSpeed ZeRO 0-3 checkpoints (own implementation; DeepSpeed is not imported).

A tag folder (``<actor>/<tag>/`` named by ``latest``, or ``actor/`` itself) enters; a
:class:`rft.convert.types.CheckpointContents` leaves, each parameter assembled from the ranks'
fp32 master weights straight into the output tensor when loaded (Adam moments are never read).
Files are read with :mod:`rft.convert.torchfile`, CRC-checked.
"""

from __future__ import annotations

import logging
import math
import re
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from rft.convert.torchfile import LazyTensor, open_torch_file
from rft.convert.types import CheckpointContents, SourceTensor, check_ranks
from rft.errors import CheckpointError, NotSupportedError

log = logging.getLogger(__name__)

_OPTIM_RE = re.compile(r"^(?:\w+_)?zero_pp_rank_(\d+)_mp_rank_(\d+)_optim_states\.pt$")
_Z3_MODEL_RE = re.compile(r"^zero_pp_rank_(\d+)_mp_rank_(\d+)_model_states\.pt$")


class FlatView:
    """Several 1-D LazyTensors read as one concatenated vector (rank partitions, flat groups)."""

    def __init__(self, pieces: list[LazyTensor]) -> None:
        self.pieces = pieces
        self.starts = [0]
        for p in pieces:
            self.starts.append(self.starts[-1] + p.numel())

    def numel(self) -> int:
        return self.starts[-1]

    def read(self, start: int, count: int, out: torch.Tensor | None = None) -> torch.Tensor:
        """Elements ``[start, start+count)`` of the concatenation, read into ``out`` if given."""
        if start + count > self.numel():
            raise CheckpointError(
                f"a parameter needs elements up to {start + count} of a flat fp32 vector that has "
                f"{self.numel()} ({self.pieces[0].storage.archive.path.parent}); the shards do not "
                "match the model states (mixed checkpoints, or a different world size)"
            )
        if out is None:
            out = torch.empty(count, dtype=self.pieces[0].dtype)
        for piece, lo, hi in zip(self.pieces, self.starts, self.starts[1:]):
            a, b = max(start, lo), min(start + count, hi)
            if a < b:
                piece.read(a - lo, b - a, out[a - start : b - start])
        return out


def _open(contents: CheckpointContents, path: Path) -> Any:  # the unpickled tree
    archive, tree = open_torch_file(path)
    contents.stack.callback(archive.close)
    contents.files.append(path)
    contents.checks.append(archive.verify)
    return tree


def _need(tree: Any, key: str, path: Path) -> Any:
    if not isinstance(tree, dict) or key not in tree:
        raise CheckpointError(
            f"{path} lacks '{key}': not a DeepSpeed ZeRO checkpoint file (or a damaged one)"
        )
    return tree[key]


def _rank_files(folder: Path, pattern: re.Pattern, what: str) -> dict[int, Path]:
    files: dict[int, Path] = {}
    for p in folder.iterdir():
        m = pattern.match(p.name)
        if m:
            if int(m.group(2)) != 0:
                raise NotSupportedError(
                    f"{p}: tensor/pipeline-parallel DeepSpeed checkpoints (mp_rank > 0) "
                    "are not supported; convert with DeepSpeed's universal checkpoint tools"
                )
            files[int(m.group(1))] = p
    return files


def _numel(shape: Sequence[int]) -> int:
    return math.prod(int(s) for s in shape)


def _shape(shape: Sequence[int]) -> tuple[int, ...]:
    return tuple(int(s) for s in shape)


def _lazy(tensor: LazyTensor) -> Callable[[], torch.Tensor]:
    return tensor.load


def read_deepspeed(folder: Path) -> CheckpointContents:
    """Open a DeepSpeed checkpoint tag folder (ZeRO stage 0-3)."""
    z3_models = _rank_files(folder, _Z3_MODEL_RE, "model states")
    optim_files = _rank_files(folder, _OPTIM_RE, "optimizer states")
    contents = CheckpointContents(kind="deepspeed", world_size=1, tensors=[])
    try:
        if z3_models:
            _read_zero3(folder, z3_models, optim_files, contents)
        else:
            _read_zero12(folder, optim_files, contents)
    except BaseException:
        contents.close()
        raise
    return contents


def _optim_name(optim_files: dict[int, Path], rank: int) -> str:
    sample = next(iter(optim_files.values()), None)
    prefix = sample.name.split("zero_pp_rank_")[0] if sample else ""
    return f"{prefix}zero_pp_rank_{rank}_mp_rank_00_optim_states.pt"


def _open_optim(
    contents: CheckpointContents, folder: Path, optim_files: dict[int, Path], world_size: int
) -> list[dict]:
    paths = check_ranks(
        optim_files, world_size, folder, _optim_name(optim_files, 0).replace("_0_", "_{}_", 1)
    )
    states = []
    for path in paths:
        osd = _need(_open(contents, path), "optimizer_state_dict", path)
        count = _need(osd, "partition_count", path)
        count = max(count) if isinstance(count, (list, tuple)) else int(count)
        if count != world_size:
            raise CheckpointError(
                f"{path}: world-size mismatch: partition_count {count} but the model states "
                f"say {world_size} ranks; the files come from different saves"
            )
        states.append(osd)
    return states


def _module_order(names: list[str], module_keys: list[str]) -> list[str]:
    pos = {k: i for i, k in enumerate(module_keys)}
    return sorted(names, key=lambda n: pos.get(n, len(pos)))


def _buffers(model_states: dict, path: Path) -> list[SourceTensor]:
    module = model_states.get("module") or {}
    out = []
    for name in model_states.get("buffer_names") or []:
        t = module.get(name)
        if isinstance(t, LazyTensor):
            out.append(SourceTensor(name, t.shape, t.dtype, _lazy(t)))
    return out


def _read_zero12(folder: Path, optim_files: dict[int, Path], contents: CheckpointContents) -> None:
    """ZeRO-0/1/2: ``mp_rank_00_model_states.pt`` gives names and shapes (``param_shapes``),
    ``shared_params`` (tied weights), buffers, frozen parameters and ``dp_world_size``; each
    ``[bf16_]zero_pp_rank_{r}_mp_rank_00_optim_states.pt`` holds rank r's slice of the fp32
    master weights: each parameter group's flat vector split into equal contiguous slices in
    rank order, padded at the end."""
    path = folder / "mp_rank_00_model_states.pt"
    if not path.is_file():
        raise CheckpointError(f"{folder}: missing {path.name}; not a complete DeepSpeed checkpoint")
    ms = _open(contents, path)
    param_shapes = _need(ms, "param_shapes", path)
    world_size = int(ms.get("dp_world_size") or len(optim_files) or 1)
    contents.world_size = world_size
    contents.aliases = dict(ms.get("shared_params") or {})
    tensors = {t.name: t for t in _buffers(ms, path)}
    frozen = ms.get("frozen_param_fragments") or {}
    for name, shape in (ms.get("frozen_param_shapes") or {}).items():
        tensors[name] = SourceTensor(name, _shape(shape), frozen[name].dtype, _lazy(frozen[name]))
    if optim_files:
        states = _open_optim(contents, folder, optim_files, world_size)
        stage = int(states[0].get("zero_stage", 1))
        contents.kind = f"deepspeed-zero{stage}"
        for t in _zero12_params(states, param_shapes, world_size, folder):
            tensors[t.name] = t
        _add_unlisted_module_params(ms, tensors, contents.aliases, path)
    else:
        contents.kind = "deepspeed-module"
        log.warning(
            "%s has no optimizer shards: using the module weights in %s (16-bit if trained so)",
            folder,
            path.name,
        )
        module = _need(ms, "module", path)
        for group in param_shapes:
            for name, shape in group.items():
                t = module.get(name)
                if not isinstance(t, LazyTensor) or _numel(t.shape) != _numel(shape):
                    raise CheckpointError(
                        f"{path}: no optimizer shards and no full weight for {name}; "
                        "the optimizer files are missing: copy them back or use another step"
                    )
                tensors[name] = SourceTensor(name, _shape(shape), t.dtype, _lazy(t))
    contents.tensors = [
        tensors[n] for n in _module_order(list(tensors), list((ms.get("module") or {}).keys()))
    ]


def _add_unlisted_module_params(
    ms: dict, tensors: dict[str, SourceTensor], aliases: dict[str, str], path: Path
) -> None:
    """Take parameters the optimizer does not hold from the full module weights (ZeRO-1/2 only).

    DeepSpeed's bf16 optimizer records frozen parameters nowhere but in ``module``, so without
    this they would be missing from the output (DeepSpeed's zero_to_fp32 drops them).
    """
    extra = [
        k
        for k, v in (ms.get("module") or {}).items()
        if isinstance(v, LazyTensor) and k not in tensors and k not in aliases
    ]
    for name in extra:
        t = ms["module"][name]
        tensors[name] = SourceTensor(name, t.shape, t.dtype, _lazy(t))
    if extra:
        log.info(
            "%s: %d parameter(s) outside the optimizer (frozen) taken from the module weights, e.g. %s",
            path,
            len(extra),
            extra[0],
        )


def _zero12_params(
    states: list[dict], param_shapes: list[dict], world_size: int, folder: Path
) -> list[SourceTensor]:
    groups = [_need(s, "single_partition_of_fp32_groups", folder) for s in states]
    if len(groups[0]) != len(param_shapes):
        raise CheckpointError(
            f"{folder}: {len(groups[0])} fp32 groups but {len(param_shapes)} parameter groups "
            "in the model states; the files come from different saves"
        )
    paddings = states[0].get("param_alignment_paddings")
    out = []
    for g, shapes in enumerate(param_shapes):
        flat = FlatView([groups[r][g] for r in range(world_size)])
        offset = 0
        for i, (name, shape) in enumerate(shapes.items()):
            n = _numel(shape)
            out.append(
                SourceTensor(name, _shape(shape), torch.float32, _flat_loader(flat, offset, shape))
            )
            offset += n + (paddings[g][i] if paddings else 0)
        _check_consumed(offset, flat.numel(), world_size, folder, g)
    return out


def _check_consumed(used: int, avail: int, world_size: int, folder: Path, group: int) -> None:
    # ZeRO-1/2 pad each group so it splits evenly; what is left over is padding (< 2 * ranks per param
    # group alignment) never parameters, so round both to that alignment before comparing.
    align = 2 * world_size
    if math.ceil(used / align) != math.ceil(avail / align):
        raise CheckpointError(
            f"{folder}: parameter group {group} uses {used} fp32 elements but the shards "
            f"hold {avail}; the model states and optimizer shards do not belong together"
        )


def _flat_loader(flat: FlatView, offset: int, shape: Sequence[int]) -> Callable[[], torch.Tensor]:
    return lambda: flat.read(offset, _numel(shape)).view(_shape(shape))


def _read_zero3(
    folder: Path,
    model_files: dict[int, Path],
    optim_files: dict[int, Path],
    contents: CheckpointContents,
) -> None:
    """ZeRO-3: ``zero_pp_rank_{r}_mp_rank_00_model_states.pt`` per rank (names, shapes, frozen
    fragments); every parameter split into ``ceil(numel / world_size)``-element pieces laid end
    to end in each rank's ``fp32_flat_groups``."""
    ms0 = _open(contents, model_files[min(model_files)])
    world_size = int(ms0.get("dp_world_size") or len(model_files))
    paths = check_ranks(
        model_files, world_size, folder, "zero_pp_rank_{}_mp_rank_00_model_states.pt"
    )
    model_states = [
        ms0 if p == model_files[min(model_files)] else _open(contents, p) for p in paths
    ]
    contents.world_size = world_size
    contents.kind = "deepspeed-zero3"
    contents.aliases = dict(ms0.get("shared_params") or {})
    if not optim_files:
        raise CheckpointError(
            f"{folder}: a ZeRO-3 checkpoint without optimizer shards (*_optim_states.pt) "
            "has no weights to convert; copy the shards back or use another step"
        )
    states = _open_optim(contents, folder, optim_files, world_size)
    flats = [FlatView(list(_need(s, "fp32_flat_groups", folder))) for s in states]
    tensors = {t.name: t for t in _buffers(ms0, paths[0])}
    for name, shape in (ms0.get("frozen_param_shapes") or {}).items():
        frags = [FlatView([m["frozen_param_fragments"][name]]) for m in model_states]
        tensors[name] = SourceTensor(
            name, _shape(shape), frags[0].pieces[0].dtype, _z3_loader(frags, 0, shape, world_size)
        )
    offset = 0
    for group in _need(ms0, "param_shapes", paths[0]):
        for name, shape in group.items():
            tensors[name] = SourceTensor(
                name, _shape(shape), torch.float32, _z3_loader(flats, offset, shape, world_size)
            )
            offset += math.ceil(_numel(shape) / world_size)
    if offset != flats[0].numel():
        raise CheckpointError(
            f"{folder}: parameters need {offset} fp32 elements per rank but the shards hold "
            f"{flats[0].numel()}; the model states and optimizer shards do not belong together"
        )
    contents.tensors = [
        tensors[n] for n in _module_order(list(tensors), list((ms0.get("module") or {}).keys()))
    ]


def _z3_loader(
    flats: list[FlatView], offset: int, shape: Sequence[int], world_size: int
) -> Callable[[], torch.Tensor]:
    n = _numel(shape)
    part = math.ceil(n / world_size)

    def load() -> torch.Tensor:
        out = torch.empty(part * world_size, dtype=flats[0].pieces[0].dtype)  # [world_size * part]
        for rank, flat in enumerate(flats):
            flat.read(offset, part, out[rank * part : (rank + 1) * part])
        return out[:n].view(_shape(shape))

    return load
