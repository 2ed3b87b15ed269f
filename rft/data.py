"""Local datasets as users have them: find a split's files, check and load its rows, count steps.

A ``path`` (a file, a folder downloaded from the hub, a ``save_to_disk`` folder), a
``subset_name`` and a ``split`` enter; a :class:`DatasetSource`, cheaply read column names (for
the login node's checks) and the rows (:func:`load_split`, the one loader) leave. Nothing is
downloaded (compute nodes have no internet). One owner for the rules the explorer, the trainer
and preflight share: a dataset's columns, a row as chat messages, a run's number of steps.
"""

from __future__ import annotations

import json
import math
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from rft.config.batches import rollouts_per_update
from rft.errors import DataError, nearest

if TYPE_CHECKING:
    import datasets

    from rft.config.schema import Config, FormatConfig

    Format = FormatConfig | Mapping[str, str] | None  # a taskset's format, as config or YAML

Messages = list[dict[str, str]]

EXTENSIONS = {
    ".parquet": "parquet",
    ".jsonl": "json",
    ".json": "json",
    ".arrow": "arrow",
    ".csv": "csv",
}
# Words the hub's loader reads as split names in file names (datasets.data_files.SPLIT_KEYWORDS):
# a folder whose files are named after one of them (other than the folder's own name) is a
# subset folder such as GSM8K's main/ (train-*.parquet, test-*.parquet), never one split.
SPLIT_WORDS = frozenset(
    {
        "train",
        "training",
        "validation",
        "valid",
        "dev",
        "val",
        "test",
        "testing",
        "eval",
        "evaluation",
    }
)


@dataclass(frozen=True)
class DatasetSource:
    """Where one split of a dataset lives on disk."""

    format: str  # "parquet", "json", "arrow", "csv", or "saved" (datasets.save_to_disk folder)
    files: tuple[Path, ...]  # data files, or the one saved folder


def resolve(
    path: str | Path, split: str = "train", subset_name: str | None = None
) -> DatasetSource:
    """Locate ``split`` (of ``subset_name``) under ``path``; raise DataError saying what exists."""
    root = Path(path).expanduser()
    if not root.exists():
        raise DataError(
            f"dataset path {str(path)!r} does not exist. rft reads local datasets only; download "
            f"it first (e.g. `huggingface-cli download openai/gsm8k --repo-type dataset "
            f"--local-dir /shared/data/gsm8k`) and set the path to that folder"
        )
    if root.is_file():
        return DatasetSource(_format_of(root), (root,))
    if (root / "dataset_dict.json").is_file():
        return _saved_split(root, split)
    if (root / "state.json").is_file() and (root / "dataset_info.json").is_file():
        return DatasetSource("saved", (root,))
    base = _subset_dir(root, subset_name)
    files = _split_files(base, split)
    if not files:
        found = sorted(available_splits(base))
        subsets = subset_folders(base)
        hint = nearest(split, found)
        advice = (
            _subset_advice(base, split, subsets)
            if subsets
            else (f"; did you mean {hint!r}?" if hint else "")
        )
        raise DataError(
            f"no files for split {split!r} under {base} (found splits: "
            f"{', '.join(found) or 'none'}){advice}"
        )
    formats = {_format_of(f) for f in files}
    if len(formats) > 1:
        raise DataError(f"split {split!r} under {base} mixes file formats {sorted(formats)}")
    return DatasetSource(formats.pop(), tuple(files))


def _format_of(file: Path) -> str:
    fmt = EXTENSIONS.get(file.suffix.lower())
    if fmt is None:
        raise DataError(
            f"{file}: unsupported dataset file type {file.suffix!r}; use one of "
            f"{', '.join(sorted(EXTENSIONS))} or a datasets.save_to_disk folder"
        )
    return fmt


def _saved_split(root: Path, split: str) -> DatasetSource:
    splits = json.loads((root / "dataset_dict.json").read_text()).get("splits", [])
    if split not in splits:
        raise DataError(
            f"{root} (a saved DatasetDict) has no split {split!r}; it has: {', '.join(splits)}"
        )
    return DatasetSource("saved", (root / split,))


def _subset_dir(root: Path, subset_name: str | None) -> Path:
    if not subset_name:
        return root
    base = root / subset_name
    if not base.is_dir():
        subsets = sorted(
            p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")
        )
        raise DataError(
            f"subset_name {subset_name!r}: no folder {base} (subsets found: "
            f"{', '.join(subsets) or 'none'})"
        )
    return base


def _data_files(folder: Path) -> list[Path]:
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.iterdir() if p.is_file() and p.suffix.lower() in EXTENSIONS)


def _split_files(base: Path, split: str) -> list[Path]:
    """Hub layouts: <split>.ext, <split>-00000-of-00001.ext, data/<split>-*.ext, <split>/*.ext.

    Never the files of several splits: a ``<split>/`` folder whose files are named after
    another split (a subset folder) gives none."""
    for folder in (base, base / "data"):
        files = [f for f in _data_files(folder) if _split_of(f) == split]
        if files:
            return files
    if _is_subset_folder(base / split):
        return []
    return _data_files(base / split)


def _split_of(file: Path) -> str:
    stem = file.name[: -len(file.suffix)]
    return stem.split("-")[0]


def _is_subset_folder(folder: Path) -> bool:
    """True when ``folder``'s data files are named after a split other than the folder itself."""
    named = {_split_of(f) for f in _data_files(folder) if _split_of(f).lower() in SPLIT_WORDS}
    return bool(named - {folder.name})


def subset_folders(base: Path) -> list[str]:
    """Sub-folders of ``base`` that are subsets holding splits (``main/`` of GSM8K), sorted."""
    if not base.is_dir():
        return []
    return sorted(p.name for p in base.iterdir() if p.is_dir() and _is_subset_folder(p))


def available_splits(base: Path) -> set[str]:
    """Split names visible under a hub-style folder (subset folders are not splits)."""
    names = {_split_of(f) for folder in (base, base / "data") for f in _data_files(folder)}
    if base.is_dir():
        names |= {
            p.name
            for p in base.iterdir()
            if p.is_dir() and _data_files(p) and not _is_subset_folder(p)
        }
    return names


def _subset_advice(base: Path, split: str, subsets: list[str]) -> str:
    """'; set subset_name: S and split: X' for a split asked of a folder that holds subsets."""
    holding = [s for s in subsets if split in available_splits(base / s)]
    subset = (holding or ([split] if split in subsets else subsets))[0]
    splits = sorted(available_splits(base / subset))
    pick = split if split in splits else ("train" if "train" in splits else splits[0])
    return (
        f"; {base} holds subset folders ({', '.join(subsets)}), which are not splits: set "
        f"subset_name: {subset} and split: {pick} (the splits of {subset}: {', '.join(splits)})"
    )


def read_columns(source: DatasetSource) -> list[str]:
    """Column names of a split, without loading its rows."""
    first = source.files[0]
    if source.format == "parquet":
        import pyarrow.parquet as pq

        try:
            return list(pq.read_schema(first).names)
        except Exception as e:  # pyarrow raises several types for damaged files
            raise DataError(
                f"{first}: cannot read the parquet schema ({e}); is the file complete?"
            ) from e
    if source.format == "json":
        return _json_columns(first)
    if source.format == "csv":
        return first.open().readline().strip().split(",")
    if source.format == "saved":
        info = json.loads((first / "dataset_info.json").read_text())
        return list(info.get("features", {}))
    import pyarrow as pa

    with pa.memory_map(str(first)) as stream:
        return list(pa.ipc.open_stream(stream).schema.names)


def _json_columns(file: Path) -> list[str]:
    with file.open() as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                return _json_array_columns(file)
            if isinstance(row, list) or (
                isinstance(row, dict) and isinstance(row.get("data"), list)
            ):
                return _json_array_columns(file)  # one JSON document on one line
            if not isinstance(row, dict):
                raise DataError(f"{file}:{number}: expected one JSON object per line")
            return list(row)
    raise DataError(f"{file} is empty: a taskset needs at least one row")


def _json_array_columns(file: Path) -> list[str]:
    try:
        data = json.loads(file.read_text())
    except json.JSONDecodeError as e:
        raise DataError(f"{file}: neither JSON lines nor a JSON array ({e})") from e
    rows = data.get("data", data) if isinstance(data, dict) else data
    if not isinstance(rows, list) or not rows or not isinstance(rows[0], dict):
        raise DataError(f"{file}: expected a list of JSON objects (rows)")
    return list(rows[0])


def check_columns(columns: list[str], required: dict[str, str], where: str) -> None:
    """Raise if a configured column is missing; ``required`` maps config key -> column name."""
    for key, column in required.items():
        if column not in columns:
            hint = nearest(column, columns)
            raise DataError(
                f"{where}: {key}={column!r} is not a column of the dataset (columns: "
                f"{', '.join(columns)}){f'; did you mean {hint!r}?' if hint else ''}"
            )


def count_rows(source: DatasetSource) -> int | None:
    """Row count when it is cheap (parquet metadata, JSON lines); None otherwise (see num_rows)."""
    if source.format == "parquet":
        import pyarrow.parquet as pq

        return sum(pq.ParquetFile(f).metadata.num_rows for f in source.files)
    if source.format == "json" and all(f.suffix.lower() == ".jsonl" for f in source.files):
        total = 0
        for f in source.files:
            with f.open("rb") as stream:
                total += sum(1 for line in stream if line.strip())
        return total
    return None


def num_rows(source: DatasetSource, label: str = "dataset") -> int:
    """Row count: cheap when :func:`count_rows` knows it, else by loading the split."""
    rows = count_rows(source)
    return rows if rows is not None else len(_load(source, label))


def _load(source: DatasetSource, label: str) -> datasets.Dataset:
    import datasets

    # A private cache, in memory: tasks on many nodes never share or lock one on the shared filesystem.
    cache = tempfile.mkdtemp(prefix="rft-datasets-")
    try:
        if source.format == "saved":
            return datasets.load_from_disk(str(source.files[0]), keep_in_memory=True)
        return datasets.load_dataset(
            source.format,
            data_files=[str(f) for f in source.files],
            split="train",
            cache_dir=cache,
            keep_in_memory=True,
        )
    except Exception as e:  # datasets raises many types for unreadable files
        raise DataError(f"{label}: cannot load {source.files[0]} ({e})") from e
    finally:
        shutil.rmtree(cache, ignore_errors=True)


def load_split(
    path: str, split: str, subset_name: str | None, label: str, required: Mapping[str, str]
) -> datasets.Dataset:
    """The split as an in-memory ``datasets.Dataset``, its ``required`` columns checked (config
    key -> column) and at least one row; DataError naming ``label`` otherwise."""
    source = resolve(path, split, subset_name)
    ds = _load(source, label)
    check_columns(list(ds.column_names), dict(required), label)
    if len(ds) == 0:
        raise DataError(f"{label}: split {split!r} of {path} has no rows")
    return ds


# ----------------------------------------------------------------------------- columns, messages


def format_field(fmt: Format, key: str) -> str | None:
    """A ``format`` field (``prompt_key``, ``response_key``...) from a FormatConfig, a mapping,
    or None (then None)."""
    if fmt is None:
        return None
    if isinstance(fmt, Mapping):
        return fmt.get(key)
    return getattr(fmt, key, None)


def task_columns(fmt: Format, label: str = "") -> dict[str, str]:
    """Columns a taskset must have (config key -> column): the prompt, or the messages, and the
    reference answer, which every reward compares with."""
    prefix = f"{label}.format" if label else "format"
    prompt = "messages_key" if format_field(fmt, "messages_key") else "prompt_key"
    return {
        f"{prefix}.{prompt}": format_field(fmt, prompt) or "prompt",
        f"{prefix}.response_key": format_field(fmt, "response_key") or "response",
    }


def expert_columns(fmt: Format, label: str = "") -> dict[str, str]:
    """Columns an SFT/expert dataset must have: messages ending with the reply, or prompt and
    response."""
    prefix = f"{label}.format" if label else "format"
    if format_field(fmt, "messages_key"):
        return {f"{prefix}.messages_key": format_field(fmt, "messages_key")}
    return {
        f"{prefix}.prompt_key": format_field(fmt, "prompt_key") or "prompt",
        f"{prefix}.response_key": format_field(fmt, "response_key") or "response",
    }


def column(row: Mapping[str, Any], key: str) -> Any:
    """``row[key]``, or DataError naming the row's columns and the format keys to fix."""
    if key not in row:
        raise DataError(
            f"task row has no column {key!r}; its columns are {sorted(row)}. Set the taskset's "
            f"format (prompt_key / response_key / messages_key) to the right column."
        )
    return row[key]


def _row_messages(row: Mapping[str, Any], key: str) -> Messages:
    value = column(row, key)
    ok = isinstance(value, list) and all(
        isinstance(m, Mapping)
        and isinstance(m.get("role"), str)
        and isinstance(m.get("content"), str)
        for m in value
    )
    if not ok or not value:
        raise DataError(
            f"task column {key!r} must be a non-empty list of {{'role': str, 'content': str}} "
            f"messages; got {str(value)[:200]!r}."
        )
    return [{"role": m["role"], "content": m["content"]} for m in value]


def chat_messages(
    row: Mapping[str, Any],
    fmt: Format,
    default_system_prompt: str | None = None,
    *,
    with_reply: bool = False,
) -> Messages:
    """``row`` as chat messages.

    Without ``with_reply`` (generation): the prompt, a trailing assistant reply in
    ``messages_key`` dropped, then ``reply_prefix`` as an assistant message the model continues.
    With ``with_reply`` (SFT/expert data): the prompt and the reply (the last message, which
    must be the assistant's). Either way ``format.system_prompt`` (else
    ``default_system_prompt``) leads unless the messages already start with a system message.
    """
    messages_key = format_field(fmt, "messages_key")
    if messages_key:
        messages = _row_messages(row, messages_key)
        if with_reply and messages[-1]["role"] != "assistant":
            raise DataError(f"column {messages_key!r} must end with an assistant reply to train on")
        while not with_reply and messages and messages[-1]["role"] == "assistant":
            messages.pop()
        if not messages:
            raise DataError(
                f"task column {messages_key!r} holds only assistant messages: there is no prompt."
            )
    else:
        messages = [
            {
                "role": "user",
                "content": str(column(row, format_field(fmt, "prompt_key") or "prompt")),
            }
        ]
        if with_reply:
            reply = column(row, format_field(fmt, "response_key") or "response")
            messages.append({"role": "assistant", "content": str(reply)})
    system_prompt = format_field(fmt, "system_prompt") or default_system_prompt
    if system_prompt and messages[0]["role"] != "system":
        messages = [{"role": "system", "content": system_prompt}] + messages
    reply_prefix = format_field(fmt, "reply_prefix")
    if reply_prefix and not with_reply:
        messages = messages + [{"role": "assistant", "content": reply_prefix}]
    return messages


# ----------------------------------------------------------------------------- steps


def planned_steps(
    rows: Sequence[int], total_epochs: int, batch_size: int, total_steps: int | None = None
) -> int:
    """Steps of a run: ``total_steps`` when set, else ``ceil(sum(rows) x total_epochs /
    batch_size)`` (a step's batch may span an epoch boundary; only the last step is short)."""
    if total_steps is not None:
        return total_steps
    return math.ceil(sum(rows) * total_epochs / batch_size)


def run_steps(cfg: "Config") -> int | None:
    """How many steps ``cfg`` runs (explorer, trainer, plan and LR schedule all use this).

    SFT (``storage_type: file``) counts the dataset's rows in ``train_batch_size`` batches;
    otherwise the training tasksets' rows in ``batch_size`` batches (an asynchronous trainer,
    ``mode: train``: their ``repeat_times`` rollouts each in ``train_batch_size``, its rollout
    part with CHORD). None when neither is
    known: an asynchronous trainer with no tasksets in its config runs until input ends.
    """
    buf = cfg.buffer
    if buf.total_steps is not None:
        return buf.total_steps
    experiences = buf.trainer_input.experience_buffer
    if experiences.storage_type == "file" and experiences.path:
        source = resolve(experiences.path, experiences.split, experiences.subset_name)
        rows = [num_rows(source, "buffer.trainer_input.experience_buffer")]
        return planned_steps(rows, buf.total_epochs, buf.train_batch_size or 1)
    tasksets = cfg.training_tasksets()
    if not tasksets:
        return None
    rows = [num_rows(resolve(ts.path, ts.split, ts.subset_name), ts.path) for ts in tasksets]
    if cfg.mode == "train":  # an async trainer: the tasks' rollouts, train_batch_size per step
        return planned_steps(
            rows, buf.total_epochs * cfg.algorithm.repeat_times, rollouts_per_update(cfg)
        )
    return planned_steps(rows, buf.total_epochs, buf.batch_size)
