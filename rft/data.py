"""Local datasets as users have them: find the files of a split, read their columns.

Input: a ``path`` (a file, a folder downloaded from the hub, or a ``save_to_disk`` folder), an
optional ``subset_name`` and a ``split``. Output: a :class:`DatasetSource` (format + files) that
``datasets`` can load, and the column names, read cheaply (parquet schema, first JSON line) so
a config can be checked on the login node. Nothing is downloaded: compute nodes usually have no
internet, so a hub id such as ``openai/gsm8k`` gets an error that says how to fetch it first.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from rft.errors import DataError
from rft.typed_dict import nearest

EXTENSIONS = {".parquet": "parquet", ".jsonl": "json", ".json": "json", ".arrow": "arrow",
              ".csv": "csv"}


@dataclass(frozen=True)
class DatasetSource:
    """Where one split of a dataset lives on disk."""

    format: str  # "parquet", "json", "arrow", "csv", or "saved" (datasets.save_to_disk folder)
    files: tuple[Path, ...]  # data files, or the one saved folder


def resolve(path: str | Path, split: str = "train", subset_name: str | None = None) -> DatasetSource:
    """Locate ``split`` (of ``subset_name``) under ``path``; raise DataError saying what exists."""
    root = Path(path).expanduser()
    if not root.exists():
        raise DataError(
            f"dataset path {str(path)!r} does not exist. rft reads local datasets only; download "
            f"it first (e.g. `huggingface-cli download openai/gsm8k --repo-type dataset "
            f"--local-dir /shared/data/gsm8k`) and set the path to that folder")
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
        hint = nearest(split, found)
        raise DataError(f"no files for split {split!r} under {base} (found splits: "
                        f"{', '.join(found) or 'none'}){f'; did you mean {hint!r}?' if hint else ''}")
    formats = {_format_of(f) for f in files}
    if len(formats) > 1:
        raise DataError(f"split {split!r} under {base} mixes file formats {sorted(formats)}")
    return DatasetSource(formats.pop(), tuple(files))


def _format_of(file: Path) -> str:
    fmt = EXTENSIONS.get(file.suffix.lower())
    if fmt is None:
        raise DataError(f"{file}: unsupported dataset file type {file.suffix!r}; use one of "
                        f"{', '.join(sorted(EXTENSIONS))} or a datasets.save_to_disk folder")
    return fmt


def _saved_split(root: Path, split: str) -> DatasetSource:
    splits = json.loads((root / "dataset_dict.json").read_text()).get("splits", [])
    if split not in splits:
        raise DataError(f"{root} (a saved DatasetDict) has no split {split!r}; it has: "
                        f"{', '.join(splits)}")
    return DatasetSource("saved", (root / split,))


def _subset_dir(root: Path, subset_name: str | None) -> Path:
    if not subset_name:
        return root
    base = root / subset_name
    if not base.is_dir():
        subsets = sorted(p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
        raise DataError(f"subset_name {subset_name!r}: no folder {base} (subsets found: "
                        f"{', '.join(subsets) or 'none'})")
    return base


def _data_files(folder: Path) -> list[Path]:
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.iterdir() if p.is_file() and p.suffix.lower() in EXTENSIONS)


def _split_files(base: Path, split: str) -> list[Path]:
    """Hub layouts: <split>.ext, <split>-00000-of-00001.ext, data/<split>-*.ext, <split>/*.ext."""
    for folder in (base, base / "data"):
        files = [f for f in _data_files(folder) if _split_of(f) == split]
        if files:
            return files
    return _data_files(base / split)


def _split_of(file: Path) -> str:
    stem = file.name[: -len(file.suffix)]
    return stem.split("-")[0]


def available_splits(base: Path) -> set[str]:
    """Split names visible under a hub-style folder."""
    names = {_split_of(f) for folder in (base, base / "data") for f in _data_files(folder)}
    if base.is_dir():
        names |= {p.name for p in base.iterdir() if p.is_dir() and _data_files(p)}
    return names


def read_columns(source: DatasetSource) -> list[str]:
    """Column names of a split, without loading its rows."""
    first = source.files[0]
    if source.format == "parquet":
        import pyarrow.parquet as pq

        try:
            return list(pq.read_schema(first).names)
        except Exception as e:  # pyarrow raises several types for damaged files
            raise DataError(f"{first}: cannot read the parquet schema ({e}); is the file complete?") from e
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
            if isinstance(row, list) or (isinstance(row, dict) and isinstance(row.get("data"), list)):
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
            raise DataError(f"{where}: {key}={column!r} is not a column of the dataset (columns: "
                            f"{', '.join(columns)}){f'; did you mean {hint!r}?' if hint else ''}")


def count_rows(source: DatasetSource) -> int | None:
    """Row count when it is cheap (parquet metadata, JSON lines); None otherwise."""
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
