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

import yaml

from rft.config.batches import rollouts_per_update
from rft.errors import DataError, nearest

if TYPE_CHECKING:
    import datasets

    from rft.config.schema import Config, FormatConfig

    Format = FormatConfig | Mapping[str, Any] | None  # a taskset's format, as config or YAML

Messages = list[dict[str, Any]]  # chat messages: role, content (tool_calls...)

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
    if not files and not subset_name:
        files = _default_config_files(root, split)
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


def _readme_configs(root: Path) -> list[dict[str, Any]]:
    """The ``configs:`` of a hub dataset card's YAML header (README.md), or []."""
    card = root / "README.md"
    if not card.is_file():
        return []
    text = card.read_text(encoding="utf-8", errors="replace")
    if not text.startswith("---"):
        return []
    header = text.split("---", 2)[1] if text.count("---") >= 2 else ""
    try:
        meta = yaml.safe_load(header) or {}
    except yaml.YAMLError:
        return []
    configs = meta.get("configs") if isinstance(meta, dict) else None
    return [c for c in configs or [] if isinstance(c, dict)]


def _card_split_files(root: Path, config: dict[str, Any], split: str) -> list[Path]:
    """A card config's files of ``split`` (its ``data_files`` patterns, relative to root)."""
    files = config.get("data_files")
    if isinstance(files, list) and all(isinstance(f, str) for f in files):
        files = {"split": "train", "path": files}  # patterns without splits: train's
    entries = files if isinstance(files, list) else [{"split": "train", "path": files}]
    out: list[Path] = []
    for entry in entries:
        if isinstance(entry, dict) and "split" not in entry:
            entry = {**entry, "split": "train"}
        if not isinstance(entry, dict) or entry.get("split") != split:
            continue
        paths = entry.get("path")
        for pattern in paths if isinstance(paths, list) else [paths]:
            if isinstance(pattern, str):
                out += sorted(p for p in root.glob(pattern) if p.is_file())
    return out


def _default_config_files(root: Path, split: str) -> list[Path]:
    """Where Hugging Face ``datasets`` finds ``split`` of a folder given no subset name: the
    dataset card's only (or ``default: true``) config, else the one subset folder holding that
    split (``main/train-*.parquet`` of GSM8K). [] when that is not one place."""
    configs = _readme_configs(root)
    if configs:
        chosen = [c for c in configs if c.get("default")] or configs
        return _card_split_files(root, chosen[0], split) if len(chosen) == 1 else []
    holding = [s for s in subset_folders(root) if _split_files(root / s, split)]
    return _split_files(root / holding[0], split) if len(holding) == 1 else []


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

        check_parquet_files(source.files)
        return list(pq.read_schema(first).names)
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


def check_parquet_files(files: Sequence[Path]) -> None:
    """Every parquet shard must open: its footer (schema, row groups) and the first row of its
    first row group are read. DataError naming the first damaged shard: datasets and a plain
    pyarrow read fail on it with a traceback, or name shard 0."""
    import pyarrow.parquet as pq

    for number, file in enumerate(files, 1):
        try:
            with pq.ParquetFile(file) as parquet:
                next(parquet.iter_batches(batch_size=1), None)
        except Exception as e:  # pyarrow raises several types for damaged files
            which = f" (shard {number} of {len(files)})" if len(files) > 1 else ""
            raise DataError(
                f"{file}{which}: cannot read the parquet schema or its first rows ({e}); the "
                "file was copied or downloaded incompletely: fetch it again"
            ) from e


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
            advice = format_advice(columns, required)
            lead = "" if key.startswith(where) else f"{where}: "  # the key path names it
            raise DataError(
                f"{lead}{key}={column!r} is not a column of the dataset (columns: "
                f"{', '.join(columns)}){f'; did you mean {hint!r}?' if hint else ''}"
                f"{f'; {advice}' if advice else ''}"
            )


def count_rows(source: DatasetSource) -> int | None:
    """Row count when it is cheap (parquet metadata, JSON lines); None otherwise (see num_rows)."""
    if source.format == "parquet":
        import pyarrow.parquet as pq

        try:
            return sum(pq.ParquetFile(f).metadata.num_rows for f in source.files)
        except Exception:  # pyarrow's own error names no file
            check_parquet_files(source.files)  # raises a DataError naming the damaged shard
            raise
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
        if source.format == "parquet":
            try:
                check_parquet_files(source.files)
            except DataError as damaged:  # names the damaged shard, not the first
                raise DataError(f"{label}: {damaged}") from e
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

# Trinity's FormatConfig.messages_key default, used when prompt_type is messages and no
# messages_key is given (rft's own default is unset: prompt_key/response_key rows).
DEFAULT_MESSAGES_KEY = "message"
# Column names that usually hold a chat (for the advice of a failed column check).
CHAT_COLUMNS = ("messages", "message", "conversations", "conversation", "chat", "dialog")


def format_field(fmt: Format, key: str) -> Any:
    """A ``format`` field (``prompt_key``, ``response_key``...) from a FormatConfig, a mapping,
    or None (then None)."""
    if fmt is None:
        return None
    if isinstance(fmt, Mapping):
        return fmt.get(key)
    return getattr(fmt, key, None)


def prompt_type(fmt: Format) -> str:
    """The row shape (Trinity's ``format.prompt_type``): ``messages``, ``plaintext`` or
    ``chatpair``; unset, ``messages`` when ``messages_key`` is set, else ``plaintext``."""
    return format_field(fmt, "prompt_type") or (
        "messages" if format_field(fmt, "messages_key") else "plaintext"
    )


def messages_key(fmt: Format) -> str:
    """The column of a ``messages`` row (Trinity's default ``message`` when unset)."""
    return format_field(fmt, "messages_key") or DEFAULT_MESSAGES_KEY


def _key(fmt: Format, key: str, default: str) -> str:
    return format_field(fmt, key) or default


def _prompt_columns(fmt: Format, prefix: str) -> dict[str, str]:
    """The columns holding the prompt: the chat (messages) or ``prompt_key`` (plaintext,
    chatpair), and ``system_prompt_key`` when set."""
    shape = prompt_type(fmt)
    out = (
        {f"{prefix}.messages_key": messages_key(fmt)}
        if shape == "messages"
        else {f"{prefix}.prompt_key": _key(fmt, "prompt_key", "prompt")}
    )
    system = format_field(fmt, "system_prompt_key")
    if system and shape != "messages":
        out[f"{prefix}.system_prompt_key"] = system
    return out


def _prefix(label: str) -> str:
    return f"{label}.format" if label else "format"


def task_columns(fmt: Format, label: str = "") -> dict[str, str]:
    """Columns a taskset must have (config key -> column): the prompt, or the messages, and the
    reference answer, which every reward compares with."""
    prefix = _prefix(label)
    return {
        **_prompt_columns(fmt, prefix),
        f"{prefix}.response_key": _key(fmt, "response_key", "response"),
    }


def expert_columns(fmt: Format, label: str = "") -> dict[str, str]:
    """Columns an SFT/expert dataset must have: messages ending with the reply (``messages``),
    or prompt and response (``plaintext``: text; ``chatpair``: messages)."""
    prefix = _prefix(label)
    if prompt_type(fmt) == "messages":
        return _prompt_columns(fmt, prefix)
    return task_columns(fmt, label)


def pair_columns(fmt: Format, label: str = "") -> dict[str, str]:
    """Columns a DPO dataset must have: the prompt (as :func:`expert_columns`) and the chosen
    and rejected replies."""
    prefix = _prefix(label)
    return {
        **_prompt_columns(fmt, prefix),
        f"{prefix}.chosen_key": _key(fmt, "chosen_key", "chosen"),
        f"{prefix}.rejected_key": _key(fmt, "rejected_key", "rejected"),
    }


def trains_pairs(cfg: Config) -> bool:
    """Whether the trainer's dataset holds preference pairs (``algorithm.policy_loss_fn: dpo``)."""
    return cfg.algorithm.policy_loss_fn == "dpo"


def trainer_dataset_columns(cfg: Config, label: str, buf: Any) -> dict[str, str]:
    """Columns of a trainer-input dataset ``buf`` at key path ``label``: pairs for DPO's
    experience buffer (:func:`pair_columns`), else SFT/expert rows (:func:`expert_columns`)."""
    pairs = trains_pairs(cfg) and label.endswith("experience_buffer")
    return (pair_columns if pairs else expert_columns)(buf.format, label)


def format_advice(columns: Sequence[str], required: Mapping[str, str]) -> str:
    """What to set when the dataset's columns do not fit ``required`` (config key -> column):
    a chat column for a prompt/response format, prompt/response columns for a messages one."""
    keys = {key.rpartition(".")[2]: key.rpartition(".")[0] for key in required}
    chat = next((c for c in CHAT_COLUMNS if c in columns), None)
    if "prompt_key" in keys and chat is not None:
        prefix = keys["prompt_key"]
        return (
            f"the dataset has a `{chat}` column: set {prefix}.prompt_type: messages and "
            f"{prefix}.messages_key: {chat}"
        )
    if "messages_key" in keys:
        prefix = keys["messages_key"]
        if chat is not None:
            return f"the dataset has a `{chat}` column: set {prefix}.messages_key: {chat}"
        if "prompt" in columns:
            return (
                f"the dataset has a `prompt` column: set {prefix}.prompt_type: plaintext "
                f"(text) or chatpair (messages), and {prefix}.prompt_key / response_key"
            )
    return ""


def column(row: Mapping[str, Any], key: str) -> Any:
    """``row[key]``, or DataError naming the row's columns and the format keys to fix."""
    if key not in row:
        raise DataError(
            f"row has no column {key!r}; its columns are {sorted(row)}. Set the format "
            f"(prompt_type, prompt_key / response_key / messages_key / chosen_key / "
            f"rejected_key) to the right columns."
        )
    return row[key]


def _message(value: Any, where: str) -> dict[str, Any]:
    """One chat message: a role and a text content (None only beside ``tool_calls``); keys a
    table gave every row (None here) are left out."""
    ok = (
        isinstance(value, Mapping)
        and isinstance(value.get("role"), str)
        and (isinstance(value.get("content"), str) or bool(value.get("tool_calls")))
    )
    if not ok:
        raise DataError(
            f"{where} must hold {{'role': str, 'content': str}} messages; got {str(value)[:200]!r}."
        )
    return {k: v for k, v in value.items() if v is not None}


def _as_messages(value: Any, role: str, where: str, *, parse_json: bool = False) -> Messages:
    """``value`` as a non-empty message list: a list of messages, one message, or a text (one
    ``role`` message); with ``parse_json`` a JSON-encoded list is decoded first (Trinity's)."""
    if parse_json and isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as e:
            raise DataError(f"{where} is a string but not JSON-encoded messages ({e})") from e
    if isinstance(value, str):
        return [{"role": role, "content": value}]
    items = [value] if isinstance(value, Mapping) else value
    if not isinstance(items, list) or not items:
        raise DataError(f"{where} must be a non-empty list of messages; got {str(value)[:200]!r}.")
    return [_message(m, where) for m in items]


def _with_system(
    messages: Messages, row: Mapping[str, Any], fmt: Format, default: str | None
) -> Messages:
    """``messages`` led by the row's ``system_prompt_key`` column, else ``format.system_prompt``,
    else ``default``, unless they already start with a system message."""
    key = format_field(fmt, "system_prompt_key")
    system = str(column(row, key)) if key else format_field(fmt, "system_prompt") or default
    if system and messages[0]["role"] != "system":
        return [{"role": "system", "content": system}] + messages
    return messages


def _ends_with_reply(messages: Messages, where: str) -> Messages:
    if messages[-1]["role"] != "assistant":
        raise DataError(f"{where} must end with an assistant reply to train on")
    return messages


def prompt_messages(
    row: Mapping[str, Any], fmt: Format, default_system_prompt: str | None = None
) -> Messages:
    """The prompt of ``row`` as chat messages (any trailing assistant reply dropped)."""
    shape = prompt_type(fmt)
    if shape == "plaintext":
        prompt = str(column(row, _key(fmt, "prompt_key", "prompt")))
        messages: Messages = [{"role": "user", "content": prompt}]
    else:
        key = messages_key(fmt) if shape == "messages" else _key(fmt, "prompt_key", "prompt")
        where = f"column {key!r}"
        messages = _as_messages(column(row, key), "user", where, parse_json=shape == "messages")
        while messages and messages[-1]["role"] == "assistant":
            messages.pop()
        if not messages:
            raise DataError(f"{where} holds only assistant messages: there is no prompt.")
    return _with_system(messages, row, fmt, default_system_prompt)


def chat_messages(
    row: Mapping[str, Any],
    fmt: Format,
    default_system_prompt: str | None = None,
    *,
    with_reply: bool = False,
) -> Messages:
    """``row`` as chat messages, in the shape of ``format.prompt_type`` (:func:`prompt_type`).

    Without ``with_reply`` (generation): the prompt (:func:`prompt_messages`), then
    ``reply_prefix`` as an assistant message the model continues. With ``with_reply``
    (SFT/expert data): the prompt and the reply, which must end with the assistant's message
    (``messages``: the chat as it is; ``plaintext``: ``response_key``'s text; ``chatpair``:
    ``response_key``'s messages). Either way the system prompt (:func:`_with_system`) leads
    unless the messages already start with a system message.
    """
    shape = prompt_type(fmt)
    if with_reply and shape == "messages":
        key = messages_key(fmt)
        where = f"column {key!r}"
        messages = _as_messages(column(row, key), "user", where, parse_json=True)
        return _with_system(_ends_with_reply(messages, where), row, fmt, default_system_prompt)
    messages = prompt_messages(row, fmt, default_system_prompt)
    if with_reply:
        key = _key(fmt, "response_key", "response")
        reply = _as_messages(column(row, key), "assistant", f"column {key!r}")
        return messages + _ends_with_reply(reply, f"column {key!r}")
    reply_prefix = format_field(fmt, "reply_prefix")
    if reply_prefix:
        messages = messages + [{"role": "assistant", "content": reply_prefix}]
    return messages


def preference_messages(row: Mapping[str, Any], fmt: Format) -> tuple[Messages, Messages, Messages]:
    """A DPO row as (prompt, chosen reply, rejected reply) messages: the prompt as
    :func:`prompt_messages`; each reply a text (one assistant message), a message or a list of
    messages that ends with the assistant's (Trinity's DPO formatter)."""
    prompt = prompt_messages(row, fmt)
    replies = []
    for name, default in (("chosen_key", "chosen"), ("rejected_key", "rejected")):
        key = _key(fmt, name, default)
        where = f"column {key!r}"
        replies.append(_ends_with_reply(_as_messages(column(row, key), "assistant", where), where))
    return prompt, replies[0], replies[1]


def row_tools(row: Mapping[str, Any], fmt: Format) -> list[dict[str, Any]] | None:
    """The row's tool schemas for the chat template (``format.tools_key``; a JSON string is
    decoded), or None when the row has none."""
    value = row.get(_key(fmt, "tools_key", "tools"))
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as e:
            raise DataError(f"column {format_field(fmt, 'tools_key')!r}: not JSON ({e})") from e
    return value or None


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
